"""Small real matrix and scenario files for tests, written to a temporary folder."""

from __future__ import annotations

import textwrap
from pathlib import Path

from repromatrix.matrix.config import Matrix, load_matrix
from repromatrix.matrix.scenarios import load_scenarios
from repromatrix.values import Scenario

GPU_LANE = """
lanes:
  gpu:
    images: [v0.31.0, v0.31.1rc0, v0.32.0, nightly]
    gpus:
      h100: {runner: gpu-h100, count: 1, compute_capability: "9.0", memory_gib: 80}
      a6000: {runner: gpu-a6000, count: 1, compute_capability: "8.6", memory_gib: 48}
    models:
      moe: {source: org/moe, moe: true}
      dense: {source: org/dense, intermediate_size: 6144}
    flagsets:
      default: {}
      eager: {enforce_eager: true, max_lora_rank: 64}
"""

MOE_SCENARIO = """
id: moe-rank
title: MoE LoRA rank over 128
lanes: [gpu]
trigger:
  model.moe: true
  flags.enable_lora: true
  flags.max_lora_rank: {gt: 128}
  flags.fully_sharded_loras: {ne: true}
launch:
  flags: {enable_lora: true, max_lora_rank: 320}
  startup_timeout_s: 100
signatures: [{pattern: "fused_moe_lora_one_shot", process: EngineCore}]
affected: ">=0.31.0,<0.31.1rc0"
fixed: ">=0.31.1rc0"
variants:
  - {name: rank-128, kind: control, flags: {max_lora_rank: 128}}
  - {name: sharded, kind: workaround, flags: {fully_sharded_loras: true}}
avoided: ready and answered
"""

BASELINE = """
id: healthy
title: healthy
baseline: true
lanes: [gpu, cpu]
launch: {}
avoided: ready and answered
"""


def write(folder: Path, name: str, text: str) -> Path:
    """Write dedented ``text`` to ``folder/name`` and return the path."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def setup(
    folder: Path, matrix: str = GPU_LANE, scenarios: dict[str, str] | None = None
) -> tuple[Matrix, tuple[Scenario, ...]]:
    """Write a matrix and scenario files, load them with the real loaders."""
    chosen = scenarios if scenarios is not None else {"moe-rank": MOE_SCENARIO, "healthy": BASELINE}
    for name, text in chosen.items():
        write(folder / "scenarios", f"{name}.yaml", text)
    return load_matrix(write(folder, "matrix.yaml", matrix)), load_scenarios(folder / "scenarios")


def at(text: str, needle: str, occurrence: int = 1) -> str:
    """Return ``line:column`` of the n-th ``needle`` in ``text`` as ``write`` saves it."""
    seen = 0
    for number, line in enumerate(textwrap.dedent(text).lstrip().splitlines(), start=1):
        column = line.find(needle)
        while column >= 0:
            seen += 1
            if seen == occurrence:
                return f"{number}:{column + 1}"
            column = line.find(needle, column + 1)
    raise AssertionError(f"{needle!r} not found")
