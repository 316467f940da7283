"""Triage time over the real logs with RE2 (what patterns.py uses) against Python's re.

Every pattern from data (the catalogue, the scenario files' signatures and
``reached`` lines) is matched by RE2 so that no pattern can take exponential
time. This measures what that costs on the hot path: every real log in
tests/data (``*.log`` and ``*.log.gz``) triaged against the built-in catalogue and
every scenario of scenarios/, once with RE2 and once with ``re`` put back in its
place, in the same run, best of ``--repeat``. Prints seconds per engine, the
ratio RE2 / re, and whether both engines gave the same answer for every log.

    .venv/bin/python benchmarks/bench_patterns.py              # best of 5
    .venv/bin/python benchmarks/bench_patterns.py --quick      # once: a few seconds
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import quick_mode

from repromatrix import patterns
from repromatrix.matrix.scenarios import load_catalogue
from repromatrix.triage import builtin_catalogue, triage_path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SCENARIOS = ROOT / "scenarios"
QUICK = {"repeat": 1}


def real_logs() -> list[Path]:
    """Every real log of the test data."""
    return sorted(p for p in DATA.rglob("*") if p.name.endswith((".log", ".log.gz")))


def _re_compiled(text: str, ignore_case: bool, multiline: bool) -> Any:
    """What patterns.py compiled before RE2: Python's re with the same flags."""
    flags = (re.IGNORECASE if ignore_case else 0) | (re.MULTILINE if multiline else 0)
    return re.compile(text, flags)


@contextmanager
def engine(name: str) -> Iterator[None]:
    """Patterns compiled by ``name`` ("re2" or "re") inside the block."""
    kept: Callable[..., Any] = patterns._compiled
    if name == "re":
        patterns._compiled = _re_compiled  # type: ignore[assignment]
    builtin_catalogue.cache_clear()  # its patterns are compiled once, when it is built
    try:
        yield
    finally:
        patterns._compiled = kept  # type: ignore[assignment]
        builtin_catalogue.cache_clear()


def triage_all(logs: list[Path], scenarios: Any) -> tuple[float, list[str]]:
    """Seconds to triage every log (the catalogue built inside), and each answer as JSON."""
    start = time.perf_counter()
    answers = [json.dumps(triage_path(log, scenarios).to_json()) for log in logs]
    return time.perf_counter() - start, answers


def measure(name: str, logs: list[Path], repeat: int) -> tuple[float, list[str]]:
    """The best of ``repeat`` runs under one engine."""
    with engine(name):
        scenarios = load_catalogue([SCENARIOS])
        runs = [triage_all(logs, scenarios) for _ in range(repeat)]
    return min(seconds for seconds, _ in runs), runs[0][1]


def main() -> None:
    """Measure both engines in this run and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per engine; the best counts")
    args = quick_mode.parse_args(parser, QUICK)
    logs = real_logs()
    size = sum(p.stat().st_size for p in logs)
    re2_s, re2_answers = measure("re2", logs, args.repeat)
    re_s, re_answers = measure("re", logs, args.repeat)
    print(f"{len(logs)} real logs, {size / 1e6:.2f} MB, best of {args.repeat}")
    print(f"triage with RE2: {re2_s:.3f} s")
    print(f"triage with re:  {re_s:.3f} s")
    print(f"ratio RE2 / re:  {re2_s / re_s:.2f}")
    same = sum(a == b for a, b in zip(re2_answers, re_answers, strict=True))
    print(f"same answer from both engines: {same} of {len(logs)} logs")


if __name__ == "__main__":
    main()
