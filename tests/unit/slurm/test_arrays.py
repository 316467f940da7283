"""A run's cells as Slurm arrays: an array per GPU kind, a task per fleet job, each task's
``--only`` globs selecting exactly its cells when its own ``repromatrix run`` plans them."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from repromatrix.fleet.jobs import JobBudget, estimator
from repromatrix.host.runner import MIB
from repromatrix.matrix.expand import expand, plan
from repromatrix.matrix.inputs import load_inputs
from repromatrix.matrix.selector import Selector
from repromatrix.run.schedule import CPU_ENGINE_PROCESS_BYTES, kv_budget_bytes
from repromatrix.slurm.arrays import GPU_TASK_GIB, TIME_MARGIN, WARNING_S, split
from repromatrix.values import Cell, Gpu, Lane, SlurmOptions
from support import factories, paths


@pytest.fixture(scope="module")
def default_plan() -> tuple[tuple[Cell, ...], frozenset[str]]:
    matrix, scenarios = load_inputs(paths.ROOT / "matrix.yaml", None)
    cells = tuple(expand(matrix, scenarios))
    return cells, frozenset(cell.id for cell in cells)


def test_every_cell_is_in_one_task_and_each_tasks_globs_plan_exactly_its_cells(default_plan):
    cells, everything = default_plan
    matrix, scenarios = load_inputs(paths.ROOT / "matrix.yaml", None)
    arrays = split(cells, everything, JobBudget(), estimator({}))
    assert {a.name for a in arrays} == {g.name for c in cells for g in [c.gpu]}
    owned = [cell for array in arrays for task in array.tasks for cell in task.cell_ids]
    assert sorted(owned) == sorted(everything)  # each cell once
    for array in arrays:
        assert [t.index for t in array.tasks] == list(range(len(array.tasks)))
        for task in array.tasks:
            # What the task's own `repromatrix run --only ...` will plan on its node:
            planned = plan(matrix, scenarios, None, Selector(task.job.only, ()))
            assert sorted(c.id for c in planned) == list(task.cell_ids)
            assert {c.gpu.name for c in planned} == {array.gpu.name}


def test_a_partial_selection_names_its_cells_not_the_whole_group(default_plan):
    cells, everything = default_plan
    some = [c for c in cells if c.id.startswith("cpu/0.32.0/cpu/tiny-llama/default/cpu-kv")]
    (array,) = split(some, everything, JobBudget(), estimator({}))
    (task,) = array.tasks
    assert task.job.only == (
        "cpu/0.32.0/cpu/tiny-llama/default/cpu-kv-cache-too-small/{max-model-len-64,trigger}",
    )


def test_cpu_tasks_ask_for_a_core_and_the_most_one_cell_needs(default_plan):
    cells, everything = default_plan
    some = [c for c in cells if c.lane is Lane.CPU and kv_budget_bytes(c) is not None]
    arrays = split(some, everything, JobBudget(), estimator({}))
    (array,) = arrays
    most = max(kv_budget_bytes(c) or 0 for c in some if c.level.value == "engine")
    res = array.resources
    assert res.cpus == 1 and res.gres is None
    assert res.mem == f"{math.ceil((most + CPU_ENGINE_PROCESS_BYTES) / MIB)}M"
    longest = max(t.job.estimate_s for t in array.tasks)
    assert res.minutes == math.ceil((longest * (1 + TIME_MARGIN) + WARNING_S) / 60)


def test_a_cell_that_needs_the_runner_to_itself_asks_for_the_whole_node():
    greedy = factories.cell(flags={"max_model_len": 2048})  # no KV-cache budget of its own
    (array,) = split([greedy], {greedy.id}, JobBudget(), estimator({}))
    assert array.resources.mem == "0"


def test_the_time_limit_never_exceeds_the_jobs_limit():
    cell = factories.cell(deadline_s=2280.0)  # the most a 60-minute job holds
    (array,) = split([cell], {cell.id}, JobBudget(job_minutes=60), estimator({}))
    assert array.resources.minutes == 60


def gpu_cell(slurm: SlurmOptions, count: int = 2, memory_gib: int = 80) -> Cell:
    gpu = Gpu("h100x2", Lane.GPU, "gpu-h100x2", count, "9.0", memory_gib, slurm=slurm)
    return factories.cell(Lane.GPU, gpu=gpu)


def test_gpu_tasks_ask_for_their_gres_cores_and_host_memory():
    cell = gpu_cell(SlurmOptions(partition="gpu", gres="h100"))
    (array,) = split([cell], {cell.id}, JobBudget(), estimator({}))
    assert (array.resources.gres, array.resources.cpus, array.resources.mem) == (
        "gpu:h100:2",
        8,
        "160G",
    )
    assert array.options.partition == "gpu"
    untyped = gpu_cell(SlurmOptions(), count=1, memory_gib=0)
    (plain,) = split([untyped], {untyped.id}, JobBudget(), estimator({}))
    assert (plain.resources.gres, plain.resources.mem) == ("gpu:1", f"{GPU_TASK_GIB}G")


def test_the_mapping_wins_over_what_the_cells_would_ask_for():
    cell = gpu_cell(SlurmOptions(cpus_per_task=32, mem="500G"))
    (array,) = split([cell], {cell.id}, JobBudget(), estimator({}))
    assert (array.resources.cpus, array.resources.mem) == (32, "500G")


def test_two_lanes_with_one_gpu_name_get_arrays_of_their_own():
    cpu = factories.cell()
    gpu = factories.cell(Lane.GPU, gpu=replace(factories.default_gpu(Lane.GPU), name="cpu"))
    arrays = split([cpu, gpu], {cpu.id, gpu.id}, JobBudget(), estimator({}))
    assert sorted(a.name for a in arrays) == ["cpu-cpu", "gpu-cpu"]


def test_measured_durations_size_the_tasks(tmp_path: Path):
    cell = factories.cell(deadline_s=3000.0)
    (slow,) = split([cell], {cell.id}, JobBudget(), estimator({}))
    (fast,) = split([cell], {cell.id}, JobBudget(), estimator({cell.id: 60.0}))
    assert fast.resources.minutes < slow.resources.minutes
