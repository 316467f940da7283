"""A scenario's ``interrupt_on``, matched on the host: the runner reads the cell's output as it
streams, matches each line with RE2 and has the backend send the harness its interrupt."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from repromatrix.backends.base import Prepared
from repromatrix.backends.local import LocalBackend
from repromatrix.harness.harness import INTERRUPT_MARK, LAUNCH_PREFIX
from repromatrix.harness.oomwatch import LINE_PREFIX
from repromatrix.run.cell import CellContext, InterruptOn, execute_cell, make_listener
from support.harness import install_standin, make_cell


def recorder() -> tuple[list[str], InterruptOn]:
    sent: list[str] = []
    return sent, InterruptOn(r"Warming up multi-modal processing\.\.\.$", lambda: sent.append("!"))


def test_the_first_matching_line_sends_the_interrupt_once_across_chunks() -> None:
    sent, watch = recorder()
    watch.feed(b"INFO starting\nINFO Warming up multi-")
    assert sent == []  # half a line is not a line
    watch.feed(b"modal processing...\r\nINFO Warming up multi-modal processing...\n")
    assert sent == ["!"]
    assert watch.line == "INFO Warming up multi-modal processing..."


def test_the_harness_own_lines_never_interrupt() -> None:
    sent, watch = recorder()
    launch = f'{LAUNCH_PREFIX}["vllm", "--x", "Warming up multi-modal processing..."]\n'
    watch.feed(launch.encode())
    watch.feed(f"{LINE_PREFIX}Warming up multi-modal processing...\n".encode())
    assert sent == [] and watch.line is None


def test_a_cell_without_interrupt_on_never_asks() -> None:
    sent: list[str] = []
    watch, _ = make_listener(make_cell(), lambda: sent.append("!"))
    watch(b"Warming up multi-modal processing...\nstandin engine pid 1\n")
    assert sent == []


def test_the_local_backend_interrupts_the_server_on_its_line(tmp_path: Path) -> None:
    standin = install_standin(tmp_path / "standin")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(os.path.realpath(sys.executable), venv / "bin" / "python3")
    cell = make_cell(
        env={"PYTHONPATH": str(standin), "STANDIN": "never-ready"},
        interrupt_on=r"standin engine pid \d+$",
    )
    backend = LocalBackend(tmp_path / "venvs", environ={"PATH": os.environ["PATH"]})
    try:
        run = execute_cell(backend, cell, CellContext(Prepared(cell.image.key, str(venv)), "/m"))
    finally:
        backend.close()
    lines = run.execution.log.decode().splitlines()
    [engine] = [i for i, line in enumerate(lines) if line.startswith("standin engine pid")]
    assert INTERRUPT_MARK in lines[engine + 1 :]
    assert run.status is not None and run.status.exit_code == -signal.SIGTERM
    assert not run.status.ready and not run.execution.timed_out
