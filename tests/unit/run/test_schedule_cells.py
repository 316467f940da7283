"""Cells as scheduler jobs (``run.cell_needs``): what each needs, how long it should take."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from repromatrix.judgement import Expected, Outcome
from repromatrix.results.store import CellResult, Timings
from repromatrix.run.images import image_job
from repromatrix.run.schedule import (
    CPU_ENGINE_PROCESS_BYTES,
    CPU_PROBE_BYTES,
    GIB,
    Capacity,
    Planner,
    cell_jobs,
    estimate_s,
    kv_budget_bytes,
    measured_durations,
    need_of,
)
from repromatrix.values import Lane, Level, frozen_flags
from support.runner import cell

FREE = 16 * GIB


def test_a_gpu_cell_needs_its_gpu_count() -> None:
    assert need_of(cell(Lane.GPU, gpus=4), FREE).gpus == 4
    assert need_of(cell(Lane.GPU, gpus=1), FREE).gpus == 1


def test_a_cpu_engine_needs_its_kv_budget_plus_its_processes() -> None:
    need = need_of(cell(), FREE)  # kv_cache_memory_bytes 262144
    assert (need.cores, need.memory) == (1, 262144 + CPU_ENGINE_PROCESS_BYTES)


def test_vllm_cpu_kvcache_space_overrides_the_flag() -> None:
    spaced = replace(cell(), env=MappingProxyType({"VLLM_CPU_KVCACHE_SPACE": "2"}))
    assert kv_budget_bytes(spaced) == 2 * GIB
    assert need_of(spaced, FREE).memory == 2 * GIB + CPU_ENGINE_PROCESS_BYTES


def test_without_a_budget_an_engine_needs_the_runners_free_memory() -> None:
    unbounded = replace(cell(), flags=frozen_flags({"max_model_len": 2048}))
    assert kv_budget_bytes(unbounded) is None
    assert need_of(unbounded, FREE).memory == FREE


def test_a_cpu_probe_needs_one_process() -> None:
    assert need_of(cell(level=Level.PROBE), FREE).memory == CPU_PROBE_BYTES


def test_a_budget_larger_than_the_host_is_skipped_not_queued() -> None:
    huge = replace(cell(), env=MappingProxyType({"VLLM_CPU_KVCACHE_SPACE": "40"}))
    planner = Planner(cell_jobs([huge], FREE), Capacity(core_ids=(0, 1), memory=FREE))
    assert "43.0 GiB of memory (this runner has 16.0 GiB free)" in planner.skipped[huge.id]


def test_probes_take_seconds_and_crashes_less_than_healthy_starts() -> None:
    crash = cell(Lane.GPU, deadline_s=1800)
    healthy = replace(crash, expected=Expected.AVOIDED)
    probe = cell(Lane.GPU, level=Level.PROBE, deadline_s=1800)
    assert estimate_s(probe) < estimate_s(crash) < estimate_s(healthy) <= 1800


def test_an_estimate_never_exceeds_the_deadline() -> None:
    assert estimate_s(replace(cell(Lane.GPU), expected=Expected.AVOIDED, deadline_s=90)) == 90


def test_a_measured_duration_wins() -> None:
    c = cell()
    assert estimate_s(c, {c.id: 412.5}) == 412.5
    assert estimate_s(c, {c.id: 0.0}) == estimate_s(c)


def test_measured_durations_come_from_earlier_results() -> None:
    def result(cid: str, total: float) -> CellResult:
        base = cell()
        return CellResult(
            cid, Outcome.HIT, Expected.HIT, "cpu", "engine", base.image.ref, base.image.tag,
            "cpu", "tiny-llama", "default", base.scenario.id, "trigger",
            timings=Timings(total_s=total),
        )  # fmt: skip

    durations = measured_durations([result("a", 31.5), result("skipped", 0.0)])
    assert durations == {"a": 31.5}


def test_cells_wait_for_their_image_task() -> None:
    c = cell()
    image = image_job(c.image.key)
    [job] = cell_jobs([c], FREE, image_task={c.image.key: image.key})
    assert job.after == image.key and image.image_task
