"""The upgrade view: safety per image and configuration, workarounds, the move, the title."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from repromatrix.errors import UsageError
from repromatrix.judgement import Expected, Outcome, Safety, SafetyMove
from repromatrix.matrix.scenarios import load_scenarios
from repromatrix.reports.diff import diff
from repromatrix.reports.findings import ReportOptions, build_findings, skip_groups, title
from repromatrix.reports.move import build_move, move_json
from repromatrix.reports.ranges import documented_ranges
from repromatrix.reports.upgrade import (
    Configuration,
    build_upgrade,
    flag_change,
    image_safety,
    upgrade_json,
)
from repromatrix.reports.write import answer_lines, write_reports
from repromatrix.results.schema import CellResult
from repromatrix.results.verdicts import judge_all, shorten
from support import paths
from support.reports import MOE_CAUSE, cpu_lane, result, write_run
from support.upgrade import MOE, NO_MEMORY, NO_RUNNER, cpu_probes, gpu_run, write_gpu_run

WORSE = SafetyMove(Safety.SAFE, Safety.NOT_SAFE)
FIXED = SafetyMove(Safety.NOT_SAFE, Safety.SAFE)
STILL_NOT_SAFE = SafetyMove(Safety.NOT_SAFE, Safety.NOT_SAFE)
WITH_FLAG_CHANGE = SafetyMove(Safety.NOT_SAFE, Safety.SAFE_WITH_FLAG_CHANGE)
STILL_SAFE = SafetyMove(Safety.SAFE, Safety.SAFE)

H100 = Configuration("gpu", "h100", "qwen3-30b-a3b", "default")
EAGER = Configuration("gpu", "h100", "qwen3-30b-a3b", "eager")


def gpu_view() -> object:
    return build_upgrade(judge_all(gpu_run()))


def test_rows_are_images_in_version_order_and_columns_are_configurations() -> None:
    [gpu] = build_upgrade(judge_all(gpu_run())).lanes
    assert gpu.tags == ("v0.30.0", "v0.31.0", "v0.31.1rc0", "v0.32.0")
    assert gpu.configurations == (H100, EAGER)  # skipped hardware gets no column


def test_safety_follows_the_crash_and_its_verified_workaround_not_the_documents() -> None:
    [gpu] = build_upgrade(judge_all(gpu_run())).lanes
    v030, v031 = gpu.at("v0.30.0", H100), gpu.at("v0.31.0", H100)
    assert v030 is not None and v031 is not None
    # Hit as documented on v0.31.0 (the documents agree) is still not safe as it stands.
    assert v031.safety is Safety.SAFE_WITH_FLAG_CHANGE
    assert v031.docs == "as documented"
    [crash] = v031.crashes
    assert crash.scenario == MOE
    [fix] = crash.workarounds
    assert (fix.variant, fix.change) == ("fully-sharded-loras", "--fully-sharded-loras")
    assert v031.words == (
        "safe with a flag change; hits moe-lora-rank-over-128, avoided with "
        "--fully-sharded-loras (fully-sharded-loras)"
    )
    # Hit outside the documented range: the same safety, a different documents dimension.
    assert v030.safety is Safety.SAFE_WITH_FLAG_CHANGE
    assert v030.docs == "1 cell(s) differ from the documents"
    assert gpu.at("v0.31.1rc0", H100).safety is Safety.SAFE  # type: ignore[union-attr]


def test_a_crash_without_a_workaround_or_a_failed_baseline_is_unsafe() -> None:
    [gpu] = build_upgrade(judge_all(gpu_run(v032=Outcome.HIT))).lanes
    v032 = gpu.at("v0.32.0", H100)
    assert v032 is not None and v032.safety is Safety.NOT_SAFE
    assert v032.crashes[0].workarounds == ()
    eager = gpu.at("v0.32.0", EAGER)
    assert eager is not None and eager.safety is Safety.NOT_SAFE
    assert eager.failures == ("gpu/v0.32.0/h100/qwen3-30b-a3b/eager/healthy-gpu/baseline",)
    assert gpu.at("v0.31.0", EAGER).safety is Safety.SAFE  # type: ignore[union-attr]


def test_nothing_decided_is_unknown() -> None:
    cells = judge_all([result(outcome=Outcome.INFRA_ERROR), result(outcome=Outcome.TIMEOUT)])
    assert image_safety(cells[:1]).safety is Safety.UNKNOWN


def test_a_workaround_seen_only_on_another_image_does_not_count() -> None:
    cells = [c for c in gpu_run() if not (c.image_tag == "v0.31.0" and c.variant != "trigger")]
    [gpu] = build_upgrade(judge_all(cells)).lanes
    assert gpu.at("v0.31.0", H100).safety is Safety.NOT_SAFE  # type: ignore[union-attr]


def test_flag_changes_are_exact() -> None:
    before = {"max_model_len": 2048, "enforce_eager": True, "kv_cache_memory_bytes": 262144}
    after = {"max_model_len": 64, "kv_cache_memory_bytes": 262144, "fully_sharded_loras": True}
    assert flag_change(before, after) == (
        "without --enforce-eager, --fully-sharded-loras, --max-model-len 64 (was 2048)"
    )
    assert flag_change(before, before) == "same flags"


def test_what_changes_if_we_move() -> None:
    judged = judge_all(gpu_run(v032=Outcome.HIT))
    view = build_upgrade(judged)
    move = build_move(judged, view, "v0.31.1rc0", "v0.32.0")
    assert move.worse
    assert [(i.move, i.scenario, i.configuration.flagset) for i in move.items] == [
        (WORSE, "healthy-gpu", "eager"),
        (WORSE, MOE, "default"),
    ]
    move = build_move(judged, view, "v0.30.0", "v0.31.0")
    assert [(i.move, i.scenario) for i in move.items] == [(WITH_FLAG_CHANGE, MOE)]
    assert move.items[0].detail == "--fully-sharded-loras (fully-sharded-loras)"
    fixed = build_move(judge_all(gpu_run()), view, "v0.31.0", "v0.32.0")
    assert [i.move for i in fixed.items] == [WORSE, FIXED]
    assert fixed.items[1].detail == (
        "hit → avoided: AssertionError: fused_moe_lora_one_shot supports max_lora_rank<=128"
    )
    with pytest.raises(UsageError, match="Perhaps you meant"):
        build_move(judged, view, "v0.31.0", "v0.32")


def test_the_move_answers_in_the_words_of_diff() -> None:
    cells = gpu_run(v032=Outcome.HIT)
    judged = judge_all(cells)
    view = build_upgrade(judged)
    for baseline, candidate in (("v0.30.0", "v0.31.0"), ("v0.31.1rc0", "v0.32.0")):
        paired = {
            (p.key.scenario, p.key.flagset, p.key.level): p.move
            for p in diff(cells, baseline, candidate).pairs
            if p.key.variant in ("trigger", "baseline")
        }
        move = build_move(judged, view, baseline, candidate)
        for item in move.items:
            said = paired[item.scenario, item.configuration.flagset, item.level]
            # The move only adds what diff cannot know: the candidate's verified workaround.
            refined = {WITH_FLAG_CHANGE: STILL_NOT_SAFE}
            assert refined.get(item.move, item.move) == said
        assert move.count(STILL_SAFE) == list(paired.values()).count(STILL_SAFE)


def test_the_move_counts_every_change_under_one_key() -> None:
    judged = judge_all(gpu_run())
    document = move_json(build_move(judged, build_upgrade(judged), "v0.30.0", "v0.31.0"))
    assert document["counts"] == [
        {"baseline": "safe", "candidate": "not_safe", "crashes": 0},
        {"baseline": "not_safe", "candidate": "safe", "crashes": 0},
        {"baseline": "not_safe", "candidate": "not_safe", "crashes": 0},
        {"baseline": "not_safe", "candidate": "safe_with_flag_change", "crashes": 1},
        # the healthy baselines, default and eager
        {"baseline": "safe", "candidate": "safe", "crashes": 2},
    ]
    assert "still_avoided" not in document  # counted with the others, not beside them
    flag_change_move = {"baseline": "not_safe", "candidate": "safe_with_flag_change"}
    assert [i["safety"] for i in document["items"]] == [flag_change_move]


def test_a_merged_report_is_titled_by_its_matrix_and_runs() -> None:
    assert title(None, ["20260102-000000"], "merged") == ("vLLM compatibility: run 20260102-000000")
    assert (
        title("matrix.yaml", ["a", "b"], "merged") == "vLLM compatibility: matrix.yaml · runs a, b"
    )
    assert title(None, [], "merged") == "vLLM compatibility: run merged"
    assert title(None, list("abcd"), "x") == "vLLM compatibility: 4 runs, a to d"
    judged = judge_all([*gpu_run("shard-a"), *cpu_probes("shard-b")])
    assert build_findings(judged, "merged", ReportOptions()).title.endswith("run shard (2 shards)")
    fleet = ["gh-42-1-cpu-0", "gh-42-1-gpu-0", "gh-42-1-gpu-1", "gh-42-1-gpu-2"]
    assert title(None, fleet, "merged") == "vLLM compatibility: run gh-42-1 (4 shards)"


def test_skipped_cells_are_summarised_per_lane_and_reason() -> None:
    groups = skip_groups(judge_all(gpu_run()))
    assert [(g.lane, g.reason, g.count) for g in groups] == [
        ("gpu", NO_RUNNER, 8),
        ("gpu", NO_MEMORY, 4),
    ]


def test_causes_are_shortened_around_their_numbers() -> None:
    cause = (
        "ValueError: LoRA rank 64 is greater than max_lora_rank 16. Please use a LoRA "
        "with a smaller rank or increase max_lora_rank."
    )
    short = shorten(cause, 70)
    assert short == "ValueError: LoRA rank 64 is greater than max_lora_rank 16. …"
    assert shorten("short enough", 70) == "short enough"


def test_causes_are_cut_at_word_boundaries_never_inside_a_phrase() -> None:
    cause = (
        "ValueError: To serve at least one request with the model's max seq len (2048), "
        "(0.0 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(0.0 GiB)."
    )
    # The clause ends at the number; the parenthesis after it is left out whole.
    expected = "ValueError: To serve at least one request with the model's max seq len (2048) …"
    assert shorten(cause, 90) == expected
    for limit in range(14, len(cause)):  # from the first word and its mark on
        short = shorten(cause, limit)
        kept = short.removesuffix(" …").split()
        assert len(short) <= limit and short.endswith(" …")
        assert kept[:-1] == cause.split()[: len(kept) - 1]  # every word kept, in its place
        assert kept[-1] == cause.split()[len(kept) - 1].rstrip(",:")
        assert short.count("(") == short.count(")")


class _Tables(HTMLParser):
    """Collects the text of each table's rows, the ids of sections in order, and the move's
    kinds of change with their titles."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.rows: list[list[str]] = []
        self.changes: list[tuple[str, str]] = []
        self._cell: list[str] | None = None
        self._change: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "section" and named.get("id"):
            self.sections.append(str(named["id"]))
        if tag == "tr":
            self.rows.append([])
        if tag in ("td", "th"):
            self._cell = []
        if tag == "li" and named.get("data-safety-before"):
            self._change = f"{named['data-safety-before']}-{named.get('data-safety-after')}"

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._change is not None and data.strip():
            self.changes.append((self._change, data.strip()))
            self._change = None


