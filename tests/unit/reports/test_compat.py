"""The compatibility table: its shape, compat.md (escaping, levels, 1 MiB bound), compat.json."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from repromatrix.judgement import Expected, Outcome, Verdict
from repromatrix.reports.markdown import MD_LIMIT, escape, format_markdown
from repromatrix.reports.table import Agreement, Column, Entry, Table, build_table, tag_key
from repromatrix.reports.write import write_reports
from repromatrix.results.store import CellResult
from repromatrix.results.verdicts import Judged, ProblemKind, RunProblem, judge_all
from repromatrix.triage.diagnosis import RootCause
from support.reports import MOE_CAUSE, mixed_run, result, write_run


def test_tags_sort_by_version_with_nightly_last() -> None:
    tags = ["nightly", "v0.32.0", "v0.17.0", "v0.31.1rc0", "v0.31.0", "0.9.2", "latest"]
    assert sorted(tags, key=tag_key) == [
        "0.9.2",
        "v0.17.0",
        "v0.31.0",
        "v0.31.1rc0",
        "v0.32.0",
        "latest",
        "nightly",
    ]


def test_sections_rows_and_columns() -> None:
    table = build_table(judge_all(mixed_run()))
    assert [s.configuration.title for s in table.sections] == [
        "cpu lane · cpu · tiny-llama · default",
        "gpu lane · h100 · qwen3-30b-a3b · default",
    ]
    cpu, gpu = table.sections
    assert cpu.tags == ("0.27.1", "0.31.0", "0.32.0")
    assert [c.label for c in cpu.columns] == [
        "cpu-kv-cache-too-small / trigger",
        "cpu-kv-cache-too-small / lower-max-model-len",
        "healthy-cpu / baseline",
        "moe-lora-rank-over-128 / trigger",
    ]
    assert gpu.tags[-1] == "nightly"
    assert gpu.row_label("nightly") == "nightly (0.33.0.dev7+g1234abc)"
    assert gpu.row_label("v0.31.0") == "v0.31.0"
    assert cpu.entry("0.27.1", Column("healthy-cpu", "baseline")) is None
    assert table.cells == len(mixed_run())


def test_both_levels_share_an_entry_and_say_whether_they_agree() -> None:
    gpu = build_table(judge_all(mixed_run())).sections[1]
    column = Column("moe-lora-rank-over-128", "trigger")
    agree, disagree = gpu.entry("v0.31.0", column), gpu.entry("v0.32.0", column)
    assert agree is not None and disagree is not None
    assert agree.agreement is Agreement.AGREE
    assert disagree.agreement is Agreement.DISAGREE
    assert [j.level.value for j in disagree.levels] == ["engine", "probe"]
    only_engine = gpu.entry("v0.22.1", column)
    assert only_engine is not None and only_engine.agreement is None


def test_a_level_that_did_not_decide_cannot_agree() -> None:
    engine, probe = judge_all(
        [result(outcome=Outcome.TIMEOUT), result(probe=True, outcome=Outcome.HIT)]
    )
    assert Entry(engine, probe).agreement is Agreement.UNDECIDED


def test_markdown_escapes_what_github_would_render() -> None:
    assert escape("a|b <script> *x* `y` [l](u) _z_\nnext") == (
        "a\\|b &lt;script&gt; \\*x\\* \\`y\\` \\[l\\](u) \\_z\\_ next"
    )


def test_markdown_cells(tmp_path: Path) -> None:
    judged = judge_all(mixed_run())
    text = format_markdown(build_table(judged), judged, [], "run-1")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()}
    assert "💥 **REGRESSION** AssertionError: fused\\_moe\\_lora\\_one\\_shot" in rows["v0.32.0"]
    assert "🔬✅<br>**levels disagree**" in rows["v0.32.0"]
    assert "<br>levels agree" in rows["v0.31.0"]
    assert "✅ **UNEXPECTED FIX**" in rows["v0.31.1rc0"]
    assert rows["nightly (0.33.0.dev7+g1234abc)"].endswith("| ✅ ❔ |")
    assert "🔬🚫" in rows["0.27.1"]
    assert "18 cells: 1 regression · 1 fail · 1 unexpected fix" in text


def test_a_cause_cannot_break_the_table() -> None:
    cause = RootCause(line="x", exception="ValueError", message="a | b <img src=x> `c`\nd")
    judged = judge_all([result(root_cause=cause)])
    text = format_markdown(build_table(judged), judged, [], "run")
    rows = [line for line in text.splitlines() if line.startswith("| 0.32.0")]
    assert [row.count(" | ") for row in rows] == [1, 1]  # upgrade view and table: image | entry
    assert "<img" not in text


def test_problems_are_listed_in_the_markdown() -> None:
    problems = [RunProblem(ProblemKind.CORRUPT, "cells/a/result.json", "not valid JSON")]
    text = format_markdown(build_table([]), [], problems, "run")
    assert "**1 problem(s) with this run's files:**" in text
    assert "- corrupt: cells/a/result.json: not valid JSON" in text


def big_matrix(tags: int, gpus: int, models: int, variants: int) -> list:
    cells = []
    for t in range(tags):
        for g in range(gpus):
            for m in range(models):
                for v in range(variants):
                    for probe in (False, True):
                        outcome = (Outcome.HIT, Outcome.AVOIDED, Outcome.OTHER_FAILURE)[
                            (t + g + m + v) % 3
                        ]
                        cells.append(
                            result(
                                lane="gpu",
                                tag=f"v0.{t}.0",
                                gpu=f"gpu-{g}",
                                model=f"model-{m}",
                                scenario=f"scenario-{v // 3}",
                                variant=f"variant-{v % 3}",
                                probe=probe,
                                outcome=outcome,
                                expected=Expected.AVOIDED,
                                root_cause=MOE_CAUSE if outcome is not Outcome.AVOIDED else None,
                            )
                        )
    return cells


@dataclass(frozen=True)
class Big:
    cells: tuple[CellResult, ...]
    judged: tuple[Judged, ...]
    table: Table


@pytest.fixture(scope="module")
def big() -> Big:
    """61 440 results, judged and tabled once for the two tests that format them."""
    cells = tuple(big_matrix(tags=40, gpus=8, models=8, variants=12))
    judged = tuple(judge_all(cells))
    return Big(cells, judged, build_table(judged))


def test_a_large_matrix_stays_under_a_mebibyte(big: Big) -> None:
    cells, judged, table = big.cells, big.judged, big.table
    text = format_markdown(table, judged, [], "big")
    assert len(text.encode("utf-8")) <= MD_LIMIT < 1024 * 1024
    assert "does not fit in a job summary" in text
    assert "| gpu | v0.39.0 |" in text  # counts per image tag are still there
    assert re.search(r"- … and \d+ more \(see compat.html\)", text)
    assert f"{len(cells)} cells:" in text


def test_a_table_that_fits_without_causes_keeps_its_symbols() -> None:
    cells = big_matrix(tags=6, gpus=2, models=2, variants=6)
    judged = judge_all(cells)
    table = build_table(judged)
    full = format_markdown(table, judged, [], "mid")
    assert "AssertionError" in full
    limit = len(full.encode("utf-8")) - 1
    smaller = format_markdown(table, judged, [], "mid", limit=limit)
    assert "AssertionError" not in smaller.split("## ", 1)[1]
    assert "💥 **REGRESSION**" in smaller
    assert len(smaller.encode("utf-8")) <= limit


def test_compat_json(tmp_path: Path) -> None:
    write_run(tmp_path, mixed_run())
    write_reports(tmp_path)
    document = json.loads((tmp_path / "compat.json").read_text())
    assert document["schema_version"] == 5
    assert document["summary"]["cells"] == 18
    assert document["summary"]["verdicts"]["regression"] == 1
    by_id = {c["id"]: c for c in document["cells"]}
    regression = by_id["gpu/v0.32.0/h100/qwen3-30b-a3b/default/moe-lora-rank-over-128/trigger"]
    assert regression["verdict"] == Verdict.REGRESSION.value
    assert regression["observed"] == "hit"
    assert regression["expected"] == "avoided"
    assert regression["level"] == "engine"
    assert regression["root_cause"]["exception"] == "AssertionError"
    assert regression["log"] == (
        "cells/gpu/v0.32.0/h100/qwen3-30b-a3b/default/moe-lora-rank-over-128/trigger/log.txt"
    )
    assert (tmp_path / regression["log"]).is_file()
    levels = {(x["image_tag"], x["agreement"]) for x in document["levels"]}
    assert levels == {("v0.31.0", "agree"), ("v0.32.0", "disagree")}


@pytest.mark.parametrize("name", ["compat.md", "compat.html", "compat.json", "junit.xml"])
def test_an_empty_run_still_gets_every_report(tmp_path: Path, name: str) -> None:
    (tmp_path / "cells").mkdir()
    summary = write_reports(tmp_path)
    assert summary.cells == 0
    assert (tmp_path / name).stat().st_size > 0


def test_a_huge_upgrade_view_keeps_to_its_marks(big: Big) -> None:
    judged = big.judged
    limit = 40 * 1024  # the upgrade view in words (64 configurations) takes more than half
    text = format_markdown(big.table, judged, [], "big", limit)
    assert len(text.encode("utf-8")) <= limit
    assert "## Can we upgrade?" in text
    assert "| v0.39.0 | 🟢 | 🟢 |" in text  # marks, no words
