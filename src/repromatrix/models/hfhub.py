"""The runner's Hugging Face cache for ``repromatrix prepare``: what is downloaded, and whether
the cache holds what the cells read.

``hub_downloader`` is the real downloader (``huggingface_hub.snapshot_download``),
imported only when ``prepare`` has something to fetch, so nothing else needs the
package (``pip install 'repromatrix[prepare]'``). It fetches each repo at its
pinned revision and only the files vLLM reads (``allow_patterns``): never a
repository's other checkpoints, training states or images. ``HF_TOKEN`` is read
by the hub client itself from the environment of ``prepare``, the only step that
is given it.

``cache_problems`` is ``prepare --check``: every repo the cells read is in the
cache at its revision, with its config and weights, read with the harness's own
resolution (``harness.hubcache``), so the check and the cell agree.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from repromatrix.errors import InfraError
from repromatrix.harness import hubcache
from repromatrix.matrix.sources import Download, Downloader

WEIGHTS = "*.safetensors"
# PyTorch pickles, only for a repo that has no safetensors: vLLM prefers safetensors and
# reads the pickles only when there are none, so a repo that has both needs one copy.
PICKLED_WEIGHTS = "*.bin"
# Everything else vLLM reads: configs (config.json, generation_config.json, the safetensors
# index, adapter_config.json, tokenizer_config.json), tokenizer files and chat templates.
READ_BY_VLLM = ("*.json", "tokenizer*", "*.model", "*.tiktoken", "merges.txt", "vocab*", "*.jinja")
# What a snapshot must hold for each kind of repo to be loadable.
CONFIG = {"model": "config.json", "adapter": "adapter_config.json"}


def allow_patterns(files: Iterable[str]) -> tuple[str, ...]:
    """The patterns of the files vLLM reads in a repo that holds ``files``."""
    safetensors = any(name.endswith(".safetensors") for name in files)
    return (WEIGHTS if safetensors else PICKLED_WEIGHTS, *READ_BY_VLLM)


def hub_downloader() -> Downloader:
    """Return a downloader into an HF hub cache folder; ``InfraError`` without the package."""
    try:
        hub: Any = importlib.import_module("huggingface_hub")
    except ModuleNotFoundError as exc:
        raise InfraError(
            "prepare needs huggingface_hub: pip install 'repromatrix[prepare]'"
        ) from exc

    def download(item: Download, cache: Path) -> Path:
        files = hub.list_repo_files(item.repo_id, revision=item.revision)
        folder = hub.snapshot_download(
            repo_id=item.repo_id,
            revision=item.revision,
            cache_dir=str(cache),
            allow_patterns=list(allow_patterns(files)),
        )
        return Path(folder)

    return download


def cache_problems(wanted: Sequence[Download], hub: Path) -> list[str]:
    """One line for each repo of ``wanted`` the hub cache ``hub`` cannot serve offline."""
    return [problem for item in wanted if (problem := _problem(item, hub)) is not None]


def _problem(item: Download, hub: Path) -> str | None:
    what = f"{item.kind} {item.label}"
    snapshot = hubcache.resolve(str(hub), item.repo_id, item.revision)
    if snapshot is None:
        return f"{what}: not in the HF cache {hub}"
    folder = Path(snapshot.folder)
    # Snapshot files link to blobs: a link whose blob is gone is not a file.
    files = [path.name for path in folder.rglob("*") if path.is_file()]
    lacking = [name for name in (CONFIG[item.kind],) if name not in files]
    if not any(name.endswith((".safetensors", ".bin")) for name in files):
        lacking.append("weights (*.safetensors or *.bin)")
    if lacking:
        return f"{what}: snapshot {snapshot.commit} in {hub} lacks {', '.join(lacking)}"
    return None
