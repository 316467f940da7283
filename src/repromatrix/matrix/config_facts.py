"""A model's facts from its own files: ``config.json`` and the weights' size.

Where the GPU lane's HF cache (``runtime.hf_cache``, laid out as ``repromatrix prepare``
fills it: ``<hf_cache>/hub/models--<org>--<name>/snapshots/<commit>/``, at the model's
pinned ``revision``) or the model's local ``path`` holds them, the memory estimate and
the triggers read the facts vLLM itself reads there:

- ``config.json`` (of a multimodal model, its ``text_config``: vLLM's
  ``get_hf_text_config``): hidden size, layers, heads, KV heads, ``head_dim`` (and
  Gemma 4's ``global_head_dim``), experts and their intermediate size, dtype, tied
  embeddings, vocabulary, ``layer_types`` (the full-attention layers) and the KV-shared
  layers, architecture, ``max_position_embeddings``;
- the weights' bytes: ``model.safetensors.index.json``'s ``metadata.total_size``, else
  the headers of the ``*.safetensors`` files (the 8-byte length and the JSON header
  only, never the tensors), which also count the parameters.

A fact the matrix gives wins over the file's, and where the two differ the model's
``FactsSource`` says so (``plan`` warns). A fact the files lack is left unknown with the
reason, never guessed; a ``config.json`` that is missing, unreadable or not JSON gives no
facts and says why. Standard library only.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from repromatrix.errors import Problem
from repromatrix.harness import hubcache
from repromatrix.values import DTYPE_BYTES, Cell, FactsSource, Lane, Model

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
WEIGHTS_SUFFIX = ".safetensors"
HUB = "hub"  # the hub cache under HF_HOME (``commands.prepare.HUB``)
MAX_JSON_BYTES = 64 * 2**20  # a config or index larger than this is not one
# The safetensors format refuses headers over 100 MB (safetensors' ``MAX_HEADER_SIZE``).
MAX_HEADER_BYTES = 100_000_000

FactValue = int | str | bool

# config.json's ``model_type`` whose config class, when the file gives no ``head_dim``,
# sizes the heads as hidden_size // num_attention_heads: transformers 4.57.1's LlamaConfig
# sets it so (models/llama/configuration_llama.py:209); MistralConfig and MixtralConfig keep
# None (configuration_mistral.py:146, configuration_mixtral.py:175) and Qwen2, Qwen2-MoE
# and Qwen3-MoE's have no such attribute, where vLLM divides (0.32.0
# transformers_utils/model_arch_config_convertor.py:102-116, ``get_head_size``).
HEAD_DIM_FROM_HIDDEN = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3_moe"})
# The config classes whose ``head_dim`` has a default of its own (transformers 4.57.1):
# Qwen3Config 128 (configuration_qwen3.py:163), GemmaConfig, Gemma2Config, Gemma3TextConfig
# 256 (configuration_gemma.py:118, configuration_gemma2.py:127, configuration_gemma3.py:177).
HEAD_DIM_DEFAULTS: Mapping[str, int] = {
    "qwen3": 128,
    "gemma": 256,
    "gemma2": 256,
    "gemma3_text": 256,
}
# config.json dtypes as the matrix names them.
CONFIG_DTYPES: Mapping[str, str] = {
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float32": "float32",
}
# Where each kind of config names its routed experts and their width.
EXPERTS_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
EXPERT_WIDTH_KEYS = ("moe_intermediate_size", "expert_intermediate_size")
# The facts the weights' files give (the rest come from config.json).
WEIGHTS_FACTS = frozenset({"weights_bytes", "num_parameters"})
# The plain whole-number facts, read as the config names them.
INTEGER_FACTS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
    "vocab_size",
)


@dataclass(frozen=True)
class FileFacts:
    """What a model's files say: facts by ``Model`` field name, and what they lack."""

    config: str  # the config.json read, or where it was looked for
    found: bool
    values: Mapping[str, FactValue] = dataclasses.field(default_factory=dict)
    weights: str | None = None  # the file the weights' size came from
    notes: tuple[str, ...] = ()


