"""compat.html: self-contained, escaped, and working in a real headless Chromium."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from repromatrix.model import Expected
from repromatrix.reports.write import write_reports
from repromatrix.results.store import RootCause, cell_dir
from support.reports import mixed_run, result, write_run

PAYLOAD = '<img src="http://127.0.0.1:9/x.png" onerror="window.pwned = 1">'


@pytest.fixture(scope="module")
def page_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("html") / "20260101-000000"
    hostile = result(
        tag="0.30.0",
        expected=Expected.AVOIDED,
        root_cause=RootCause(line=PAYLOAD, exception="ValueError", message=PAYLOAD),
    )
    write_run(run_dir, [*mixed_run(), hostile])
    log = cell_dir(run_dir, hostile.id) / "log.txt"
    log.write_text(f"start\n{PAYLOAD}\n<script>window.pwned = 2</script>\nend\n")
    write_reports(run_dir)
    return run_dir / "compat.html"


def test_the_page_needs_nothing_from_outside(page_file: Path) -> None:
    html = page_file.read_text()
    assert not re.search(r"<(link|img|iframe)\b|<script\s+src|@import|url\(", html)
    assert "&lt;img src=" in html
    assert "<img" not in html
    assert html.count("<script>") == 1  # ours, inline
