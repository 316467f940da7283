#!/usr/bin/env python3
"""Make the tiny random-weight Llama the CPU lane serves, and LoRA adapters for it.

Usage: ``python3 make_tiny_model.py --recipe-json JSON --out DIR [--lora-rank N]...``
(the recipe comes from ``repromatrix.models.tinymodel.recipe``).

Runs inside a vLLM environment (an image or a local virtualenv): it needs the
torch, transformers, tokenizers and safetensors that vLLM already depends on,
and nothing from the network. It writes ``DIR`` (config, safetensors weights,
a byte-level BPE tokenizer trained here, a chat template) and, per rank,
``DIR/adapters/lora-r<rank>/`` in PEFT format. Each folder is written under a
temporary name, renamed into place, then marked ``<folder>.complete``; finished
folders are left alone, so running it again only adds missing adapters.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
from typing import Any

ADAPTER_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)
# Enough varied English for a byte-level BPE of a thousand tokens; deterministic.
CORPUS = (
    "the quick brown fox jumps over a lazy dog while engines start and servers answer "
    "requests with tokens from a tiny model that runs on the cpu in a container where "
    "every cell records what happened to the kernel cache memory and the adapter rank "
    "paris is the capital of france berlin of germany rome of italy madrid of spain"
)


def complete(folder: str) -> bool:
    """Whether ``folder`` was finished (its ``.complete`` marker exists)."""
    return os.path.isfile(folder + ".complete")


def publish(partial: str, folder: str) -> None:
    """Make ``partial`` readable by all, move it into place and mark it complete."""
    # Cells mount the model read-only and may run as another user than the generator;
    # safetensors writes its files owner-only.
    for root, dirs, files in os.walk(partial):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    os.chmod(partial, 0o755)
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.rename(partial, folder)
    with open(folder + ".complete", "w", encoding="utf-8"):
        pass


def fresh(folder: str) -> str:
    """An empty ``folder`` (a leftover of an interrupted run is removed)."""
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    return folder


def corpus() -> list[str]:
    """Lines to train the tokenizer on, the same on every run."""
    words = CORPUS.split()
    return [" ".join(words[i:] + words[:i]) for i in range(len(words))]


def make_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE (any text encodes) wrapped as a ``PreTrainedTokenizerFast``."""
    tokenizers: Any = importlib.import_module("tokenizers")
    transformers: Any = importlib.import_module("transformers")
    byte_level = tokenizers.pre_tokenizers.ByteLevel
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = byte_level(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=byte_level.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="</s>",
        chat_template=CHAT_TEMPLATE,
    )


def make_model(recipe: dict[str, Any], folder: str) -> None:
    """Write the random-weight model and its tokenizer into ``folder``."""
    torch: Any = importlib.import_module("torch")
    transformers: Any = importlib.import_module("transformers")
    tokenizer = make_tokenizer(int(recipe["vocab_size"]))
    torch.manual_seed(int(recipe["seed"]))
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=recipe["hidden_size"],
        intermediate_size=recipe["intermediate_size"],
        num_hidden_layers=recipe["num_hidden_layers"],
        num_attention_heads=recipe["num_attention_heads"],
        num_key_value_heads=recipe["num_key_value_heads"],
        max_position_embeddings=recipe["max_position_embeddings"],
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config).to(getattr(torch, recipe["dtype"]))
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)


def adapter_shapes(recipe: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) features of each attention projection the adapter targets."""
    hidden = int(recipe["hidden_size"])
    head_dim = hidden // int(recipe["num_attention_heads"])
    kv = head_dim * int(recipe["num_key_value_heads"])
    return {
        "q_proj": (hidden, hidden),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (hidden, hidden),
    }


def make_adapter(recipe: dict[str, Any], rank: int, model_dir: str, folder: str) -> None:
    """Write a PEFT LoRA adapter of ``rank`` with small random weights into ``folder``."""
    torch: Any = importlib.import_module("torch")
    save_file: Any = importlib.import_module("safetensors.torch").save_file
    dtype = getattr(torch, recipe["dtype"])
    generator = torch.Generator().manual_seed(int(recipe["seed"]) + rank)
    tensors = {}
    for layer in range(int(recipe["num_hidden_layers"])):
        for name, (fan_in, fan_out) in adapter_shapes(recipe).items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            lora_a = torch.randn(rank, fan_in, generator=generator) * 0.01
            lora_b = torch.randn(fan_out, rank, generator=generator) * 0.01
            tensors[f"{prefix}.lora_A.weight"] = lora_a.to(dtype).contiguous()
            tensors[f"{prefix}.lora_B.weight"] = lora_b.to(dtype).contiguous()
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": model_dir,
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(ADAPTER_TARGETS),
        "fan_in_fan_out": False,
        "modules_to_save": None,
    }
    with open(os.path.join(folder, "adapter_config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2, sort_keys=True)


def main(argv: list[str] | None = None) -> int:
    """Make what is missing of the model and the requested adapters."""
    parser = argparse.ArgumentParser(description="Make the tiny model and its LoRA adapters.")
    parser.add_argument("--recipe-json", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--lora-rank", type=int, action="append", default=[])
    args = parser.parse_args(argv)
    recipe = json.loads(args.recipe_json)
    out = os.path.abspath(args.out)
    if not complete(out):
        partial = fresh(out + ".partial")
        make_model(recipe, partial)
        publish(partial, out)
    for rank in sorted(set(args.lora_rank)):
        folder = os.path.join(out, "adapters", f"lora-r{rank}")
        if not complete(folder):
            partial = fresh(folder + ".partial")
            make_adapter(recipe, rank, out, partial)
            publish(partial, folder)
    print(f"tiny model ready in {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
