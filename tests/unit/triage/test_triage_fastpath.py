"""The WARNING fast path: which warnings are skipped unread, and that skipping changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from repromatrix.triage import builtin_catalogue, triage_path
from repromatrix.triage.fastpath import WarningFilter
from repromatrix.triage.logmodel import decode, parse_line
from support.triage import case_id, labelled

FILTER = WarningFilter(builtin_catalogue())

SKIPPED = [
    "(APIServer pid=7) WARNING 11-29 20:39:18 [system_utils.py:299] Found ulimit of 20000",
    "WARNING 11-29 20:39:27 [importing.py:83] Triton is installed, but not usable.",
    "vllm-1  | (Worker pid=3) WARNING 01-01 00:00:00 [cpu_worker.py:128] libtcmalloc not found",
    "[W1129 20:39:33.978872382 ProcessGroupGloo.cpp:524] Warning: Unable to resolve hostname",
    "/opt/venv/lib/python3.11/site-packages/x.py:24: DeprecationWarning: `x` is deprecated",
    "WARNING 2025-08-11T09:12:44.517 [serve.py:131] slow tokenizer in use",
]

READ = [
    # catalogued at warning level: a cause marked as_warning, a consequence, weak evidence
    "WARNING 11-29 18:50:01 [cpu.py:646] Failed to import from vllm._C: ImportError('libnuma.so.1:"
    " cannot open shared object file')",
    "(APIServer pid=7) WARNING 01-01 00:00:00 [x.py:1] EngineDeadError: the engine died",
    "(Worker pid=7) WARNING 01-01 00:00:00 [x.py:1] worker exited, exitcode: -9",
    "(Worker pid=7) WARNING 01-01 00:00:00 [x.py:1] worker exited, exitcode: -7",  # digits read 0
    # what a traceback logged at warning level is made of
    "(Worker pid=7) WARNING 01-01 00:00:00 [x.py:1] Traceback (most recent call last):",
    '(Worker pid=7) WARNING 01-01 00:00:00 [x.py:1]   File "/v/x.py", line 3, in f',
    "(Worker pid=7) WARNING 01-01 00:00:00 [x.py:1] ValueError: bad",
    "(Worker pid=7) WARNING 01-01 00:00:00 [x.py:1] InvalidCxxCompiler",
    "(Worker pid=7) WARNING 01-01 00:00:00 [x.py:1] During handling of the above exception, x",
    "(Worker pid=7) WARNING 01-01 00:00:00 [x.py:1] ",
    # what the slow path reads differently: colours, carriage returns
    "\x1b[33mWARNING\x1b[0m 01-01 00:00:00 [x.py:1] slow",
    "WARNING 01-01 00:00:00 [x.py:1] loading\rERROR 01-01 00:00:00 [x.py:1] ValueError: bad",
    # not a warning
    "(Worker pid=7) ERROR 01-01 00:00:00 [x.py:1] something odd",
]


@pytest.mark.parametrize("raw", SKIPPED)
def test_a_warning_no_rule_can_use_is_skipped(raw: str) -> None:
    assert FILTER.skippable(raw.encode())


@pytest.mark.parametrize("raw", READ)
def test_a_line_that_may_matter_is_read(raw: str) -> None:
    assert not FILTER.skippable(raw.encode())


def all_lines() -> list[bytes]:
    return [line for path, _ in labelled() for line in path.read_bytes().split(b"\n")]


def test_no_skipped_line_is_recognised_by_the_catalogue() -> None:
    catalogue = builtin_catalogue()
    for raw in filter(FILTER.skippable, all_lines()):
        line = parse_line(1, decode(raw))
        assert line.level == "WARNING", raw
        assert catalogue.match(line.text, warning=True) is None, raw


@pytest.mark.parametrize("case", labelled(), ids=case_id)
def test_skipping_changes_no_diagnosis(
    case: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = case
    fast = triage_path(path)
    monkeypatch.setattr(WarningFilter, "skippable", lambda self, raw: False)
    slow = triage_path(path)
    assert fast.root_cause == slow.root_cause
    assert fast.final_error == slow.final_error
