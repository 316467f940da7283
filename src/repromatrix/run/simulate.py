"""A discrete-event run of the packing policy on a simulated clock: the benchmark and the ETA.

``simulate`` drives a ``Planner`` exactly as the thread pool does (``starts``
at each moment something ends, ``finish`` when a job ends), with job
durations given by a function instead of real work. The benchmark gives it
the durations cells "really" take; the ETA gives it the planner's own
estimates, from a copy of the live planner.
"""

from __future__ import annotations

import copy
import heapq
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from repromatrix.run.schedule import OVERRUN_SHARE, Allocation, Job, Planner


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
