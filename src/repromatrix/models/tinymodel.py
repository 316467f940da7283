"""The CPU lane's model: a tiny random-weight Llama generated locally, cached by recipe.

No model can be downloaded, so the CPU lane makes its own: the matrix's model
facts (hidden size, layers, heads, ...) become a recipe, the recipe's hash
names the cache folder ``.cache/models/<name>-<hash>/``, and
``harness/make_tiny_model.py`` writes it there once, inside a vLLM
environment (the first CPU image, or a local virtualenv) because it needs
torch and transformers. Cells mount the folder read-only. LoRA adapters for the
model live in ``<folder>/adapters/lora-r<rank>/`` (PEFT format), one per rank a
scenario asks for (``launch.lora_rank``). The zoo's broken model folders
(``launch.model_files``: no ``config.json``, a corrupt tokenizer) are copies of
the whole folder beside it, ``<folder>-<files>/``, broken here on the host by plain
file operations: nothing is fetched.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from repromatrix.errors import ConfigError, InfraError, Problem, suggest
from repromatrix.images.wheelhouse import CACHE_ROOT, OUTPUT_TAIL
from repromatrix.values import MODEL_FILES, MODEL_SHAPE, Model

MODELS_ROOT = CACHE_ROOT / "models"
GENERATOR = "make_tiny_model.py"
# Recipe name (a CPU-lane model's ``source``) → architecture the generator writes.
RECIPES: Mapping[str, str] = {"tiny-llama": "LlamaForCausalLM"}
# The facts ENVIRONMENT.md measured vLLM serving on 2 cores; a model may override any.
# The shape of a tiny model whose matrix entry leaves a fact at 0, in MODEL_SHAPE's order.
DEFAULTS: Mapping[str, int] = dict(zip(MODEL_SHAPE, (512, 256, 2, 4, 2, 2048), strict=True))
DTYPES = ("bfloat16", "float16", "float32")
VOCAB_SIZE = 1024
SEED = 0
LORA_RANK = 8


@dataclass(frozen=True)
class TinyModel:
    """A generated (or to-be-generated) tiny model in the cache."""

    name: str
    recipe_hash: str
    path: Path

    @property
    def complete(self) -> bool:
        """Whether the model has been generated."""
        return _marker(self.path).is_file()

    def adapter_path(self, rank: int = LORA_RANK) -> Path:
        """Where the model's LoRA adapter of ``rank`` lies."""
        return self.path / "adapters" / f"lora-r{rank}"

    def has_adapter(self, rank: int = LORA_RANK) -> bool:
        """Whether the adapter of ``rank`` has been generated."""
        return _marker(self.adapter_path(rank)).is_file()

    def files_path(self, files: str = "intact") -> Path:
        """Where the folder served for ``files`` (a ``MODEL_FILES`` name) lies."""
        return self.path if files == "intact" else self.path.with_name(f"{self.path.name}-{files}")


def _drop_config(folder: Path) -> None:
    (folder / "config.json").unlink()


