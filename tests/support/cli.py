"""The ``repromatrix`` command, run as a user runs it.

``repromatrix(...)`` calls the entry point (``repromatrix.cli.main``) in this process, as
``python -m repromatrix`` would in its own: its standard streams are files behind file
descriptors 0, 1 and 2 (what a child program it starts writes is captured too), the given
environment replaces ``os.environ``, the working folder is the project root, ``SystemExit``
and an escaping exception become the exit status, and all of it is put back afterwards.
It takes milliseconds where a new interpreter took one to two seconds.

``repromatrix_process(...)`` starts the real interpreter, for what only a process shows: the
console script and ``python -m``, exit codes through the interpreter, signals, a run that
must be killed when it overruns (real cells, containers, Slurm jobs).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from types import FrameType
from typing import IO, BinaryIO

from repromatrix import cli
from repromatrix.images import wheelhouse
from support import paths

# A token-shaped value in a run's environment: containers get it, nothing may keep it.
TOKEN = "hf_repromatrixNotARealToken0123456789"
ENV = {**os.environ, "HF_TOKEN": TOKEN}

# The handlers a command may change (``run`` holds SIGINT/SIGTERM while it writes results).
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM, signal.SIGCHLD)
# What Python sets when flushing standard output at exit fails.
EXIT_FLUSH_FAILED = 120

Stream = int | IO[str] | None


def argv(*args: str) -> list[str]:
    """The argv that runs ``repromatrix ARGS`` with this Python."""
    return [sys.executable, "-m", "repromatrix", *args]


def repromatrix(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
    input: str | None = None,
    stdout: Stream = subprocess.PIPE,
) -> subprocess.CompletedProcess[str]:
    """Run ``repromatrix ARGS`` in this process, in the project root (or ``cwd``), as
    ``repromatrix_process`` would in its own; its output captured (``stdout`` may instead be
    ``subprocess.DEVNULL`` or a file), never raising but ``subprocess.TimeoutExpired``."""
    cache = (env or {}).get("REPROMATRIX_CACHE")
    if cache is not None and Path(cache) != wheelhouse.CACHE_ROOT:
        raise ValueError("REPROMATRIX_CACHE is read once, at import: use repromatrix_process")
    with ExitStack() as stack:
        out = _output(stack, stdout)
        err = stack.enter_context(tempfile.TemporaryFile())
        given = None if input is None else stack.enter_context(_pipe_from(input))
        with (
            _process_state(env, cwd or paths.ROOT),
            deadline(argv(*args), timeout),
            _standard_streams(given, out, err),
        ):
            code = _main(args)
        return subprocess.CompletedProcess(
            argv(*args), code, _read(out) if stdout == subprocess.PIPE else None, _read(err)
        )


def repromatrix_process(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
    input: str | None = None,
    stdout: Stream = subprocess.PIPE,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m repromatrix ARGS`` in a process of its own, in the project root (or
    ``cwd``); its output captured, never raising but ``subprocess.TimeoutExpired``."""
    return subprocess.run(
        argv(*args),
        cwd=cwd or paths.ROOT,
        input=input,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def run_zoo_cells(cell_ids: list[str], results: Path, run_id: str, timeout: float) -> Path:
    """Run the zoo's cells ``cell_ids`` for real into ``results/run_id``; its folder."""
    only = [arg for cell in cell_ids for arg in ("--only", cell)]
    done = repromatrix_process(
        "run", "--lane", "cpu", "--scenarios", "scenarios/zoo", *only,
        "--results", str(results), "--run-id", run_id, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return results / run_id


def _main(args: Sequence[str]) -> int:
    """``sys.exit(main())`` as the interpreter ends it: the status, a traceback on standard
    error for an exception that escapes, and standard output flushed at exit."""
    try:
        code = _status(cli.main(list(args)))
    except SystemExit as exit_:
        code = _status(exit_.code)
    except _Overran:
        raise
    except BaseException:  # the interpreter prints it and exits 1
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
    except (OSError, ValueError) as exc:
        print(f"Exception ignored in: {sys.stdout!r}", file=sys.stderr)
        traceback.print_exception(exc)
        code = EXIT_FLUSH_FAILED
    return code


def _status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code % 256
    print(code, file=sys.stderr)
    return 1


def _output(stack: ExitStack, stdout: Stream) -> BinaryIO | IO[str]:
    if stdout == subprocess.PIPE:
        return stack.enter_context(tempfile.TemporaryFile())
    if stdout == subprocess.DEVNULL or stdout is None:
        return stack.enter_context(open(os.devnull, "wb"))
    assert not isinstance(stdout, int), f"unsupported stdout {stdout}"
    return stdout


def _read(file: BinaryIO | IO[str]) -> str:
    """What was written to ``file``, decoded as ``subprocess.run(text=True)`` does."""
    file.seek(0)
    data = file.read()
    text = data.decode() if isinstance(data, bytes) else data
    return text.replace("\r\n", "\n").replace("\r", "\n")


@contextmanager
def _process_state(env: dict[str, str] | None, cwd: Path) -> Iterator[None]:
    """The environment, working folder and signal handlers of a new process; put back after."""
    environ, folder = dict(os.environ), os.getcwd()
    handlers = {sig: signal.getsignal(sig) for sig in SIGNALS}
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(folder)
        os.environ.clear()
        os.environ.update(environ)
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)


@contextmanager
def _standard_streams(given: int | None, out: BinaryIO | IO[str], err: BinaryIO) -> Iterator[None]:
    """File descriptors 0, 1, 2 and ``sys.stdin/stdout/stderr`` on these files, as a process
    started with ``stdin=given, stdout=out, stderr=err`` has them (standard input inherited
    when ``given`` is None); put back after."""
    streams = sys.stdin, sys.stdout, sys.stderr
    for stream in streams[1:]:
        stream.flush()
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    try:
        if given is not None:
            os.dup2(given, 0)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = open(  # noqa: SIM115  (line-buffered, as Python's own)
            2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False
        )
        yield
    finally:
        for opened in (sys.stdout, sys.stderr):
            with suppress(OSError, ValueError):  # _main reported it, as the interpreter does
                opened.flush()
        sys.stdin, sys.stdout, sys.stderr = streams
        for fd, copy in enumerate(saved):
            os.dup2(copy, fd)
            os.close(copy)


@contextmanager
def _pipe_from(text: str) -> Iterator[int]:
    """The read end of a pipe a thread writes ``text`` into, as ``subprocess.run(input=)``."""
    read, write = os.pipe()

    def feed() -> None:
        with open(write, "wb") as end, suppress(BrokenPipeError):
            end.write(text.encode())

    feeder = threading.Thread(target=feed, name="standard input", daemon=True)
    feeder.start()
    try:
        yield read
    finally:
        os.close(read)  # a command that stopped reading: the writer sees a broken pipe
        feeder.join()


class _Overran(BaseException):
    """The command ran past its timeout (a BaseException: no ``except Exception`` keeps it)."""


@contextmanager
def deadline(command: Sequence[str], timeout: float) -> Iterator[None]:
    """``subprocess.TimeoutExpired`` (naming ``command``) when the block is still running after
    ``timeout``: a guard against a hang (a FIFO read, a regular expression that backtracks
    for ever: Python's ``re`` checks for signals as it goes), as a process's timeout was."""

    def overran(signum: int, frame: FrameType | None) -> None:
        raise _Overran

    previous = signal.signal(signal.SIGALRM, overran)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        yield
    except _Overran:
        raise subprocess.TimeoutExpired(list(command), timeout) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