def snapshot_folder(model: Model, hf_cache: str | None) -> tuple[Path | None, str, str]:
    """The folder of ``model``'s files (its ``path``, or its snapshot in the HF cache at its
    revision), the config.json read there, and why there is none (``""`` where there is)."""
    if model.path is not None:
        return Path(model.path), str(Path(model.path) / CONFIG), ""
    if hf_cache is None:
        return None, "", "the GPU lane sets no runtime.hf_cache"
    try:
        hub = Path(hf_cache).expanduser() / HUB
    except RuntimeError:  # `~name/...` for a user this host does not have
        return None, "", f"the HF cache {hf_cache}: no home folder for its `~` on this host"
    revision = model.revision or hubcache.MAIN
    snapshot = hubcache.resolve(str(hub), model.source, model.revision)
    if snapshot is None:
        config = f"{hubcache.repo_folder(str(hub), model.source)}/snapshots/<{revision}>/{CONFIG}"
        why = (
            f"{model.source} at revision {revision} is not in the HF cache {hub}; "
            "`repromatrix prepare` downloads it"
        )
        return None, config, why
    return Path(snapshot.folder), str(Path(snapshot.folder) / CONFIG), ""


def read_files(folder: Path) -> FileFacts:
    """The facts of the model files in ``folder``; never raises for what is in the files."""
    config_path = folder / CONFIG
    loaded, why = _read_json(config_path)
    if not isinstance(loaded, dict):
        return FileFacts(
            str(config_path), False, notes=(why or f"{config_path}: not a JSON object",)
        )
    values, notes = config_facts(loaded)
    weights, weight_notes, source = weights_facts(folder, loaded, values)
    return FileFacts(str(config_path), True, {**values, **weights}, source, (*notes, *weight_notes))


def config_facts(config: Mapping[str, object]) -> tuple[dict[str, FactValue], list[str]]:
    """The facts of one parsed ``config.json`` (its ``text_config`` where it has one), and a
    note for each the estimate reads that it lacks."""
    text = config.get("text_config")
    body: Mapping[str, object] = text if isinstance(text, dict) else config
    values: dict[str, FactValue] = {}
    notes: list[str] = []
    for name in INTEGER_FACTS:
        if (value := _positive(body, name, notes)) is not None:
            values[name] = value
    _heads(body, values, notes)
    _experts(body, values, notes)
    _layers(body, values, notes)
    _kinds(config, body, values, notes)
    return values, notes


def _heads(body: Mapping[str, object], values: dict[str, FactValue], notes: list[str]) -> None:
    heads = values.get("num_attention_heads")
    kv_heads = _positive(body, "num_key_value_heads", notes)
    if kv_heads is None and "num_key_value_heads" not in body and isinstance(heads, int):
        kv_heads = heads  # no grouped-query attention: vLLM's get_total_num_kv_heads default
    if kv_heads is not None:
        values["num_key_value_heads"] = kv_heads
    head_dim = _positive(body, "head_dim", notes)
    model_type = body.get("model_type")
    hidden = values.get("hidden_size")
    if head_dim is None and model_type in HEAD_DIM_DEFAULTS:
        head_dim = HEAD_DIM_DEFAULTS[str(model_type)]
    elif head_dim is None and model_type in HEAD_DIM_FROM_HIDDEN and hidden and heads:
        head_dim = int(hidden) // int(heads)
    if head_dim is None:
        notes.append(
            f"no `head_dim`, and its model_type {model_type!r} has no rule for one here "
            "(hidden_size / num_attention_heads holds only for some)"
        )
    else:
        values["head_dim"] = head_dim
    global_dim = _positive(body, "global_head_dim", notes)
    if global_dim is not None and global_dim != head_dim:
        values["global_head_dim"] = global_dim