def test_reports_open_with_the_upgrade_view(tmp_path: Path) -> None:
    run_dir = tmp_path / "20260102-000000"
    write_gpu_run(run_dir)
    write_reports(run_dir, ReportOptions(baseline="v0.31.1rc0", candidate="v0.32.0"))
    markdown = (run_dir / "compat.md").read_text()
    assert markdown.index("## Can we upgrade?") < markdown.index("## Every cell")
    assert "| v0.31.0 | 🟡 safe with a flag change; hits moe-lora-rank-over-128, avoided with " in (
        markdown
    )
    move = markdown.split("## What changes if we move from v0.31.1rc0 to v0.32.0\n", 1)[1]
    assert move.split("\n## ")[0].strip().splitlines() == [
        "The candidate is **worse**; 2 crash check(s) stay avoided.",
        "",
        "- safe → not safe: 1",
        "  - healthy-gpu on h100 · qwen3-30b-a3b · eager: avoided → other\\_failure: the "
        "server became ready but did not answer its first request",
        "- not safe → safe: 0",
        "- not safe → not safe: 0",
        "- not safe → safe with a flag change: 0",
    ]
    assert f"- gpu lane, 8 cell(s): {NO_RUNNER}" in markdown
    assert "h200x4" not in markdown.split("## Every cell")[1]  # no skipped cell listed
    parser = _Tables()
    page = (run_dir / "compat.html").read_text()
    parser.feed(page)
    assert parser.sections[:4] == ["upgrade", "move", "ranges", "heat"]
    assert parser.changes == [
        ("safe-not_safe", "safe → not safe"),
        ("not_safe-safe", "not safe → safe"),
        ("not_safe-not_safe", "not safe → not safe"),
        ("not_safe-safe_with_flag_change", "not safe → safe with a flag change"),
    ]
    upgrade = [row for row in parser.rows if row and row[0].startswith("v0.")][:4]
    assert [row[0] for row in upgrade] == ["v0.30.0", "v0.31.0", "v0.31.1rc0", "v0.32.0"]
    assert upgrade[3][2].startswith("not safe fails: healthy-gpu / baseline")


