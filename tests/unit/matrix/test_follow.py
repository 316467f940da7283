"""A lane's images as a follow rule: read from matrix.yaml, and what it makes of the tags."""

from __future__ import annotations

from pathlib import Path

import pytest

from repromatrix.errors import ConfigError, UsageError
from repromatrix.matrix.config import load_matrix
from repromatrix.matrix.expand import plan
from repromatrix.matrix.follow import Follow, LeftOut, choose
from repromatrix.values import Lane
from support.matrix import GPU_LANE, at, setup, write

FOLLOWING = GPU_LANE.replace(
    "images: [v0.31.0, v0.31.1rc0, v0.32.0, nightly]",
    'images: {follow: ">=0.31", release_candidates: true, exclude: ["*.post*"], newest: 3}',
)
TAGS = ["v0.30.0", "v0.31.0", "v0.31.1rc0", "v0.32.0", "v0.32.0.post1", "nightly",
        "nightly-1a2b3c", "latest", "v0.33.0"]  # fmt: skip


def test_a_lane_reads_its_follow_rule_and_has_no_images_until_locked(tmp_path: Path) -> None:
    config = load_matrix(write(tmp_path, "m.yaml", FOLLOWING)).lanes[Lane.GPU]
    assert config.images == ()
    assert config.follow == Follow(
        ">=0.31", release_candidates=True, exclude=("*.post*",), newest=3,
        where=config.follow.where if config.follow else None,
    )  # fmt: skip
    assert config.follow is not None and config.follow.words == (
        ">=0.31 (release candidates, newest 3, not *.post*)"
    )


def test_expanding_a_following_lane_before_its_lock_is_refused(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path, FOLLOWING)
    with pytest.raises(UsageError, match=r"follows `>=0.31.*lock file"):
        plan(matrix, scenarios)


def test_the_rule_takes_versions_in_range_and_says_why_it_left_each_other_tag_out() -> None:
    choice = choose(Follow(">=0.31"), TAGS)
    assert choice.taken == ("v0.31.0", "v0.32.0", "v0.32.0.post1", "v0.33.0")
    assert choice.left_out == (
        LeftOut("latest", "not a version"),
        LeftOut("nightly", "a nightly (nightlies: false)"),
        LeftOut("nightly-1a2b3c", "a nightly (nightlies: false)"),
        LeftOut("v0.30.0", "outside `>=0.31`"),
        LeftOut("v0.31.1rc0", "a pre-release (release_candidates: false)"),
    )


def test_one_tag_per_version_the_first_in_name_order() -> None:
    choice = choose(Follow("all"), ["v0.32.0", "0.32.0"])
    assert choice.taken == ("0.32.0",)
    assert choice.left_out == (LeftOut("v0.32.0", "the same version as `0.32.0`"),)


def test_every_tag_offered_is_either_taken_or_left_out_with_a_reason() -> None:
    for rule in (Follow(">=0.31"), Follow("all", True, True), Follow("<0.32", exclude=("v0.31*",))):
        choice = choose(rule, TAGS)
        assert sorted([*choice.taken, *(o.tag for o in choice.left_out)]) == sorted(set(TAGS))
        assert all(o.reason for o in choice.left_out)


def test_switches_excludes_and_the_newest_n() -> None:
    rule = Follow(">=0.31", release_candidates=True, nightlies=True, exclude=("*.post*",), newest=2)
    choice = choose(rule, TAGS)
    # the newest two versions, then the nightlies (no version to order them by)
    assert choice.taken == ("v0.32.0", "v0.33.0", "nightly", "nightly-1a2b3c")
    reasons = {o.tag: o.reason for o in choice.left_out}
    assert reasons["v0.32.0.post1"] == "excluded (`*.post*`)"
    assert reasons["v0.31.0"] == reasons["v0.31.1rc0"] == "older than the newest 2"
    assert reasons["latest"] == "not a version"


def test_a_rule_that_takes_nothing_takes_nothing() -> None:
    assert choose(Follow(">=9"), TAGS).taken == ()


@pytest.mark.parametrize(
    ("images", "needle", "message"),
    [
        ('{follow: ">=0.31", nightly: true}', "nightly:", "unknown key `nightly`"),
        ('{follow: "0.31 or later"}', '"0.31', "is not a version specifier set"),
        ("{release_candidates: true}", "{release", "missing the required key `follow`"),
        ('{follow: ">=0.31", newest: 0}', "0}", "must be at least 1"),
        ('{follow: ">=0.31", release_candidates: yes please}', "yes", "true or false"),
    ],
)
def test_a_bad_rule_is_named_where_it_is_written(
    tmp_path: Path, images: str, needle: str, message: str
) -> None:
    text = GPU_LANE.replace("images: [v0.31.0, v0.31.1rc0, v0.32.0, nightly]", f"images: {images}")
    with pytest.raises(ConfigError) as caught:
        load_matrix(write(tmp_path, "m.yaml", text))
    [problem] = [p for p in caught.value.problems if message in p.message]
    assert f"{problem.line}:{problem.column}" == at(text, needle)


def test_the_cpu_lane_has_no_nightlies(tmp_path: Path) -> None:
    text = """
    lanes:
      cpu:
        images: {follow: ">=0.31", nightlies: true}
        gpus: {cpu: {runner: ubuntu-latest, count: 0}}
        models: {m: {source: tiny-llama}}
    """
    with pytest.raises(ConfigError, match="the CPU lane follows package versions"):
        load_matrix(write(tmp_path, "m.yaml", text))


def test_an_exclude_rule_may_name_tags_of_a_following_lane(tmp_path: Path) -> None:
    # the tags are known once locked: a rule naming one is no misspelling yet
    text = FOLLOWING + "exclude:\n  - {image: v0.31.0, model: dense}\n"
    assert load_matrix(write(tmp_path, "m.yaml", text)).exclude