def _experts(body: Mapping[str, object], values: dict[str, FactValue], notes: list[str]) -> None:
    experts = next((v for k in EXPERTS_KEYS if (v := _positive(body, k, notes)) is not None), None)
    if body.get("enable_moe_block") is False:
        experts = None  # Gemma 4 dense: its expert keys are null
    values["moe"] = experts is not None
    if experts is None:
        return
    values["num_experts"] = experts
    width_key = next((k for k in EXPERT_WIDTH_KEYS if k in body), None)
    if width_key is None and "num_local_experts" in body:
        width_key = "intermediate_size"  # Mixtral: the experts are the MLP
    width = _positive(body, width_key, notes) if width_key else None
    if width is None:
        notes.append("a MoE model without `moe_intermediate_size`")
    else:
        values["moe_intermediate_size"] = width
    layers = values.get("num_hidden_layers")
    if isinstance(layers, int) and (moe := _moe_layers(body, layers)) is not None:
        values["moe_layers"] = moe


def _moe_layers(body: Mapping[str, object], layers: int) -> int | None:
    """The layers with experts where fewer than all (Qwen's ``decoder_sparse_step`` and
    ``mlp_only_layers``, DeepSeek's ``first_k_dense_replace``); ``None``: every layer."""
    step, dense = body.get("decoder_sparse_step", 1), body.get("mlp_only_layers") or []
    first = body.get("first_k_dense_replace", 0)
    if not (isinstance(step, int) and step > 0 and isinstance(dense, list)):
        return None
    if not isinstance(first, int) or first < 0:
        return None
    count = sum(1 for i in range(layers) if i >= first and i not in dense and (i + 1) % step == 0)
    return count if count < layers else None


def _layers(body: Mapping[str, object], values: dict[str, FactValue], notes: list[str]) -> None:
    """The full-attention layers with a KV cache of their own, and the KV-shared layers."""
    layers = values.get("num_hidden_layers")
    shared = body.get("num_kv_shared_layers")
    shared = shared if isinstance(shared, int) and not isinstance(shared, bool) else 0
    if shared > 0:
        values["kv_shared_layers"] = shared
    types = body.get("layer_types")
    if isinstance(types, list) and isinstance(layers, int) and len(types) == layers:
        # A KV-shared layer reads an earlier layer's cache (``kv_sharing_target_layer_name``,
        # vLLM 0.22.1 gemma4.py:457-463, 0.32.0 gemma4.py:471-490): only the layers before
        # them hold one.
        own = types[: max(layers - shared, 0)]
        values["full_attention_layers"] = sum(1 for kind in own if kind == "full_attention")
    elif isinstance(types, list):
        notes.append(f"`layer_types` has {len(types)} entries for {layers} layers: not used")
    elif (
        isinstance(body.get("sliding_window"), int) and body.get("use_sliding_window") is not False
    ):
        # Every layer keeps a window only: none holds every token (a lower bound).
        values["full_attention_layers"] = 0


def _kinds(
    config: Mapping[str, object],
    body: Mapping[str, object],
    values: dict[str, FactValue],
    notes: list[str],
) -> None:
    """Architecture, multimodality, tied embeddings, the double-wide MLP and the dtype."""
    architectures = config.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        values["architecture"] = architectures[0]
    values["multimodal"] = isinstance(config.get("vision_config"), dict)
    for owner in (body, config):
        if isinstance(tied := owner.get("tie_word_embeddings"), bool):
            values["tie_word_embeddings"] = tied
            break
    if body.get("use_double_wide_mlp") is True:
        values["use_double_wide_mlp"] = True
    quantization = config.get("quantization_config")
    if isinstance(quantization, dict):
        method = quantization.get("quant_method")
        if method == "fp8":
            values["dtype"] = "fp8"
        else:
            notes.append(f"weights quantized by {method!r}: their dtype is not read")
        return
    dtype = next(
        (d for o in (body, config) for k in ("dtype", "torch_dtype") if (d := o.get(k))), None
    )
    if isinstance(dtype, str) and dtype in CONFIG_DTYPES:
        values["dtype"] = CONFIG_DTYPES[dtype]
    else:
        notes.append(f"no `dtype` (or `torch_dtype`) the estimate knows: {dtype!r}")


