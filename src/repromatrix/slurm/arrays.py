"""A run's cells as Slurm job arrays: one array per GPU kind, one task per fleet job.

The cells are split as the CI forms split them (``fleet.jobs.plan_jobs``: cells of
one image together, each job sized to the time limit by its estimate), per GPU kind,
since all tasks of an array share one set of batch options. Those options come from
the GPU's ``slurm`` mapping where it gives them, else from the cells: the time limit
is the longest task's estimate with a margin and the warning signal's lead; the
memory is the most any one of its cells needs (all of the node's, ``--mem=0``, for a
cell that needs the runner to itself); one core per CPU cell, a few per GPU.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from repromatrix.fleet.jobs import Estimate, FleetJob, JobBudget, plan_jobs
from repromatrix.host.runner import MIB
from repromatrix.matrix.selector import Selector
from repromatrix.run.schedule import CPU_CELL_CORES, need_of
from repromatrix.values import Cell, Gpu, Lane, SlurmOptions

MAX_ARRAY_SIZE = 1000  # Slurm's default MaxArraySize (1001) allows indexes 0-1000
TIME_MARGIN = 0.25  # over a task's estimate: a slow pull, a busy node
WARNING_S = 120  # the task is signalled this long before its time limit (--signal=B:TERM@...)
CPUS_PER_GPU = 4  # the API server, the engine core and a worker per GPU, with room
GPU_TASK_GIB = 32  # a GPU task's host memory: at least this, else its GPUs' own memory


@dataclass(frozen=True)
class Task:
    """One task of an array: the fleet job it runs and the ids of its cells."""

    index: int
    job: FleetJob
    cell_ids: tuple[str, ...]


@dataclass(frozen=True)
class Resources:
    """What every task of an array asks Slurm for."""

    minutes: int  # --time
    cpus: int  # --cpus-per-task
    mem: str  # --mem; "0" is all of the node's memory
    gres: str | None  # --gres=gpu:<type>:<count> (None: no GPU)


@dataclass(frozen=True)
class TaskArray:
    """One ``sbatch --array``: the tasks of one GPU kind, their resources and site options."""

    name: str  # the GPU's name (with its lane where two lanes share a GPU name)
    lane: Lane
    gpu: Gpu
    tasks: tuple[Task, ...]
    resources: Resources

    @property
    def options(self) -> SlurmOptions:
        """The GPU's ``slurm`` mapping: partition, account, QOS, constraint, exclusive."""
        return self.gpu.slurm

    @property
    def cells(self) -> int:
        """How many cells its tasks run in all."""
        return sum(len(task.cell_ids) for task in self.tasks)


def split(
    cells: Sequence[Cell],
    everything: Collection[str],
    budget: JobBudget,
    estimate: Estimate,
) -> tuple[TaskArray, ...]:
    """The arrays that run exactly ``cells``; ``everything`` is the unselected plan's ids (a
    job's ``--only`` glob is a whole group's only where the whole group is to run)."""
    by_gpu: dict[tuple[Lane, str], list[Cell]] = {}
    for cell in cells:
        by_gpu.setdefault((cell.lane, cell.gpu.name), []).append(cell)
    names = [gpu for _, gpu in by_gpu]
    arrays = []
    for (lane, gpu_name), members in by_gpu.items():
        jobs = plan_jobs(members, everything, budget, estimate, max_jobs=MAX_ARRAY_SIZE)
        name = gpu_name if names.count(gpu_name) == 1 else f"{lane.value}-{gpu_name}"
        tasks = tuple(Task(index, job, cells_of(job, members)) for index, job in enumerate(jobs))
        gpu = members[0].gpu
        arrays.append(TaskArray(name, lane, gpu, tasks, resources(gpu, members, tasks, budget)))
    return tuple(arrays)


def cells_of(job: FleetJob, cells: Sequence[Cell]) -> tuple[str, ...]:
    """The ids of ``cells`` that ``job``'s ``--only`` globs select, in id order."""
    selector = Selector(job.only, ())
    return tuple(sorted(cell.id for cell in cells if selector.matches(cell.id)))


def resources(
    gpu: Gpu, cells: Sequence[Cell], tasks: Sequence[Task], budget: JobBudget
) -> Resources:
    """The batch resources of the array of ``gpu``'s ``cells``: the mapping's, else computed."""
    options = gpu.slurm
    longest = max(task.job.estimate_s for task in tasks)
    wanted = math.ceil((longest * (1 + TIME_MARGIN) + WARNING_S) / 60)
    minutes = max(1, min(wanted, math.floor(budget.job_minutes)))
    gpu_task = gpu.lane is Lane.GPU
    cpus = options.cpus_per_task or (CPUS_PER_GPU * gpu.count if gpu_task else CPU_CELL_CORES)
    mem = options.mem or (gpu_memory(gpu) if gpu_task else cpu_memory(cells))
    gres = None
    if gpu_task:
        gres = f"gpu:{options.gres}:{gpu.count}" if options.gres else f"gpu:{gpu.count}"
    return Resources(minutes, cpus, mem, gres)


def cpu_memory(cells: Sequence[Cell]) -> str:
    """The most memory one CPU cell needs (cells run one at a time on one core), in MiB; "0"
    (the whole node) when a cell needs the runner's memory to itself."""
    needs = [need_of(cell, free_memory=0).memory for cell in cells]
    if any(need == 0 for need in needs):
        return "0"
    return f"{math.ceil(max(needs) / MIB)}M"


def gpu_memory(gpu: Gpu) -> str:
    """A GPU task's host memory: its GPUs' memory (the checkpoint passes through host memory
    on its way to them), at least ``GPU_TASK_GIB``."""
    return f"{max(GPU_TASK_GIB, gpu.memory_gib * gpu.count)}G"
