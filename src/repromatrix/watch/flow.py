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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from repromatrix.backends import kinds
from repromatrix.backends.base import BackendKind
from repromatrix.errors import UsageError
from repromatrix.fleet.dispatch import Dispatcher, Handoff
from repromatrix.images.wheelhouse import CACHE_ROOT
from repromatrix.matrix.config import Matrix
from repromatrix.matrix.expand import plan
from repromatrix.matrix.inputs import load_inputs, scenario_dirs
from repromatrix.matrix.selector import Selector
from repromatrix.model import Cell, Lane, Level, Scenario
from repromatrix.publish.history import History, read_history
from repromatrix.publish.site import PublishSummary, cell_page, publish_staged
from repromatrix.reports.findings import ReportOptions
from repromatrix.reports.ranges import load_documents
from repromatrix.results.merge import merge
from repromatrix.results.verdicts import Judged, judge_all
from repromatrix.run.folder import claimed
from repromatrix.run.main import RunOptions, execute_run, infeasible_reasons, skip_reasons
from repromatrix.run.progress import Progress
from repromatrix.runner import Runner, detect_runner
from repromatrix.upstream.lock import Lock, apply_lock, restricted, write_lock
from repromatrix.upstream.resolve import Online, Upstream, resolve
from repromatrix.watch import deliver as delivering
from repromatrix.watch.answer import (
    Answer,
    Evidence,
    Stage,
    answer_json,
    answer_markdown,
    build_answer,
    counts_of,
)
from repromatrix.watch.candidates import Candidate, offered, only_image, ungraded
from repromatrix.watch.notify import Channels
from repromatrix.watch.state import WATCH_DIR, WatchFolder, read_json, recorded, write_json

FLEET_WAIT_S = 24 * 3600.0
SITE_ANSWERS = "answers.json"  # the final answers, in the published site


@dataclass(frozen=True)
class Fleet:
    """Who runs the cells this host cannot, and how the fleet's checkout names the inputs."""

    dispatcher: Dispatcher | None = None
    matrix: str | None = None  # default: --matrix as given
    scenarios: str | None = None  # default: the first --scenarios folder
    package: str = "."
    wait_s: float = FLEET_WAIT_S  # after this, the final answer counts missing cells unknown


@dataclass(frozen=True)
class WatchOptions:
    """What ``repromatrix watch`` was asked to do."""

    site: Path
    baselines: tuple[str, ...]
    matrix: Path = Path("matrix.yaml")
    scenarios: tuple[Path, ...] | None = None
    results: Path = Path("results")
    lane: Lane | None = None
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    backend: str = kinds.AUTO
    rehearse: bool = False
    pull: str | None = None
    gpus: str | None = None
    jobs: int | None = None
    cache: Path = CACHE_ROOT
    site_url: str | None = None
    channels: Channels = field(default_factory=Channels)
    fleet: Fleet = field(default_factory=Fleet)
    dry_run: bool = False  # say what is new and where its cells would run; run nothing


@dataclass(frozen=True)
class WatchReport:
    """What one round did."""

    offered: tuple[Candidate, ...]
    new: tuple[Candidate, ...]
    answers: tuple[Answer, ...] = ()  # made this round, preliminary and final
    waiting: tuple[str, ...] = ()  # new images whose fleet cells have no result yet
    failed: tuple[str, ...] = ()  # new images with cells the infrastructure stopped
    deliveries: tuple[str, ...] = ()  # one line per delivery attempted
    undelivered: int = 0

    @property
    def worse(self) -> bool:
        """Whether a final answer of this round hits what its baseline avoided."""
        return any(a.worse for a in self.answers if a.stage is Stage.FINAL)


