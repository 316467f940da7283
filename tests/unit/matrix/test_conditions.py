"""Trigger facts and their arithmetic: seed 003's int32 boundary, the KV cache budget."""

from __future__ import annotations

from dataclasses import replace

import pytest

from repromatrix.matrix.conditions import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    INT32_LIMIT,
    Facts,
    compare,
    holds,
    kv_cache_bytes_needed,
    kv_cache_bytes_short,
    lora_overflow_tokens,
    lora_row_elements,
    lora_row_offset_elements,
    num_tokens,
    subject_problem,
    tensor_parallel_size,
)
from repromatrix.values import Condition, FlagValue, Gpu, Lane, Launch, Model, Op

GEMMA = Model(
    "gemma-4-e2b-it",
    Lane.GPU,
    "google/gemma-4-E2B-it",
    intermediate_size=6144,
    max_position_embeddings=131072,
    dtype="bfloat16",
    use_double_wide_mlp=True,
)
LLAMA = Model(
    "llama-3.1-8b",
    Lane.GPU,
    "meta-llama/Llama-3.1-8B-Instruct",
    intermediate_size=14336,
    max_position_embeddings=131072,
    dtype="bfloat16",
)
TINY = Model(
    "tiny-llama",
    Lane.CPU,
    "tiny-llama",
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
)
H100 = Gpu("h100", Lane.GPU, "gpu-h100", 1, "9.0", 80)
BLACKWELL = Gpu("rtx-pro-6000-blackwell", Lane.GPU, "x", 1, "12.0", 96)
NO_CHUNKING = {"enable_lora": True, "enable_chunked_prefill": False}


def test_seed_003_boundary_for_gemma_4_e2b() -> None:
    below = lora_row_offset_elements(GEMMA, {**NO_CHUNKING, "max_model_len": 87382})
    at = lora_row_offset_elements(GEMMA, {**NO_CHUNKING, "max_model_len": 87383})
    assert below is not None and at is not None
    # The double-wide KV-shared layers: a gate_up row of 2 * 12288 elements.
    assert below == 87381 * 24576 < INT32_LIMIT <= at == 87382 * 24576
    assert lora_overflow_tokens(GEMMA, {}) == 87383  # the seed's measured boundary


def test_the_row_offset_counts_elements_whatever_the_dtype() -> None:
    # The kernel's offset is row index x output_d0_stride, in elements (Triton's addptr):
    # a Llama 3 8B's gate_up row is 2 * 14336 = 28672 elements, in bf16 as in float32.
    for dtype in ("bfloat16", "float32"):
        llama = replace(LLAMA, dtype=dtype)
        below = lora_row_offset_elements(llama, {**NO_CHUNKING, "max_model_len": 74899})
        at = lora_row_offset_elements(llama, {**NO_CHUNKING, "max_model_len": 74900})
        assert below is not None and at is not None
        assert below == 74898 * 28672 < INT32_LIMIT <= at == 74899 * 28672
        assert lora_overflow_tokens(llama, {}) == 74900


def test_a_model_without_double_wide_layers_overflows_at_its_plain_width() -> None:
    # The seed's own reading of Gemma 4 E2B (2 * 6144 a row) would crash only from here.
    plain = replace(GEMMA, use_double_wide_mlp=False)
    assert lora_overflow_tokens(plain, {}) == 174764


def test_chunked_prefill_bounds_the_profile_run() -> None:
    long = {"enable_lora": True, "max_model_len": 100001}
    assert (
        num_tokens(GEMMA, long) == DEFAULT_MAX_NUM_BATCHED_TOKENS
    )  # chunked prefill is the default
    assert num_tokens(GEMMA, {**long, "max_num_batched_tokens": 4096}) == 4096
    assert num_tokens(GEMMA, {**long, "enable_chunked_prefill": False}) == 100001
    assert num_tokens(GEMMA, {"enable_chunked_prefill": False}) == 131072  # the model's length
    offset = lora_row_offset_elements(GEMMA, long)
    assert offset is not None and offset < INT32_LIMIT


def test_unknown_sizes_give_unknown_facts() -> None:
    bare = Model("m", Lane.GPU, "a/b")
    assert lora_row_offset_elements(bare, NO_CHUNKING) is None
    assert lora_overflow_tokens(bare, {}) is None
    assert kv_cache_bytes_needed(bare, {"max_model_len": 10}) is None
    assert kv_cache_bytes_short(TINY, {}) is None  # no fixed budget: vLLM sizes it itself


def test_kv_cache_for_the_tiny_llama() -> None:
    # 2048 tokens * (K and V) * 2 layers * 2 KV heads * head_dim 64 * 2 bytes
    assert kv_cache_bytes_needed(TINY, {"max_model_len": 2048}) == 2048 * 2 * 2 * 2 * 64 * 2
    assert kv_cache_bytes_needed(TINY, {}) == 2097152  # the model's 2048 tokens
    assert kv_cache_bytes_needed(TINY, {"kv_cache_dtype": "fp8"}) == 1048576
    short = kv_cache_bytes_short(TINY, {"kv_cache_memory_bytes": 262144, "max_model_len": 2048})
    fits = kv_cache_bytes_short(TINY, {"kv_cache_memory_bytes": 262144, "max_model_len": 64})
    assert short is not None and short > 0
    assert fits is not None and fits < 0