def test_an_expectation_inferred_without_scenario_files(tmp_path: Path) -> None:
    judged = judge_all([*cpu_probes()])
    [evidence] = build_findings(judged, "r", ReportOptions()).ranges
    assert evidence.words == (
        "hit on 0.27.1 and 0.30.0, outside the documented range; the observations fit "
        "`>=0.27.1,<0.32.0`"
    )
    assert (evidence.suggested_affected, evidence.suggested_fixed) == (
        ">=0.27.1,<0.32.0",
        ">=0.32.0",
    )


def test_one_level_is_enough_for_a_crash() -> None:
    probe = result(
        scenario=MOE, probe=True, outcome=Outcome.HIT, expected=Expected.HIT, root_cause=MOE_CAUSE
    )
    [crash] = image_safety(judge_all([probe])).crashes
    assert crash.level == "probe"


WARMUP = "mm-warmup-interrupted"
VL = Configuration("gpu", "h100", "qwen3-vl-8b-instruct", "default")


def staged_run() -> list[CellResult]:
    """Seed 004's staged interruption hit on two images with no workaround run; the healthy
    baseline served on both."""
    vl: dict[str, Any] = {"lane": "gpu", "gpu": "h100", "model": "qwen3-vl-8b-instruct"}
    cells = [
        result(tag=tag, scenario="healthy-gpu", variant="baseline", outcome=Outcome.AVOIDED,
               expected=Expected.AVOIDED, **vl)
        for tag in ("v0.27.1", "v0.32.0")
    ]  # fmt: skip
    cells += [
        result(tag=tag, scenario=WARMUP, outcome=Outcome.HIT, expected=Expected.HIT, **vl)
        for tag in ("v0.27.1", "v0.32.0")
    ]
    return cells


