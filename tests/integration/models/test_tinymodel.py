"""The tiny local model, loaded and generating in real vLLM with its adapter."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from repromatrix.models.tinymodel import (
    LORA_RANK,
    ensure_tiny_model,
)
from support.harness import TINY
from support.machine import venv

VENV = venv("0.32.0")


@pytest.mark.vllm("0.32.0")
def test_generated_model_loads_and_the_adapter_matches_it(tmp_path: Path) -> None:
    python = str(VENV / "bin" / "python3")
    tiny = ensure_tiny_model(TINY, python, tmp_path, lora_ranks=(LORA_RANK,))
    assert tiny.complete and tiny.has_adapter(LORA_RANK)
    check = """
import json, sys
from safetensors import safe_open
from transformers import AutoConfig, AutoTokenizer
model, adapter = sys.argv[1], sys.argv[2]
config = AutoConfig.from_pretrained(model)
tok = AutoTokenizer.from_pretrained(model)
ids = tok("The capital of France is")["input_ids"]
chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                               add_generation_prompt=True)
with safe_open(adapter + "/adapter_model.safetensors", "pt") as f:
    shapes = {k: list(f.get_tensor(k).shape) for k in f.keys()}
print(json.dumps({"hidden": config.hidden_size, "vocab": config.vocab_size, "ids": ids,
                  "len": len(tok), "chat": chat, "shapes": shapes}))
"""
    done = subprocess.run(
        [python, "-c", check, str(tiny.path), str(tiny.adapter_path(LORA_RANK))],
        capture_output=True,
        check=True,
        timeout=300,
    )
    facts = json.loads(done.stdout.decode().splitlines()[-1])
    assert facts["hidden"] == 256
    assert facts["vocab"] == facts["len"]
    assert facts["ids"][0] == 1 and all(0 <= i < facts["vocab"] for i in facts["ids"])
    assert facts["chat"].endswith("assistant: ")
    shapes = facts["shapes"]
    prefix = "base_model.model.model.layers.1.self_attn"
    assert shapes[f"{prefix}.q_proj.lora_A.weight"] == [LORA_RANK, 256]
    assert shapes[f"{prefix}.k_proj.lora_B.weight"] == [128, LORA_RANK]  # 2 kv heads of 64
    config = json.loads((tiny.adapter_path(LORA_RANK) / "adapter_config.json").read_text())
    assert config["r"] == LORA_RANK and config["peft_type"] == "LORA"
    # Cells may run as another user and mount the folder read-only.
    for path in tiny.path.rglob("*"):
        assert path.stat().st_mode & 0o004, path
    # A second call reuses the cache and adds a missing adapter only.
    again = ensure_tiny_model(TINY, python, tmp_path, lora_ranks=(LORA_RANK, 16))
    assert again == tiny and tiny.has_adapter(16)