@pytest.mark.parametrize(
    ("actual", "op", "expected", "result"),
    [
        (320, Op.GT, 128, True),
        (128, Op.GT, 128, False),
        (None, Op.GT, 128, False),  # an unset flag is no rank above 128
        (None, Op.EQ, None, True),
        (None, Op.NE, True, True),
        (True, Op.NE, True, False),
        ("auto", Op.GT, 3, False),  # text against a number: does not hold, no TypeError
        (2, Op.IN, (1, 2), True),
        (3, Op.IN, (1, 2), False),
        (9.0, Op.GE, 9.0, True),
        (8.6, Op.GE, 9.0, False),
        (5, Op.LE, 5, True),
        (6, Op.LT, 5, False),
    ],
)
def test_compare(actual: FlagValue, op: Op, expected: FlagValue, result: bool) -> None:
    assert compare(actual, op, expected) is result


def test_compute_capability_orders_as_a_number() -> None:
    trigger = (Condition("gpu.compute_capability", Op.GE, 9.0),)
    facts = Facts(GEMMA, BLACKWELL, {}, Launch())
    assert facts.get("gpu.compute_capability") == 12.0  # "12.0" > "9.0" as text would fail
    assert holds(trigger, facts)


def test_facts_from_every_namespace() -> None:
    launch = Launch(interrupt_on="Warming up")
    facts = Facts(TINY, H100, {"max_model_len": 64}, launch, interrupt_on=None)
    assert facts.get("model.moe") is False
    assert facts.get("model.head_dim") == 64
    assert facts.get("model.max_position_embeddings") == 2048
    assert facts.get("gpu.count") == 1
    assert facts.get("flags.max_model_len") == 64 and facts.get("flags.absent") is None
    assert facts.get("launch.mode") == "server"
    assert facts.get("launch.interrupt_on") is None  # the variant dropped the interrupt
    assert facts.get("model.use_double_wide_mlp") is False
    assert facts.get("derived.max_model_len") == 64
    assert holds((), facts)


def test_subject_problems_suggest() -> None:
    assert subject_problem("flags.anything_goes") is None
    assert subject_problem("derived.lora_row_offset_elements") is None
    assert subject_problem("derived.lora_overflow_tokens") is None
    assert "Perhaps you meant `moe`?" in (subject_problem("model.moee") or "")
    assert "Perhaps you meant `flags`?" in (subject_problem("flag.enable_lora") or "")
    assert subject_problem("model") is not None and subject_problem("gpu.") is not None


def test_seed_003_overflows_per_rank_so_tensor_parallelism_moves_the_boundary() -> None:
    # Each TP rank's gate_up output is its share of the row: 2 * 12288 / TP elements.
    tp2 = {**NO_CHUNKING, "tensor_parallel_size": 2}
    assert lora_row_elements(GEMMA, {}) == 24576
    assert lora_row_elements(GEMMA, tp2) == 12288
    at_tp2 = lora_row_offset_elements(GEMMA, {**tp2, "max_model_len": 87383})
    assert at_tp2 == 87382 * 12288 < INT32_LIMIT  # the seed's length cannot overflow at TP2
    assert lora_overflow_tokens(GEMMA, tp2) == 174764
    trigger = (Condition("derived.lora_row_offset_elements", Op.GE, INT32_LIMIT),)
    long = {**NO_CHUNKING, "max_model_len": 87383}
    assert holds(trigger, Facts(GEMMA, H100, long, Launch()))
    assert not holds(trigger, Facts(GEMMA, H100, {**long, "tensor_parallel_size": 2}, Launch()))
    assert tensor_parallel_size(GEMMA, {}) == 1 and tensor_parallel_size(GEMMA, tp2) == 2


def test_env_facts_are_the_launchs_variables() -> None:
    env = {"VLLM_USE_FLASHINFER_MOE_FP16": "1"}
    facts = Facts(TINY, H100, {}, Launch(), env=env)
    assert facts.get("env.VLLM_USE_FLASHINFER_MOE_FP16") == "1"
    assert facts.get("env.VLLM_FLASHINFER_MOE_BACKEND") is None  # unset: unknown
    assert holds((Condition("env.VLLM_USE_FLASHINFER_MOE_FP16", Op.EQ, "1"),), facts)
    assert not holds(
        (Condition("env.VLLM_USE_FLASHINFER_MOE_FP16", Op.EQ, "1"),), replace(facts, env={})
    )
    assert subject_problem("env.VLLM_USE_V2_MODEL_RUNNER") is None
    assert "no environment variable name" in (subject_problem("env.A-B") or "")
    assert "env.*" in (subject_problem("envs.X") or "")
