"""The concurrent executor (``run.pool``) with real threads: errors, hangs, Ctrl-C, image tasks.

Callables that "hang" block on their ticket until cancelled; the waits that guard a
broken pool from hanging the suite are far longer than any test needs and never decide
an outcome.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repromatrix.run.pool import DependencyFailed, Done, Pool, PoolReport, Skipped, Ticket
from repromatrix.run.schedule import Allocation, Capacity, Job, Need

GUARD_S = 60.0


def gpus(n: int) -> Capacity:
    return Capacity(gpu_ids=tuple(str(i) for i in range(n)))


def job(key: str, count: int = 1, estimate: float = 60.0, after: str | None = None) -> Job:
    return Job(key, Need(gpus=count), estimate, after=after)


def returns(value: str) -> Callable[[Ticket], str]:
    return lambda _ticket: value


def hangs(started: threading.Event | None = None) -> Callable[[Ticket], str]:
    def work(ticket: Ticket) -> str:
        if started is not None:
            started.set()
        assert ticket.wait_cancelled(GUARD_S), "never cancelled"
        return "stopped"

    return work


def drain(
    pool: Pool[str], on_done: Callable[[Done[str]], object] = lambda _d: None
) -> PoolReport[str]:
    """Take every job the pool hands back, as the cell stage does, and the pool's report."""
    for done in pool.ended():
        on_done(done)
    return pool.report


def test_every_job_is_handed_back_with_its_value() -> None:
    seen: list[Done[str]] = []
    jobs = [job("a", 2), job("b", 1), job("c", 1)]
    pool = Pool(jobs, gpus(2), {j.key: returns(j.key.upper()) for j in jobs})
    report = drain(pool, seen.append)
    assert sorted((d.key, d.value) for d in seen) == [("a", "A"), ("b", "B"), ("c", "C")]
    assert not report.interrupted and report.done == tuple(seen)


def test_a_callable_that_raises_becomes_that_jobs_error() -> None:
    def boom(_ticket: Ticket) -> str:
        raise OSError("engine gone")

    seen: dict[str, Done[str]] = {}
    pool = Pool([job("bad"), job("good")], gpus(1), {"bad": boom, "good": returns("ok")})
    drain(pool, lambda d: seen.setdefault(d.key, d))
    assert isinstance(seen["bad"].error, OSError) and seen["bad"].value is None
    assert seen["good"].value == "ok" and seen["good"].error is None


def test_a_hung_cell_does_not_block_the_others() -> None:
    # Two GPUs: "hung" holds one until cancelled; the three others pass through the other.
    order: list[str] = []
    pool: Pool[str]

    def on_done(done: Done[str]) -> None:
        order.append(done.key)
        if set(order) == {"a", "b", "c"}:
            pool.cancel("hung")

    work = {"hung": hangs(), "a": returns("a"), "b": returns("b"), "c": returns("c")}
    jobs = [job("hung", 1, 1000), job("a"), job("b"), job("c")]
    pool = Pool(jobs, gpus(2), work)
    report = drain(pool, on_done)
    assert order[-1] == "hung" and sorted(order[:3]) == ["a", "b", "c"]
    assert report.done[-1].cancelled and report.done[-1].value == "stopped"


@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_cancels_every_running_cell_and_returns_the_finished_ones() -> None:
    started = {key: threading.Event() for key in ("b", "c")}
    hooks: list[str] = []
    returned: list[str] = []
    main = threading.get_ident()

    def hung(key: str) -> Callable[[Ticket], str]:
        def work(ticket: Ticket) -> str:
            ticket.on_cancel(lambda: hooks.append(key))
            started[key].set()
            assert ticket.wait_cancelled(GUARD_S)
            returned.append(key)
            return "stopped"

        return work

    def first(_ticket: Ticket) -> str:
        for event in started.values():
            assert event.wait(GUARD_S)
        signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C while b and c run
        return "done"

    seen: list[Done[str]] = []
    jobs = [job("a", 1, 10), job("b", 1, 100), job("c", 1, 100), job("d", 1, 1)]
    work = {"a": first, "b": hung("b"), "c": hung("c"), "d": returns("never")}
    report = drain(Pool(jobs, gpus(3), work), seen.append)
    assert report.interrupted
    assert [d.key for d in seen] == ["a"] and report.done == tuple(seen)
    assert report.cancelled == ("b", "c")
    assert sorted(hooks) == ["b", "c"] and sorted(returned) == ["b", "c"]


def test_a_cancel_hook_added_after_cancellation_runs_at_once() -> None:
    ticket = Ticket("x", Allocation())
    calls: list[int] = []
    ticket.cancel()
    ticket.on_cancel(lambda: calls.append(1))
    assert calls == [1]


def test_too_big_cells_end_as_skipped_without_being_called() -> None:
    seen: list[Done[str]] = []

    def never(_ticket: Ticket) -> str:
        raise AssertionError("called")

    drain(Pool([job("wide", 8), job("ok")], gpus(2), {"wide": never, "ok": returns("ok")}),
          seen.append)  # fmt: skip
    wide = next(d for d in seen if d.key == "wide")
    assert isinstance(wide.error, Skipped) and "needs 8 GPU(s)" in str(wide.error)


