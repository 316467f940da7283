"""A lane's ``models``: where the weights are, their LoRA adapters, and the facts triggers test.

On the GPU lane a model is an HF repo id (``source: Qwen/Qwen3-30B-A3B``, read
from the runner's HF cache, which ``repromatrix prepare`` fills) or a local
folder (``path: /models/qwen3``, mounted read-only). Its LoRA adapters belong
to it, each a repo id or a local folder:

    qwen3-30b-a3b:
      source: Qwen/Qwen3-30B-A3B
      revision: 0123456789abcdef0123456789abcdef01234567  # optional: a branch, tag or commit
      adapters:
        my-adapter: {source: org/qwen3-lora, revision: v1}
        local-adapter: {path: ./adapters/qwen3}

A relative ``path`` is taken from the matrix file's folder, ``~`` is the home
folder. Whether a folder exists is checked on the runner (``sources.check_local``),
not when the matrix is read: a plan may be made on another machine.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from repromatrix.grammars import check_model_source, check_revision
from repromatrix.matrix.config_facts import with_file_facts
from repromatrix.matrix.keys import section
from repromatrix.matrix.yamlsrc import Location, Reader, YEntry, YMap, YNode
from repromatrix.values import DTYPE_BYTES, MODEL_SHAPE, MODEL_SIZES, Adapter, Lane, Model

MODEL_INTS = (*MODEL_SHAPE, *MODEL_SIZES)
# An HF repo id: ``name`` or ``org/name``.
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(?:/[A-Za-z0-9][\w.-]*)?")


def read_model(
    lane: Lane, entry: YEntry, reader: Reader, hf_cache: str | None = None
) -> Model | None:
    """Read one model entry (its problems recorded in ``reader``), with the facts of its own
    files (in ``hf_cache``, the GPU lane's, or its ``path``) where the entry gives none."""
    what = f"model `{entry.key}`"
    body = reader.mapping(entry.value, what)
    if body is None:
        return None
    reader.keys(body, section("model").names, what)
    facts = _integers(body, reader)
    dtype = _dtype(body, reader)
    _check_heads(body, facts, reader)
    full_attention = _full_attention_layers(body, facts, reader)
    node = body.get("architecture")
    architecture = reader.text(node, "`architecture`") if node is not None else None
    source, path = _weights(lane, entry.key, body, reader)
    revision = _revision(body, path is not None or lane is Lane.CPU, reader)
    adapters = _adapters(lane, body.get("adapters"), reader)
    moe, multimodal = _bool(body, "moe", reader), _bool(body, "multimodal", reader)
    line = path_node.where.line if (path_node := body.get("path")) is not None else 0
    model = Model(
        entry.key,
        lane,
        source,
        moe,
        multimodal,
        dtype=dtype,
        use_double_wide_mlp=_bool(body, "use_double_wide_mlp", reader),
        path=path,
        adapters=adapters,
        path_line=line,
        full_attention_layers=full_attention,
        architecture=architecture,
        line=entry.where.line,
        revision=revision,
        deadline_s=_deadline(body, reader),
        **facts,
    )
    return with_file_facts(model, (item.key for item in body), hf_cache)


def _deadline(body: YMap, reader: Reader) -> float | None:
    """The model's own ``deadline_s`` (a positive number of seconds), if it gives one."""
    node = body.get("deadline_s")
    return reader.number(node, "`deadline_s`", positive=True) if node is not None else None


def _integers(body: YMap, reader: Reader) -> dict[str, Any]:
    """The model's sizes that are given (each at least 1)."""
    facts: dict[str, Any] = {}
    for key in MODEL_INTS:
        if (node := body.get(key)) is not None:
            value = reader.integer(node, f"`{key}`", minimum=1)
            if value is not None:
                facts[key] = value
    return facts


def _full_attention_layers(body: YMap, facts: dict[str, int], reader: Reader) -> int | None:
    """The layers with a whole KV cache (0 is an answer here, not unknown); ``moe_layers`` and
    these are each at most ``num_hidden_layers``."""
    node = body.get("full_attention_layers")
    value = reader.integer(node, "`full_attention_layers`", minimum=0) if node is not None else None
    layers = facts.get("num_hidden_layers")
    for key, some in (("moe_layers", facts.get("moe_layers")), ("full_attention_layers", value)):
        if layers and some is not None and some > layers:
            message = f"{key} {some} is more than num_hidden_layers {layers}"
            reader.error(_where(body, key), message)
    return value


def _dtype(body: YMap, reader: Reader) -> str:
    node = body.get("dtype")
    dtype = (reader.text(node, "`dtype`") if node is not None else None) or "bfloat16"
    if dtype not in DTYPE_BYTES:
        hint = f" Known: {', '.join(sorted(DTYPE_BYTES))}."
        reader.error(_where(body, "dtype"), f"unknown dtype `{dtype}`.{hint}")
        return "bfloat16"
    return dtype


def _weights(lane: Lane, name: str, body: YMap, reader: Reader) -> tuple[str, str | None]:
    """``(source, path)``: a repo id (or CPU recipe), or a local folder and that folder."""
    source_node, path_node = body.get("source"), body.get("path")
    if lane is Lane.CPU and path_node is not None:
        reader.error(path_node.where, "`path` is for GPU models: a CPU model is a local recipe")
        path_node = None
    if source_node is not None and path_node is not None:
        reader.error(body.where, f"model `{name}` has `source` and `path`: give one of them")
    if source_node is None and path_node is None:
        hint = "`source` (an HF repo id) or `path` (a local folder)"
        needs = hint if lane is Lane.GPU else "`source` (a tiny-model recipe)"
        reader.error(body.where, f"model `{name}` needs {needs}")
        return name, None
    if path_node is not None:
        path = _folder(path_node, reader)
        return (path or name), path
    assert source_node is not None
    source = reader.grammar(source_node, "`source`", check_model_source)
    if source is None:
        return name, None
    if lane is Lane.GPU and not REPO_ID.fullmatch(source):
        message = f"`source` `{source}` is not an HF repo id like org/name (a folder: use `path`)"
        reader.error(source_node.where, message)
    return source, None


def _folder(node: YNode, reader: Reader) -> str | None:
    """An absolute folder: ``~`` expanded, a relative path taken from the matrix's folder."""
    text = reader.text(node, "`path`")
    if text is None:
        return None
    try:
        folder = Path(text).expanduser()
    except RuntimeError:  # `~name/...` for a user this host does not have
        reader.error(node.where, f"`path` {text!r}: no home folder for its `~` here")
        return None
    if not folder.is_absolute():
        folder = Path(node.where.file).resolve().parent / folder
    return str(folder)


def _adapters(lane: Lane, node: YNode | None, reader: Reader) -> tuple[Adapter, ...]:
    if node is None:
        return ()
    if lane is Lane.CPU:
        reader.error(node.where, "`adapters` are for GPU models: the CPU recipes make their own")
        return ()
    body = reader.mapping(node, "`adapters`")
    adapters = []
    for entry in body or ():
        name = reader.key_name(entry, "adapter name")
        value = reader.mapping(entry.value, f"adapter `{entry.key}`")
        if value is None:
            continue
        reader.keys(value, section("adapter").names, f"adapter `{entry.key}`")
        source, path = value.get("source"), value.get("path")
        if (source is None) == (path is None):
            message = f"adapter `{entry.key}` needs one of `source` (an HF repo id) or `path`"
            reader.error(value.where, message)
            continue
        repo = reader.text(source, "`source`") if source is not None else None
        if repo is not None and not REPO_ID.fullmatch(repo):
            message = f"`source` `{repo}` is not an HF repo id like org/name (a folder: use `path`)"
            reader.error(source.where if source is not None else value.where, message)
        folder = _folder(path, reader) if path is not None else None
        revision = _revision(value, path is not None, reader)
        if name is not None and (repo or folder):
            adapters.append(Adapter(name, repo, folder, entry.where.line, revision))
    return tuple(adapters)


def _revision(body: YMap, local: bool, reader: Reader) -> str | None:
    """The pinned ``revision`` of a repo id; a local folder or a CPU recipe has none to pin."""
    node = body.get("revision")
    if node is None:
        return None
    if local:
        message = "`revision` pins an HF repo (a GPU model's `source`); a folder or recipe has none"
        reader.error(node.where, message)
        return None
    return reader.grammar(node, "`revision`", check_revision)


def _bool(body: YMap, key: str, reader: Reader) -> bool:
    node = body.get(key)
    return bool(reader.boolean(node, f"`{key}`")) if node is not None else False


def _where(body: YMap, key: str) -> Location:
    node = body.get(key)
    return (node or body).where


def _check_heads(body: YMap, facts: dict[str, int], reader: Reader) -> None:
    hidden, heads = facts.get("hidden_size"), facts.get("num_attention_heads")
    if hidden and heads and hidden % heads and not facts.get("head_dim"):
        reader.error(
            body.where, f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}"
        )
    kv_heads = facts.get("num_key_value_heads")
    if heads and kv_heads and heads % kv_heads:
        reader.error(
            body.where,
            f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}",
        )
