"""A scenario's ``interrupt_on``: text the spec carries to the harness, which SIGTERMs the server
at the first line that holds it, as the line is relayed."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from repromatrix.backends.base import Prepared
from repromatrix.backends.harness_spec import build_spec
from repromatrix.backends.local import LocalBackend
from repromatrix.harness.harness import INTERRUPT_MARK
from repromatrix.run.cell import CellContext, execute_cell
from support.harness import install_standin, make_cell


def test_the_local_backend_interrupts_the_server_on_its_line(tmp_path: Path) -> None:
    standin = install_standin(tmp_path / "standin")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(os.path.realpath(sys.executable), venv / "bin" / "python3")
    cell = make_cell(
        env={"PYTHONPATH": str(standin), "STANDIN": "never-ready"},
        interrupt_on="standin engine pid ",
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


def test_the_spec_carries_the_text_and_only_when_there_is_one() -> None:
    assert build_spec(make_cell(interrupt_on="Supported tasks: "), "/m")["interrupt_on"] == (
        "Supported tasks: "
    )
    assert "interrupt_on" not in build_spec(make_cell(), "/m")
