"""Evidence against the documented ranges: words, suggested specifiers, the patch, compat.json."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest

from repromatrix.cli import main
from repromatrix.judgement import Expected, Outcome
from repromatrix.reports.findings import ReportOptions
from repromatrix.reports.ranges import Documented, load_documents, patched, range_evidence
from repromatrix.reports.write import write_reports
from repromatrix.results.verdicts import judge_all
from support import paths
from support.reports import result
from support.upgrade import MOE, cpu_probes, gpu_run, move_counts, schema, write_gpu_run

REPO = paths.ROOT
DOCUMENTS = load_documents(REPO / "scenarios")
# Seed 000's range as its document gave it (the scenario file now reads it from vLLM's
# source: every version whose dispatch sends rank > 128 to the one-shot kernel).
SEED_RANGE = ">=0.31.0,<0.31.1rc0"
SEED_DOCUMENTS = {**DOCUMENTS, MOE: replace(DOCUMENTS[MOE], affected=SEED_RANGE)}


def seed_range(folder: Path) -> None:
    """Put the seed document's own range back into a copy of seed 000's scenario file."""
    path = folder / "scenarios" / "moe-lora-rank-over-128.yaml"
    text = path.read_text()
    path.write_text(text.replace('affected: ">=0.22.0,<0.31.1rc0"', f'affected: "{SEED_RANGE}"'))


def test_the_shipped_range_of_seed_000_fits_the_measurements() -> None:
    # The probe's hits on 0.27.1 and 0.30.0 lie inside the range read from the source.
    for observed in (cpu_probes(), [*gpu_run(), *cpu_probes()]):
        [moe] = [e for e in range_evidence(judge_all(observed), DOCUMENTS) if e.scenario == MOE]
        assert moe.documented is not None and moe.documented.affected == ">=0.22.0,<0.31.1rc0"
        assert not moe.disagrees and moe.suggested_affected is None


def test_suggest_ranges_agrees_with_the_shipped_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(REPO / "scenarios", tmp_path / "scenarios")
    run_dir = tmp_path / "results" / "20260102-000000"
    write_gpu_run(run_dir)
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(run_dir), "--suggest-ranges"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "every documented range fits the observations" in err


def test_seed_000_hit_below_its_documented_range() -> None:
    [evidence] = range_evidence(judge_all(cpu_probes()), SEED_DOCUMENTS)
    assert evidence.documented is not None
    assert evidence.documented.affected == ">=0.31.0,<0.31.1rc0"
    assert evidence.outside == ("0.27.1", "0.30.0")
    assert evidence.words == (
        "hit on 0.27.1 and 0.30.0, outside the documented range `>=0.31.0,<0.31.1rc0`; "
        "the observations fit `>=0.27.1,<0.31.1rc0`"
    )
    assert (evidence.suggested_affected, evidence.suggested_fixed) == (
        ">=0.27.1,<0.31.1rc0",
        ">=0.31.1rc0",
    )


def test_both_lanes_together_keep_the_documented_fix() -> None:
    evidence = range_evidence(judge_all([*gpu_run(), *cpu_probes()]), SEED_DOCUMENTS)
    [moe] = [e for e in evidence if e.scenario == MOE]
    assert moe.hit == ("0.27.1", "0.30.0", "0.31.0")
    assert moe.avoided == ("0.31.1rc0", "0.32.0")
    assert moe.suggested_affected == ">=0.27.1,<0.31.1rc0"


def seen(*pairs: tuple[str, Outcome, Expected]) -> list:
    return judge_all([result(tag=t, scenario=MOE, outcome=o, expected=e) for t, o, e in pairs])


def test_avoided_inside_the_range_moves_the_upper_bound() -> None:
    docs = {MOE: Documented(MOE, ">=0.30.0,<0.33.0", ">=0.33.0")}
    [evidence] = range_evidence(
        seen(
            ("0.30.0", Outcome.HIT, Expected.HIT),
            ("0.31.0", Outcome.HIT, Expected.HIT),
            ("0.32.0", Outcome.AVOIDED, Expected.HIT),
        ),
        docs,
    )
    assert evidence.missed == ("0.32.0",)
    assert evidence.words == (
        "avoided on 0.32.0, inside the documented range `>=0.30.0,<0.33.0`; "
        "the observations fit `>=0.30.0,<0.32.0`"
    )
    assert evidence.suggested_fixed == ">=0.32.0"


def test_a_crash_that_comes_and_goes_gets_no_range() -> None:
    docs = {MOE: Documented(MOE, ">=0.31.0,<0.32.0", ">=0.32.0")}
    [evidence] = range_evidence(
        seen(
            ("0.31.0", Outcome.HIT, Expected.HIT),
            ("0.32.0", Outcome.AVOIDED, Expected.AVOIDED),
            ("0.33.0", Outcome.HIT, Expected.AVOIDED),
        ),
        docs,
    )
    assert evidence.suggested_affected is None
    assert evidence.words.endswith("the observations are not one range of versions")


def test_agreement_says_so() -> None:
    [evidence] = range_evidence(seen(("0.31.0", Outcome.HIT, Expected.HIT)), SEED_DOCUMENTS)
    assert not evidence.disagrees
    assert evidence.suggested_affected is None


def test_the_patch_changes_only_the_range_lines() -> None:
    text = '# a comment\naffected: ">=0.31.0,<0.31.1rc0"\nfixed: ">=0.31.1rc0"\nvariants: []\n'
    assert patched(text, ">=0.27.1,<0.31.1rc0", ">=0.31.1rc0") == (
        '# a comment\naffected: ">=0.27.1,<0.31.1rc0"\nfixed: ">=0.31.1rc0"\nvariants: []\n'
    )
    assert patched('affected: "<1"\nx: 1\n', ">=0.1,<0.2", ">=0.2") == (
        'affected: ">=0.1,<0.2"\nfixed: ">=0.2"\nx: 1\n'
    )


def test_suggest_ranges_prints_a_patch_that_applies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(REPO / "scenarios", tmp_path / "scenarios")
    seed_range(tmp_path)
    run_dir = tmp_path / "results" / "20260102-000000"
    write_gpu_run(run_dir)
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(run_dir), "--suggest-ranges"]) == 0
    patch = capsys.readouterr().out
    assert patch.startswith("--- a/scenarios/moe-lora-rank-over-128.yaml\n")
    assert '-affected: ">=0.31.0,<0.31.1rc0"\n+affected: ">=0.27.1,<0.31.1rc0"\n' in patch
    (tmp_path / "fix.patch").write_text(patch)
    subprocess.run(["patch", "-p1", "-i", "fix.patch"], cwd=tmp_path, check=True)
    assert main(["report", str(run_dir), "--suggest-ranges"]) == 0
    assert capsys.readouterr().out == ""  # the patched files fit the observations


def test_compat_json_holds_the_findings_and_matches_its_schema(tmp_path: Path) -> None:
    run_dir = tmp_path / "20260102-000000"
    write_gpu_run(run_dir)
    options = ReportOptions(documents=SEED_DOCUMENTS, baseline="v0.31.0", candidate="v0.32.0")
    write_reports(run_dir, options)
    document = json.loads((run_dir / "compat.json").read_text())
    jsonschema.validate(document, schema("compat.schema.json"))
    [moe] = [r for r in document["ranges"] if r["scenario"] == MOE]
    assert moe["suggested"] == {"affected": ">=0.27.1,<0.31.1rc0", "fixed": ">=0.31.1rc0"}
    assert moe["outside_range"] == ["0.27.1", "0.30.0"]
    rows = {(u["image_tag"], u["flagset"]): u for u in document["upgrade"] if u["lane"] == "gpu"}
    assert rows["v0.31.0", "default"]["safety"] == "safe_with_flag_change"
    assert rows["v0.31.0", "default"]["crashes"][0]["workarounds"][0]["change"] == (
        "--fully-sharded-loras"
    )
    assert move_counts(document["move"]["counts"]) == {
        "safe->not_safe": 1,  # the healthy baseline with --enforce-eager fails on v0.32.0
        "not_safe->safe": 1,
        "not_safe->not_safe": 0,
        "not_safe->safe_with_flag_change": 0,
        "safe->safe": 1,
    }
    assert [i["safety"] for i in document["move"]["items"]] == [
        {"baseline": "safe", "candidate": "not_safe"},
        {"baseline": "not_safe", "candidate": "safe"},
    ]
    assert document["skipped"][0]["cells"] == 8
    verdicts = {
        c["id"].split("/")[1]: c["verdict"] for c in document["cells"] if "@probe" in c["id"]
    }
    assert verdicts["0.27.1"] == "outside_range"  # not "regression"
    document["upgrade"][0]["safety"] = "fine"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, schema("compat.schema.json"))


@pytest.mark.parametrize(
    "old",
    [
        pytest.param({"schema_version": 2}, id="schema version 2"),
        pytest.param({"schema_version": 4}, id="schema version 4"),
        pytest.param({"move.still_avoided": 1}, id="still_avoided beside the counts"),
        pytest.param({"move.counts": {"newly_failing": 1}}, id="a count in diff's old words"),
        pytest.param({"move.counts": {"newly_hit": 1}}, id="a count in version 4's words"),
        pytest.param({"move.items.0.change": "newly_hit"}, id="a change in version 4's words"),
        pytest.param({"move.items.0.safety": "newly_hit"}, id="a move in version 4's words"),
        pytest.param({"upgrade.0.safety": "unsafe"}, id="a safety in version 4's words"),
        pytest.param({"upgrade.0.safety": "workaround"}, id="a flag change in version 4's words"),
    ],
)
def test_the_compat_schema_refuses_the_moves_old_words(
    tmp_path: Path, old: dict[str, object]
) -> None:
    run_dir = tmp_path / "20260102-000000"
    write_gpu_run(run_dir)
    write_reports(run_dir, ReportOptions(baseline="v0.31.0", candidate="v0.32.0"))
    document = json.loads((run_dir / "compat.json").read_text())
    jsonschema.validate(document, schema("compat.schema.json"))
    [(path, value)] = old.items()
    *parents, name = path.split(".")
    where = document
    for part in parents:
        where = where[int(part)] if part.isdigit() else where[part]
    where[name] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, schema("compat.schema.json"))
