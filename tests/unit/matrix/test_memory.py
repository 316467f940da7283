"""The memory estimate: its arithmetic, seed 000's cell on an 80 GB H100, missing facts as
warnings, and what ``plan`` prints of it."""

from __future__ import annotations

import json
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
from repromatrix.model import DTYPE_BYTES, Cell, FlagValue, Gpu, Lane, Level, Model, frozen_flags
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


def test_seed_000_does_not_fit_one_80_gb_h100() -> None:
    found = estimated(gpu_cell(SEED_000))
    assert found.weights == 30_532_122_624 * 2  # 56.9 GiB of bf16
    # vLLM's MoE LoRA buffers: 48 layers x 128 experts x rank 320 x 3 x (2048 + 768), bf16.
    assert found.lora == 48 * 128 * 320 * 3 * (2048 + 768) * 2  # 30.9 GiB
    assert found.kv_cache == 4096 * 2 * 48 * 4 * 128 * 2  # head_dim 128, not 2048 / 32
    assert found.budget is not None
    assert found.budget.bytes == 78_679_145_186  # ceil(81559 MiB x 0.92): 73.3 GiB
    assert found.fit is Fit.INFEASIBLE and found.missing == ()
    assert round(found.need / GIB, 1) == 88.2
    assert table_text(found) == "infeasible:56.9+30.9+0.4=88.2>73.3"
    assert infeasible_reason(gpu_cell(SEED_000)) == (
        "infeasible: needs at least 88.2 GiB of GPU memory (weights 56.9 + LoRA buffers 30.9 "
        "+ KV cache 0.4), more than the 73.3 GiB vLLM may use (79.6 GiB reported x "
        "gpu_memory_utilization 0.92 x 1 GPU)"
    )


def test_rank_128_and_two_gpus_fit() -> None:
    rank_128 = estimated(gpu_cell({**SEED_000, "max_lora_rank": 128}))
    assert rank_128.lora == 48 * 128 * 128 * 3 * (2048 + 768) * 2
    assert rank_128.fit is Fit.FITS and infeasible_reason(gpu_cell({"max_lora_rank": 128})) is None
    two = replace(H100, name="h100x2", count=2)
    tp2 = estimated(gpu_cell({**SEED_000, "tensor_parallel_size": 2}, gpu=two))
    assert tp2.budget is not None and tp2.budget.gpus == 2
    assert tp2.need == estimated(gpu_cell(SEED_000)).need  # the sum over GPUs, at least
    assert tp2.fit is Fit.FITS


def test_fully_sharded_loras_at_tp1_still_allocates_every_buffer() -> None:
    sharded = estimated(gpu_cell({**SEED_000, "fully_sharded_loras": True}))
    assert sharded.lora == estimated(gpu_cell(SEED_000)).lora and sharded.fit is Fit.INFEASIBLE


def test_lora_buffers_need_lora_and_experts() -> None:
    assert estimated(gpu_cell({**SEED_000, "enable_lora": False})).lora == 0
    dense = replace(QWEN3_30B, moe=False)
    assert estimated(gpu_cell(SEED_000, model=dense)).lora == 0
    shared = estimated(gpu_cell({**SEED_000, "enable_moe_shared_loras": True}))
    # One w13 lora_A (2 x r x H) and one w2 lora_B (H x r) for all experts.
    per_layer = 320 * (3 * 2048 + 3 * 128 * 768)
    assert shared.lora == 48 * per_layer * 2
    # An architecture not known to have two LoRA slices gets the smallest layout vLLM has
    # (one slice: non-gated experts), 2/3 of Qwen3's.
    other = replace(QWEN3_30B, architecture="Qwen3_5MoeForConditionalGeneration")
    assert estimated(gpu_cell(SEED_000, model=other)).lora == 48 * 128 * 320 * 2 * 2816 * 2
    assert estimated(gpu_cell(SEED_000, model=replace(QWEN3_30B, architecture=None))).lora == (
        48 * 128 * 320 * 2 * 2816 * 2
    )
    two_slots = estimated(gpu_cell({**SEED_000, "max_loras": 2, "lora_dtype": "float16"}))
    assert two_slots.lora == 2 * estimated(gpu_cell(SEED_000)).lora
    some_layers = replace(QWEN3_30B, moe_layers=45)
    assert estimated(gpu_cell(SEED_000, model=some_layers)).lora == 45 * 128 * 320 * 3 * 2816 * 2


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
    assert fixed.kv_cache == 8 * GIB  # kv_cache_memory_bytes is per GPU
    assert fixed.budget is not None and fixed.budget.utilization is None
    assert fixed.budget.bytes == 2 * 81559 * 2**20


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
    assert table_text(found) == "unknown:?+?+?=?/73.3"
    assert infeasible_reason(gpu_cell(SEED_000, model=bare)) is None


def test_known_parts_alone_can_rule_a_cell_out() -> None:
    big = Model("big", Lane.GPU, "org/big", num_parameters=122_000_000_000)
    found = estimated(gpu_cell({}, model=big))
    assert found.kv_cache is None and found.missing
    assert found.fit is Fit.INFEASIBLE  # 227 GiB of weights on one H100, whatever the rest
    assert table_text(found) == "infeasible:227.2+0.0+?=227.2>73.3"


def test_probes_and_the_cpu_lane() -> None:
    probe = replace(gpu_cell(SEED_000), level=Level.PROBE)
    assert estimate(probe) is None and infeasible_reason(probe) is None
    assert table_text(None) == "-"
    tiny = replace(factories.TINY, num_parameters=1_419_008)
    cpu = estimated(factories.cell(Lane.CPU, model=tiny, flags={"kv_cache_memory_bytes": 2**26}))
    assert cpu.budget is None and cpu.missing == () and cpu.fit is Fit.UNKNOWN
    assert (cpu.weights, cpu.kv_cache) == (2_838_016, 2**26)


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
    # Seed 000 at TP4 on four H200s: the parts are the TP1 figures summed over the GPUs.
    assert cell["memory"] == {
        "fit": "fits",
        "need_bytes": 94_685_786_112,
        "weights_bytes": 61_064_245_248,
        "lora_bytes": 33_218_887_680,
        "kv_cache_bytes": 402_653_184,
        "budget_bytes": 554_777_737_956,
        "reported_bytes_per_gpu": 143771 * 2**20,
        "gpu_memory_utilization": 0.92,
        "gpus": 4,
        "missing": [],
    }
    assert captured.err == ""  # Qwen3-30B-A3B's facts are all in matrix.yaml
    assert main([*common, "--only", "gpu/v0.31.0/h200x4/*/moe-lora-rank-over-128/*"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[9] == "memory"
    memory = {line.split()[6] + "@" + line.split()[7]: line.split()[9] for line in table[1:-4]}
    assert memory == {
        "trigger@engine": "fits:56.9+30.9+0.4=88.2<=516.7",
        "rank-128@engine": "fits:56.9+12.4+0.4=69.6<=516.7",
        "fully-sharded-loras@engine": "fits:56.9+30.9+0.4=88.2<=516.7",
    }
    assert not table[-1].endswith("infeasible (memory)")


def test_plan_warns_with_file_and_line(capsys: pytest.CaptureFixture[str]) -> None:
    matrix = ROOT / "matrix.yaml"
    assert (
        main(["plan", "--matrix", str(matrix), "--only", "gpu/v0.32.0/h100/gemma-4-e2b-it/*"]) == 0
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
    assert (infeasible_reason(one_h100) or "").startswith("infeasible: needs at least 88.2 GiB")