def weights_facts(
    folder: Path, config: Mapping[str, object], values: Mapping[str, FactValue]
) -> tuple[dict[str, FactValue], list[str], str | None]:
    """The checkpoint's bytes (and, where they count them, its parameters) from the
    safetensors index, else the safetensors headers."""
    index = folder / INDEX
    if index.exists():
        loaded, why = _read_json(index)
        metadata = loaded.get("metadata") if isinstance(loaded, dict) else None
        total = metadata.get("total_size") if isinstance(metadata, dict) else None
        if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
            return {}, [why or f"{index}: no positive `metadata.total_size`"], None
        facts: dict[str, FactValue] = {"weights_bytes": total}
        dtype = values.get("dtype")
        if dtype in CONFIG_DTYPES.values() and "quantization_config" not in config:
            # One dtype throughout: the bytes over its width are the parameters, or what
            # stands for them (a float32 tensor counts twice in a bfloat16 checkpoint).
            facts["num_parameters"] = total // DTYPE_BYTES[str(dtype)]
        return facts, [], str(index)
    files = sorted(p for p in _files(folder) if p.name.endswith(WEIGHTS_SUFFIX))
    if not files:
        return (
            {},
            [f"{folder}: neither {INDEX} nor *{WEIGHTS_SUFFIX}: the weights' size is unknown"],
            None,
        )
    size = params = 0
    for path in files:
        counted = safetensors_sizes(path)
        if isinstance(counted, str):
            return {}, [counted], None
        size, params = size + counted[0], params + counted[1]
    where = str(files[0]) if len(files) == 1 else f"{folder}/*{WEIGHTS_SUFFIX} ({len(files)} files)"
    if "quantization_config" in config and values.get("dtype") != "fp8":
        # Packed weights (int4 in int32, ...): their elements are not the parameters.
        why = f"{where}: a quantized checkpoint's tensor elements are not its parameters"
        return {"weights_bytes": size}, [why], where
    return {"weights_bytes": size, "num_parameters": params}, [], where