def test_a_staged_start_up_interruption_is_not_held_against_an_image() -> None:
    judged = judge_all(staged_run())
    [gpu] = build_upgrade(judged, staged={WARMUP}).lanes
    cell = gpu.at("v0.32.0", VL)
    assert cell is not None
    assert cell.safety is Safety.SAFE and cell.crashes == () and cell.failures == ()
    assert cell.staged == (WARMUP,)
    assert cell.words == "safe; staged crash shown (not held against it): mm-warmup-interrupted"
    assert cell.cells == 2
    # The same hit counted as a defect, with no workaround seen, makes the image unsafe.
    [held] = build_upgrade(judged).lanes
    assert held.at("v0.32.0", VL).safety is Safety.NOT_SAFE  # type: ignore[union-attr]
    # Its variant without the interrupt is an ordinary start: served, it decides.
    interrupted, served = judge_all(
        [
            result(scenario=WARMUP, outcome=Outcome.HIT),
            result(scenario=WARMUP, variant="full-startup-allowance", outcome=Outcome.AVOIDED,
                   expected=Expected.AVOIDED),
        ]
    )  # fmt: skip
    alone = image_safety([interrupted, served], staged={WARMUP})
    assert (alone.safety, alone.crashes, alone.staged) == (Safety.SAFE, (), (WARMUP,))


def test_a_staged_crash_makes_no_move_between_two_images() -> None:
    judged = judge_all(staged_run())
    move = build_move(judged, build_upgrade(judged, staged={WARMUP}), "v0.27.1", "v0.32.0")
    assert [i.scenario for i in move.items] == [] and move.still_avoided == 1  # the baseline
    assert not move.worse
    # Held as a defect, the same hit on both sides is a crash the move keeps.
    held = build_move(judged, build_upgrade(judged), "v0.27.1", "v0.32.0")
    assert [(i.scenario, i.move) for i in held.items] == [
        (WARMUP, SafetyMove(Safety.NOT_SAFE, Safety.NOT_SAFE))
    ]


