"""Running cells at the same time: one thread per running job, the ``Planner`` decides who starts.

The caller's thread owns the planner: iterating ``Pool.ended`` starts jobs,
waits for any to end, hands each ended job to the caller at once (so a result
is written the moment its cell ends, by the caller: the pool calls no one back)
and starts whatever now fits. A job's callable runs in its own thread and gets
a ``Ticket``: the device ids it holds and a place to hang a cancel hook (stop
its container). A callable that raises becomes that job's error; one that
hangs holds only its own ids, and each cell's deadline is the backend's to
enforce. On Ctrl-C (``KeyboardInterrupt`` while the pool waits) the pool stops
starting jobs, calls every running job's cancel hooks, waits for their threads,
hands over the jobs that had ended and ends: cells cut short are listed as
cancelled (never handed over: ``--resume`` runs them again). A caller that
stops for a reason of its own (its own Ctrl-C, a backend that died) calls
``Pool.stop`` for the same, and gets the ended jobs back. An image job still
running then is not waited for.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from repromatrix.heartbeat import duration
from repromatrix.run.schedule import Allocation, Capacity, Job, Planner, Start, eta_s

R = TypeVar("R")


class NotRun(Exception):
    """Why a job ended without its callable being called."""


class Skipped(NotRun):
    """The job needs more than the runner has (the message says what)."""


class DependencyFailed(NotRun):
    """The image task the job waited for raised (the message says which and why)."""


class Ticket:
    """What a running job's callable is given: its ids, what the job it waited for returned
    (a cell's image job's value), and cancellation."""

    def __init__(self, key: str, allocation: Allocation, before: object = None) -> None:
        self.key = key
        self.allocation = allocation
        self.before = before
        self._cancelled = threading.Event()
        self._returned = False
        self._hooks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    @property
    def cancelled(self) -> bool:
        """True once the job was asked to stop."""
        return self._cancelled.is_set()

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Block until the job is asked to stop (or ``timeout`` passes); True if it was."""
        return self._cancelled.wait(timeout)

    def on_cancel(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` when the job is cancelled (at once if it already is)."""
        with self._lock:
            if not self.cancelled:
                self._hooks.append(hook)
                return
        _call_quietly(hook)

    def cancel(self) -> None:
        """Ask the job to stop: set the flag, then call each hook once, in order. A job whose
        callable has returned is not cancelled: it ended on its own."""
        with self._lock:
            if self._returned:
                return
            self._cancelled.set()
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            _call_quietly(hook)

    def returned(self) -> bool:
        """Mark the job's callable as returned; True when it was cancelled before that."""
        with self._lock:
            self._returned = True
            return self.cancelled


def _call_quietly(hook: Callable[[], None]) -> None:
    # A cancel hook that fails (a container already gone) must not stop the others;
    # the backend's close() removes whatever is left.
    with contextlib.suppress(Exception):
        hook()


Work = Callable[[Ticket], R]


@dataclass(frozen=True)
class Done(Generic[R]):
    """One ended job: its value, or the exception it raised (``NotRun`` when never called)."""

    key: str
    value: R | None
    error: BaseException | None
    started: float
    ended: float
    allocation: Allocation = field(default_factory=Allocation)
    image_task: bool = False
    cancelled: bool = False  # ``Pool.cancel`` asked it to stop before it returned


@dataclass(frozen=True)
class PoolProgress:
    """Progress at one moment: cells running, cells ended of all cells, seconds left."""

    running: tuple[str, ...]
    finished: int
    total: int
    eta_s: float

    def line(self) -> str:
        """``3 running, 5/20 done, eta 4m10s``: what the progress printer shows."""
        return f"{len(self.running)} running, {self.finished}/{self.total} done, " + (
            f"eta {duration(self.eta_s)}"
        )


@dataclass(frozen=True)
class PoolReport(Generic[R]):
    """How a pool run ended: every job handed over, those cut short, whether it was stopped."""

    done: tuple[Done[R], ...]
    cancelled: tuple[str, ...]  # running when interrupted; no ``Done`` was delivered
    interrupted: bool


def pace(finished: Sequence[tuple[float, float]]) -> float:
    """How much longer than estimated the finished jobs took (``(took, estimate)`` each): the
    factor the rest's ETA is corrected by, 1 before any job has finished. A loaded machine
    takes three times the typical figures; the ETA learns that from the first cells."""
    took = sum(pair[0] for pair in finished)
    estimated = sum(pair[1] for pair in finished)
    return took / estimated if took > 0 and estimated > 0 else 1.0


class Pool(Generic[R]):
    """Runs ``jobs`` with their callables in ``work`` as ``capacity`` allows."""

    def __init__(
        self,
        jobs: Sequence[Job],
        capacity: Capacity,
        work: Mapping[str, Work[R]],
        *,
        image_slots: int = 1,
        on_start: Callable[[Start], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        missing = [job.key for job in jobs if job.key not in work]
        if missing:
            raise ValueError(f"no callable for job(s): {', '.join(missing)}")
        self._planner = Planner(jobs, capacity, image_slots)
        self._work = work
        self._on_start = on_start
        self._clock = clock
        self._image_tasks = {job.key for job in jobs if job.image_task}
        self._total = len(jobs) - len(self._image_tasks)
        self._ended: queue.SimpleQueue[Done[R]] = queue.SimpleQueue()
        self._threads: dict[str, tuple[Ticket, threading.Thread]] = {}
        self._delivered: list[Done[R]] = []
        self._values: dict[str, R] = {}  # what each finished image task returned
        self._estimates = {job.key: job.estimate_s for job in jobs}
        self._paced: list[tuple[float, float]] = []  # (took, estimate) of each finished job
        self._lock = threading.Lock()
        self._cancelled: tuple[str, ...] = ()
        self._interrupted = False

    @property
    def skipped(self) -> Mapping[str, str]:
        """Jobs that can never run here, and why (each is also delivered as ``Skipped``)."""
        return dict(self._planner.skipped)

    def ended(self) -> Iterator[Done[R]]:
        """Each job as it ends, in the caller's thread, until every job has ended or
        ``KeyboardInterrupt``; see the module doc. A job counts as handed over once the
        caller asks for the next one."""
        try:
            now = self._clock()
            for key, reason in sorted(self._planner.skipped.items()):
                yield from self._hand_over(Done(key, None, Skipped(reason), now, now))
            self._dispatch()
            while self._threads:
                yield from self._complete(self._ended.get())
        except KeyboardInterrupt:
            yield from self.stop()
        except BaseException:  # the caller's own exception, or it dropped the iteration
            self._stop_all()
            raise

    def stop(self) -> tuple[Done[R], ...]:
        """End the run early: cancel every running job, wait for its thread, and return the
        jobs that had ended, not yet handed over (the caller handles them: each counts as
        handed over); those cut short are the report's ``cancelled``."""
        left = self._stop_all()
        with self._lock:
            self._delivered.extend(left)
        return left

    @property
    def report(self) -> PoolReport[R]:
        """How the run went so far: every job handed over, those cut short, and whether it
        was stopped early."""
        with self._lock:
            return PoolReport(tuple(self._delivered), self._cancelled, self._interrupted)

    def cancel(self, key: str) -> bool:
        """Cancel the running job ``key`` (its hooks run in this thread); False if not running."""
        with self._lock:
            entry = self._threads.get(key)
        if entry is None:
            return False
        entry[0].cancel()
        return True

    def snapshot(self) -> PoolProgress:
        """Running cells, cells ended and the ETA by the estimates (safe from any thread)."""
        with self._lock:
            running = tuple(k for k in self._planner.running if k not in self._image_tasks)
            finished = sum(1 for d in self._delivered if not d.image_task)
            left = eta_s(self._planner, self._clock()) * pace(self._paced)
        return PoolProgress(running, finished, self._total, left)

    def _dispatch(self) -> None:
        with self._lock:
            starts = self._planner.starts(self._clock())
        for start in starts:
            before = self._values.get(start.job.after) if start.job.after else None
            ticket = Ticket(start.job.key, start.allocation, before)
            thread = threading.Thread(
                target=self._worker,
                args=(ticket, self._work[start.job.key], start.job.image_task),
                name=f"repromatrix-{start.job.key}",
                daemon=True,  # a callable that ignores cancellation must not keep Python alive
            )
            with self._lock:
                self._threads[start.job.key] = (ticket, thread)
            thread.start()
            if self._on_start is not None:
                self._on_start(start)
        if self._planner.stuck():
            raise RuntimeError("scheduler stuck: jobs wait but none can start (a bug)")

    def _worker(self, ticket: Ticket, work: Work[R], image_task: bool) -> None:
        started = self._clock()
        value: R | None = None
        error: BaseException | None = None
        try:
            value = work(ticket)
        except BaseException as exc:
            error = exc
        ended = self._clock()
        cancelled = ticket.returned()
        self._ended.put(
            Done(ticket.key, value, error, started, ended, ticket.allocation, image_task, cancelled)
        )

    def _complete(self, done: Done[R]) -> Iterator[Done[R]]:
        with self._lock:
            self._threads.pop(done.key, None)
            if done.image_task and done.error is not None:
                dropped = self._planner.fail(done.key)
            else:
                self._planner.finish(done.key)
                dropped = []
            if done.image_task and done.value is not None:
                self._values[done.key] = done.value
            if not done.image_task and done.error is None and done.ended > done.started:
                self._paced.append((done.ended - done.started, self._estimates[done.key]))
        yield from self._hand_over(done)
        for job in dropped:
            why = DependencyFailed(f"{done.key} failed: {done.error!r}")
            yield from self._hand_over(Done(job.key, None, why, done.ended, done.ended))
        self._dispatch()

    def _hand_over(self, done: Done[R]) -> Iterator[Done[R]]:
        # Counted once the caller has handled it: a result cut off by Ctrl-C while it is
        # being written is not reported as kept (``--resume`` runs that cell again).
        yield done
        with self._lock:
            self._delivered.append(done)

    def _stop_all(self) -> tuple[Done[R], ...]:
        """Cancel every running job, wait for its thread; the jobs that had ended before."""
        with self._lock:
            running = dict(self._threads)
            self._threads.clear()
        for ticket, _ in running.values():
            ticket.cancel()
        try:
            for key, (_, thread) in running.items():
                # An image job (a build, a pull) cannot be cut short from here and may run
                # for minutes: it is not waited for; the backend's close() removes the run's
                # containers and its thread, a daemon, ends with the process.
                if thread.ident is not None and key not in self._image_tasks:
                    thread.join()
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: stop waiting; the backend's close() removes what is left
        cancelled: list[str] = []
        left: list[Done[R]] = []
        while not self._ended.empty():
            done = self._ended.get()
            if done.cancelled:
                cancelled.append(done.key)
            else:
                left.append(done)
        ended = {d.key for d in (*self._delivered, *left)}
        cancelled += [
            key
            for key in running
            if key not in ended and key not in cancelled and key not in self._image_tasks
        ]
        with self._lock:
            self._cancelled = tuple(sorted({*self._cancelled, *cancelled}))
            self._interrupted = True
        return tuple(left)
