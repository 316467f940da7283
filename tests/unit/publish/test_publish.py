"""``repromatrix publish``: a static site that keeps its history across publishes."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import jsonschema
import pytest

from repromatrix.cli import main
from repromatrix.errors import UsageError
from repromatrix.judgement import Outcome
from repromatrix.publish.site import cell_page
from repromatrix.publish.site import publish as site_publish
from repromatrix.reports.findings import ReportOptions
from repromatrix.results.store import write_result
from support import paths
from support.reach import NOT_COMPILED, decided
from support.upgrade import cpu_probes, gpu_run, schema, write_gpu_run

REPO = paths.ROOT
V032 = "gpu/v0.32.0/h100/qwen3-30b-a3b/default/moe-lora-rank-over-128/trigger"


def write_day(results: Path, day: int, v032: Outcome) -> Path:
    run = f"2026010{day}-000000"
    cells = [
        replace(c, started_at=f"2026-01-0{day}T00:00:00+00:00")
        for c in [*gpu_run(run, v032=v032), *cpu_probes(run)]
    ]
    write_gpu_run(results / run, cells)
    return results / run


def publish(*args: str) -> int:
    return main(["publish", *args, "--scenarios", str(REPO / "scenarios")])


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.external: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "a" and values.get("href"):
            self.links.append(str(values["href"]))
        if tag in ("link", "img", "iframe") or (tag == "script" and "src" in values):
            self.external.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text())
    return parser


@pytest.fixture
def site(tmp_path: Path) -> Path:
    out = tmp_path / "site"
    assert publish(str(write_day(tmp_path / "results", 2, Outcome.AVOIDED)), "--out", str(out)) == 0
    return out


def test_a_site_from_one_run(site: Path) -> None:
    history = json.loads((site / "history.json").read_text())
    jsonschema.validate(history, schema("history.schema.json"))
    assert [r["id"] for r in history["runs"]] == ["20260102-000000"]
    index = parse(site / "index.html")
    assert not index.external
    text = " ".join(index.text)
    assert "vLLM compatibility: run 20260102-000000" in text
    assert "safe with a flag change" in text
    for link in index.links:  # every relative link resolves inside the site
        assert not re.match(r"[a-z]+://", link), link
        assert (site / link.split("#")[0]).is_file(), link
    scenario = parse(site / "scenarios" / "moe-lora-rank-over-128.html")
    words = " ".join(" ".join(scenario.text).split())
    assert "seed 000_88d70501147b4c48.txt, vLLM PR #55161" in words
    # The probe's hits on 0.27.1 and 0.30.0 lie inside the range read from vLLM's source.
    assert "observations agree with the documented range >=0.22.0,<0.31.1rc0" in words
    cell = parse(site / cell_page("20260102-000000", V032.replace("v0.32.0", "v0.31.0")))
    cell_text = " ".join(cell.text)
    assert "AssertionError: fused_moe_lora_one_shot supports max_lora_rank<=128" in cell_text
    assert "sha256:" + "bb" * 32 in cell_text
    assert "total 31.5 s" in cell_text


def test_a_second_publish_keeps_the_history_and_says_since_when(site: Path, tmp_path: Path) -> None:
    second = write_day(tmp_path / "results", 3, Outcome.HIT)
    assert publish(str(second), "--out", str(site)) == 0
    history = json.loads((site / "history.json").read_text())
    jsonschema.validate(history, schema("history.schema.json"))
    assert [r["id"] for r in history["runs"]] == ["20260102-000000", "20260103-000000"]
    assert [p["outcome"] for p in history["cells"][V032]] == ["avoided", "hit"]
    assert (site / cell_page("20260102-000000", V032)).is_file()  # the old page stays
    index = " ".join("".join(parse(site / "index.html").text).split())
    assert f"{V032}: hit since run 20260103-000000 (2026-01-03T00:00:00+00:00, sha256:" in index
    scenario = (site / "scenarios" / "moe-lora-rank-over-128.html").read_text()
    [strip] = re.findall(
        r"<tr data-configuration=\"gpu/h100_·_qwen3-30b-a3b_·_default\">"
        r"<td>[^<]*</td><td>v0.32.0</td><td>(<svg.*?</svg>)",
        scenario,
    )
    assert re.findall(r'class="o-(\w+)"', strip) == ["avoided", "hit"]
    # Publishing the same run again changes nothing.
    assert publish(str(second), "--out", str(site)) == 0
    again = json.loads((site / "history.json").read_text())
    assert again == history


def test_a_new_folder_extends_a_previous_site(site: Path, tmp_path: Path) -> None:
    out = tmp_path / "fresh"
    second = write_day(tmp_path / "results", 3, Outcome.HIT)
    assert publish(str(second), "--out", str(out), "--previous", str(site)) == 0
    history = json.loads((out / "history.json").read_text())
    assert len(history["runs"]) == 2
    with pytest.raises(UsageError, match="not a published site"):
        site_publish([second], out, ReportOptions(), previous=tmp_path)


def test_a_broken_history_is_refused(site: Path, tmp_path: Path) -> None:
    (site / "history.json").write_text("{}")
    second = write_day(tmp_path / "results", 3, Outcome.HIT)
    assert publish(str(second), "--out", str(site)) == 2


def test_an_archive_of_runs_publishes_at_once(tmp_path: Path) -> None:
    first = write_day(tmp_path / "results", 2, Outcome.AVOIDED)
    second = write_day(tmp_path / "results", 3, Outcome.HIT)
    assert publish(str(second), str(first), "--out", str(tmp_path / "site")) == 0
    history = json.loads((tmp_path / "site" / "history.json").read_text())
    assert [r["id"] for r in history["runs"]] == ["20260102-000000", "20260103-000000"]
    index = (tmp_path / "site" / "index.html").read_text()
    assert "<title>vLLM compatibility: run 20260103-000000</title>" in index  # the newest


def test_baseline_and_candidate_go_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_day(tmp_path / "results", 2, Outcome.AVOIDED)
    assert main(["report", str(run), "--baseline", "v0.31.0"]) == 2
    assert "--baseline and --candidate go together" in capsys.readouterr().err
    assert main(["report", str(run), "--baseline", "v0.31.0", "--candidate", "v0.32.0"]) == 0
    assert "## What changes if we move from v0.31.0 to v0.32.0" in (run / "compat.md").read_text()


def test_a_cell_page_shows_what_the_engine_stated_and_whether_it_reached_the_path(
    tmp_path: Path,
) -> None:
    run = tmp_path / "results" / "reach"
    untested = decided("0.32.0", NOT_COMPILED)
    write_result(run, untested, NOT_COMPILED.read_bytes())
    out = tmp_path / "site"
    assert (
        main(["publish", str(run), "--out", str(out), "--scenarios", str(REPO / "scenarios")]) == 0
    )
    history = json.loads((out / "history.json").read_text())
    jsonschema.validate(history, schema("history.schema.json"))
    page = " ".join(" ".join(parse(out / cell_page("reach", untested.id)).text).split())
    assert "not reached (expected hit; verdict unknown)" in page
    assert "its code path was not shown entered" in page
    assert "compilation_mode NONE" in page
    assert "kv_cache_tokens 65536" in page
