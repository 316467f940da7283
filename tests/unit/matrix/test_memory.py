"""The memory estimate: its arithmetic, seed 000's cell on an 80 GB H100, missing facts as
warnings, and what ``plan`` prints of it."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from repromatrix.cli import main
from repromatrix.fleet.jobs import plan_jobs
from repromatrix.matrix.conditions import kv_cache_bytes_needed
from repromatrix.matrix.config import load_matrix
from repromatrix.matrix.config_facts import missing_hint
from repromatrix.matrix.expand import plan
from repromatrix.matrix.inputs import load_inputs
from repromatrix.matrix.memory import (
    GIB,
    WEIGHT_BITS,
    Fit,
    MemoryEstimate,
    estimate,
    infeasible_reason,
    memory_problems,
    table_text,
)
from repromatrix.matrix.selector import Selector
from repromatrix.values import DTYPE_BYTES, Cell, FlagValue, Gpu, Lane, Level, Model, frozen_flags
from support import factories, paths
from support.matrix import GPU_LANE, setup

ROOT = paths.ROOT
# Qwen/Qwen3-30B-A3B's config.json, as matrix.yaml gives it.
QWEN3_30B = Model(
    "qwen3-30b-a3b",
    Lane.GPU,
    "Qwen/Qwen3-30B-A3B",
    moe=True,
    architecture="Qwen3MoeForCausalLM",
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    moe_intermediate_size=768,
    max_position_embeddings=40960,
    num_parameters=30_532_122_624,
)
H100 = Gpu("h100", Lane.GPU, "gpu-h100", 1, "9.0", 80, usable_memory_mib=81559)
SEED_000: Mapping[str, FlagValue] = {
    "enable_lora": True,
    "max_lora_rank": 320,
    "max_loras": 1,
    "max_model_len": 4096,
}
SEED_000_CELL = "gpu/v0.31.0/h200x4/qwen3-30b-a3b/default/moe-lora-rank-over-128/trigger"


def gpu_cell(
    flags: Mapping[str, FlagValue],
    model: Model = QWEN3_30B,
    gpu: Gpu = H100,
    version: str = "0.31.0",
) -> Cell:
    return factories.cell(Lane.GPU, model=model, gpu=gpu, flags=flags, version=version)


def estimated(cell: Cell) -> MemoryEstimate:
    found = estimate(cell)
    assert found is not None
    return found


# Seed 000's flags on Qwen3-30B-A3B, per layer on one rank of TP ``tp`` (bf16 elements):
def experts_lora(tp: int, rank: int = 320) -> int:
    # w13_lora_a 2 x (E, r, H) and w2_lora_b (E, H, r) whole; w13_lora_b 2 x (E, I/tp, r) and
    # w2_lora_a (E, r, I/tp) split (vllm/lora/layers/fused_moe.py, 0.31.0 lines 162-222).
    inner = 768 // tp
    return 2 * 128 * rank * 2048 + 128 * 2048 * rank + 2 * 128 * inner * rank + 128 * rank * inner


def attention_lora(tp: int, rank: int = 320) -> int:
    q_out, kv_out = 4096 // tp, max(4 // tp, 1) * 128
    qkv = 3 * rank * 2048 + (q_out + 2 * kv_out) * rank
    return qkv + rank * q_out + 2048 * rank  # o_proj: lora_A of the rank's heads, lora_B of H


ROUTER_LORA = 320 * (2048 + 128)  # the replicated gate's ReplicatedLinearWithLoRA
ENABLED = 4 * (1 + 1)  # FusedMoEWithLoRA's adapter_enabled: int32, max_loras + 1 (bytes)
# Kept whole on every rank: the router (E x H) of 48 layers and 97 RMSNorms of H.
WHOLE = 48 * 128 * 2048 + 97 * 2048


def test_seed_000_does_not_fit_one_80_gb_h100() -> None:
    found = estimated(gpu_cell(SEED_000))
    assert found.weights == 30_532_122_624 * 2  # 56.9 GiB of bf16
    assert found.lora == 48 * (experts_lora(1) + ROUTER_LORA + attention_lora(1)) * 2 + 48 * ENABLED
    assert experts_lora(1) == 128 * 320 * 3 * (2048 + 768)  # the three expert matrices
    assert found.kv_cache == 4096 * 2 * 48 * 4 * 128 * 2  # head_dim 128, not 2048 / 32
    assert found.budget is not None and found.ranks == 1
    assert found.budget.bytes == 78_679_145_186  # ceil(81559 MiB x 0.92): 73.3 GiB
    assert found.fit is Fit.INFEASIBLE and found.missing == ()
    assert round(found.need / GIB, 1) == 88.7
    assert table_text(found) == "infeasible:56.9+31.5+0.4=88.7>73.3/GPU,x1"
    assert infeasible_reason(gpu_cell(SEED_000)) == (
        "infeasible: its GPU needs at least 88.7 GiB (weights 56.9 + LoRA buffers 31.5 "
        "+ KV cache 0.4), more than the 73.3 GiB vLLM may use on one GPU (79.6 GiB reported x "
        "gpu_memory_utilization 0.92)"
    )


H200X4 = Gpu("h200x4", Lane.GPU, "gpu-h200x4", 4, "9.0", 141, usable_memory_mib=143771)
# nvidia-smi of an L4 (../shared/nvidia-smi/plain-l4-idle.txt): 23034 MiB.
L4X8 = Gpu("l4x8", Lane.GPU, "gpu-l4x8", 8, "8.9", 24, usable_memory_mib=23034)


def test_seed_000_at_tp4_per_gpu_of_one_h200() -> None:
    found = estimated(gpu_cell({**SEED_000, "tensor_parallel_size": 4}, gpu=H200X4))
    assert found.ranks == 4
    assert found.weights == ((30_532_122_624 - WHOLE) // 4 + WHOLE) * 2  # 14.2 GiB
    assert found.lora == 48 * (experts_lora(4) + ROUTER_LORA + attention_lora(4)) * 2 + 48 * ENABLED
    assert found.kv_cache == 4096 * 2 * 48 * 1 * 128 * 2  # one of the 4 KV heads per rank
    assert found.budget is not None and found.budget.bytes == math.ceil(143771 * 2**20 * 0.92)
    assert 35 * GIB < found.need < 45 * GIB and found.fit is Fit.FITS
    assert table_text(found) == "fits:14.2+25.0+0.1=39.3<=129.2/GPU,x4"


def test_eight_l4s_cannot_hold_seed_000_at_tp8() -> None:
    found = estimated(gpu_cell({**SEED_000, "tensor_parallel_size": 8}, gpu=L4X8))
    # 4 KV heads on 8 ranks: each rank holds one whole (K and V of 128 x 2048 per layer).
    kv_extra = 48 * 2 * 128 * 2048 - 48 * 2 * 128 * 2048 * 4 // 8
    assert found.weights == ((30_532_122_624 - WHOLE) // 8 + WHOLE + kv_extra) * 2
    assert found.lora == 48 * (experts_lora(8) + ROUTER_LORA + attention_lora(8)) * 2 + 48 * ENABLED
    assert found.kv_cache == 4096 * 2 * 48 * 1 * 128 * 2  # replicated, not a half head
    assert found.fit is Fit.INFEASIBLE  # 7.2 + 23.9 + 0.1 on each 20.7 GiB budget
    assert table_text(found) == "infeasible:7.2+23.9+0.1=31.1>20.7/GPU,x8"
    tp8 = gpu_cell({**SEED_000, "tensor_parallel_size": 8}, gpu=L4X8)
    assert infeasible_reason(tp8) == (
        "infeasible: each of its 8 GPUs (TP x PP) needs at least 31.1 GiB (weights 7.2 + LoRA "
        "buffers 23.9 + KV cache 0.1), more than the 20.7 GiB vLLM may use on one GPU (22.5 GiB "
        "reported x gpu_memory_utilization 0.92)"
    )


def test_pipeline_stages_divide_the_layers() -> None:
    flags = {**SEED_000, "tensor_parallel_size": 2, "pipeline_parallel_size": 2}
    found = estimated(gpu_cell(flags, gpu=H200X4))
    assert found.ranks == 4
    assert found.weights == ((30_532_122_624 - WHOLE) // 2 + WHOLE) // 2 * 2
    assert (
        found.lora
        == (48 * (experts_lora(2) + ROUTER_LORA + attention_lora(2)) * 2 + 48 * ENABLED) // 2
    )
    assert found.kv_cache == 4096 * 2 * 48 * 2 * 128 * 2 // 2


def test_expert_parallel_divides_the_experts_not_their_width() -> None:
    flags = {**SEED_000, "tensor_parallel_size": 4, "enable_expert_parallel": True}
    found = estimated(gpu_cell(flags, gpu=H200X4))
    experts = 32 * 320 * (2 * 2048 + 2 * 768 + 768 + 2048)  # 128 / 4 experts of I = 768
    assert found.lora == 48 * (experts + ROUTER_LORA + attention_lora(4)) * 2 + 48 * ENABLED


def test_rank_128_fits_one_h100() -> None:
    rank_128 = estimated(gpu_cell({**SEED_000, "max_lora_rank": 128}))
    router = 128 * (2048 + 128)
    per_layer = experts_lora(1, 128) + router + attention_lora(1, 128)
    assert rank_128.lora == 48 * per_layer * 2 + 48 * ENABLED
    assert rank_128.fit is Fit.FITS and infeasible_reason(gpu_cell({"max_lora_rank": 128})) is None


def test_fully_sharded_loras_divide_what_vllm_divides() -> None:
    sharded = estimated(gpu_cell({**SEED_000, "fully_sharded_loras": True}))
    assert sharded.lora == estimated(gpu_cell(SEED_000)).lora  # at TP1 nothing is divided
    tp4 = {**SEED_000, "tensor_parallel_size": 4, "fully_sharded_loras": True}
    found = estimated(gpu_cell(tp4, gpu=H200X4))
    # w13_lora_a's rank and w2_lora_b's H are divided; w2_lora_a and w13_lora_b as before.
    experts = 2 * 128 * 80 * 2048 + 128 * 512 * 320 + 2 * 128 * 192 * 320 + 128 * 320 * 192
    qkv = 3 * 80 * 2048 + (1024 + 2 * 128) * 320
    o_proj = 320 * 1024 + 512 * 320
    assert found.lora == 48 * (experts + ROUTER_LORA + qkv + o_proj) * 2 + 48 * ENABLED


def test_lora_buffers_need_lora() -> None:
    assert estimated(gpu_cell({**SEED_000, "enable_lora": False})).lora == 0
    dense = replace(QWEN3_30B, moe=False)
    # A dense model of the same shape: attention and gate_up/down LoRA, no experts or router.
    mlp = 2 * 320 * 2048 + 2 * 6144 * 320 + 320 * 6144 + 2048 * 320
    assert estimated(gpu_cell(SEED_000, model=dense)).lora == 48 * (attention_lora(1) + mlp) * 2
    two_slots = estimated(gpu_cell({**SEED_000, "max_loras": 2, "lora_dtype": "float16"}))
    # Twice the buffers; adapter_enabled grows by one int32 a layer.
    assert two_slots.lora == 2 * estimated(gpu_cell(SEED_000)).lora - 48 * 4
    some_layers = replace(QWEN3_30B, moe_layers=45)
    expected = 45 * (experts_lora(1) + ROUTER_LORA) + 48 * attention_lora(1) + 3 * mlp
    assert estimated(gpu_cell(SEED_000, model=some_layers)).lora == expected * 2 + 45 * ENABLED
    # Layers unknown, MoE layers given: no dense layers are made up (nor taken away).
    unknown_layers = replace(some_layers, num_hidden_layers=0, full_attention_layers=0)
    only_moe = 45 * (experts_lora(1) + ROUTER_LORA) * 2 + 45 * ENABLED
    assert estimated(gpu_cell(SEED_000, model=unknown_layers)).lora == only_moe


def test_shared_expert_loras_from_the_first_version_that_has_them() -> None:
    flags = {**SEED_000, "enable_moe_shared_loras": True}
    # One w13 lora_A (2 x r x H) and one w2 lora_B (H x r) for all experts.
    experts = 320 * (3 * 2048 + 3 * 128 * 768)
    shared = 48 * (experts + ROUTER_LORA + attention_lora(1)) * 2 + 48 * ENABLED
    assert estimated(gpu_cell(flags, version="0.27.1")).lora == shared
    assert estimated(gpu_cell(flags, version="0.32.0")).lora == shared
    # 0.22.1's LoRAConfig has no such field: every expert keeps its buffers.
    assert estimated(gpu_cell(flags, version="0.22.1")).lora == estimated(gpu_cell(SEED_000)).lora


def test_an_unknown_architecture_counts_only_the_experts() -> None:
    # The smallest layout vLLM has (one slice: non-gated experts), 2/3 of Qwen3's, and no
    # attention, router or replicated weights (a lower bound).
    other = replace(QWEN3_30B, architecture="Qwen3_5MoeForConditionalGeneration")
    assert (
        estimated(gpu_cell(SEED_000, model=other)).lora
        == 48 * 128 * 320 * 2 * 2816 * 2 + 48 * ENABLED
    )
    unnamed = replace(QWEN3_30B, architecture=None)
    assert (
        estimated(gpu_cell(SEED_000, model=unnamed)).lora
        == 48 * 128 * 320 * 2 * 2816 * 2 + 48 * ENABLED
    )
    tp4 = estimated(gpu_cell({"tensor_parallel_size": 4}, model=unnamed, gpu=H200X4))
    assert tp4.weights == 30_532_122_624 // 4 * 2


def test_weights_follow_the_dtype() -> None:
    fp8 = replace(QWEN3_30B, dtype="fp8")
    assert estimated(gpu_cell({}, model=fp8)).weights == 30_532_122_624
    assert estimated(gpu_cell({"dtype": "float32"})).weights == 30_532_122_624 * 4
    assert estimated(gpu_cell({"dtype": "float32"}, model=fp8)).weights == 30_532_122_624
    assert estimated(gpu_cell({}, model=replace(fp8, dtype="nvfp4"))).weights == 30_532_122_624 // 2
    quantized = estimated(gpu_cell({"quantization": "fp8"}))
    assert quantized.weights is None and quantized.missing == () and quantized.fit is Fit.UNKNOWN
    assert set(WEIGHT_BITS) == set(DTYPE_BYTES)


def test_the_kv_cache_of_one_request() -> None:
    per_token = 2 * 48 * 4 * 128 * 2
    assert estimated(gpu_cell({"max_model_len": 8192})).kv_cache == 8192 * per_token
    assert estimated(gpu_cell({})).kv_cache == 40960 * per_token  # max_position_embeddings
    assert estimated(gpu_cell({"max_model_len": 8192, "kv_cache_dtype": "fp8_e4m3"})).kv_cache == (
        8192 * per_token // 2
    )
    assert estimated(gpu_cell({"kv_cache_dtype": "turboquant_3bit_nc"})).kv_cache is None
    sliding = replace(QWEN3_30B, full_attention_layers=12)
    assert estimated(gpu_cell({"max_model_len": 8192}, model=sliding)).kv_cache == (
        8192 * per_token // 4
    )
    assert estimated(gpu_cell({}, model=replace(QWEN3_30B, full_attention_layers=0))).kv_cache == 0
    # The trigger fact is the same arithmetic.
    assert kv_cache_bytes_needed(QWEN3_30B, {"max_model_len": 8192}) == 8192 * per_token
    # Without head_dim the KV cache is unknown: 2048 / 32 = 64 would halve it (it is 128).
    no_head_dim = replace(QWEN3_30B, head_dim=0)
    assert kv_cache_bytes_needed(no_head_dim, {"max_model_len": 8192}) is None


def test_a_fixed_kv_cache_takes_the_whole_memory() -> None:
    fixed = estimated(gpu_cell({"kv_cache_memory_bytes": 4 * GIB, "tensor_parallel_size": 2}))
    assert fixed.kv_cache == 4 * GIB and fixed.ranks == 2  # kv_cache_memory_bytes is per GPU
    assert fixed.budget is not None and fixed.budget.utilization is None
    assert fixed.budget.bytes == 81559 * 2**20  # one GPU's whole memory


def test_the_budget_follows_utilization_and_the_image() -> None:
    def budget(cell: Cell) -> float | None:
        found = estimated(cell).budget
        assert found is not None
        return found.utilization

    assert budget(gpu_cell({}, version="0.31.0")) == 0.92
    assert budget(gpu_cell({}, version="0.19.1")) == 0.9
    assert budget(gpu_cell({}, version="0.20.0rc1")) == 0.92
    nightly = replace(gpu_cell({}), image=replace(gpu_cell({}).image, version=None))
    assert budget(nightly) == 0.92
    assert budget(gpu_cell({"gpu_memory_utilization": 0.5})) == 0.5
    marketing = estimated(gpu_cell({}, gpu=replace(H100, usable_memory_mib=0))).budget
    assert marketing is not None and marketing.per_gpu == 80 * GIB
    nothing = estimated(gpu_cell({}, gpu=replace(H100, usable_memory_mib=0, memory_gib=0)))
    assert nothing.budget is None and nothing.missing == ("gpu.usable_memory_mib",)


def test_missing_facts_leave_the_cell_unknown_and_are_named() -> None:
    bare = Model("bare", Lane.GPU, "org/bare", moe=True)
    found = estimated(gpu_cell(SEED_000, model=bare))
    assert found.fit is Fit.UNKNOWN and found.parts == (None, None, None)
    assert found.missing == (
        "model.num_parameters",
        "model.num_experts",
        "model.moe_intermediate_size",
        "model.hidden_size",
        "model.num_hidden_layers",
        "model.head_dim",
        "model.num_key_value_heads",
    )
    assert table_text(found) == "unknown:?+?+?=?/73.3/GPU,x1"
    assert infeasible_reason(gpu_cell(SEED_000, model=bare)) is None


def test_known_parts_alone_can_rule_a_cell_out() -> None:
    big = Model("big", Lane.GPU, "org/big", num_parameters=122_000_000_000)
    found = estimated(gpu_cell({}, model=big))
    assert found.kv_cache is None and found.missing
    assert found.fit is Fit.INFEASIBLE  # 227 GiB of weights on one H100, whatever the rest
    assert table_text(found) == "infeasible:227.2+0.0+?=227.2>73.3/GPU,x1"


def test_probes_and_the_cpu_lane() -> None:
    probe = replace(gpu_cell(SEED_000), level=Level.PROBE)
    assert estimate(probe) is None and infeasible_reason(probe) is None
    assert table_text(None) == "-"
    tiny = replace(factories.TINY, num_parameters=1_419_008)
    cpu = estimated(factories.cell(Lane.CPU, model=tiny, flags={"kv_cache_memory_bytes": 2**26}))
    assert cpu.budget is None and cpu.missing == () and cpu.fit is Fit.UNKNOWN
    assert (cpu.weights, cpu.kv_cache) == (2_838_016, 2**26)
    assert table_text(cpu) == "host:0.0+0.0+0.1=0.1"  # no GPU, no GPU's budget


MATRIX = GPU_LANE.replace(
    "moe: {source: org/moe, moe: true}",
    "moe: {source: org/moe, moe: true, num_parameters: 30532122624}",
).replace("memory_gib: 80}", "memory_gib: 80, usable_memory_mib: 81559}")


# Where a model's facts would come from: this matrix sets no HF cache.
HINT = (
    "or set the GPU lane's runtime.hf_cache to a cache holding its files (config.json, and "
    "for the weights model.safetensors.index.json or *.safetensors)"
)


def test_missing_facts_are_warnings_at_the_model_line(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path, MATRIX)
    cells = plan(matrix, scenarios, Lane.GPU, Selector(["gpu/v0.31.0/*"]))
    problems = memory_problems(cells, "matrix.yaml")
    lines = (tmp_path / "matrix.yaml").read_text().splitlines()
    moe_line = next(n for n, text in enumerate(lines, 1) if text.strip().startswith("moe:"))
    dense_line = next(n for n, text in enumerate(lines, 1) if text.strip().startswith("dense:"))
    assert [str(p) for p in problems] == [
        f"matrix.yaml:{moe_line}: model `moe`: too few facts to estimate the memory of its "
        "cells; give `hidden_size`, `num_hidden_layers`, `num_key_value_heads`, "
        f"`max_position_embeddings`, `head_dim`, `num_experts`, `moe_intermediate_size`, {HINT}; "
        "its cells are planned with memory unknown",
        f"matrix.yaml:{dense_line}: model `dense`: too few facts to estimate the memory of its "
        "cells; give `num_hidden_layers`, `num_key_value_heads`, `max_position_embeddings`, "
        f"`head_dim`, `num_parameters`, {HINT}; its cells are planned with memory unknown",
    ]


def test_infeasible_cells_get_no_ci_job(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path, MATRIX)
    planned = plan(matrix, scenarios, Lane.GPU)
    cells = [replace(c, model=QWEN3_30B) if c.model.name == "moe" else c for c in planned]
    out = {c.id for c in cells if infeasible_reason(c) is not None}
    assert out  # rank 320 on one H100 (and on the 48 GB card)
    jobs = plan_jobs(cells, [c.id for c in cells])
    ran = [c.id for c in cells for job in jobs if Selector(list(job.only)).matches(c.id)]
    assert sorted(ran) == sorted({c.id for c in cells} - out)  # the others, each once


def test_plan_prints_the_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    common = ["plan", "--matrix", str(ROOT / "matrix.yaml"), "--scenarios", str(ROOT / "scenarios")]
    assert main([*common, "--json", "--only", SEED_000_CELL]) == 0
    captured = capsys.readouterr()
    [cell] = json.loads(captured.out)
    # Seed 000 at TP4 on four H200s: each GPU's share against one H200's budget.
    assert cell["memory"] == {
        "fit": "fits",
        "per": "gpu",
        "need_bytes": 42_199_296_384,
        "weights_bytes": ((30_532_122_624 - WHOLE) // 4 + WHOLE) * 2,
        "lora_bytes": 48 * (experts_lora(4) + ROUTER_LORA + attention_lora(4)) * 2 + 48 * ENABLED,
        "kv_cache_bytes": 4096 * 2 * 48 * 1 * 128 * 2,
        "budget_bytes": math.ceil(143771 * 2**20 * 0.92),
        "reported_bytes_per_gpu": 143771 * 2**20,
        "gpu_memory_utilization": 0.92,
        "ranks": 4,
        "missing": [],
    }
    assert 35 * GIB < cell["memory"]["need_bytes"] < 45 * GIB  # issue 30's figure: 39.3 GiB
    assert captured.err == ""  # Qwen3-30B-A3B's facts are all in matrix.yaml
    assert main([*common, "--only", "gpu/v0.31.0/h200x4/*/moe-lora-rank-over-128/*"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[9] == "memory"
    memory = {line.split()[6] + "@" + line.split()[7]: line.split()[9] for line in table[1:-4]}
    assert memory == {
        "trigger@engine": "fits:14.2+25.0+0.1=39.3<=129.2/GPU,x4",
        "rank-128@engine": "fits:14.2+10.0+0.1=24.3<=129.2/GPU,x4",
        "fully-sharded-loras@engine": "fits:14.2+7.9+0.1=22.3<=129.2/GPU,x4",
    }
    assert "memory (GiB, per GPU)" in table[-2]
    assert not table[-1].endswith("infeasible (memory)")


def test_plan_warns_with_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The default matrix without gemma's parameter count: one warning at its line."""
    text = ROOT.joinpath("matrix.yaml").read_text()
    given = "        num_parameters: 4308598784\n"
    assert given in text
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(text.replace(given, ""))
    only = "gpu/v0.32.0/h100/gemma-4-e2b-it/*"
    assert (
        main(
            [
                "plan",
                "--matrix",
                str(matrix),
                "--scenarios",
                str(ROOT / "scenarios"),
                "--only",
                only,
            ]
        )
        == 0
    )
    err = capsys.readouterr().err.splitlines()
    line = next(
        n for n, text in enumerate(matrix.read_text().splitlines(), 1) if "gemma-4-e2b-it:" in text
    )
    # The rest of its facts are typed from its config.json; its weights would be read from the
    # runner's HF cache (where they come from depends on this host's cache).
    gemma = next(
        m for m in load_matrix(matrix).lanes[Lane.GPU].models if m.name == "gemma-4-e2b-it"
    )
    assert err == [
        f"repromatrix: warning: {matrix}:{line}: model `gemma-4-e2b-it`: too few facts to "
        f"estimate the memory of its cells; give `num_parameters`, {missing_hint(gemma)}; its "
        "cells are planned with memory unknown"
    ]


def test_the_default_matrix_plans_seed_000_only_where_it_fits() -> None:
    matrix, scenarios = load_inputs(ROOT / "matrix.yaml", ROOT / "scenarios")
    selected = Selector(["gpu/*/*/*/*/moe-lora-rank-over-128/*"])
    engine = [c for c in plan(matrix, scenarios, Lane.GPU, selected) if c.level is Level.ENGINE]
    assert engine and {c.gpu.name for c in engine} == {"h200x4"}
    assert all(infeasible_reason(c) is None for c in engine)
    # The same trigger at TP1 on one 80 GB H100, where it was planned before, cannot fit.
    [trigger] = [c for c in engine if c.variant.name == "trigger" and c.image.tag == "v0.31.0"]
    assert trigger.model.head_dim == 128
    one_h100 = replace(
        trigger, gpu=H100, flags=frozen_flags({**trigger.flags, "tensor_parallel_size": 1})
    )
    assert (infeasible_reason(one_h100) or "").startswith(
        "infeasible: its GPU needs at least 88.7 GiB"
    )
