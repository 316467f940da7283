"""One round of ``watch``, top to bottom: what is new, its cells, its answer, published, sent.

1. The published history is read (a malformed one stops the round before
   anything runs), the matrix's follow rules are resolved afresh into the
   round's lock, and GPU tags the matrix lists are looked up for their digest.
2. The images the history holds no run of (at their digest) are new; the
   baselines are checked (each in the history, or offered now and graded first).
3. For each new image: the cells already recorded in the results root are kept;
   this host runs the rest it can, probe cells first, then engine cells
   (``run.main.execute_run``, one run folder per image, so an interrupted round
   resumes where it stopped); the cells it cannot run are handed to the fleet
   once. As soon as probe cells have decided while more is to come, a
   preliminary answer goes out.
4. Once every cell has a result (or the fleet's time is up), the final answer
   against the baseline is published with the cells (the site swapped in whole)
   and kept to be sent.
5. Every answer not yet delivered to a channel is sent (the webhook, GitHub);
   one that fails stays for the next round, and the grading stands.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from repromatrix.backends import kinds
from repromatrix.backends.base import BackendKind
from repromatrix.errors import UsageError
from repromatrix.host.runner import Runner, detect_runner
from repromatrix.matrix.config import Matrix
from repromatrix.matrix.expand import plan
from repromatrix.matrix.inputs import apply_lock, load_inputs
from repromatrix.matrix.selector import Selector
from repromatrix.publish.history import History, read_history
from repromatrix.publish.site import PublishSummary, cell_page, publish_staged
from repromatrix.reports.findings import ReportOptions, staged_scenarios
from repromatrix.reports.ranges import documented_ranges
from repromatrix.results.merge import merge
from repromatrix.results.verdicts import Judged, judge_all
from repromatrix.run.claim import claimed
from repromatrix.run.main import RunOptions, execute_run, infeasible_reasons, skip_reasons
from repromatrix.run.progress import Progress
from repromatrix.secret_env import redact_text
from repromatrix.upstream.lock import write_lock
from repromatrix.upstream.resolve import Online, Upstream, resolve
from repromatrix.values import Cell, Lane, Level, Scenario
from repromatrix.visible import visible
from repromatrix.watch import deliver as delivering
from repromatrix.watch.answer import (
    SiteLinks,
    Stage,
    TagAnswer,
    answer_json,
    answer_markdown,
    build_answer,
    counts_of,
)
from repromatrix.watch.baselines import (
    baseline_side,
    baselines_first,
    baselines_of,
    check_baselines,
)
from repromatrix.watch.candidates import (
    Candidate,
    at_most_new,
    later_line,
    offered,
    only_image,
    round_lock,
    ungraded,
)
from repromatrix.watch.handoff import hand_off, handoff_of, waited_out
from repromatrix.watch.options import Round, WatchOptions, WatchReport
from repromatrix.watch.state import WATCH_DIR, WatchFolder, read_json, recorded, write_json

SITE_ANSWERS = "answers.json"  # the final answers, in the published site


def watch(
    options: WatchOptions,
    note: Callable[[str], None] | None = None,
    upstream: Upstream | None = None,
) -> WatchReport:
    """One round (see the module's docstring). Bad input raises before anything runs."""
    say = note or _stderr
    history = read_history(options.site)
    matrix, scenarios = load_inputs(options.matrix, options.scenarios)
    lanes = _lanes(matrix, options.lane)
    selector = Selector(options.only, options.skip)  # its own options before any registry
    ask = upstream or Online(options.cache)
    keep = at_most_new(history, options.baselines, options.max_new_tags)
    lock = resolve(matrix, ask, lanes, keep=keep)
    if (later := later_line(lock)) is not None:
        say(later)
    locked = apply_lock(matrix, lock)
    plan(locked, scenarios, options.lane, selector)  # a selection of nothing is bad input
    found = offered(locked, lock, ask, lanes, say if options.dry_run else None)
    lock = round_lock(matrix, lock, found)
    baselines = baselines_of(options.baselines, found, history, options.site)
    new = baselines_first(ungraded(found, history), baselines)
    check_baselines(new, baselines)
    folder = WatchFolder(options.results / WATCH_DIR)
    say(_offer_line(found, new, options.site))
    this = Round(options, locked, scenarios, lock, folder, selector, baselines, say)
    if options.dry_run:
        return WatchReport(found, new, described=describe(this, new))
    folder.root.mkdir(parents=True, exist_ok=True)
    with claimed(folder.root):
        write_lock(folder.lock, lock)
        owed = delivering.deliver_all(folder, options.channels, say)  # earlier rounds' first
        this.sent.extend(owed[0])
        answers, waiting, failed = grade_all(this, new, history)
    undelivered = owed[1] + sum(this.owed)
    return WatchReport(
        found, new, answers, waiting, failed, tuple(this.sent), undelivered=undelivered
    )


def grade_all(
    this: Round, new: Sequence[Candidate], history: History
) -> tuple[tuple[TagAnswer, ...], tuple[str, ...], tuple[str, ...]]:
    """Grade each new image in turn; the history is read again after each publish (a
    baseline graded first is what the next ones compare with)."""
    answers: list[TagAnswer] = []
    waiting: list[str] = []
    failed: list[str] = []
    runner = detect_runner(this.options.gpus, rehearse=this.options.rehearse)
    kind = kinds.choose(this.options.backend)
    for candidate in new:
        made, state = grade(this, candidate, history, kind, runner)
        answers += made
        if state == "waiting":
            waiting.append(candidate.words)
        elif state == "failed":
            failed.append(candidate.words)
        if any(a.stage is Stage.FINAL for a in made):
            history = read_history(this.options.site)
    return tuple(answers), tuple(waiting), tuple(failed)


@dataclass(frozen=True)
class Split:
    """A new image's selected cells: those recorded, those this host runs, the fleet's."""

    matrix: Matrix  # the image's own matrix
    cells: tuple[Cell, ...]
    recorded: int
    here: tuple[Cell, ...]
    away: tuple[Cell, ...]


def split(this: Round, candidate: Candidate, kind: BackendKind, runner: Runner) -> Split:
    """Where each cell of the image not recorded yet runs: here (what the backend can run
    on this runner, and cells too big for any GPU, saved as skipped), else on the fleet."""
    matrix = only_image(this.matrix, candidate)
    cells = candidate_cells(matrix, this.scenarios, candidate, this.selector)
    done = recorded(this.options.results, candidate).results
    todo = [c for c in cells if c.id not in done]
    infeasible = infeasible_reasons(todo)
    skips = skip_reasons(kind, todo, runner)
    here = tuple(c for c in todo if c.id not in skips or c.id in infeasible)
    away = tuple(c for c in todo if c.id in skips and c.id not in infeasible)
    return Split(matrix, cells, len(cells) - len(todo), here, away)


def grade(
    this: Round, candidate: Candidate, history: History, kind: BackendKind, runner: Runner
) -> tuple[list[TagAnswer], str]:
    """One new image: its cells run here or handed over, then (when complete) its final
    answer published. Returns the answers made and ``final``, ``waiting``, ``failed`` or
    ``empty`` (no cell selected)."""
    where = split(this, candidate, kind, runner)
    cells, here, away = where.cells, where.here, where.away
    if not cells:
        this.note(f"{candidate.words}: the selection leaves no cell of it")
        return [], "empty"
    this.note(
        f"{candidate.words}: {len(cells)} cells, {where.recorded} recorded, "
        f"{len(here)} to run here, {len(away)} for the fleet"
    )
    made: list[TagAnswer] = []
    probes = [c for c in here if c.level is Level.PROBE]
    engines = [c for c in here if c.level is not Level.PROBE]
    run_here(this, where.matrix, candidate, probes)
    if engines or away:
        made += preliminary(this, candidate, cells, history, len(engines) + len(away))
    run_here(this, where.matrix, candidate, engines)
    handed = hand_off(this, candidate, cells, away) if away else None
    away_ids = {c.id for c in away}
    return finish(this, candidate, cells, history, away=away_ids, handed=handed, made=made)


def describe(this: Round, new: Sequence[Candidate]) -> tuple[dict[str, Any], ...]:
    """``--dry-run``: per new image, where its cells would run and the fleet's API call."""
    runner = detect_runner(this.options.gpus, rehearse=this.options.rehearse)
    kind = kinds.choose(this.options.backend)
    described = []
    for candidate in new:
        where = split(this, candidate, kind, runner)
        entry: dict[str, Any] = {
            "image": candidate.image.ref,
            "lane": candidate.lane.value,
            "tag": candidate.tag,
            "digest": candidate.digest,
            "cells": len(where.cells),
            "recorded": where.recorded,
            "here": [c.id for c in where.here],
            "fleet": [c.id for c in where.away],
        }
        dispatcher = this.options.fleet.dispatcher
        if where.away and dispatcher is not None:
            handoff = handoff_of(this, candidate, where.cells, where.away)
            entry["handoff"] = dispatcher.describe(handoff)
        described.append(entry)
    return tuple(described)


def finish(
    this: Round,
    candidate: Candidate,
    cells: Sequence[Cell],
    history: History,
    *,
    away: set[str],
    handed: Mapping[str, Any] | None,
    made: list[TagAnswer],
) -> tuple[list[TagAnswer], str]:
    """Answer and publish once every cell has a result; else say what it waits for: cells
    the infrastructure stopped here run again next round, the fleet's are waited for (a
    dispatch that failed is tried again) until ``--fleet-wait-hours``; without a fleet,
    the cells this host cannot run are answered as not run."""
    have = recorded(this.options.results, candidate)
    missing = [c for c in cells if c.id not in have.results]
    if lost := [c for c in missing if c.id not in away]:
        this.note(
            f"{candidate.words}: {len(lost)} cells have no result (infrastructure errors "
            "above); the next round runs them again"
        )
        return made, "failed"
    if missing and handed is not None and not waited_out(handed, this.options.fleet):
        this.note(
            f"{candidate.words}: waiting for the fleet's {len(missing)} cells "
            f"({handed.get('words')})"
        )
        return made, "waiting"
    answer = publish_final(this, candidate, cells, history, len(missing))
    return [*made, answer], "final"


def candidate_cells(
    matrix: Matrix, scenarios: Sequence[Scenario], candidate: Candidate, selector: Selector
) -> tuple[Cell, ...]:
    """The selected cells of one image (none, rather than an error, where it has none)."""
    try:
        cells = plan(matrix, scenarios, candidate.lane, selector)
    except UsageError:
        return ()
    return tuple(c for c in cells if c.image.tag == candidate.tag)


def run_here(this: Round, matrix: Matrix, candidate: Candidate, cells: Sequence[Cell]) -> None:
    """Run cells on this host, in the image's own run folder."""
    if not cells:
        return
    options = this.options
    run = RunOptions(
        matrix=options.matrix,
        scenarios=options.scenarios,
        backend=options.backend,
        results=options.results,
        run_id=candidate.run_id,
        rehearse=options.rehearse,
        pull=options.pull,
        gpus=options.gpus,
        jobs=options.jobs,
        cache=options.cache,
    )
    execute_run(run, Progress(0), planned=(matrix, cells))


def preliminary(
    this: Round, candidate: Candidate, cells: Sequence[Cell], history: History, pending: int
) -> list[TagAnswer]:
    """The answer of the probe cells, once, while engine or fleet cells are still to come."""
    path = this.folder.answer(candidate.key, Stage.PRELIMINARY.value)
    if path.is_file():
        return []
    judged = judge_all(recorded(this.options.results, candidate).results.values())
    if not any(j.level is Level.PROBE for j in judged):
        return []
    counts = counts_of(len(cells), judged, pending)
    answer = build_answer(
        candidate,
        judged,
        baseline_side(this.baselines, candidate, history),
        stage=Stage.PRELIMINARY,
        counts=counts,
        run=candidate.run_id,
        staged=staged_of(this),
    )
    keep(this, answer)
    return [answer]


def staged_of(this: Round) -> frozenset[str]:
    """The round's scenarios whose crash the matrix stages: they decide no image's safety."""
    return staged_scenarios(documented_ranges(this.scenarios))


def publish_final(
    this: Round, candidate: Candidate, cells: Sequence[Cell], history: History, missing: int
) -> TagAnswer:
    """The final answer, published with the image's cells (the site swapped in whole)."""
    have = recorded(this.options.results, candidate)
    judged = judge_all(have.results.values())
    baseline = baseline_side(this.baselines, candidate, history)
    folders = sorted(set(have.folders.values()))
    source = folders[0] if len(folders) == 1 else _merged(this.folder, candidate, folders)
    counts = counts_of(len(cells), [j for j in judged if j.result.id in {c.id for c in cells}], 0)
    if missing:
        this.note(f"{candidate.words}: answered without {missing} cells the fleet never sent")
    made: list[TagAnswer] = []
    documents = documented_ranges(this.scenarios)  # the round's own, every folder of them

    def answers_page(_history: History, summary: PublishSummary) -> dict[str, bytes]:
        evidence = _evidence(this.options, summary, judged)
        answer = build_answer(
            candidate,
            judged,
            baseline,
            stage=Stage.FINAL,
            counts=counts,
            run=summary.runs[0],
            evidence=evidence,
            staged=staged_scenarios(documents),
        )
        made.append(answer)
        return {SITE_ANSWERS: _site_answers(this.options.site, answer)}

    published = publish_staged([source], this.options.site, ReportOptions(documents), answers_page)
    this.note(f"{candidate.words}: published in {published.out}/ (run {published.runs[0]})")
    keep(this, made[0])
    return made[0]


def keep(this: Round, answer: TagAnswer) -> None:
    """Keep the answer, put it in the job summary and send it now (what a channel does
    not take is kept for the next round)."""
    markdown = answer_markdown(answer)
    path = this.folder.answer(answer.candidate.key, answer.stage.value)
    write_json(
        path,
        {
            "made_at": datetime.now(UTC).isoformat(),
            "key": answer.candidate.key,
            "lane": answer.candidate.lane.value,
            "tag": answer.candidate.tag,
            "stage": answer.stage.value,
            "title": answer.headline,
            "payload": answer_json(answer),
            "markdown": markdown,
            "delivered": {},
            "attempts": {},
        },
    )
    this.note(answer.headline)
    if this.options.channels.summary is not None:
        with this.options.channels.summary.open("a", encoding="utf-8") as out:
            out.write(redact_text(markdown) + "\n")
    said, left = delivering.deliver_one(this.folder, path, this.options.channels, this.note)
    this.sent.extend(said)
    this.owed.append(left)


def _lanes(matrix: Matrix, lane: Lane | None) -> tuple[Lane, ...]:
    if lane is not None and lane not in matrix.lanes:
        raise UsageError(f"{matrix.file} defines no `{lane}` lane")
    return (lane,) if lane is not None else tuple(sorted(matrix.lanes))


def _offer_line(found: Sequence[Candidate], new: Sequence[Candidate], site: Path) -> str:
    if not new:
        return (
            f"nothing new: the {len(found)} images the matrix gives are all graded in "
            f"{site}/ ({', '.join(c.words for c in found)})"
        )
    return f"{len(new)} new of {len(found)} images: {', '.join(c.words for c in new)}"


def _merged(folder: WatchFolder, candidate: Candidate, folders: Sequence[Path]) -> Path:
    out = folder.merged(candidate.key)
    shutil.rmtree(out, ignore_errors=True)
    merge(folders, out)
    return out


def _evidence(
    options: WatchOptions, summary: PublishSummary, judged: Sequence[Judged]
) -> SiteLinks:
    """Where the answer can be checked once published: the site's URL, else its folder."""
    run = summary.runs[0]

    def url(page: str) -> str:
        if options.site_url:
            return f"{options.site_url.rstrip('/')}/{page}"
        return (options.site / page).resolve().as_uri()

    pages = {j.result.id: url(cell_page(run, j.result.id)) for j in judged}
    return SiteLinks(url("index.html"), pages)


def _site_answers(site: Path, answer: TagAnswer) -> bytes:
    """The site's ``answers.json``: every final answer published, the newest last."""
    earlier = read_json(site / SITE_ANSWERS) or {}
    kept = [a for a in earlier.get("answers", []) if isinstance(a, dict)]
    document = {"answers": [*kept, answer_json(answer)]}
    return (json.dumps(document, indent=1, ensure_ascii=False) + "\n").encode()


def _stderr(line: str) -> None:
    """A line about the round, as every line this tool prints: redacted, made visible."""
    print(visible(redact_text(f"repromatrix: watch: {line}")), file=sys.stderr, flush=True)
