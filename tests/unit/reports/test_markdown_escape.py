"""Markdown gets the same escaping as HTML: a value from a result or a log (a model revision,
a host, a root cause) written into compat.md, a job summary, an annotation or an issue body
cannot forge a heading, a link, an image or HTML, nor notify anyone by an @mention."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from repromatrix.reports.markdown import code, escape
from repromatrix.reports.write import write_reports
from repromatrix.triage.diagnosis import RootCause
from support.upgrade import gpu_run, write_gpu_run

# What an attacker writes into a result.json they hand to `merge` or `report`.
HOSTILE = (
    "main`\n# Forged heading\n[click me](https://evil.example/x) "
    '![pixel](https://evil.example/p.png) <img src="https://evil.example/q.png"> '
    "@octocat ops@evil.example https://evil.example/bare | cell ``` `"
)


def live(markdown: str) -> list[str]:
    """Whatever GitHub would render of ``HOSTILE`` as more than text (a code span's inside
    is text: a run of backticks up to the next run of as many)."""
    markdown = re.sub(r"(?<![`\\])(`+)(?!`).*?(?<!`)\1(?!`)", "CODE", markdown)
    found = []
    patterns = {
        "heading": r"(?m)^ {0,3}#{1,6}[ \t]+Forged",
        "link": r"(?<!\\)\[[^\]\n]*(?<!\\)\]\(",
        "image": r"(?<!\\)!(?<!\\)\[",
        "html": r"<(?:img|a|script)\b",
        "mention": r"(?<![\w\u200d])@octocat",
        "e-mail": r"ops@evil",
        "bare url": r"https://evil",
    }
    for name, pattern in patterns.items():
        if re.search(pattern, markdown):
            found.append(name)
    return found


def test_escape_leaves_nothing_github_would_render() -> None:
    text = escape(HOSTILE)
    assert live(text) == [] and "\n" not in text
    assert live(HOSTILE) == ["heading", "link", "image", "html", "mention", "e-mail", "bare url"]


@pytest.mark.parametrize("value", [HOSTILE, "`", "a``b", "``x", "c" * 40])
def test_a_code_span_holds_any_value_on_one_line(value: str) -> None:
    span = code(value)
    fence = re.match("`+", span)
    assert fence is not None and span.endswith(fence.group()) and "\n" not in span
    inner = span[len(fence.group()) : -len(fence.group())]
    assert fence.group() not in inner  # no run of backticks closes it early
    assert inner.strip() == " ".join(value.split())


def test_compat_md_writes_a_results_values_as_text(tmp_path: Path) -> None:
    run_dir = tmp_path / "20260102-000000"
    cause = RootCause(line=HOSTILE, exception="ValueError", message=HOSTILE)
    cells = [
        replace(cell, model_revision=HOSTILE, host=HOSTILE, root_cause=cause)
        for cell in gpu_run(run_dir.name)
    ]
    write_gpu_run(run_dir, cells)
    write_reports(run_dir)
    markdown = (run_dir / "compat.md").read_text()
    assert "Forged heading" in markdown  # shown, as text
    assert live(markdown) == []
