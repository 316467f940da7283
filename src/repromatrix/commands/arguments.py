"""The command-line arguments several commands share (the matrix and its selection, the
lock, the runner's GPUs and pulls, output folders) and what they select; no executor here."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from repromatrix.errors import UsageError
from repromatrix.host.runner import parse_gpu_ids
from repromatrix.matrix.config import Matrix
from repromatrix.matrix.inputs import apply_lock, load_inputs
from repromatrix.upstream.resolve import Locked, Locking, Online, lock_for
from repromatrix.values import Lane, PullPolicy, Scenario

# The help of options several commands share.
MATRIX_HELP = "the matrix file (default: matrix.yaml)"
SCENARIOS_HELP = (
    "the folder of scenario files (default: the scenarios shipped with repromatrix, and a "
    "scenarios/ folder beside the matrix file)"
)
SCENARIOS_REPEAT_HELP = (
    "a folder of scenario files, read instead of the default; repeat to combine folders, e.g. "
    "--scenarios scenarios --scenarios my-scenarios (default: the scenarios shipped with "
    "repromatrix, and a scenarios/ folder beside the matrix file)"
)
RESULTS_HELP = "where run folders are made (default: results)"
BACKEND_HELP = (
    "what runs the cells: docker, local (virtualenvs, CPU lane only), or auto (default: the "
    "first this host can use, said with why)"
)


def add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the cells' selection (``add_cell_selection``) and the lock: --lock, --relock."""
    add_cell_selection(parser)
    add_lock_arguments(parser)


def add_cell_selection(parser: argparse.ArgumentParser) -> None:
    """Add --matrix, --scenarios, --lane, --only and --skip (watch keeps its own lock)."""
    parser.add_argument(
        "--matrix",
        type=Path,
        default=Path("matrix.yaml"),
        metavar="FILE",
        help=MATRIX_HELP,
    )
    parser.add_argument(
        "--scenarios",
        type=Path,
        action="append",
        metavar="DIR",
        help=SCENARIOS_REPEAT_HELP,
    )
    parser.add_argument("--lane", choices=[lane.value for lane in Lane], help="one lane only")
    parser.add_argument(
        "--only", action="append", default=[], metavar="GLOB", help="keep cells whose id matches"
    )
    parser.add_argument(
        "--skip", action="append", default=[], metavar="GLOB", help="drop cells whose id matches"
    )


def add_lock_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --lock and --relock: where the lanes' followed tags are pinned, and a re-resolve."""
    parser.add_argument(
        "--lock",
        type=Path,
        metavar="FILE",
        help="the lock of the lanes whose images follow a rule: read when it holds for the "
        "rules, else resolved from the registry (or pip) and written (default: "
        "<matrix>.lock.json beside the matrix; a matrix that lists its images has none)",
    )
    parser.add_argument(
        "--relock",
        action="store_true",
        help="resolve the follow rules again now and rewrite the lock (new tags, moved digests)",
    )


def load_selected(
    args: argparse.Namespace, note: Callable[[str], None]
) -> tuple[Matrix, tuple[Scenario, ...], Locked]:
    """The matrix of ``--matrix``, locked (``--lock``, ``--relock``), its catalogue
    (``--scenarios``), and the lock; ``note`` hears what the lock says."""
    from repromatrix.images.wheelhouse import CACHE_ROOT  # noqa: PLC0415  (keeps --help fast)

    matrix, scenarios = load_inputs(args.matrix, args.scenarios)
    locking = Locking(args.lock, args.relock)
    locked = lock_for(matrix, locking, lambda: Online(CACHE_ROOT, note), note)
    return apply_lock(matrix, locked.lock), scenarios, locked


def add_runner_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --pull and --gpus (for ``run``: how this runner pulls images and which GPUs it has)."""
    parser.add_argument(
        "--pull",
        choices=[policy.value for policy in PullPolicy],
        help="pull GPU images always, only when missing, or never (default: per image: "
        "always for moving tags such as nightly and release candidates, else missing)",
    )
    parser.add_argument(
        "--gpus",
        type=gpu_ids_argument,
        metavar="IDS",
        help="the GPUs this runner may use, e.g. 0,1 or GPU-<uuid> (default: "
        "CUDA_VISIBLE_DEVICES, else NVIDIA_VISIBLE_DEVICES, else every GPU of the host)",
    )


def gpu_ids_argument(text: str) -> str:
    """Check ``--gpus`` as argparse reads it (kept as text: ``runner.detect_runner`` reads it)."""
    try:
        parse_gpu_ids(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def check_output_folder(path: Path, option: str) -> Path:
    """Raise ``UsageError`` (one line) where a file is in the way of an output folder.

    The folder itself may not exist yet; the first part of it that does must be a folder.
    """
    for part in (path, *path.parents):
        if part.exists():
            if not part.is_dir():
                where = "is" if part == path else f"is under {part}, which is"
                raise UsageError(f"{option} {path} {where} a file, not a folder")
            break
    return path
