"""Follow rules resolved into a lock that every shard reads, and what ``plan`` says of it.

``Answers`` stands behind the project's own ``Upstream`` interface with fixed tags and
digests, and counts what it was asked: a shard that reads a lock asks nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from repromatrix.cli import main
from repromatrix.errors import ConfigError, InfraError, UsageError
from repromatrix.matrix.config import Matrix
from repromatrix.matrix.expand import plan
from repromatrix.matrix.follow import LeftOut
from repromatrix.matrix.inputs import apply_lock, load_inputs
from repromatrix.upstream.lock import read_lock, restricted, stale_lanes, write_lock
from repromatrix.upstream.resolve import Locked, Locking, lock_for, resolve
from repromatrix.values import Lane, PullPolicy
from support.matrix import BASELINE, GPU_LANE, MOE_SCENARIO, setup, write

FOLLOWING = GPU_LANE.replace(
    "images: [v0.31.0, v0.31.1rc0, v0.32.0, nightly]",
    'registry: mirror.example/vllm/vllm-openai\n    images: {follow: ">=0.31", nightlies: true}',
)
TAGS = ("v0.30.0", "v0.31.0", "v0.31.1rc0", "v0.32.0", "nightly", "latest")


def digest(tag: str) -> str:
    return "sha256:" + hashlib.sha256(tag.encode()).hexdigest()


class Answers:
    """Fixed tags and digests, and a count of the questions asked."""

    def __init__(self, tags: Sequence[str] = TAGS, down: bool = False) -> None:
        self.tags_ = tuple(tags)
        self.asked: list[str] = []
        self.down = down

    def tags(self, repository: str) -> Sequence[str]:
        self.asked.append(f"tags {repository}")
        if self.down:
            raise InfraError(f"registry {repository}: connection refused")
        return self.tags_

    def digest(self, repository: str, tag: str) -> str:
        self.asked.append(f"digest {tag}")
        return digest(tag)

    def versions(self, package: str) -> tuple[Sequence[str], Sequence[LeftOut]]:
        self.asked.append(f"versions {package}")
        return ("0.30.0", "0.31.0", "0.32.0"), (LeftOut("0.29.0", "pins torch==2.1+cpu"),)


def test_a_resolution_locks_each_tag_taken_with_its_digest_and_every_other_with_why(
    tmp_path: Path,
) -> None:
    matrix, _ = setup(tmp_path, FOLLOWING)
    lock = resolve(matrix, Answers())
    locked = lock.lanes[Lane.GPU]
    assert [(i.tag, i.digest) for i in locked.images] == [
        (tag, digest(tag)) for tag in ("v0.31.0", "v0.32.0", "nightly")
    ]
    assert {o.tag for o in locked.left_out} == {"v0.30.0", "v0.31.1rc0", "latest"}
    assert locked.source == "mirror.example/vllm/vllm-openai"


def test_the_lock_pins_each_gpu_image_to_its_digest(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path, FOLLOWING)
    locked = apply_lock(matrix, resolve(matrix, Answers()))
    images = {i.tag: i for i in locked.lanes[Lane.GPU].images}
    assert images["v0.32.0"].ref == f"mirror.example/vllm/vllm-openai@{digest('v0.32.0')}"
    assert images["nightly"].pull is PullPolicy.MISSING  # a digest never moves
    assert images["nightly"].version is None and str(images["v0.31.0"].version) == "0.31.0"
    tags = {cell.image.tag for cell in plan(locked, scenarios)}
    assert tags == {"v0.31.0", "v0.32.0", "nightly"}


def test_the_cpu_lane_follows_the_versions_that_install_here(tmp_path: Path) -> None:
    text = """
    lanes:
      cpu:
        images: {follow: ">=0.30,<0.32"}
        gpus: {cpu: {runner: ubuntu-latest, count: 0}}
        models: {m: {source: tiny-llama}}
    """
    matrix, _ = setup(tmp_path, text, {"healthy": BASELINE})
    locked = resolve(matrix, Answers()).lanes[Lane.CPU]
    assert [(i.tag, i.digest) for i in locked.images] == [("0.30.0", None), ("0.31.0", None)]
    assert set(locked.left_out) == {
        LeftOut("0.29.0", "pins torch==2.1+cpu"),
        LeftOut("0.32.0", "outside `>=0.30,<0.32`"),
    }


def test_a_rule_that_takes_no_tag_is_bad_input_at_the_rule(tmp_path: Path) -> None:
    matrix, _ = setup(tmp_path, FOLLOWING.replace(">=0.31", ">=0.40"))
    with pytest.raises(ConfigError) as caught:
        resolve(matrix, Answers(tags=("v0.31.0", "latest")))
    [problem] = caught.value.problems
    assert problem.file.endswith("matrix.yaml") and problem.line == 4
    assert "takes none of the tags of mirror.example/vllm/vllm-openai: 2 offered" in str(problem)
    assert "v0.31.0: outside `>=0.40`" in str(problem) and "latest: not a version" in str(problem)


def test_a_registry_that_does_not_answer_is_an_infra_error_never_an_empty_matrix(
    tmp_path: Path,
) -> None:
    matrix, _ = setup(tmp_path, FOLLOWING)
    with pytest.raises(InfraError, match="connection refused"):
        resolve(matrix, Answers(down=True))


def test_a_lock_is_read_back_as_written_and_holds_for_its_rule_only(tmp_path: Path) -> None:
    matrix, _ = setup(tmp_path, FOLLOWING)
    lock = resolve(matrix, Answers())
    write_lock(tmp_path / "m.lock.json", lock)
    again = read_lock(tmp_path / "m.lock.json")
    assert again.to_json() == lock.to_json()
    assert stale_lanes(matrix, again) == ()
    other, _ = setup(tmp_path / "other", FOLLOWING.replace(">=0.31", ">=0.32"))
    assert stale_lanes(other, again) == (Lane.GPU,)


def test_a_restricted_lock_holds_one_tag(tmp_path: Path) -> None:
    matrix, _ = setup(tmp_path, FOLLOWING)
    only = restricted(resolve(matrix, Answers()), Lane.GPU, ["v0.32.0"])
    assert [i.tag for i in only.lanes[Lane.GPU].images] == ["v0.32.0"]
    assert stale_lanes(matrix, only) == ()


@pytest.mark.parametrize(
    "text",
    ["not json", '{"schema_version": 99, "lanes": {}}', '{"schema_version": 1, "lanes": 3}',
     '{"schema_version": 1, "matrix": "m", "resolved_at": "t", "lanes": {"gpu": '
     '{"rule": {}, "source": "s", "images": [{"tag": "v1", "digest": "md5:x"}]}}}'],
)  # fmt: skip
def test_a_lock_this_tool_did_not_write_is_named(tmp_path: Path, text: str) -> None:
    (tmp_path / "bad.lock.json").write_text(text)
    with pytest.raises(UsageError, match=r"bad.lock.json: not a lock file .* --relock"):
        read_lock(tmp_path / "bad.lock.json")


def load_locked(
    folder: Path,
    locking: Locking,
    upstream: Callable[[], Answers],
    note: Callable[[str], None] | None = None,
) -> tuple[Matrix, Locked]:
    """The run's steps: the matrix loaded, its lock read or resolved, the lock applied."""
    matrix, _scenarios = load_inputs(folder / "matrix.yaml", folder / "scenarios")
    locked = lock_for(matrix, locking, upstream, note)
    return apply_lock(matrix, locked.lock), locked


