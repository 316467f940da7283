"""The real downloader behind ``repromatrix prepare``: ``huggingface_hub.snapshot_download``.

Imported only when ``prepare`` has something to fetch, so nothing else needs the
package (``pip install 'repromatrix[prepare]'``). ``HF_TOKEN`` is read by the hub
client itself from the environment, as on any runner.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from repromatrix.errors import InfraError
from repromatrix.matrix.sources import Downloader


def hub_downloader() -> Downloader:
    """Return a downloader into an HF hub cache folder; ``InfraError`` without the package."""
    try:
        hub: Any = importlib.import_module("huggingface_hub")
    except ModuleNotFoundError as exc:
        raise InfraError(
            "prepare needs huggingface_hub: pip install 'repromatrix[prepare]'"
        ) from exc

    def download(repo_id: str, cache: Path) -> Path:
        return Path(hub.snapshot_download(repo_id=repo_id, cache_dir=str(cache)))

    return download
