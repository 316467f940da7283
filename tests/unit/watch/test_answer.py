"""The answer for a new tag: the upgrade view's verdict and the move from the baseline, as the
versioned payload and as Markdown."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from repromatrix.judgement import Expected, Outcome
from repromatrix.matrix.images import make_image
from repromatrix.publish.history import EMPTY, RunInfo, extend
from repromatrix.results.verdicts import judge_all
from repromatrix.values import Lane
from repromatrix.watch.answer import (
    ANSWER_SCHEMA,
    ANSWER_SCHEMA_VERSION,
    SiteLinks,
    Stage,
    answer_json,
    answer_markdown,
    build_answer,
    counts_of,
)
from repromatrix.watch.candidates import Candidate
from support.reports import MOE_CAUSE, result
from support.upgrade import TRIGGER_FLAGS, move_counts

REGISTRY = "127.0.0.1:5000/vllm/vllm-openai"
DIGEST = "sha256:" + "c" * 64
MOE: dict[str, Any] = {"lane": "gpu", "gpu": "h100", "model": "qwen3-30b-a3b",
                       "scenario": "moe-lora-rank-over-128", "flags": TRIGGER_FLAGS}  # fmt: skip


def candidate(tag: str = "v0.32.0", digest: str | None = DIGEST) -> Candidate:
    image = make_image(Lane.GPU, tag, None, REGISTRY, None, ref=f"{REGISTRY}@{digest}")
    return Candidate(Lane.GPU, image, digest)


def cells(tag: str, trigger: Outcome, workaround: Outcome | None = None) -> list[Any]:
    made = [result(tag=tag, outcome=trigger, expected=Expected.AVOIDED,
                   root_cause=MOE_CAUSE if trigger is Outcome.HIT else None, **MOE)]  # fmt: skip
    if workaround is not None:
        flags = {**TRIGGER_FLAGS, "max_lora_rank": 128}
        fields = {**MOE, "flags": flags, "variant": "rank-128", "root_cause": None}
        made.append(result(tag=tag, outcome=workaround, expected=Expected.AVOIDED, **fields))
    return made


def published(tag: str, trigger: Outcome) -> list[Any]:
    """The baseline's cells as the history gives them back."""
    judged = judge_all(cells(tag, trigger))
    history = extend(EMPTY, RunInfo("r1", "2026-01-01", "t", len(judged)), judged, {})
    return list(history.published("gpu", tag))


def answer_of(trigger: Outcome, workaround: Outcome | None = None, baseline: Any = None) -> Any:
    judged = judge_all(cells("v0.32.0", trigger, workaround))
    return build_answer(
        candidate(), judged, baseline, stage=Stage.FINAL,
        counts=counts_of(len(judged), judged, 0), run="watch-gpu-v0.32.0-cccccccccccc",
        evidence=SiteLinks("https://compat.example/index.html"),
    )  # fmt: skip


def test_a_crash_with_a_verified_flag_change_is_safe_with_that_change() -> None:
    answer = answer_of(Outcome.HIT, Outcome.AVOIDED, ("v0.31.0", published("v0.31.0", Outcome.HIT)))
    payload = answer_json(answer)
    assert payload["schema_version"] == 2
    assert (payload["safety"], payload["safety_words"]) == (
        "safe_with_flag_change",
        "safe with a flag change",
    )
    [configuration] = payload["configurations"]
    [crash] = configuration["crashes"]
    assert crash["scenario"] == "moe-lora-rank-over-128"
    assert crash["flag_changes"][0]["change"] == "--max-lora-rank 128 (was 320)"
    assert move_counts(payload["changes"]["counts"])["not_safe->safe_with_flag_change"] == 1
    assert not payload["worse"]


def test_a_crash_the_baseline_avoided_is_newly_hit_and_worse() -> None:
    answer = answer_of(Outcome.HIT, baseline=("v0.31.0", published("v0.31.0", Outcome.AVOIDED)))
    assert answer.worse and answer.safety.value == "not_safe"
    [item] = answer_json(answer)["changes"]["items"]
    assert (item["safety"], item["level"]) == (
        {"baseline": "safe", "candidate": "not_safe"},
        "engine",
    )
    assert "avoided → hit" in item["detail"]


