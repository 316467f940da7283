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

from repromatrix.backends.base import GB, Footprint
from repromatrix.values import Cell

REASONS_SHOWN = 3


def outlook(
    run_line: str,
    runnable: Sequence[Cell],
    skips: Mapping[str, str],
    cache: Path,
    footprint: Footprint,
) -> list[str]:
    """The first lines: cells to run vs cells this host cannot run (the commonest reasons),
    and the disk the backend's images need (``footprint``) against what is free under
    ``cache``."""
    noun = "cell" if len(runnable) == 1 else "cells"
    lines = [f"{run_line}: {len(runnable)} {noun} to run here, {len(skips)} this host cannot run"]
    reasons = Counter(skips.values()).most_common()
    lines += [f"  {count} cannot run: {reason}" for reason, count in reasons[:REASONS_SHOWN]]
    if len(reasons) > REASONS_SHOWN:
        rest = sum(count for _reason, count in reasons[REASONS_SHOWN:])
        lines.append(f"  {rest} cannot run for {len(reasons) - REASONS_SHOWN} other reason(s)")
    if runnable:
        needed = disk_needed(runnable, footprint)
        lines.append(disk_line(needed, free_bytes(cache), footprint.made))
    return lines


def disk_needed(cells: Sequence[Cell], footprint: Footprint) -> int:
    """About how many bytes the distinct images of ``cells`` take on disk, made from scratch
    by a backend with ``footprint``."""
    images = {cell.image.key: cell.lane for cell in cells}
    return sum(footprint.bytes_per_image[lane] for lane in images.values())


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


def disk_line(needed: int, free: int | None, made: str = "images") -> str:
    """``disk: about 20 GB for the images made from scratch (120 GB free)``, with a warning
    where less is free."""
    have = "" if free is None else f" ({free / GB:.0f} GB free)"
    line = f"disk: about {needed / GB:.0f} GB for the {made} made from scratch{have}"
    if free is not None and free < needed:
        line += f"; warning: less is free than {made} made from scratch need"
    return line
