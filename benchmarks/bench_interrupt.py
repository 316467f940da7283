"""The delay from a scenario's ``interrupt_on`` line to the server's SIGTERM: image against host.

Today the harness looks for the ``interrupt_on`` text in each line as it relays it, in the
image, and SIGTERMs the server at the first that holds it. Before, the runner on the host
matched each relayed line (RE2) and had the backend send the harness SIGUSR1, which then
SIGTERMed the server: a round trip that, on a loaded CI machine with Docker, took longer than
the CPU zoo scenario's whole window (the server came up). This runs both, in the same run, on
the CPU lane's path without Docker: the harness as a local process, as the local backend runs
it, with a stand-in engine (a ``vllm`` package of a few lines) that notes the time, prints the
line, and notes when its SIGTERM arrives (``CLOCK_MONOTONIC`` is one clock for every process
of the machine).

- image: today's harness through ``LocalBackend`` and ``run.cell.execute_cell``;
- host: the harness of commit ``BASELINE`` (the last with the runner's round trip), read from
  git, its output read line by line and matched with RE2 as that runner did, and SIGUSR1 sent
  to it at the first match as that ``LocalBackend.interrupt`` did (``os.kill``).

Prints the median and the largest delay of each way (milliseconds) and the ratio of the
medians, host / image.

    python benchmarks/bench_interrupt.py                # 20 runs of each, interleaved
    python benchmarks/bench_interrupt.py --quick        # one of each
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import quick_mode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from repromatrix.backends.base import Prepared  # noqa: E402
from repromatrix.backends.harness_spec import build_spec  # noqa: E402
from repromatrix.backends.local import LocalBackend  # noqa: E402
from repromatrix.patterns import compile_pattern  # noqa: E402
from repromatrix.run.cell import CellContext, execute_cell  # noqa: E402
from support.harness import install_standin, make_cell  # noqa: E402

# The last commit whose runner matched ``interrupt_on`` on the host and signalled the harness.
BASELINE = "1d9ed4f"
BASELINE_FILES = ("harness.py", "hubcache.py", "oomwatch.py", "offline.py")
TEXT = "Warming up multi-modal processing..."
PATTERN = r"Warming up multi-modal processing\.\.\."  # as the baseline's scenario wrote it
QUICK = {"repeat": 1}

# The stand-in server: it notes the time, prints seed 004's line, and notes when SIGTERM comes.
SERVER = """
import os, signal, sys, time
out = os.environ["BENCH_OUT"]

def on_term(signum, frame):
    with open(out + ".term", "w") as handle:
        handle.write(str(time.monotonic_ns()))
    os._exit(0)

signal.signal(signal.SIGTERM, on_term)
print("DEBUG standin engine ready", flush=True)
time.sleep(0.2)
with open(out + ".line", "w") as handle:
    handle.write(str(time.monotonic_ns()))
print("DEBUG [base.py:299] Warming up multi-modal processing...", flush=True)
time.sleep(600)
"""


def baseline_harness(folder: Path) -> Path | None:
    """The harness of ``BASELINE`` written to ``folder`` (None: git or the commit is missing)."""
    folder.mkdir(parents=True)
    for name in BASELINE_FILES:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{BASELINE}:src/repromatrix/harness/{name}"],
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            return None
        (folder / name).write_bytes(done.stdout)
    return folder / "harness.py"


def delay_ms(out: Path) -> float:
    """Milliseconds from the line's print to the server's SIGTERM, as the stand-in noted them."""
    line = int(Path(str(out) + ".line").read_text())
    term = int(Path(str(out) + ".term").read_text())
    for suffix in (".line", ".term"):
        Path(str(out) + suffix).unlink()
    return (term - line) / 1e6


def in_image(standin: Path, venv: Path, work: Path, out: Path) -> float:
    """One cell through today's path: the harness finds the text in the line it relays."""
    cell = make_cell(env={"PYTHONPATH": str(standin), "BENCH_OUT": str(out)}, interrupt_on=TEXT)
    backend = LocalBackend(work / "venvs", environ={"PATH": os.environ["PATH"]})
    try:
        execute_cell(backend, cell, CellContext(Prepared(cell.image.key, str(venv)), "/m"))
    finally:
        backend.close()
    return delay_ms(out)


def on_host(harness: Path, standin: Path, work: Path, out: Path) -> float:
    """One run of the baseline harness, signalled by a runner that matched the line (RE2)."""
    cell = make_cell(env={"PYTHONPATH": str(standin), "BENCH_OUT": str(out)})
    spec_file = work / "spec.json"
    spec_file.write_text(json.dumps(build_spec(cell, "/m")))
    proc = subprocess.Popen(
        [sys.executable, str(harness), str(spec_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={"PATH": os.environ["PATH"]},
    )
    assert proc.stdout is not None
    pattern = compile_pattern(PATTERN)
    for raw in iter(proc.stdout.readline, b""):
        if pattern.search(raw.decode("utf-8", errors="replace").rstrip("\r\n")):
            os.kill(proc.pid, signal.SIGUSR1)  # the baseline's INTERRUPT_SIGNAL
            break
    proc.stdout.read()
    proc.wait(timeout=120)
    return delay_ms(out)


def describe(name: str, delays: list[float]) -> str:
    """One line: the median and the largest delay of one way."""
    return (
        f"{name:>6}: median {statistics.median(delays):7.2f} ms, "
        f"max {max(delays):7.2f} ms over {len(delays)} runs"
    )


def main() -> None:
    """Measure both ways, interleaved, and print the ratio of the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="runs of each way")
    args = quick_mode.parse_args(parser, QUICK)
    with tempfile.TemporaryDirectory(prefix="repromatrix-bench-interrupt-") as tmp:
        work = Path(tmp)
        standin = install_standin(work / "standin")
        (standin / "vllm" / "entrypoints" / "openai" / "api_server.py").write_text(SERVER)
        venv = work / "venv"
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python3").symlink_to(os.path.realpath(sys.executable))
        harness = baseline_harness(work / "baseline")
        if harness is None:
            print(f"the baseline (commit {BASELINE}) is not in this checkout's git history")
        out = work / "times"
        host: list[float] = []
        image: list[float] = []
        for _ in range(args.repeat):
            image.append(in_image(standin, venv, work, out))
            if harness is not None:
                host.append(on_host(harness, standin, work, out))
    print("delay from the interrupt_on line to the server's SIGTERM (CPU lane, local process)")
    print(describe("image", image))
    if host:
        print(describe("host", host))
        ratio = statistics.median(host) / statistics.median(image)
        print(f"ratio host / image (medians): {ratio:.2f}")


if __name__ == "__main__":
    main()
