"""``repromatrix prepare``: put what the selected cells read into the runner's HF cache.

Run on the runner, with the network and ``HF_TOKEN``, before ``repromatrix run``
(whose cells stay offline and never see the token). It checks every local model
and adapter folder the cells need, then downloads each HF repo they read (models,
adapters, each at its pinned revision, only the files vLLM reads) into the HF
cache the GPU lane mounts, saying how far it got. ``--check`` downloads nothing:
it is the pre-flight before the cells, failing (exit 3) with every repo the cache
cannot serve offline.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from repromatrix.commands.arguments import (
    add_selection_arguments,
    check_output_folder,
    load_selected,
)
from repromatrix.errors import EXIT_OK, ConfigError, InfraError, UsageError
from repromatrix.matrix.config import Matrix
from repromatrix.matrix.expand import plan
from repromatrix.matrix.selector import Selector
from repromatrix.matrix.sources import Download, Downloader, check_local, downloads, fetch
from repromatrix.models.hfhub import cache_problems, hub_downloader
from repromatrix.values import Lane

HUB = "hub"  # the HF cache's repo folder under HF_HOME (what the container's HF_HOME holds)


def add_parser(subparsers: Any) -> None:
    """Register ``prepare`` and its options."""
    parser = subparsers.add_parser(
        "prepare",
        help="download the models and adapters the selected cells need into the HF cache",
        description=(
            "Check the local model and adapter folders of the selected cells, then download "
            "every HF repo they read into the runner's HF cache (the GPU lane's "
            "runtime.hf_cache), so the cells run offline. Needs the network."
        ),
    )
    add_selection_arguments(parser)
    parser.add_argument(
        "--hf-cache",
        type=Path,
        metavar="DIR",
        help="HF_HOME to fill (default: the GPU lane's runtime.hf_cache)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="download nothing: fail (exit 3) naming each repo the cache cannot serve offline",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, download: Downloader | None = None) -> int:
    """Check folders, then download (or with ``--check`` only check the cache); exit 3 naming
    each repo that could not be fetched (or is not in the cache)."""
    matrix, scenarios, _lock = load_selected(args, lambda line: print(line, file=sys.stderr))
    lane = Lane(args.lane) if args.lane else None
    cells = plan(matrix, scenarios, lane, Selector(args.only, args.skip))
    problems = check_local(cells, matrix.file)
    if problems:
        raise ConfigError(problems)
    wanted = downloads(cells)
    if not wanted:
        print("prepare: the selected cells read no HF repo", file=sys.stderr)
        return EXIT_OK
    cache = hf_home(args.hf_cache, matrix) / HUB
    if args.check:
        return check(wanted, cache)
    if download is None:
        download = hub_downloader()  # needs huggingface_hub, only here
    failures = fetch(wanted, cache, download, lambda line: print(line, file=sys.stderr))
    if failures:
        lines = "\n  ".join(failures)
        raise InfraError(f"prepare: {len(failures)} of {len(wanted)} repos not fetched:\n  {lines}")
    print(f"prepare: {len(wanted)} repos in {cache}", file=sys.stderr)
    return EXIT_OK


def check(wanted: Sequence[Download], cache: Path) -> int:
    """The pre-flight: every repo of ``wanted`` is in ``cache``; ``InfraError`` naming the rest."""
    problems = cache_problems(wanted, cache)
    if problems:
        lines = "\n  ".join(problems)
        raise InfraError(
            f"prepare --check: {len(problems)} of {len(wanted)} repos cannot be read offline "
            f"(run `repromatrix prepare` with the network first):\n  {lines}"
        )
    print(f"prepare --check: all {len(wanted)} repos are in {cache}", file=sys.stderr)
    return EXIT_OK


def hf_home(given: Path | None, matrix: Matrix) -> Path:
    """``--hf-cache``, else the GPU lane's ``runtime.hf_cache``; ``UsageError`` with neither."""
    if given is not None:
        return check_output_folder(_home_expanded(given, "--hf-cache"), "--hf-cache")
    config = matrix.lanes.get(Lane.GPU)
    if config is None or config.runtime.hf_cache is None:
        raise UsageError(
            f"{matrix.file}: the GPU lane sets no runtime.hf_cache: pass --hf-cache DIR"
        )
    folder = _home_expanded(Path(config.runtime.hf_cache), "runtime.hf_cache")
    return check_output_folder(folder, "runtime.hf_cache")


def _home_expanded(path: Path, what: str) -> Path:
    try:
        return path.expanduser()
    except RuntimeError:  # `~name/...` for a user this host does not have
        raise UsageError(f"{what} {str(path)!r}: no home folder for its `~` here") from None