def test_a_shard_reads_the_lock_and_asks_upstream_nothing(tmp_path: Path) -> None:
    setup(tmp_path, FOLLOWING, {"moe-rank": MOE_SCENARIO})
    first = Answers()
    planned, lock = load_locked(tmp_path, Locking(), lambda: first)
    assert lock.fresh and lock.path == tmp_path / "matrix.lock.json"
    assert first.asked  # the plan asked
    # A tag appears upstream: the shard still sees what the plan locked.
    later = Answers(tags=(*TAGS, "v0.33.0"))
    shard, again = load_locked(tmp_path, Locking(), lambda: later)
    assert later.asked == [] and not again.fresh
    assert shard.lanes[Lane.GPU].images == planned.lanes[Lane.GPU].images
    relocked, _ = load_locked(tmp_path, Locking(relock=True), lambda: later)
    assert "v0.33.0" in {i.tag for i in relocked.lanes[Lane.GPU].images}


def test_a_lock_for_another_rule_is_resolved_again(tmp_path: Path) -> None:
    setup(tmp_path, FOLLOWING, {"moe-rank": MOE_SCENARIO})
    load_locked(tmp_path, Locking(), Answers)
    write(tmp_path, "matrix.yaml", FOLLOWING.replace(">=0.31", ">=0.32"))
    said: list[str] = []
    matrix, again = load_locked(tmp_path, Locking(), Answers, said.append)
    assert again.fresh and "resolved for other rules (lanes gpu)" in said[0]
    assert {i.tag for i in matrix.lanes[Lane.GPU].images} == {"v0.32.0", "nightly"}


