"""The README shows only what is true: its matrix.yaml excerpt is the shipped file's own
lines, and its pictures come from real CPU-lane runs, never from GPU results."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from support import paths

README = paths.ROOT / "README.md"
ELIDED = "# ..."
PICTURE = re.compile(r"!\[[^\]]*\]\((docs/[^)]+\.png)\)")
REAL_RUNS = paths.DATA / "cpu-run"  # real CPU-lane results, their provenance in README.md


def excerpt(text: str) -> list[str]:
    """The lines of the yaml block under ``## matrix.yaml``."""
    section = text.split("\n## matrix.yaml\n", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("\n```", 1)[0]
    return block.splitlines()


def pieces(lines: list[str]) -> list[list[str]]:
    """The excerpt cut at its ``# ...`` lines (what is left out)."""
    cut: list[list[str]] = [[]]
    for line in lines:
        if line.strip() == ELIDED:
            cut.append([])
        else:
            cut[-1].append(line)
    return cut


def where(piece: list[str], shipped: list[str], start: int) -> int:
    """Where ``piece`` begins in ``shipped`` at or after ``start``; -1 when it is not there."""
    for at in range(start, len(shipped) - len(piece) + 1):
        if shipped[at : at + len(piece)] == piece:
            return at
    return -1


def test_the_matrix_excerpt_is_the_shipped_files_own_lines_in_order() -> None:
    shipped = (paths.ROOT / "matrix.yaml").read_text(encoding="utf-8").splitlines()
    cut = pieces(excerpt(README.read_text(encoding="utf-8")))
    assert len(cut) > 1 and all(cut), "the excerpt: pieces of matrix.yaml between `# ...` lines"
    start = 0
    for piece in cut:
        at = where(piece, shipped, start)
        assert at >= 0, f"README's matrix.yaml excerpt differs from matrix.yaml:\n{piece}"
        start = at + len(piece)


def text_chunks(png: bytes) -> dict[str, str]:
    """The PNG's tEXt chunks, keyword to text."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    found: dict[str, str] = {}
    at = 8
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        kind, data = png[at + 4 : at + 8], png[at + 8 : at + 8 + length]
        if kind == b"tEXt":
            keyword, _, value = data.partition(b"\0")
            found[keyword.decode("latin-1")] = value.decode("latin-1")
        at += 12 + length
    return found


def test_every_picture_is_made_from_real_cpu_lane_runs_and_says_so() -> None:
    text = README.read_text(encoding="utf-8")
    pictures = PICTURE.findall(text)
    assert pictures
    for picture in pictures:
        chunks = text_chunks((paths.ROOT / picture).read_bytes())
        assert "repromatrix:source" in chunks, f"{picture}: not made by .ci/upgrade-view"
        runs = json.loads(chunks["repromatrix:source"])["runs"]
        for run in runs:
            folder = paths.ROOT / run
            assert folder.parent == REAL_RUNS, f"{picture}: {run} is not a recorded real run"
            lanes = {
                json.loads(path.read_text(encoding="utf-8"))["lane"]
                for path in folder.rglob("result.json")
            }
            assert lanes == {"cpu"}, f"{picture}: {run} holds {lanes}"
            assert f"`{Path(run).name}`" in text, f"the README does not name {run}"
        assert "tests/data/cpu-run" in text
