"""A drafted workaround stays inside the flag's valid range (issue 32, class 7): the
catalogue carries each flag's bounds, a first try is halved or doubled inside them, and
where the range leaves no value on that side the draft offers none and says why."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from types import MappingProxyType

import pytest
import yaml

from repromatrix.commands.scenario import _draft
from repromatrix.drafting.check import load_draft
from repromatrix.drafting.write import render_draft
from repromatrix.errors import ConfigError, UsageError
from repromatrix.triage import Diagnosis, Direction, FlagChange, FlagFix, builtin_catalogue
from repromatrix.triage.catalogue import parse_catalogue
from repromatrix.triage.diagnosis import RootCause
from repromatrix.triage.facts import LaunchRecord
from repromatrix.triage.fixes import Bounds, step
from support import paths

LOGS = paths.ROOT / "tests" / "data" / "logs"
BOUNDS = builtin_catalogue().bounds


def test_every_flag_a_fix_lowers_or_raises_has_bounds():
    moved = {
        change.name
        for cause in builtin_catalogue().causes
        for fix in cause.fix_flags
        for change in fix.flags
        if change.direction is not None
    }
    assert moved
    assert sorted(moved - set(BOUNDS)) == []


@pytest.mark.parametrize(
    ("flag", "now", "direction", "expected"),
    [
        ("gpu_memory_utilization", 0.9, Direction.RAISE, 1),  # 1.8 is past vLLM's le=1
        ("gpu_memory_utilization", 0.92, Direction.RAISE, 1),  # the draft that said 1.84
        ("gpu_memory_utilization", 1.0, Direction.RAISE, None),  # already at the top
        ("gpu_memory_utilization", 0.9, Direction.LOWER, 0.45),
        ("max_num_seqs", 1, Direction.LOWER, None),  # 0 sequences is no value
        ("max_num_seqs", 3, Direction.LOWER, 1),
        ("max_num_seqs", 3, Direction.RAISE, 6),
        ("max_lora_rank", 320, Direction.LOWER, 256),  # 160 is no rank vLLM takes
        ("max_lora_rank", 512, Direction.RAISE, None),
        ("max_model_len", 4096, Direction.LOWER, 2048),
    ],
)
def test_a_first_try_stays_inside_the_flag_s_range(
    flag: str, now: float, direction: Direction, expected: float | None
):
    assert step(now, direction, BOUNDS[flag]) == expected


def diagnosis(flag: str, direction: Direction) -> Diagnosis:
    line = "ValueError: No available memory for the cache blocks."
    cause = RootCause(line, "EngineCore", "ValueError", line.partition(": ")[2], "gpu_oom")
    fixes = (FlagFix(flags=(FlagChange(flag, direction=direction),)),)
    return Diagnosis(cause, "", "", fix_flags=fixes)


def record(**args: object) -> LaunchRecord:
    return LaunchRecord(MappingProxyType(args), "non-default args", "/m", None, "cpu")  # type: ignore[arg-type]


def test_a_draft_raises_a_fraction_to_its_limit_not_past_it():
    text = render_draft(
        diagnosis("gpu_memory_utilization", Direction.RAISE),
        record(gpu_memory_utilization=0.92),
        "draft-x",
        "x.log",
    )
    variants = load_draft("draft-x", text).variants
    assert [dict(v.flags) for v in variants[1:]] == [{"gpu_memory_utilization": 1.0}]


def test_where_the_range_leaves_no_value_the_draft_offers_none_and_says_why():
    text = render_draft(
        diagnosis("gpu_memory_utilization", Direction.RAISE),
        record(gpu_memory_utilization=1.0),
        "draft-x",
        "x.log",
    )
    assert yaml.safe_load(text)["variants"] == []
    assert (
        "# not drafted: raise gpu_memory_utilization (gpu_memory_utilization is 1.0 and vLLM"
        " accepts 0 < value <= 1: no valid value is higher)"
    ) in text


def test_bad_bounds_are_refused_at_their_line():
    body = (
        "flag_bounds:\n"
        "  max_num_seqs: {min: one}\n"
        "  BadName: {min: 1}\n"
        "  max_model_len: {mni: 1}\n"
        "causes: []\n"
    )
    with pytest.raises(ConfigError) as caught:
        parse_catalogue(body, "c.yaml")
    text = str(caught.value)
    assert "c.yaml:2" in text and "`min` must be a number" in text
    assert "c.yaml:3" in text and "not the name of an engine argument" in text
    assert "c.yaml:4" in text and "Perhaps you meant" in text


def test_bounds_say_what_they_allow():
    assert Bounds(above=0, max=1).describe() == "0 < value <= 1"
    assert not Bounds(above=0, max=1).allows(1.78)
    assert Bounds(min=1, integer=True).allows(1)
    assert not Bounds(min=1, integer=True).allows(2.5)


@cache
def drafts() -> tuple[tuple[Path, str], ...]:
    """The draft of every labelled crash log in tests/data/logs, as the command makes it."""
    found = []
    for labels in sorted(LOGS.glob("*/labels.yaml")):
        for label in yaml.safe_load(labels.read_text(encoding="utf-8")):
            path = labels.parent / label["file"]
            if label.get("root_cause_line") and path.exists():
                try:
                    found.append((path, _draft(path, None)[1]))
                except UsageError:  # triage names no cause in it: nothing to draft
                    continue
    return tuple(found)


def test_no_draft_from_the_test_logs_proposes_a_value_outside_its_flag_s_range():
    assert len(drafts()) >= 100
    outside = []
    proposed = 0
    for path, text in drafts():
        for variant in yaml.safe_load(text)["variants"]:
            for name, value in (variant.get("flags") or {}).items():
                bounds = BOUNDS.get(name)
                if bounds is not None and isinstance(value, int | float):
                    proposed += 1
                    if isinstance(value, bool) or not bounds.allows(value):
                        outside.append(f"{path.name}: {name}={value}")
    assert proposed >= 5  # the test sees real proposals, not none
    assert outside == []
