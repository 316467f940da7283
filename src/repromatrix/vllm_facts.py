"""The facts vLLM states about itself in its log: what it chose and sized, by name.

Triage reads them from every log (``triage.facts``); a scenario's ``reached``
evidence may test them, so the scenario loader (``matrix``) checks a fact's
name against this table and triage reads exactly these, the same way
``vllm_processes`` serves both. Each value is text, as vLLM printed it (numbers
without thousands separators).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

FACTS: Mapping[str, str] = MappingProxyType(
    {
        "vllm_version": "the vLLM version the engine says it is",
        "torch_version": "the PyTorch version, where the log names it (collect_env output)",
        "moe_experts_backend": "the fused-MoE experts backend vLLM selected (FlashInfer CUTLASS, "
        "TRITON, ...)",
        "attention_backend": "the attention backend vLLM selected (FLASH_ATTN, CPU_ATTN, ...)",
        "kernel_path": "the LoRA kernels' wrapper vLLM selected (PunicaWrapperGPU, "
        "PunicaWrapperCPU)",
        "quantization": "the engine config's quantization method (None: unquantized)",
        "compilation_mode": "the engine config's compilation mode (NONE, DYNAMO_TRACE_ONCE, "
        "VLLM_COMPILE)",
        "cudagraph_capture_sizes": "the batch sizes CUDA graphs are captured for ([]: none)",
        "max_num_batched_tokens": "tokens per scheduler step, where chunked prefill states it",
        "kv_cache_tokens": "the tokens the KV cache holds, as the engine sized it",
        "kv_cache_gib": "the memory given to the KV cache, in GiB",
        "model_load_gib": "the memory the model's weights took when loaded, in GiB",
        "checkpoint_gib": "the size of the checkpoint on disk, in GiB",
    }
)
