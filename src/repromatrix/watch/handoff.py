"""The cells of a new image this host cannot run, handed to the fleet once, and waited for."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from repromatrix.fleet.dispatch import Handoff
from repromatrix.fleet.jobs import brace_glob
from repromatrix.matrix.follow import Lock
from repromatrix.matrix.inputs import scenario_dirs
from repromatrix.results import store
from repromatrix.run import cell as outcome
from repromatrix.run.cell import NOT_RUN, CellRun, cell_result
from repromatrix.run.folder import RunFolder
from repromatrix.upstream.lock import restricted
from repromatrix.values import Cell
from repromatrix.watch.candidates import Candidate
from repromatrix.watch.options import Fleet, Round
from repromatrix.watch.state import read_json, write_json


def hand_off(
    this: Round, candidate: Candidate, cells: Sequence[Cell], away: Sequence[Cell]
) -> Mapping[str, Any] | None:
    """Hand the cells this host cannot run to the fleet, once (a dispatch that failed is
    tried again next round); None without a fleet (they are answered as not run)."""
    dispatcher = this.options.fleet.dispatcher
    if dispatcher is None:
        this.note(
            f"{candidate.words}: {len(away)} cells cannot run here ({_gpus(away)}) and "
            "no fleet is given (--fleet): they are answered as not run"
        )
        save_not_run(this, candidate, away)
        return None
    path = this.folder.handoff(candidate.key)
    record = read_json(path) or {}
    if record.get("ok"):
        return record
    handoff = handoff_of(this, candidate, cells, away)
    dispatched = dispatcher.dispatch(handoff)
    now = datetime.now(UTC).isoformat()
    record = {
        "ok": dispatched.ok,
        "words": dispatched.words,
        "url": dispatched.url,
        "fleet_id": dispatched.fleet_id,
        "at": record.get("at", now),  # the first attempt: the fleet's time runs from it
        "last_attempt": now,
        "dispatcher": dispatcher.name,
        "cells": [c.id for c in away],
        "run": handoff.name,
    }
    write_json(path, record)
    verb = "handed to the fleet" if dispatched.ok else "not handed over (next round tries again)"
    this.note(f"{candidate.words}: {len(away)} cells {verb}: {dispatched.words}")
    return record


def save_not_run(this: Round, candidate: Candidate, away: Sequence[Cell]) -> None:
    """Record each cell no one runs as skipped, with why, in the image's run folder: the
    answer counts it not run (as the docs say), and the round has a result for every cell."""
    results = this.options.results
    folder = RunFolder(candidate.run_id, store.run_folder(results, candidate.run_id))
    reason = f"this host cannot run it ({_gpus(away)}) and no fleet is given (--fleet)"
    digest = candidate.image.ref if candidate.digest else None  # whose cells they are
    for cell in away:
        run = CellRun(outcome.skipped(reason), NOT_RUN)
        made = cell_result(
            cell, run, context=None, run_id=folder.run_id, started_at=store.now_iso()
        )
        store.write_result(folder.path, dataclasses.replace(made, image_digest=digest), b"")


def handoff_of(
    this: Round, candidate: Candidate, cells: Sequence[Cell], away: Sequence[Cell]
) -> Handoff:
    """The hand-off of ``away``: its globs, and the lock of this image alone."""
    fleet = this.options.fleet
    followed = candidate.lane in this.lock.lanes
    lock = restricted(this.lock, candidate.lane, [candidate.tag]) if followed else None
    lock_text = json.dumps((lock or Lock(this.lock.matrix, this.lock.resolved_at, {})).to_json())
    # The fleet's checkout has the project's own folder: no installed path goes to it.
    folders = scenario_dirs(this.options.scenarios) if this.options.scenarios else ("scenarios",)
    return Handoff(
        key=candidate.key,
        lane=candidate.lane.value,
        tag=candidate.tag,
        matrix=fleet.matrix or str(this.options.matrix),
        scenarios=fleet.scenarios or str(folders[0]),
        only=(brace_glob(sorted(c.id for c in away)),),  # exactly these, whatever the rest
        skip=(),
        lock=lock_text,
        cells=len(away),
        package=fleet.package,
    )


def waited_out(handed: Mapping[str, Any], fleet: Fleet) -> bool:
    try:
        at = datetime.fromisoformat(str(handed.get("at")))
    except ValueError:
        return True
    return (datetime.now(UTC) - at).total_seconds() > fleet.wait_s


def _gpus(cells: Sequence[Cell]) -> str:
    gpus = sorted({c.gpu.name for c in cells})
    return f"GPUs {', '.join(gpus)}"
