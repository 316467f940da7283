"""The packing policy (``run.schedule``) on a simulated clock: ids, limits, skips, backfill."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repromatrix.run.schedule import (
    GIB,
    Capacity,
    Job,
    Need,
    Planner,
    eta_s,
    makespan_lower_bound,
    simulate,
)


def gpus(n: int) -> Capacity:
    return Capacity(gpu_ids=tuple(str(i) for i in range(n)))


def gpu_job(key: str, count: int, estimate: float = 60.0, after: str | None = None) -> Job:
    return Job(key, Need(gpus=count), estimate, after=after)


def starts_of(planner: Planner) -> dict[str, float]:
    return {span.key: span.start for span in simulate(planner, lambda j: j.estimate_s).spans}


def check_invariants(planner: Planner, capacity: Capacity, image_slots: int) -> None:
    """What must hold whenever anything runs."""
    cells = [r for r in planner.running.values() if not r.job.image_task]
    held_gpus = [g for r in cells for g in r.allocation.gpu_ids]
    held_cores = [c for r in cells for c in r.allocation.core_ids]
    assert len(held_gpus) == len(set(held_gpus)), "a GPU id is held by two running cells"
    assert len(held_cores) == len(set(held_cores)), "a core is held by two running cells"
    assert set(held_gpus) <= set(capacity.gpu_ids)
    assert set(held_cores) <= set(capacity.core_ids)
    for run in cells:
        assert len(run.allocation.gpu_ids) == run.job.need.gpus
        assert len(run.allocation.core_ids) == run.job.need.cores
        assert run.job.after is None or run.job.after in planner.finished
    assert sum(r.allocation.memory for r in cells) <= capacity.memory
    assert capacity.jobs is None or len(cells) <= capacity.jobs
    assert sum(1 for r in planner.running.values() if r.job.image_task) <= image_slots


@st.composite
def job_mixes(draw: st.DrawFn) -> tuple[list[Job], Capacity, int]:
    capacity = Capacity(
        gpu_ids=tuple(str(i) for i in range(draw(st.integers(0, 8)))),
        core_ids=tuple(range(draw(st.integers(0, 4)))),
        memory=draw(st.integers(0, 16)) * GIB,
        jobs=draw(st.none() | st.integers(1, 4)),
    )
    images = [
        Job(f"image:{i}", Need(slots=0), draw(st.floats(1, 300)), image_task=True)
        for i in range(draw(st.integers(0, 3)))
    ]
    cells = []
    for i in range(draw(st.integers(1, 14))):
        need = Need(
            gpus=draw(st.sampled_from((0, 1, 1, 2, 4, 9))),
            cores=draw(st.integers(0, 2)),
            memory=draw(st.integers(0, 6)) * GIB,
        )
        after = draw(st.none() | st.sampled_from([j.key for j in images])) if images else None
        cells.append(Job(f"cell-{i}", need, draw(st.floats(1, 600)), after=after))
    return images + cells, capacity, draw(st.integers(1, 2))


@settings(max_examples=300, deadline=None)
@given(mix=job_mixes(), data=st.data())
def test_no_two_running_cells_share_an_id_and_every_limit_holds(
    mix: tuple[list[Job], Capacity, int], data: st.DataObject
) -> None:
    jobs, capacity, image_slots = mix
    planner = Planner(jobs, capacity, image_slots)
    now = 0.0
    while True:
        planner.starts(now)
        check_invariants(planner, capacity, image_slots)
        if not planner.running:
            break
        # Any running job may end next, whatever the estimates said.
        planner.finish(data.draw(st.sampled_from(sorted(planner.running))))
        now += data.draw(st.floats(0, 100))
    # No deadlock: every job either ran or was skipped with a reason.
    assert planner.finished | set(planner.skipped) == {j.key for j in jobs}
    assert not planner.pending


def test_a_cell_bigger_than_the_runner_is_skipped_with_a_reason() -> None:
    capacity = Capacity(gpu_ids=("0", "1"), core_ids=(0,), memory=4 * GIB)
    wide = gpu_job("wide", 4)
    fat = Job("fat", Need(cores=1, memory=8 * GIB), 60.0)
    planner = Planner([wide, fat, gpu_job("fits", 2)], capacity)
    assert planner.skipped["wide"] == "needs 4 GPU(s) (this runner may use 2: 0, 1)"
    assert planner.skipped["fat"] == "needs 8.0 GiB of memory (this runner has 4.0 GiB free)"
    assert [s.job.key for s in planner.starts(0.0)] == ["fits"]


def test_a_gpu_cell_on_a_runner_without_gpus_is_skipped() -> None:
    planner = Planner([gpu_job("g", 1)], Capacity(core_ids=(0, 1), memory=GIB))
    assert planner.skipped == {"g": "needs 1 GPU(s) (this runner may use 0: none)"}
    assert planner.done


def test_each_cell_gets_exactly_its_count_of_distinct_ids() -> None:
    planner = Planner([gpu_job("a", 2), gpu_job("b", 1), gpu_job("c", 4)], gpus(8))
    got = {s.job.key: s.allocation.gpu_ids for s in planner.starts(0.0)}
    assert sorted(len(ids) for ids in got.values()) == [1, 2, 4]
    assert sorted(g for ids in got.values() for g in ids) == [str(i) for i in range(7)]


def test_freed_ids_go_to_the_next_cell() -> None:
    planner = Planner([gpu_job("a", 2, 100), gpu_job("b", 2, 50)], Capacity(("3", "7")))
    assert [s.allocation.gpu_ids for s in planner.starts(0.0)] == [("3", "7")]
    planner.finish("a")
    assert [s.allocation.gpu_ids for s in planner.starts(100.0)] == [("3", "7")]


def test_longest_estimate_starts_first() -> None:
    jobs = [gpu_job("short", 1, 10), gpu_job("long", 1, 500), gpu_job("mid", 1, 100)]
    order = sorted(starts_of(Planner(jobs, gpus(1))).items(), key=lambda kv: kv[1])
    assert [key for key, _ in order] == ["long", "mid", "short"]


def test_the_jobs_cap_limits_cells_at_once() -> None:
    capacity = Capacity(gpu_ids=tuple(str(i) for i in range(8)), jobs=2)
    planner = Planner([gpu_job(f"c{i}", 1) for i in range(5)], capacity)
    assert len(planner.starts(0.0)) == 2


def test_memory_decides_how_many_cpu_engines_run_together() -> None:
    capacity = Capacity(core_ids=(0, 1, 2, 3), memory=10 * GIB)
    small = [Job(f"s{i}", Need(cores=1, memory=3 * GIB), 60.0) for i in range(4)]
    big = [Job(f"b{i}", Need(cores=1, memory=7 * GIB), 60.0) for i in range(2)]
    assert len(Planner(small, capacity).starts(0.0)) == 3
    assert len(Planner(big, capacity).starts(0.0)) == 1


def test_a_wide_cell_is_not_starved_by_narrow_ones() -> None:
    # "wide" waits for "long"'s GPU; short cells may use the other three GPUs only while
    # they end before "long" does, so "wide" starts the moment "long" ends.
    jobs = [gpu_job("long", 1, 100), gpu_job("wide", 4, 50)]
    jobs += [gpu_job(f"short{i}", 1, 30) for i in range(20)]
    starts = starts_of(Planner(jobs, gpus(4)))
    assert starts["wide"] == 100.0
    assert all(start + 30 <= 100.0 for k, start in starts.items() if starts[k] < 100.0)


def test_a_narrow_cell_backfills_what_the_reserved_cell_will_not_need() -> None:
    # "wide" needs 2 of 3 GPUs at t=100; the third is spare then, so "later" (longer than the
    # wait) still starts now on it.
    jobs = [gpu_job("long", 2, 100), gpu_job("wide", 2, 90), gpu_job("later", 1, 80)]
    starts = starts_of(Planner(jobs, gpus(3)))
    assert starts == {"long": 0.0, "later": 0.0, "wide": 100.0}


def test_a_cell_waits_for_its_image_task() -> None:
    image = Job("image:x", Need(slots=0), 200.0, image_task=True)
    jobs = [image, gpu_job("needs-x", 1, 10, after="image:x"), gpu_job("free", 1, 5)]
    starts = starts_of(Planner(jobs, gpus(2)))
    assert starts == {"image:x": 0.0, "free": 0.0, "needs-x": 200.0}


def test_image_tasks_run_one_at_a_time_longest_cell_first() -> None:
    images = [Job(f"image:{k}", Need(slots=0), 100.0, image_task=True) for k in "ab"]
    cells = [gpu_job("a1", 1, 10, after="image:a"), gpu_job("b1", 1, 400, after="image:b")]
    starts = starts_of(Planner(images + cells, gpus(2), image_slots=1))
    assert starts["image:b"] == 0.0 and starts["image:a"] == 100.0


def test_a_failed_image_task_drops_the_cells_waiting_for_it() -> None:
    image = Job("image:x", Need(slots=0), 1.0, image_task=True)
    planner = Planner([image, gpu_job("c", 1, after="image:x")], gpus(1))
    planner.starts(0.0)
    assert [job.key for job in planner.fail("image:x")] == ["c"]
    assert planner.done


def test_eta_is_the_simulated_end_by_estimates() -> None:
    planner = Planner([gpu_job("a", 1, 100), gpu_job("b", 1, 50), gpu_job("c", 2, 30)], gpus(2))
    planner.starts(0.0)
    assert eta_s(planner, 10.0) == 120.0  # a ends at 100, then c: 130 - 10
    assert set(planner.running) == {"a", "b"}  # the ETA ran on a copy


def test_the_lower_bound_is_area_or_longest() -> None:
    assert makespan_lower_bound([(4, 100.0), (1, 40.0)], 4) == 110.0
    assert makespan_lower_bound([(1, 600.0), (1, 10.0)], 8) == 600.0


def test_duplicate_keys_are_a_bug_of_the_caller() -> None:
    with pytest.raises(ValueError, match="distinct keys"):
        Planner([gpu_job("a", 1), gpu_job("a", 1)], gpus(1))


def test_an_overrunning_cell_is_expected_to_need_a_little_longer() -> None:
    # Not "any moment now": that would put a reserved cell's start at now and forbid
    # every backfill for as long as the cell overruns.
    planner = Planner([gpu_job("a", 1, 100)], gpus(1))
    planner.starts(0.0)
    assert eta_s(planner, 150.0) == 25.0


def test_the_image_that_frees_the_most_work_is_made_first():
    images = [Job(f"image:{name}", Need(slots=0), 300.0, image_task=True) for name in "ab"]
    # a: one long 1-GPU cell (600 GPU-seconds); b: two 4-GPU cells of 100 s (800).
    cells = [Job("a-long", Need(gpus=1), 600.0, after="image:a")]
    cells += [Job(f"b-{i}", Need(gpus=4), 100.0, after="image:b") for i in range(2)]
    planner = Planner([*images, *cells], Capacity(gpu_ids=("0", "1", "2", "3")), image_slots=1)
    [first] = planner.starts(0.0)
    assert first.job.key == "image:b"