def test_the_reports_read_the_kind_from_the_scenario_files() -> None:
    documents = documented_ranges(load_scenarios(paths.ROOT / "scenarios"))
    assert documents[WARMUP].kind == "startup-interruption"
    findings = build_findings(judge_all(staged_run()), "r", ReportOptions(documents=documents))
    [gpu] = findings.upgrade.lanes
    assert gpu.at("v0.27.1", VL).safety is Safety.SAFE  # type: ignore[union-attr]
    [entry, *_] = [e for e in upgrade_json(findings.upgrade) if e["image_tag"] == "v0.27.1"]
    assert entry["staged_interruptions"] == [WARMUP]


def test_the_staged_kv_cache_misconfiguration_never_counts_against_a_cpu_image(
    tmp_path: Path,
) -> None:
    # The shipped scenario is a deliberate misconfiguration (its budget comes from an include):
    # every image refuses it, so the newest image with a healthy baseline reads "safe".
    documents = documented_ranges(load_scenarios(paths.ROOT / "scenarios"))
    assert documents["cpu-kv-cache-too-small"].kind == "misconfiguration"
    findings = build_findings(judge_all(cpu_lane()), "r", ReportOptions(documents=documents))
    [cpu] = findings.upgrade.lanes
    for tag in ("0.31.0", "0.32.0"):
        [cell] = [found for (t, _), found in cpu.safeties.items() if t == tag]
        assert cell.safety is Safety.SAFE and cell.staged == ("cpu-kv-cache-too-small",)
    # The run's last lines give that answer per image, and where the whole answer is.
    write_run(tmp_path, cpu_lane())
    answer = write_reports(tmp_path).answer
    assert answer[:2] == (
        "cpu 0.31.0: safe; staged crash shown (not held against it): cpu-kv-cache-too-small",
        "cpu 0.32.0: safe; staged crash shown (not held against it): cpu-kv-cache-too-small",
    )
    assert answer[-1] == f"the full answer: {tmp_path / 'compat.md'}"


def test_the_last_lines_name_every_verdict_that_disagrees_with_the_documents(
    tmp_path: Path,
) -> None:
    outside = result(tag="0.31.0", scenario="healthy-cpu", variant="baseline",
                     expected=Expected.AVOIDED)  # fmt: skip
    judged = judge_all([*cpu_lane(), outside])
    view = build_upgrade(judged)
    lines = answer_lines(view, judged, tmp_path / "compat.md")
    differ = [line for line in lines if line.startswith("differs from the documents: ")]
    assert differ == [f"differs from the documents: {outside.id}: outside range"]
    assert lines[0].startswith("cpu 0.31.0: not safe")


def test_compat_html_shows_what_the_plan_expects_of_a_lane_that_did_not_run(
    tmp_path: Path,
) -> None:
    skipped = {
        "outcome": Outcome.SKIPPED,
        "reason": "GPU cell needs 1 GPU(s); this host has no GPU",
    }
    gpu = {"lane": "gpu", "gpu": "h100", "model": "qwen3-30b-a3b", "scenario": MOE, **skipped}
    cells = [
        *cpu_lane(),
        result(tag="v0.31.0", expected=Expected.HIT, **gpu),
        result(tag="v0.31.0", variant="rank-64", expected=Expected.AVOIDED, **gpu),
        result(tag="v0.32.0", expected=Expected.AVOIDED, **gpu),
    ]
    write_run(tmp_path, cells)
    write_reports(tmp_path)
    page = (tmp_path / "compat.html").read_text()
    assert "What the plan expects of the gpu lane where it runs" in page
    planned = page.split('<table class="planned">', 1)[1].split("</table>", 1)[0]
    assert f"<th>{MOE}</th>" in planned
    assert "<tr><th>v0.31.0</th><td>1 avoided, 1 hit</td></tr>" in planned
    assert "<tr><th>v0.32.0</th><td>1 avoided</td></tr>" in planned
    assert "What the plan expects of the cpu lane" not in page  # it ran