@dataclass(frozen=True)
class Round:
    """What every step of a round reads: its inputs, as resolved, and where things go."""

    options: WatchOptions
    matrix: Matrix  # locked: following lanes' images from the round's lock
    scenarios: tuple[Scenario, ...]
    lock: Lock
    folder: WatchFolder
    selector: Selector
    baselines: Mapping[Lane, str]
    note: Callable[[str], None]
    sent: list[str] = field(default_factory=list)  # what the deliveries said
    owed: list[int] = field(default_factory=list)  # deliveries left for the next round


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
    ask = upstream or Online(options.cache)
    lock = resolve(matrix, ask)
    locked = apply_lock(matrix, lock)
    selector = Selector(options.only, options.skip)
    plan(locked, scenarios, options.lane, selector)  # a selection of nothing is bad input
    found = offered(locked, lock, ask, lanes)
    baselines = baselines_of(options.baselines, found, history, options.site)
    new = _baselines_first(ungraded(found, history), baselines)
    folder = WatchFolder(options.results / WATCH_DIR)
    say(_offer_line(found, new, options.site))
    if options.dry_run:
        return WatchReport(found, new)
    folder.root.mkdir(parents=True, exist_ok=True)
    with claimed(folder.root):
        write_lock(folder.lock, lock)
        this = Round(options, locked, scenarios, lock, folder, selector, baselines, say)
        owed = delivering.deliver_all(folder, options.channels, say)  # earlier rounds' first
        this.sent.extend(owed[0])
        answers, waiting, failed = grade_all(this, new, history)
    undelivered = owed[1] + sum(this.owed)
    return WatchReport(found, new, answers, waiting, failed, tuple(this.sent), undelivered)


def grade_all(
    this: Round, new: Sequence[Candidate], history: History
) -> tuple[tuple[Answer, ...], tuple[str, ...], tuple[str, ...]]:
    """Grade each new image in turn; the history is read again after each publish (a
    baseline graded first is what the next ones compare with)."""
    answers: list[Answer] = []
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


def grade(
    this: Round, candidate: Candidate, history: History, kind: BackendKind, runner: Runner
) -> tuple[list[Answer], str]:
    """One new image: its cells run here or handed over, then (when complete) its final
    answer published. Returns the answers made and ``final``, ``waiting``, ``failed`` or
    ``empty`` (no cell selected)."""
    matrix = only_image(this.matrix, candidate)
    cells = candidate_cells(matrix, this.scenarios, candidate, this.selector)
    if not cells:
        this.note(f"{candidate.words}: the selection leaves no cell of it")
        return [], "empty"
    todo = [c for c in cells if c.id not in recorded(this.options.results, candidate).results]
    infeasible = infeasible_reasons(todo)
    skips = skip_reasons(kind, todo, runner)
    here = [c for c in todo if c.id not in skips or c.id in infeasible]
    away = [c for c in todo if c.id in skips and c.id not in infeasible]
    this.note(
        f"{candidate.words}: {len(cells)} cells, {len(cells) - len(todo)} recorded, "
        f"{len(here)} to run here, {len(away)} for the fleet"
    )
    made: list[Answer] = []
    probes = [c for c in here if c.level is Level.PROBE]
    engines = [c for c in here if c.level is not Level.PROBE]
    run_here(this, matrix, candidate, probes)
    if engines or away:
        made += preliminary(this, candidate, cells, history, len(engines) + len(away))
    run_here(this, matrix, candidate, engines)
    handed = hand_off(this, candidate, cells, away) if away else None
    away_ids = {c.id for c in away}
    return finish(this, candidate, cells, history, away=away_ids, handed=handed, made=made)


def finish(
    this: Round,
    candidate: Candidate,
    cells: Sequence[Cell],
    history: History,
    *,
    away: set[str],
    handed: Mapping[str, Any] | None,
    made: list[Answer],
) -> tuple[list[Answer], str]:
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
    if missing and handed is not None and not _waited_out(handed, this.options.fleet):
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
) -> list[Answer]:
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
        baseline_side(this, candidate, history),
        stage=Stage.PRELIMINARY,
        counts=counts,
        run=candidate.run_id,
    )
    keep(this, answer)
    return [answer]


