#!/usr/bin/env python3
"""Probe for seed 003: is the LoRA expand kernel's output row offset int32, and does it overflow?

Usage: ``python3 lora_int32_offsets.py '<params json>'`` with the image's own python.

It does what ``PunicaWrapperGPU.add_lora_linear`` does for a gate_up (merged
column) layer in the start-up profile run, with the installed vLLM's own code:
``LoRAKernelMeta.make`` and ``prepare_tensors`` build the token index arrays
(every token on LoRA 0), then ``_lora_expand`` gets the float32 shrink buffer,
the LoRA B weights and the layer output of ``num_tokens`` rows. The kernel
launch is captured (``probekit.intercept_launches``) and the installed Triton
lowers that very launch of ``_lora_expand_kernel`` to TTIR for CUDA
``sm_<gpu_arch>`` (``tritonir.compile_ttir``). The verdict comes from the IR:
the multiply of the loaded token row index by the row stride on its way into
the output store address is ``i32`` (overflows once ``(num_tokens - 1) *
stride >= 2**31``) or ``i64`` (PRs #53034/#53038).

Outcomes: ``hit`` when the multiply is i32 and this batch's largest row offset
reaches 2**31 (the documented illegal memory access), ``avoided`` when it is
i64 or the batch stays below the threshold (the evidence says which),
``unreachable`` when the functions or the multiply are not found.

Params: ``intermediate_size`` (required: the model's MLP width),
``max_model_len`` (required unless ``max_num_batched_tokens`` is given; the
profile batch is ``max_model_len`` tokens with chunked prefill off, as
documented), ``max_num_batched_tokens``, ``enable_chunked_prefill``,
``num_slices`` (2: gate and up), ``max_lora_rank`` (16), ``max_loras`` (1),
``dtype`` (bfloat16), ``gpu_arch`` (90). Other keys are ignored.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any

try:
    from repromatrix.probes import probekit, tritonir
except ImportError:  # run as a program inside an image: only this folder is on sys.path
    import probekit  # type: ignore[import-not-found,no-redef]
    import tritonir  # type: ignore[import-not-found,no-redef]

EXPAND = "vllm.lora.ops.triton_ops.lora_expand_op"
META = "vllm.lora.ops.triton_ops.lora_kernel_metadata"
INDEX_ARGUMENT = "token_indices_sorted_by_lora_ids"
INT32_LIMIT = 2**31


@dataclass(frozen=True)
class Batch:
    """The profile run's LoRA expand for one gate_up layer."""

    num_tokens: int
    intermediate_size: int
    num_slices: int = 2
    max_lora_rank: int = 16
    max_loras: int = 1
    dtype: str = "bfloat16"
    gpu_arch: int = 90

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Batch:
        """Read the batch from the probe's params (engine flag names where there is one)."""
        get = probekit.int_param
        return cls(
            num_tokens=_num_tokens(params),
            intermediate_size=get(params, "intermediate_size"),
            num_slices=get(params, "num_slices", cls.num_slices),
            max_lora_rank=get(params, "max_lora_rank", cls.max_lora_rank),
            max_loras=get(params, "max_loras", cls.max_loras),
            dtype=probekit.str_param(params, "dtype", cls.dtype),
            gpu_arch=get(params, "gpu_arch", cls.gpu_arch),
        )


def _num_tokens(params: dict[str, Any]) -> int:
    if params.get("max_num_batched_tokens") is not None:
        return probekit.int_param(params, "max_num_batched_tokens")
    if probekit.bool_param(params, "enable_chunked_prefill", False):
        raise probekit.BadParams(
            "with chunked prefill on, give max_num_batched_tokens (the profile batch size)"
        )
    return probekit.int_param(params, "max_model_len")


