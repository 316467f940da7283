"""The delay from a scenario's ``interrupt_on`` line to the server's SIGTERM: host against image.

Since the interrupt is matched on the host, a line takes this path: the engine prints it, the
harness relays it, the runner reads it from the stream, matches it (RE2) and has the backend
send the harness SIGUSR1, and the harness SIGTERMs the server. Before, the harness matched the
line itself as it relayed it (``linear_regex.py``, a regex engine of its own, in the image).
This runs both, in the same run, on the CPU lane's path without Docker: the harness as a local
process, as the local backend runs it, with a stand-in engine (a ``vllm`` package of a few
lines) that notes the time, prints the line, and notes when its SIGTERM arrives
(``CLOCK_MONOTONIC`` is one clock for every process of the machine).

- host: today's harness through ``LocalBackend`` and ``run.cell.execute_cell`` (the live
  watcher, triage, ``InterruptOn``, ``LocalBackend.interrupt``);
- image: the harness of commit ``BASELINE`` (the last with the in-image match), read from git,
  run on the same spec with ``interrupt_on`` in it, its output read as the backend reads it.

Prints the median and the largest delay of each way (milliseconds) and the ratio of the
medians, host / image.

    python benchmarks/bench_interrupt.py                # 20 runs of each, interleaved
    python benchmarks/bench_interrupt.py --quick        # one of each
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import quick_mode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from repromatrix.backends.base import Prepared  # noqa: E402
from repromatrix.backends.harness_spec import build_spec  # noqa: E402
from repromatrix.backends.local import LocalBackend  # noqa: E402
from repromatrix.run.cell import CellContext, execute_cell  # noqa: E402
from support.harness import install_standin, make_cell  # noqa: E402

# The last commit whose harness matched ``interrupt_on`` itself, in the image.
BASELINE = "a5397fc"
BASELINE_FILES = ("harness.py", "hubcache.py", "oomwatch.py", "offline.py", "linear_regex.py")
PATTERN = r"Warming up multi-modal processing\.\.\."
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


def on_host(standin: Path, venv: Path, work: Path, out: Path) -> float:
    """One cell through today's path: the runner matches the line and signals the harness."""
    cell = make_cell(env={"PYTHONPATH": str(standin), "BENCH_OUT": str(out)}, interrupt_on=PATTERN)
    backend = LocalBackend(work / "venvs", environ={"PATH": os.environ["PATH"]})
    try:
        execute_cell(backend, cell, CellContext(Prepared(cell.image.key, str(venv)), "/m"))
    finally:
        backend.close()
    return delay_ms(out)


def in_image(harness: Path, standin: Path, work: Path, out: Path) -> float:
    """One run of the baseline harness, which matches the line itself as it relays it."""
    cell = make_cell(env={"PYTHONPATH": str(standin), "BENCH_OUT": str(out)})
    spec = {**build_spec(cell, "/m"), "interrupt_on": PATTERN}
    spec_file = work / "spec.json"
    spec_file.write_text(json.dumps(spec))
    proc = subprocess.Popen(
        [sys.executable, str(harness), str(spec_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={"PATH": os.environ["PATH"]},
    )
    assert proc.stdout is not None
    drain = threading.Thread(target=proc.stdout.read)  # the runner reads, and does no more
    drain.start()
    proc.wait(timeout=120)
    drain.join()
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
            host.append(on_host(standin, venv, work, out))
            if harness is not None:
                image.append(in_image(harness, standin, work, out))
    print("delay from the interrupt_on line to the server's SIGTERM (CPU lane, local process)")
    print(describe("host", host))
    if image:
        print(describe("image", image))
        ratio = statistics.median(host) / statistics.median(image)
        print(f"ratio host / image (medians): {ratio:.2f}")


if __name__ == "__main__":
    main()