def baseline_side(
    this: Round, candidate: Candidate, history: History
) -> tuple[str, Sequence[Judged]] | None:
    """The baseline's tag and published cells; None for the baseline's own first grading."""
    baseline = this.baselines.get(candidate.lane)
    if baseline is None:
        return None
    if baseline == candidate.tag and not history.graded(candidate.lane.value, baseline):
        return None
    return baseline, history.published(candidate.lane.value, baseline)


def publish_final(
    this: Round, candidate: Candidate, cells: Sequence[Cell], history: History, missing: int
) -> Answer:
    """The final answer, published with the image's cells (the site swapped in whole)."""
    have = recorded(this.options.results, candidate)
    judged = judge_all(have.results.values())
    baseline = baseline_side(this, candidate, history)
    folders = sorted(set(have.folders.values()))
    source = folders[0] if len(folders) == 1 else _merged(this.folder, candidate, folders)
    counts = counts_of(len(cells), [j for j in judged if j.result.id in {c.id for c in cells}], 0)
    if missing:
        this.note(f"{candidate.words}: answered without {missing} cells the fleet never sent")
    made: list[Answer] = []

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
        )
        made.append(answer)
        return {SITE_ANSWERS: _site_answers(this.options.site, answer)}

    documents = load_documents(scenario_dirs(this.options.scenarios)[0])
    published = publish_staged([source], this.options.site, ReportOptions(documents), answers_page)
    this.note(f"{candidate.words}: published in {published.out}/ (run {published.runs[0]})")
    keep(this, made[0])
    return made[0]


def keep(this: Round, answer: Answer) -> None:
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
            out.write(markdown + "\n")
    said, left = delivering.deliver_one(this.folder, path, this.options.channels, this.note)
    this.sent.extend(said)
    this.owed.append(left)


def hand_off(
    this: Round, candidate: Candidate, cells: Sequence[Cell], away: Sequence[Cell]
) -> Mapping[str, Any] | None:
    """Hand the cells this host cannot run to the fleet, once (a dispatch that failed is
    tried again next round); None without a fleet (they are answered as not run)."""
    dispatcher = this.options.fleet.dispatcher
    if dispatcher is None:
        this.note(
            f"{candidate.words}: {len(away)} cells cannot run here ({_reason(away)}) and "
            "no fleet is given (--fleet): they are answered as not run"
        )
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


def handoff_of(
    this: Round, candidate: Candidate, cells: Sequence[Cell], away: Sequence[Cell]
) -> Handoff:
    """The hand-off of ``away``: its globs, and the lock of this image alone."""
    fleet = this.options.fleet
    followed = candidate.lane in this.lock.lanes
    lock = restricted(this.lock, candidate.lane, [candidate.tag]) if followed else None
    lock_text = json.dumps((lock or Lock(this.lock.matrix, this.lock.resolved_at, {})).to_json())
    folders = scenario_dirs(this.options.scenarios)
    return Handoff(
        key=candidate.key,
        lane=candidate.lane.value,
        tag=candidate.tag,
        matrix=fleet.matrix or str(this.options.matrix),
        scenarios=fleet.scenarios or str(folders[0]),
        only=(f"{candidate.lane.value}/{candidate.tag}/*",),
        skip=handoff_skips(cells, away),
        lock=lock_text,
        cells=len(away),
        package=fleet.package,
    )


def handoff_skips(cells: Sequence[Cell], away: Sequence[Cell]) -> tuple[str, ...]:
    """The ``--skip`` globs that leave the fleet only ``away``: ``*@probe`` when what stays
    here is exactly the probe cells, else each such cell's id."""
    handed = {c.id for c in away}
    kept = [c for c in cells if c.id not in handed]
    probes = [c for c in cells if c.level is Level.PROBE]
    if kept and kept == probes:
        return ("*@probe",)
    return tuple(c.id for c in kept)