def safetensors_sizes(path: Path) -> tuple[int, int] | str:
    """The bytes and the elements of the tensors one safetensors file holds, read from its
    header alone (an 8-byte little-endian length, then that much JSON); why not, as text."""
    try:
        with path.open("rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                return f"{path}: shorter than a safetensors header"
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES:
                return f"{path}: a header of {length} bytes, more than safetensors allows"
            header = json.loads(handle.read(length).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"{path}: not a readable safetensors header ({_one_line(exc)})"
    if not isinstance(header, dict):
        return f"{path}: its header is not a JSON object"
    size = elements = 0
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        shape = tensor.get("shape") if isinstance(tensor, dict) else None
        offsets = tensor.get("data_offsets") if isinstance(tensor, dict) else None
        if not (_ints(shape) and _ints(offsets) and len(offsets) == 2 and offsets[1] >= offsets[0]):
            return f"{path}: tensor {name!r} has no shape and data_offsets"
        size += offsets[1] - offsets[0]
        elements += math.prod(shape)
    return size, elements


def with_file_facts(model: Model, given: Iterable[str], hf_cache: str | None) -> Model:
    """``model`` with the facts of its own files where the matrix (which gave the keys
    ``given``) does not give them; its ``facts_source`` says which came from where. The
    CPU lane's recipes have no files to read."""
    if model.lane is Lane.CPU:
        return model
    folder, config, why = snapshot_folder(model, hf_cache)
    if folder is None:
        if not config:
            return model  # nowhere to look: the matrix's facts alone
        source = FactsSource(config, False, notes=(why,))
        return dataclasses.replace(model, facts_source=source)
    return merged(model, frozenset(given), read_files(folder))


def merged(model: Model, given: frozenset[str], files: FileFacts) -> Model:
    """The matrix's facts over the files': each fact the matrix gives wins, a difference is
    noted; the rest of the files' facts fill the model."""
    taken: dict[str, FactValue] = {}
    disagreements: list[str] = []
    for name, value in files.values.items():
        if name not in given:
            taken[name] = value
        elif (typed := getattr(model, name)) != value:
            where = files.weights if name in WEIGHTS_FACTS else files.config
            disagreements.append(
                f"`{name}`: the matrix gives {typed!r}, {where} {value!r}; the matrix's is used"
            )
    source = FactsSource(
        files.config,
        files.found,
        tuple(taken),
        files.weights,
        (*files.notes, *disagreements),
        tuple(disagreements),
    )
    return dataclasses.replace(model, **taken, facts_source=source)  # type: ignore[arg-type]


def cells_models(cells: Iterable[Cell]) -> list[Model]:
    """The models of ``cells``, each once (by lane and name)."""
    return list({(cell.lane, cell.model.name): cell.model for cell in cells}.values())


def facts_problems(models: Iterable[Model], matrix_file: str) -> list[Problem]:
    """One warning per model whose files and matrix facts disagree, or whose config.json
    is there but cannot be read, at the model's line."""
    problems: list[Problem] = []
    for model in models:
        source = model.facts_source
        if source is None:
            continue
        for note in source.disagreements:
            problems.append(Problem(matrix_file, model.line, 0, f"model `{model.name}`: {note}"))
        if not source.found and os.path.isdir(os.path.dirname(source.config)):
            reason = source.notes[0] if source.notes else "unreadable"
            message = f"model `{model.name}`: its facts are the matrix's alone: {reason}"
            problems.append(Problem(matrix_file, model.line, 0, message))
    return problems


def source_text(model: Model) -> str:
    """Where the model's facts came from, in one line (``plan``)."""
    source = model.facts_source
    if source is None or not source.found:
        return f"model `{model.name}`: facts from the matrix"
    taken = ", ".join(source.from_files) or "none"
    text = f"model `{model.name}`: facts from {source.config} ({taken}), the rest from the matrix"
    return text + (f"; weights from {source.weights}" if source.weights else "")


def missing_hint(model: Model) -> str:
    """Where the model's missing facts would come from, for the memory estimate's warning."""
    files = f"{CONFIG}, and for the weights {INDEX} or *{WEIGHTS_SUFFIX}"
    source = model.facts_source
    if source is None:
        return f"or set the GPU lane's runtime.hf_cache to a cache holding its files ({files})"
    folder = os.path.dirname(source.config)
    if not source.found:
        why = source.notes[0] if source.notes else "not read"
        return f"or have its files read from {folder} ({files}): {why}"
    return f"which its files in {folder} lack ({'; '.join(source.notes) or files})"


def source_json(model: Model) -> dict[str, object]:
    """The model's facts' source as ``plan --json`` gives it."""
    source = model.facts_source
    if source is None:
        return {"config": None, "found": False, "from_files": [], "weights": None, "notes": []}
    return {
        "config": source.config,
        "found": source.found,
        "from_files": list(source.from_files),
        "weights": source.weights,
        "notes": list(source.notes),
    }


def _read_json(path: Path) -> tuple[object, str | None]:
    """The JSON a file holds, or ``None`` and why not (missing, not a plain file, too large,
    not UTF-8, not JSON)."""
    try:
        if not path.is_file():
            return None, f"{path}: {'not a plain file' if path.exists() else 'not found'}"
        with path.open("rb") as handle:
            data = handle.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        return None, f"{path}: unreadable ({_one_line(exc)})"
    if len(data) > MAX_JSON_BYTES:
        return None, f"{path}: larger than {MAX_JSON_BYTES} bytes"
    try:
        return json.loads(data.decode("utf-8")), None
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"{path}: not JSON ({_one_line(exc)})"


def _positive(body: Mapping[str, object], key: str, notes: list[str]) -> int | None:
    """``body[key]`` when a positive whole number; absent or null is ``None`` quietly."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    notes.append(f"`{key}` is {value!r}, not a positive whole number: not used")
    return None


def _ints(value: object) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    )


def _files(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.is_file()]
    except OSError:
        return []


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]
