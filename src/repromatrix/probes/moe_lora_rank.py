#!/usr/bin/env python3
"""Probe for seed 000: where does vLLM's MoE-LoRA dispatch send a ``max_lora_rank`` of 320?

Usage: ``python3 moe_lora_rank.py '<params json>'`` with the image's own python.

It calls the installed vLLM's ``_fused_moe_lora`` (in
``vllm/lora/ops/triton_ops/fused_moe_lora_op.py``), the function the punica
wrapper's ``add_lora_fused_moe`` calls for a MoE layer's gate_up (w13) LoRA,
with CPU tensors of the shapes the ``FusedMoEWithLoRA`` layer allocates for the
given rank, experts and ``fully_sharded_loras``, as in the start-up profile run
(a batch large enough to use ``moe_lora_align_block_size``'s sorted blocks).
vLLM's dispatch and assertions run as they are; only the Triton launch at the
end of the chosen path is replaced (``probekit.intercept_launches``), which is
the decisive point: the path is chosen and its assertions have passed.

Outcomes: ``raised`` when the dispatch raises, with the exception (the runner
matches it against the scenario's signatures, ``AssertionError:
fused_moe_lora_one_shot supports max_lora_rank<=128``: a hit, or another
failure), ``avoided`` when a kernel launch is reached (the evidence names the
kernel, hence the path), ``unreachable`` when the module, the function or its
parameters are not what this probe knows.

Params (all optional but ``max_lora_rank``): ``max_lora_rank``,
``fully_sharded_loras``, ``tensor_parallel_size``, ``max_loras``,
``num_experts``, ``hidden_size``, ``moe_intermediate_size``, ``top_k``,
``num_tokens``, ``dtype``, ``block_size_m``. Other keys (the cell's other
engine flags) are ignored.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any

try:
    from repromatrix.probes import probekit
except ImportError:  # run as a program inside an image: only this folder is on sys.path
    import probekit  # type: ignore[import-not-found,no-redef]

MODULE = "vllm.lora.ops.triton_ops.fused_moe_lora_op"
FUNCTION = "_fused_moe_lora"
# What each of the module's kernels is, in the words of the seed and vLLM's comments.
PATHS = {
    "_fused_moe_lora_one_shot_kernel": "the one-shot fused shrink+expand kernel",
    "_fused_moe_lora_small_batch_kernel": "the small-batch (decode) kernel",
    "_fused_moe_lora_kernel": "the tiled shrink/expand kernels",
}
W13_SLICES = 2  # gate and up projections: the w13 LoRA has two slices
# The block sizes the punica wrapper uses when no tuned config exists.
BLOCKS = {"block_size_n": 64, "block_size_k": 32, "group_size_m": 8, "num_warps": 4}
STAGES, SPLIT_K = 3, 1


@dataclass(frozen=True)
class LayerShape:
    """The layer and batch the probe builds tensors for (defaults: Qwen3-30B-A3B's MoE)."""

    max_lora_rank: int
    fully_sharded: bool
    tp_size: int = 1
    max_loras: int = 1
    num_experts: int = 128
    hidden_size: int = 2048
    moe_intermediate_size: int = 768
    top_k: int = 8
    num_tokens: int = 2048
    dtype: str = "bfloat16"
    block_size_m: int = 64

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> LayerShape:
        """Read the shape from the probe's params (engine flag names where there is one)."""
        get = probekit.int_param
        return cls(
            max_lora_rank=get(params, "max_lora_rank"),
            fully_sharded=probekit.bool_param(params, "fully_sharded_loras", False),
            tp_size=get(params, "tensor_parallel_size", cls.tp_size),
            max_loras=get(params, "max_loras", cls.max_loras),
            num_experts=get(params, "num_experts", cls.num_experts),
            hidden_size=get(params, "hidden_size", cls.hidden_size),
            moe_intermediate_size=get(params, "moe_intermediate_size", cls.moe_intermediate_size),
            top_k=get(params, "top_k", cls.top_k),
            num_tokens=get(params, "num_tokens", cls.num_tokens),
            dtype=probekit.str_param(params, "dtype", cls.dtype),
            block_size_m=get(params, "block_size_m", cls.block_size_m),
        )

    @property
    def lora_rank(self) -> int:
        """The rank dimension of the w13 LoRA A buffer: sharded over TP when fully sharded."""
        return self.max_lora_rank // self.tp_size if self.fully_sharded else self.max_lora_rank

    @property
    def padded_tokens(self) -> int:
        """``moe_lora_align_block_size``'s ``max_num_tokens_padded`` for this batch."""
        return self.num_tokens * self.top_k + self.num_experts * (self.block_size_m - 1)


def arguments(torch: Any, shape: LayerShape) -> dict[str, Any]:
    """``_fused_moe_lora``'s arguments for ``shape``, by name, as the punica wrapper passes them."""
    tuning = {
        f"{stage}_{key}": value for stage in ("shrink", "expand") for key, value in BLOCKS.items()
    }
    return {
        **_tensors(torch, shape, probekit.device(torch)),
        "max_lora_rank": shape.lora_rank,  # add_lora_w13 passes lora_a_stacked[0].shape[-2]
        "top_k_num": shape.top_k,
        # LoRAKernelMeta's unspecialised active count (max_loras + 1), kept on the CPU.
        "num_active_loras": torch.tensor([shape.max_loras + 1], dtype=torch.int32),
        "shrink_block_size_m": shape.block_size_m,
        "expand_block_size_m": shape.block_size_m,
        "shrink_num_stages": STAGES,
        "expand_num_stages": STAGES,
        "shrink_split_k": SPLIT_K,
        "expand_split_k": SPLIT_K,
        **tuning,
        "mul_routed_weight": False,
        "fully_sharded": shape.fully_sharded,
        "offset": 0,
    }


def _tensors(torch: Any, shape: LayerShape, on: Any) -> dict[str, Any]:
    """The layer's w13 LoRA weights and the batch's routing, shaped as vLLM allocates them."""
    dtype, i32 = getattr(torch, shape.dtype), torch.int32
    loras, experts, tokens = shape.max_loras, shape.num_experts, shape.num_tokens
    n_slice = shape.moe_intermediate_size // shape.tp_size
    blocks = -(-shape.padded_tokens // shape.block_size_m)
    a_shape = (loras, experts, shape.lora_rank, shape.hidden_size)
    b_shape = (loras, experts, n_slice, shape.max_lora_rank)
    return {
        "output": torch.zeros((tokens, shape.top_k, W13_SLICES * n_slice), dtype=dtype, device=on),
        "qcurr_hidden_states": torch.empty((tokens, shape.hidden_size), dtype=dtype, device=on),
        "lora_a_stacked": [torch.empty(a_shape, dtype=dtype, device=on) for _ in range(W13_SLICES)],
        "lora_b_stacked": [torch.empty(b_shape, dtype=dtype, device=on) for _ in range(W13_SLICES)],
        "topk_weights": torch.full((tokens, shape.top_k), 1.0 / shape.top_k, device=on),
        "sorted_token_ids": torch.zeros((loras, shape.padded_tokens), dtype=i32, device=on),
        "expert_ids": torch.zeros((loras, blocks), dtype=i32, device=on),
        "num_tokens_post_padded": torch.full((loras,), shape.padded_tokens, dtype=i32, device=on),
        "token_lora_mapping": torch.zeros((tokens,), dtype=i32, device=on),
        # LoRAKernelMeta's active ids: every adapter slot, then the no-LoRA -1.
        "lora_ids": torch.tensor([*range(loras), -1], dtype=i32, device=on),
        "adapter_enabled": torch.ones((loras + 1,), dtype=i32, device=on),
    }


def probe(params: dict[str, Any]) -> probekit.Report:
    """Call vLLM's MoE-LoRA dispatch with the cell's rank and sharding, and report the path."""
    shape = LayerShape.from_params(params)
    triton = probekit.use_installed_triton()
    dispatch = probekit.resolve(MODULE, FUNCTION)
    args = arguments(importlib.import_module("torch"), shape)
    probekit.check_call(dispatch, **args)
    call = f"{FUNCTION}(max_lora_rank={shape.lora_rank}, fully_sharded={shape.fully_sharded})"
    details: dict[str, Any] = {"call": f"{MODULE}.{call}", "triton": triton}
    with probekit.intercept_launches():
        try:
            dispatch(**args)
        except probekit.KernelLaunch as launch:
            return _launched(call, launch, details)
        except Exception as exc:  # any exception is a verdict: hit or other failure
            return _raised(call, exc, details)
    return probekit.Report(
        probekit.OTHER_FAILURE,
        f"{call} returned without launching a kernel: the probe's tensors left it no work",
        details=details,
    )


def _launched(call: str, launch: probekit.KernelLaunch, details: dict[str, Any]) -> probekit.Report:
    name = probekit.kernel_name(launch.kernel)
    path = PATHS.get(name, "a kernel this probe does not know")
    evidence = f"{call} chose {path}: it reached the launch of {name}"
    facts = {**details, "kernel": name, "launch": launch.constants()}
    return probekit.Report(probekit.AVOIDED, evidence, details=facts)


def _raised(call: str, exc: Exception, details: dict[str, Any]) -> probekit.Report:
    """What the dispatch raised, for the runner to match against the scenario's signatures."""
    where = probekit.raised_at(exc)
    facts = {**details, "raised_at": where}
    return probekit.Report(
        probekit.RAISED, f"{call} raised at {where}", probekit.describe(exc), facts
    )


if __name__ == "__main__":
    sys.exit(probekit.run(probe))