def test_a_cell_starts_only_after_its_image_task() -> None:
    # The image task ends only once "free" has ended, so a cell that did not wait for it
    # would have started long before.
    events: list[str] = []
    free_ended = threading.Event()

    def image_work(_ticket: Ticket) -> str:
        assert free_ended.wait(GUARD_S)
        events.append("image:x ended")
        return "image"

    def cell_work(ticket: Ticket) -> str:
        events.append(ticket.key)
        return ticket.key

    def on_done(done: Done[str]) -> None:
        if done.key == "free":
            free_ended.set()

    image = Job("image:x", Need(slots=0), 100.0, image_task=True)
    jobs = [image, job("needs-x", after="image:x"), job("free")]
    work = {"image:x": image_work, "needs-x": cell_work, "free": cell_work}
    drain(Pool(jobs, gpus(2), work), on_done)
    assert events.index("image:x ended") < events.index("needs-x")


def test_a_failed_image_task_fails_its_cells_and_spares_the_rest() -> None:
    def broken(_ticket: Ticket) -> str:
        raise RuntimeError("pull failed")

    seen: dict[str, Done[str]] = {}
    image = Job("image:x", Need(slots=0), 1.0, image_task=True)
    jobs = [image, job("needs-x", after="image:x"), job("free")]
    work = {"image:x": broken, "needs-x": returns("never"), "free": returns("ok")}
    drain(Pool(jobs, gpus(1), work), lambda d: seen.setdefault(d.key, d))
    assert isinstance(seen["needs-x"].error, DependencyFailed)
    assert "image:x failed: RuntimeError('pull failed')" in str(seen["needs-x"].error)
    assert seen["free"].value == "ok"


def test_progress_shows_running_cells_finished_count_and_eta() -> None:
    snapshots = []
    pool: Pool[str]
    jobs = [job("a", 1, 100), job("b", 1, 50)]
    pool = Pool(jobs, gpus(1), {"a": returns("a"), "b": returns("b")},
                on_start=lambda _s: snapshots.append(pool.snapshot()))  # fmt: skip
    drain(pool)
    first = snapshots[0]
    assert first.running == ("a",) and first.finished == 0 and first.total == 2
    assert 149.0 <= first.eta_s <= 150.0  # a then b by their estimates, less a moment
    assert "1 running, 0/2 done, eta 2m" in first.line()
    final = pool.snapshot()
    assert (final.finished, final.eta_s, final.running) == (2, 0.0, ())


@settings(max_examples=25, deadline=None)
@given(
    widths=st.lists(st.sampled_from((1, 1, 2, 4)), min_size=1, max_size=12),
    runner=st.sampled_from((4, 8)),
    seed=st.integers(0, 1000),
)
def test_threads_never_hold_the_same_gpu_id(widths: list[int], runner: int, seed: int) -> None:
    held: set[str] = set()
    lock = threading.Lock()
    pauses = random.Random(seed)
    clashes: list[str] = []

    def work(ticket: Ticket) -> str:
        ids = set(ticket.allocation.gpu_ids)
        with lock:
            clashes.extend(ids & held)
            held.update(ids)
            pause = pauses.uniform(0, 0.002)
        time.sleep(pause)  # lets cells end in an order the estimates did not predict
        with lock:
            held.difference_update(ids)
        return ticket.key

    jobs = [job(f"c{i}", w, pauses.uniform(1, 600)) for i, w in enumerate(widths)]
    seen: list[Done[str]] = []
    drain(Pool(jobs, gpus(runner), dict.fromkeys((j.key for j in jobs), work)), seen.append)
    assert clashes == []
    assert sorted(d.key for d in seen) == sorted(j.key for j in jobs)


def test_a_job_that_returned_before_the_cancel_counts_as_ended_on_its_own() -> None:
    # Ctrl-C can land between a callable's return and the pool reading its ticket: that
    # job ended, and its result must be kept, not run again by --resume.
    hooks: list[str] = []
    ended = Ticket("ended", Allocation())
    ended.on_cancel(lambda: hooks.append("ended"))
    assert ended.returned() is False
    ended.cancel()
    assert hooks == [] and not ended.cancelled
    stopped = Ticket("stopped", Allocation())
    stopped.on_cancel(lambda: hooks.append("stopped"))
    stopped.cancel()
    assert stopped.returned() is True and hooks == ["stopped"]


def test_a_caller_that_stops_on_its_own_cancels_what_runs() -> None:
    # The cell stage stops when the backend dies: the job still running is cancelled and
    # never handed over; the one being handled when the caller stopped counts as handed over
    # only once the caller asks for the next (a result cut off while written is not kept).
    def hung(ticket: Ticket) -> str:
        assert ticket.wait_cancelled(GUARD_S), "never cancelled"
        return "stopped"

    pool = Pool([job("first", 1, 100), job("hung", 1, 90)], gpus(2),
                {"first": returns("first"), "hung": hung})  # fmt: skip
    taken = []
    for done in pool.ended():
        taken.append(done.key)
        break  # the caller's own reason to stop
    assert pool.stop() == ()
    report = pool.report
    assert taken == ["first"] and report.done == ()
    assert report.interrupted and report.cancelled == ("hung",)
