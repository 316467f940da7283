"""The Hugging Face cache as files: which snapshot a repo id and revision name.

Standard library only: the harness reads the cache mounted in a GPU cell's
container with it, and ``repromatrix prepare --check`` reads the runner's own
cache with the same code, so the two never disagree about what is there.

A cache holds ``<hub>/models--<org>--<name>/refs/<revision>`` (a file naming a
commit) and ``snapshots/<commit>/`` (the files). A revision is a branch or a
tag, found under ``refs/``, or a commit, found under ``snapshots/`` itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

MAIN = "main"


@dataclass(frozen=True)
class CacheSnapshot:
    """What a repo id and revision name in a cache: the commit and the folder of its files."""

    commit: str
    folder: str


def hub_folder(env: Mapping[str, str]) -> str:
    """The hub cache the Hugging Face libraries read: ``HF_HUB_CACHE``, else
    ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    if env.get("HF_HUB_CACHE"):
        return env["HF_HUB_CACHE"]
    home = env.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def repo_folder(hub: str, repo_id: str) -> str:
    """The cache folder of model (or adapter) ``repo_id`` (``org/name``) under ``hub``."""
    return os.path.join(hub, "models--" + repo_id.replace("/", "--"))


def resolve(hub: str, repo_id: str, revision: str | None = None) -> CacheSnapshot | None:
    """The snapshot ``revision`` (None: ``main``) of ``repo_id`` names in ``hub``, or None
    when the cache does not hold it."""
    repo = repo_folder(hub, repo_id)
    wanted = revision or MAIN
    if ".." in wanted.split("/"):
        return None
    try:
        with open(os.path.join(repo, "refs", wanted), encoding="ascii") as handle:
            commit = handle.read().strip()
    except (OSError, UnicodeDecodeError):
        commit = wanted  # not a branch or tag: a commit names its snapshot itself
    folder = os.path.join(repo, "snapshots", commit)
    if not commit or "/" in commit or not os.path.isdir(folder):
        return None
    return CacheSnapshot(commit, folder)