def threshold(stride: int) -> int:
    """The fewest tokens whose last row offset, ``(n - 1) * stride``, reaches 2**31."""
    return -(-INT32_LIMIT // stride) + 1


def capture_expand(torch: Any, batch: Batch) -> probekit.KernelLaunch:
    """Run vLLM's meta preparation and ``_lora_expand`` for ``batch``; return its kernel launch."""
    expand = probekit.resolve(EXPAND, "_lora_expand")
    meta = probekit.resolve(META, "LoRAKernelMeta").make(batch.max_loras, batch.num_tokens, "cpu")
    meta.prepare_tensors(torch.zeros(batch.num_tokens, dtype=torch.int32))
    dtype = getattr(torch, batch.dtype)
    shape = (batch.max_loras, 1, batch.intermediate_size, batch.max_lora_rank)
    args = (
        # add_lora_linear's shrink buffer is float32 (triton-lang/triton#1387).
        torch.zeros((batch.num_slices, batch.num_tokens, batch.max_lora_rank)),
        tuple(torch.zeros(shape, dtype=dtype) for _ in range(batch.num_slices)),
        # The layer output: never touched, as no kernel runs.
        torch.empty((batch.num_tokens, batch.num_slices * batch.intermediate_size), dtype=dtype),
        *meta.meta_args(batch.num_tokens, False),
    )
    probekit.check_call(expand, *args, offset_start=0, add_inputs=True)
    with probekit.intercept_launches():
        try:
            expand(*args, offset_start=0, add_inputs=True)
        except probekit.KernelLaunch as launch:
            return launch
    raise probekit.Unreachable("_lora_expand returned without launching a kernel")


def probe(params: dict[str, Any]) -> probekit.Report:
    """Capture the expand launch for the cell's batch, lower it to TTIR, judge its row offset."""
    batch = Batch.from_params(params)
    triton = probekit.use_installed_triton()
    launch = capture_expand(importlib.import_module("torch"), batch)
    name = probekit.kernel_name(launch.kernel)
    bound = launch.bound()
    ttir = tritonir.compile_ttir(launch, batch.gpu_arch)
    multiplies = tritonir.row_offsets(ttir, INDEX_ARGUMENT, bound)
    strides = [
        m for m in multiplies if len(m.factors) == 1 and isinstance(bound[m.factors[0]], int)
    ]
    if not strides:
        found = ", ".join(f"{m.width} x {m.factors}" for m in multiplies) or "none"
        raise probekit.Unreachable(
            f"{name} has no multiply of a {INDEX_ARGUMENT} row by one stride argument "
            f"feeding a store (found: {found})"
        )
    return _verdict(batch, name, strides[0], int(bound[strides[0].factors[0]]), triton)


def _verdict(
    batch: Batch, kernel: str, multiply: tritonir.Multiply, stride: int, triton: str
) -> probekit.Report:
    largest = (batch.num_tokens - 1) * stride
    factor = multiply.factors[0]
    details = {
        "kernel": kernel,
        "offset_width": multiply.width,
        "multiply_at": multiply.source,
        "row_stride": {factor: stride},
        "num_tokens": batch.num_tokens,
        "largest_row_offset": largest,
        "threshold_tokens": threshold(stride),
        "target": f"sm_{batch.gpu_arch}",
        "triton": triton,
    }
    what = (
        f"{kernel} (lowered for sm_{batch.gpu_arch}) multiplies the token row by "
        f"{factor}={stride} in {multiply.width} at {multiply.source}"
    )
    if multiply.width != "i32":
        return probekit.Report(probekit.AVOIDED, f"{what}: no int32 overflow", details=details)
    if largest >= INT32_LIMIT:
        evidence = (
            f"{what}; {batch.num_tokens} tokens put the last row at {largest} >= 2**31: "
            f"the int32 offset overflows (from {threshold(stride)} tokens)"
        )
        return probekit.Report(probekit.HIT, evidence, details=details)
    evidence = f"{what}, but {batch.num_tokens} tokens stay below 2**31 (< {threshold(stride)})"
    return probekit.Report(probekit.AVOIDED, evidence, details=details)


if __name__ == "__main__":
    sys.exit(probekit.run(probe))
