"""compat.html: self-contained, escaped, and working in a real headless Chromium."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.reports import hostile_page


@pytest.fixture(scope="module")
def page_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hostile_page(tmp_path_factory.mktemp("html") / "20260101-000000")


def test_the_page_needs_nothing_from_outside(page_file: Path) -> None:
    html = page_file.read_text()
    assert not re.search(r"<(link|img|iframe)\b|<script\s+src|@import|url\(", html)
    assert "&lt;img src=" in html
    assert "<img" not in html
    assert html.count("<script>") == 1  # ours, inline
