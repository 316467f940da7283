"""Progress lines: start and end of each cell, elapsed time and an ETA from finished cells."""

from __future__ import annotations

import io

from repromatrix.run.progress import Progress, duration, eta


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_duration_formats():
    assert duration(0) == "0s"
    assert duration(42.4) == "42s"
    assert duration(185) == "3m05s"
    assert duration(3720) == "1h02m"
    assert duration(-3) == "0s"


def test_eta_is_the_mean_of_finished_cells_times_the_cells_left():
    assert eta([], 5) is None
    assert eta([30.0, 50.0], 3) == 120.0


def test_lines_for_a_run_of_three_cells():
    out = io.StringIO()
    clock = Clock()
    progress = Progress(3, out=out, clock=clock)
    progress.start("cpu/a")
    clock.now = 40
    progress.end("cpu/a", "hit", "kv cache")
    progress.start("cpu/b")
    clock.now = 100
    progress.end("cpu/b", "avoided")
    progress.end("gpu/c", "skipped", "no GPU on this host", ran=False)
    assert out.getvalue().splitlines() == [
        "[1/3 0s] start cpu/a",
        "[1/3 40s] hit cpu/a (40s): kv cache",
        "[2/3 40s, eta 1m20s] start cpu/b",
        "[2/3 1m40s] avoided cpu/b (1m00s)",
        "[3/3 1m40s] skipped gpu/c: no GPU on this host",
    ]


def test_skipped_cells_do_not_weigh_on_the_eta():
    out = io.StringIO()
    clock = Clock()
    progress = Progress(100, out=out, clock=clock, to_run=2)  # 98 GPU cells skipped on a CPU host
    progress.end("gpu/a", "skipped", "no GPU on this host", ran=False)
    progress.start("cpu/a")
    clock.now = 60
    progress.end("cpu/a", "hit")
    progress.start("cpu/b")
    assert out.getvalue().splitlines()[-1] == "[3/100 1m00s, eta 1m00s] start cpu/b"
