"""diff: the upgrade question, pair by pair, and the exit status CI gates on."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from repromatrix.cli import main
from repromatrix.errors import UsageError
from repromatrix.judgement import Expected, Outcome, Safety, SafetyMove
from repromatrix.reports.diff import classify, diff, format_diff, to_json
from support.reports import KV_CAUSE, cpu_lane, result, seed_000_probes, write_run

H, A, F, T = Outcome.HIT, Outcome.AVOIDED, Outcome.OTHER_FAILURE, Outcome.TIMEOUT
E, S, U = Outcome.INFRA_ERROR, Outcome.SKIPPED, Outcome.UNREACHABLE
SAFE, NOT_SAFE, UNKNOWN = Safety.SAFE, Safety.NOT_SAFE, Safety.UNKNOWN
WORSE = SafetyMove(SAFE, NOT_SAFE)
FIXED = SafetyMove(NOT_SAFE, SAFE)
STILL_NOT_SAFE = SafetyMove(NOT_SAFE, NOT_SAFE)
STILL_SAFE = SafetyMove(SAFE, SAFE)


@pytest.mark.parametrize(
    ("before", "after", "move"),
    [
        (H, A, FIXED),
        (F, A, FIXED),
        (T, A, FIXED),
        (H, H, STILL_NOT_SAFE),
        (H, F, STILL_NOT_SAFE),
        (A, H, WORSE),
        (A, F, WORSE),
        (A, T, WORSE),
        (A, A, STILL_SAFE),
        (A, E, SafetyMove(SAFE, UNKNOWN)),
        (E, A, SafetyMove(UNKNOWN, SAFE)),
        (H, S, SafetyMove(NOT_SAFE, UNKNOWN)),
        (U, A, SafetyMove(UNKNOWN, SAFE)),
        (A, None, SafetyMove(SAFE, UNKNOWN)),
        (None, H, SafetyMove(UNKNOWN, NOT_SAFE)),
    ],
)
def test_classify(before: Outcome | None, after: Outcome | None, move: SafetyMove) -> None:
    baseline = result(tag="0.31.0", outcome=before) if before else None
    candidate = result(tag="0.32.0", outcome=after) if after else None
    assert classify(baseline, candidate) == move
    assert classify(baseline, candidate).decided is (UNKNOWN not in (move.before, move.after))


def cpu_results() -> list:
    return [*cpu_lane(), *seed_000_probes()]


def test_the_cpu_lane_upgrade() -> None:
    upgrade = diff(cpu_results(), "0.31.0", "0.32.0")
    assert not upgrade.worse
    by_move = {m: [p.key.label for p in upgrade.of(m)] for m in upgrade.moves}
    assert by_move == {
        WORSE: [],
        FIXED: ["moe-lora-rank-over-128/trigger [probe] cpu/cpu/tiny-llama/default"],
        # Its workaround (lower-max-model-len) is avoided on 0.32.0, but only the move says so.
        STILL_NOT_SAFE: ["cpu-kv-cache-too-small/trigger [engine] cpu/cpu/tiny-llama/default"],
        STILL_SAFE: [
            "cpu-kv-cache-too-small/lower-max-model-len [engine] cpu/cpu/tiny-llama/default",
            "healthy-cpu/baseline [engine] cpu/cpu/tiny-llama/default",
        ],
    }


def test_a_candidate_that_breaks_what_worked_is_worse() -> None:
    cells = [
        result(tag="0.31.0", scenario="healthy-cpu", outcome=A, expected=Expected.AVOIDED),
        result(tag="0.32.0", scenario="healthy-cpu", outcome=H, expected=Expected.AVOIDED),
    ]
    upgrade = diff(cells, "0.31.0", "0.32.0")
    assert upgrade.worse
    [pair] = upgrade.of(WORSE)
    assert pair.candidate is not None and pair.candidate.root_cause == KV_CAUSE


def test_levels_are_compared_separately() -> None:
    cells = [
        result(tag="0.31.0", outcome=H),
        result(tag="0.32.0", outcome=H),
        result(tag="0.31.0", probe=True, outcome=H),
        result(tag="0.32.0", probe=True, outcome=A),
    ]
    upgrade = diff(cells, "0.31.0", "0.32.0")
    assert {(p.key.level, p.move) for p in upgrade.pairs} == {
        ("engine", STILL_NOT_SAFE),
        ("probe", FIXED),
    }


def test_a_cell_on_one_side_only_is_unknown() -> None:
    cells = [*cpu_results(), result(tag="0.32.0", scenario="new-in-candidate")]
    [pair] = diff(cells, "0.31.0", "0.32.0").of(SafetyMove(UNKNOWN, NOT_SAFE))
    assert pair.baseline is None
    assert pair.outcomes == ("no cell", "hit")
    assert pair.key.scenario == "new-in-candidate"


def test_an_unknown_tag_is_a_usage_error_with_a_suggestion() -> None:
    with pytest.raises(UsageError, match=r"--candidate v0\.32\.0: .*Perhaps you meant `0\.32\.0`"):
        diff(cpu_results(), "0.31.0", "v0.32.0")


def test_tags_with_nothing_in_common_are_a_usage_error() -> None:
    cells = [result(tag="0.31.0"), result(lane="gpu", gpu="h100", tag="v0.32.0")]
    with pytest.raises(UsageError, match="no cell in common"):
        diff(cells, "0.31.0", "v0.32.0")


def test_text_answer() -> None:
    text = format_diff(diff(cpu_results(), "0.31.0", "0.32.0"))
    assert text.splitlines() == [
        "upgrade 0.31.0 -> 0.32.0: the candidate is not worse",
        "",
        "safe → not safe (0)",
        "",
        "not safe → safe (1)",
        "  moe-lora-rank-over-128/trigger [probe] cpu/cpu/tiny-llama/default: hit -> avoided "
        "(AssertionError: fused_moe_lora_one_shot supports max_lora_rank<=128)",
        "",
        "not safe → not safe (1)",
        "  cpu-kv-cache-too-small/trigger [engine] cpu/cpu/tiny-llama/default: hit -> hit "
        "(ValueError: To serve at least one request with the model's max seq len (2048), (0.0 "
        "GiB KV cache is needed, which is la…)",
        "",
        "safe → safe (2)",
    ]


def test_text_answer_lists_each_undecided_move_made() -> None:
    cells = [*cpu_results(), result(tag="0.32.0", scenario="new-in-candidate")]
    text = format_diff(diff(cells, "0.31.0", "0.32.0"))
    assert "1 pair(s) undecided (1 no cell)" in text.splitlines()[0]
    assert "unknown → not safe (1)" in text.splitlines()
    assert text.index("not safe → not safe (1)") < text.index("unknown → not safe (1)")
    assert text.index("unknown → not safe (1)") < text.index("safe → safe (2)")


def test_json_answer() -> None:
    document = to_json(diff(cpu_results(), "0.31.0", "0.32.0"))
    assert document["schema_version"] == 4
    assert document["worse"] is False
    assert document["counts"] == [
        {"baseline": "safe", "candidate": "not_safe", "pairs": 0},
        {"baseline": "not_safe", "candidate": "safe", "pairs": 1},
        {"baseline": "not_safe", "candidate": "not_safe", "pairs": 1},
        {"baseline": "safe", "candidate": "safe", "pairs": 2},
    ]
    fixed_move = {"baseline": "not_safe", "candidate": "safe"}
    [fixed] = [p for p in document["pairs"] if p["safety"] == fixed_move]
    assert fixed["level"] == "probe"
    assert fixed["baseline"]["observed"] == "hit"
    assert fixed["candidate"]["observed"] == "avoided"
    assert fixed["candidate"]["id"].endswith("@probe")


def test_the_diff_command_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path, cpu_results())
    assert main(["diff", str(tmp_path), "--baseline", "0.31.0", "--candidate", "0.32.0"]) == 0
    assert "the candidate is not worse" in capsys.readouterr().out
    # Going back from 0.32.0 to 0.31.0 brings the MoE LoRA crash back: worse, exit 1.
    assert main(["diff", str(tmp_path), "--baseline", "0.32.0", "--candidate", "0.31.0"]) == 1
    assert "the candidate is WORSE" in capsys.readouterr().out
    args = ["diff", str(tmp_path), "--baseline", "0.32.0", "--candidate", "0.31.0", "--json"]
    assert main(args) == 1
    [worse] = json.loads(capsys.readouterr().out)["counts"][:1]
    assert worse == {"baseline": "safe", "candidate": "not_safe", "pairs": 1}


def test_the_diff_command_on_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path / "results" / "run-1", cpu_results())
    args = ["--baseline", "0.31.0", "--candidate", "0.32.0"]
    assert main(["diff", str(tmp_path / "results"), *args]) == 2
    assert f"Perhaps you meant `{tmp_path / 'results' / 'run-1'}`?" in capsys.readouterr().err
    assert main(["diff", str(tmp_path / "nowhere"), *args]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_the_gate_fails_without_evidence_when_no_cell_was_decided(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A GPU shard on a host without GPUs: every cell of both tags skipped. No green for that.
    skipped = [
        replace(cell, outcome=Outcome.SKIPPED, reason="GPU cell needs 1 GPU(s); no GPU")
        for cell in cpu_results()
    ]
    write_run(tmp_path, skipped)
    assert not diff(skipped, "0.31.0", "0.32.0").evidence
    assert main(["diff", str(tmp_path), "--baseline", "0.31.0", "--candidate", "0.32.0"]) == 1
    assert "the gate has no evidence either way" in capsys.readouterr().err
    assert diff(cpu_results(), "0.31.0", "0.32.0").evidence
