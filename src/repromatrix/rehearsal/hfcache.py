"""A local model folder laid out as a Hugging Face cache repository, as the GPU lane reads one.

``<hf_home>/hub/models--<org>--<name>/snapshots/<revision>/<files>`` with
``refs/main`` naming the revision: with ``HF_HOME`` pointing at the mounted
cache and ``HF_HUB_OFFLINE=1``, vLLM resolves the repo id to these files
exactly as it resolves a model a GPU runner downloaded earlier.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path


def repo_folder(hf_home: Path, repo_id: str) -> Path:
    """The cache folder of model ``repo_id`` (``org/name``) under ``hf_home``."""
    return hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))


def revision_of(folder: Path) -> str:
    """A 40-hex revision from the folder's files (names and bytes), like a commit id."""
    digest = hashlib.sha1(usedforsecurity=False)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def lay_out(hf_home: Path, repo_id: str, source: Path, *, skip: tuple[str, ...] = ()) -> Path:
    """Copy ``source`` into the cache as ``repo_id``'s ``main``; return the snapshot folder.

    Top-level entries named in ``skip`` (an adapters folder, say) are left out.
    """
    repo = repo_folder(hf_home, repo_id)
    revision = revision_of(source)
    snapshot = repo / "snapshots" / revision
    if not snapshot.is_dir():
        partial = snapshot.with_name(revision + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(source, partial, ignore=lambda d, names: _skipped(d, names, source, skip))
        partial.rename(snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision, encoding="utf-8")
    return snapshot


def _skipped(folder: str, names: list[str], source: Path, skip: tuple[str, ...]) -> list[str]:
    return [name for name in names if Path(folder) == source and name in skip]