def _cut_tokenizer(folder: Path) -> None:
    # Half of a JSON document: the tokenizer's own loader fails to parse it.
    tokenizer = folder / "tokenizer.json"
    data = tokenizer.read_bytes()
    tokenizer.write_bytes(data[: len(data) // 2])


BREAKERS = {"no-config": _drop_config, "corrupt-tokenizer": _cut_tokenizer}
assert set(BREAKERS) == set(MODEL_FILES) - {"intact"}


def ensure_model_files(tiny: TinyModel, files: str) -> Path:
    """The folder served for ``files``: the whole model, or a broken copy of it made once
    beside it (without its adapters); raises ``InfraError`` when the copy cannot be made."""
    target = tiny.files_path(files)
    if files == "intact" or _marker(target).is_file():
        return target
    partial = target.with_name(target.name + ".partial")
    try:
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(tiny.path, partial, ignore=shutil.ignore_patterns("adapters"))
        BREAKERS[files](partial)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        _marker(target).touch()
    except OSError as exc:
        raise InfraError(f"could not make the model folder {target}: {exc}") from exc
    return target


def content_hash(folder: Path) -> str:
    """A tiny model's revision, as a result records it: the SHA-256 of the names and bytes of
    the files served from ``folder`` (its ``adapters/`` left out: each has its own)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder)
        if name.parts[0] == "adapters":
            continue
        data = path.read_bytes()
        digest.update(f"{name.as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return "sha256:" + digest.hexdigest()


def recipe(model: Model) -> dict[str, Any]:
    """The generator's recipe for ``model``; raises ``ConfigError`` for an unknown recipe."""
    if model.source not in RECIPES:
        message = f"model {model.name}: no tiny-model recipe named {model.source!r}"
        hint = suggest(model.source, RECIPES) or f" Known: {', '.join(sorted(RECIPES))}."
        raise ConfigError([Problem("matrix.yaml", 0, 0, message + hint)])
    if model.dtype not in DTYPES:
        message = f"model {model.name}: dtype {model.dtype!r} is not one of {', '.join(DTYPES)}"
        raise ConfigError([Problem("matrix.yaml", 0, 0, message)])
    facts = {key: int(getattr(model, key)) or default for key, default in DEFAULTS.items()}
    if facts["hidden_size"] % facts["num_attention_heads"]:
        message = f"model {model.name}: hidden_size is not a multiple of num_attention_heads"
        raise ConfigError([Problem("matrix.yaml", 0, 0, message)])
    return {
        "architecture": RECIPES[model.source],
        **facts,
        "dtype": model.dtype,
        "vocab_size": VOCAB_SIZE,
        "seed": SEED,
    }


def recipe_hash(model: Model) -> str:
    """A hash of the recipe and of the generator itself: changing either makes a new model."""
    digest = hashlib.sha256(json.dumps(recipe(model), sort_keys=True).encode())
    digest.update(generator_source())
    return digest.hexdigest()[:12]


def tiny_model_for(model: Model, cache_root: Path = MODELS_ROOT) -> TinyModel:
    """The cached tiny model for ``model`` (generated or not: see ``TinyModel.complete``)."""
    digest = recipe_hash(model)
    return TinyModel(model.name, digest, cache_root / f"{model.name}-{digest}")


def generator_source() -> bytes:
    """The generator program's bytes (copied into every image, beside the harness)."""
    return (resources.files("repromatrix") / "harness" / GENERATOR).read_bytes()


def generator_argv(
    model: Model,
    out: str,
    *,
    python: str = "python3",
    script: str | None = None,
    lora_ranks: Sequence[int] = (LORA_RANK,),
) -> list[str]:
    """The command that generates ``model`` into ``out`` (a path as the running side sees it).

    ``script`` is the generator's path there: the package's own by default, or
    ``/opt/repromatrix/harness/make_tiny_model.py`` inside an image.
    """
    if script is None:
        script = str(resources.files("repromatrix") / "harness" / GENERATOR)
    argv = [python, script, "--recipe-json", json.dumps(recipe(model), sort_keys=True)]
    argv += ["--out", out]
    for rank in sorted(set(lora_ranks)):
        argv += ["--lora-rank", str(rank)]
    return argv


def ensure_tiny_model(
    model: Model,
    python: str,
    cache_root: Path = MODELS_ROOT,
    lora_ranks: Sequence[int] = (LORA_RANK,),
    timeout_s: float = 600.0,
) -> TinyModel:
    """Generate ``model`` (and adapters) with ``python`` unless cached; raises ``InfraError``."""
    tiny = tiny_model_for(model, cache_root)
    if tiny.complete and all(tiny.has_adapter(rank) for rank in lora_ranks):
        return tiny
    argv = generator_argv(model, str(tiny.path), python=python, lora_ranks=lora_ranks)
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InfraError(f"could not generate the tiny model {model.name}: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).decode(errors="replace")[-OUTPUT_TAIL:]
        raise InfraError(f"generating the tiny model {model.name} failed:\n{tail}")
    return tiny


def _marker(folder: Path) -> Path:
    return folder.with_name(folder.name + ".complete")