def baselines_of(
    given: Sequence[str], found: Sequence[Candidate], history: History, site: Path
) -> dict[Lane, str]:
    """Each lane's baseline among ``given``: in the history, or offered now (then graded
    first); ``UsageError`` for one that is neither or for a lane given two."""
    if not given:
        raise UsageError("give the tag in use today: --baseline TAG (one per lane watched)")
    chosen: dict[Lane, str] = {}
    lanes = sorted({c.lane for c in found})
    for tag in given:
        where = [lane for lane in lanes if _has(history, found, lane, tag)]
        if not where:
            graded = sorted({t for lane in lanes for t in history.tags(lane.value)})
            listed = sorted({c.tag for c in found})
            raise UsageError(
                f"--baseline {tag}: not in the history of {site} (graded: "
                f"{', '.join(graded) or 'none'}) nor among the tags the matrix gives now "
                f"({', '.join(listed) or 'none'})"
            )
        for lane in where:
            if lane in chosen:
                raise UsageError(f"--baseline {chosen[lane]} and {tag}: one baseline per lane")
            chosen[lane] = tag
    return chosen


def _has(history: History, found: Sequence[Candidate], lane: Lane, tag: str) -> bool:
    """Whether ``tag`` of ``lane`` is graded in the history or offered now."""
    graded = tag in history.tags(lane.value)
    return graded or any(c.lane is lane and c.tag == tag for c in found)


def _lanes(matrix: Matrix, lane: Lane | None) -> tuple[Lane, ...]:
    if lane is not None and lane not in matrix.lanes:
        raise UsageError(f"{matrix.file} defines no `{lane}` lane")
    return (lane,) if lane is not None else tuple(sorted(matrix.lanes))


def _baselines_first(
    new: Sequence[Candidate], baselines: Mapping[Lane, str]
) -> tuple[Candidate, ...]:
    return tuple(sorted(new, key=lambda c: baselines.get(c.lane) != c.tag))


def _offer_line(found: Sequence[Candidate], new: Sequence[Candidate], site: Path) -> str:
    if not new:
        return (
            f"nothing new: the {len(found)} images the matrix gives are all graded in "
            f"{site}/ ({', '.join(c.words for c in found)})"
        )
    return f"{len(new)} new of {len(found)} images: {', '.join(c.words for c in new)}"


def _waited_out(handed: Mapping[str, Any], fleet: Fleet) -> bool:
    try:
        at = datetime.fromisoformat(str(handed.get("at")))
    except ValueError:
        return True
    return (datetime.now(UTC) - at).total_seconds() > fleet.wait_s


def _reason(cells: Sequence[Cell]) -> str:
    gpus = sorted({c.gpu.name for c in cells})
    return f"GPUs {', '.join(gpus)}"


def _merged(folder: WatchFolder, candidate: Candidate, folders: Sequence[Path]) -> Path:
    out = folder.merged(candidate.key)
    shutil.rmtree(out, ignore_errors=True)
    merge(folders, out)
    return out


def _evidence(options: WatchOptions, summary: PublishSummary, judged: Sequence[Judged]) -> Evidence:
    """Where the answer can be checked once published: the site's URL, else its folder."""
    run = summary.runs[0]

    def url(page: str) -> str:
        if options.site_url:
            return f"{options.site_url.rstrip('/')}/{page}"
        return (options.site / page).resolve().as_uri()

    pages = {j.result.id: url(cell_page(run, j.result.id)) for j in judged}
    return Evidence(url("index.html"), pages)


def _site_answers(site: Path, answer: Answer) -> bytes:
    """The site's ``answers.json``: every final answer published, the newest last."""
    earlier = read_json(site / SITE_ANSWERS) or {}
    kept = [a for a in earlier.get("answers", []) if isinstance(a, dict)]
    document = {"answers": [*kept, answer_json(answer)]}
    return (json.dumps(document, indent=1, ensure_ascii=False) + "\n").encode()


def _stderr(line: str) -> None:
    print(f"repromatrix: watch: {line}", file=sys.stderr, flush=True)
