"""Long steps say they are alive: start, beats with bytes and an estimate, end."""

from __future__ import annotations

import threading

from repromatrix.heartbeat import Beat, duration, heartbeat, size


def test_a_step_says_it_starts_beats_and_ends():
    lines: list[str] = []
    beaten = threading.Event()

    def note(line: str) -> None:
        lines.append(line)
        if "still going" in line or " of " in line:
            beaten.set()

    with heartbeat(note, "pull of x", every_s=0.01) as beat:
        assert beaten.wait(5)
        beat.progress(500_000_000, 2_000_000_000)
        beaten.clear()
        assert beaten.wait(5)
    assert lines[0] == "pull of x: started"
    assert any("500.0 MB of 2.0 GB (25%)" in line and "eta" in line for line in lines)
    assert lines[-1].startswith("pull of x: done in ")


def test_the_words_for_sizes_and_times():
    assert (size(512), size(3_400_000), size(1.2e9)) == ("512 B", "3.4 MB", "1.2 GB")
    assert (duration(42), duration(185), duration(3720)) == ("42s", "3m05s", "1h02m")
    assert Beat("x").line().startswith("x: still going, ")
