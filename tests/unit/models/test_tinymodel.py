"""The tiny local model: recipe from the matrix's facts, cache by hash, real generation."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from repromatrix.errors import ConfigError
from repromatrix.models.tinymodel import (
    DEFAULTS,
    generator_argv,
    recipe,
    tiny_model_for,
)
from repromatrix.values import Lane, Model
from support.harness import TINY


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