def test_a_fix_is_named_and_the_answer_is_safe() -> None:
    answer = answer_of(Outcome.AVOIDED, baseline=("v0.31.0", published("v0.31.0", Outcome.HIT)))
    payload = answer_json(answer)
    assert payload["safety"] == "safe"
    assert [i["safety"] for i in payload["changes"]["items"]] == [
        {"baseline": "not_safe", "candidate": "safe"}
    ]


def test_the_baseline_itself_is_answered_without_a_comparison() -> None:
    payload = answer_json(answer_of(Outcome.AVOIDED))
    assert payload["changes"] == {
        "baseline": None,
        "compared": False,
        "why": "this is the baseline",
    }


def test_a_moved_baseline_tag_is_compared_with_its_last_published_digest() -> None:
    before = published("v0.32.0", Outcome.HIT)
    answer = answer_of(Outcome.AVOIDED, baseline=("v0.32.0", before))
    assert answer.move is not None and answer.move.baseline.startswith("v0.32.0@")
    assert [i.move.label for i in answer.move.items] == ["not safe → safe"]


def test_the_payload_is_versioned_and_the_markdown_leads_with_the_answer() -> None:
    answer = answer_of(Outcome.AVOIDED, baseline=("v0.31.0", published("v0.31.0", Outcome.HIT)))
    payload = answer_json(answer)
    assert (payload["schema"], payload["schema_version"]) == (ANSWER_SCHEMA, ANSWER_SCHEMA_VERSION)
    keys = ("stage", "lane", "tag", "digest", "image", "safety", "worse", "baseline",
            "configurations", "changes", "cells", "evidence")  # fmt: skip
    assert set(payload) >= set(keys)
    assert payload["digest"] == DIGEST and payload["image"] == f"{REGISTRY}@{DIGEST}"
    text = answer_markdown(answer)
    assert text.startswith("### vLLM v0.32.0 (gpu lane, sha256:cccccccccccc): safe\n")
    assert "Against v0.31.0: 1 not safe → safe." in text
    assert "SiteLinks: https://compat.example/index.html" in text


def test_the_markdown_of_an_answer_writes_values_from_results_as_text() -> None:
    # The issue body, the job summary and the annotation: a model named by a result.
    hostile = "m\n# Forged [x](https://evil.example) ![i](https://evil.example/i.png) @octocat"
    judged = judge_all(
        [
            replace(cell, model=hostile, root_cause=replace(MOE_CAUSE, message=hostile))
            for cell in cells("v0.32.0", Outcome.HIT)
        ]
    )
    answer = build_answer(
        candidate(), judged, ("v0.31.0", published("v0.31.0", Outcome.AVOIDED)),
        stage=Stage.FINAL, counts=counts_of(len(judged), judged, 0), run="r",
        evidence=SiteLinks("https://compat.example/index.html"),
    )  # fmt: skip
    text = answer_markdown(answer)
    assert "Forged" in text and "octocat" in text
    assert not re.search(r"(?m)^#+ Forged|(?<!\\)\]\(|(?<!\\)!\[|(?<![\w\u200d])@octocat", text)


def test_a_staged_crash_decides_no_safety_in_the_answer() -> None:
    # Seed 004's interruption, staged by the matrix, hit on the candidate: listed, not held.
    staged = [
        result(tag="v0.32.0", outcome=Outcome.HIT, expected=Expected.HIT,
               **{**MOE, "scenario": "mm-warmup-interrupted", "flags": {}})
    ]  # fmt: skip
    judged = judge_all([*cells("v0.32.0", Outcome.AVOIDED), *staged])
    counts = counts_of(len(judged), judged, 0)

    def answer(**staged_arg: Any) -> Any:
        return build_answer(
            candidate(), judged, None, stage=Stage.FINAL, counts=counts,
            run="watch-gpu-v0.32.0-cccccccccccc", **staged_arg,
        )  # fmt: skip

    assert answer_json(answer(staged={"mm-warmup-interrupted"}))["safety"] == "safe"
    assert answer_json(answer())["safety"] == "not_safe"