def test_a_matrix_that_lists_its_images_never_touches_a_lock(tmp_path: Path) -> None:
    setup(tmp_path, GPU_LANE, {"moe-rank": MOE_SCENARIO})

    def never() -> Answers:
        raise AssertionError("a listed matrix plans offline")

    _matrix, listed = load_locked(tmp_path, Locking(), never)
    assert listed.lock is None and not (tmp_path / "matrix.lock.json").exists()


def test_plan_shows_the_tags_the_rule_gave_and_why_others_were_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setup(tmp_path, FOLLOWING, {"moe-rank": MOE_SCENARIO})
    matrix, _ = setup(tmp_path, FOLLOWING, {"moe-rank": MOE_SCENARIO})
    write_lock(tmp_path / "matrix.lock.json", resolve(matrix, Answers()))
    argv = ["plan", "--matrix", str(tmp_path / "matrix.yaml"), "--scenarios",
            str(tmp_path / "scenarios")]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    head = out.split("\n\n")[0].splitlines()
    assert head[0].startswith("lane gpu follows mirror.example/vllm/vllm-openai `>=0.31`")
    assert f"  v0.32.0  {digest('v0.32.0')}" in head
    assert "  left out, outside `>=0.31`: v0.30.0" in head
    assert "  left out, a pre-release (release_candidates: false): v0.31.1rc0" in head
    assert main([*argv, "--format", "github"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["include"]  # machine output stays machine output
    assert "repromatrix: lane gpu follows" in captured.err


def test_a_shard_pulls_each_gpu_image_by_the_digest_its_lock_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix, _ = setup(tmp_path, FOLLOWING, {"moe-rank": MOE_SCENARIO})
    write_lock(tmp_path / "matrix.lock.json", resolve(matrix, Answers()))
    argv = ["run", "--dry-run", "--backend", "docker", "--lane", "gpu", "--matrix",
            str(tmp_path / "matrix.yaml"), "--scenarios", str(tmp_path / "scenarios"),
            "--results", str(tmp_path / "results")]  # fmt: skip
    assert main(argv) == 0
    described = json.loads(capsys.readouterr().out)
    pulls = {c["ref"]: c["if"] for i in described["images"] for c in i["calls"]
             if c["call"] == "images.pull"}  # fmt: skip
    registry = "mirror.example/vllm/vllm-openai"
    assert pulls == {
        f"{registry}@{digest(t)}": "ref missing" for t in ("v0.31.0", "v0.32.0", "nightly")
    }
