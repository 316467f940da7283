"""``repromatrix publish``: a static site from run folders, extending the site published before.

The site needs no server and nothing from outside (styles, scripts and
pictures are inline; links are relative), so it works from ``file://`` and
from GitHub Pages alike:

- ``index.html``: the upgrade view, range evidence and heat map of the newest run;
- ``scenarios/<id>.html``: a scenario's source documents, signatures,
  documented and observed ranges, and per image a timeline strip over runs;
- ``cells/<run>/<cell>.html``: one cell run's root cause, process, excerpt,
  digest and timings, where it ran (host, GPUs, model and adapter revisions,
  the image's environment report), and since when the cell behaves like this;
- ``environment/<run>/<image>-<hash>.txt``: vLLM's environment report of each
  image on each runner, as the run saved it;
- ``history.json``: every cell's outcome in every run, for machines.

A site and its history may have been tampered with: the history is checked
field by field when it is read (``history.parse_history``), a previous site
is copied without its links or special files (each left out is said), every
page is written inside the site through ``files``, and one publish writes a
site at a time.
"""

from __future__ import annotations

import shutil
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repromatrix.errors import UsageError
from repromatrix.files import copy_tree, hold, inside
from repromatrix.grammars import check_run_id
from repromatrix.publish.history import (
    HISTORY_FILE,
    History,
    Point,
    RunInfo,
    extend,
    read_history,
    run_date,
)
from repromatrix.reports.findings import Findings, ReportOptions, build_findings, run_name
from repromatrix.reports.heatmap import heat_maps
from repromatrix.reports.html import environment
from repromatrix.reports.runners import gpu_words
from repromatrix.reports.table import Configuration
from repromatrix.reports.upgrade import TRIGGER
from repromatrix.reports.write import EXCERPT_LIMITS, load_excerpts, write_page
from repromatrix.results.schema import ENVIRONMENT_DIR
from repromatrix.results.store import atomic_write, read_environment, read_run
from repromatrix.results.verdicts import Judged, judge_all
from repromatrix.visible import escape_json

EXCERPT_BUDGET = 64 * 1024 * 1024


@dataclass(frozen=True)
class Run:
    """One run's cells, read from one or more folders (shards of a run share its id)."""

    id: str
    judged: tuple[Judged, ...]
    excerpts: Mapping[str, str]
    environments: Mapping[str, str]  # environment report path in the run -> its text


@dataclass(frozen=True)
class Strip:
    """One timeline strip: a cell's outcome in each published run (None where absent)."""

    label: str
    configuration: str
    cell: str
    points: tuple[Point | None, ...]
    since: Point | None


@dataclass(frozen=True)
class PublishSummary:
    """What ``publish`` wrote, and what it left out (each a line for a person)."""

    out: Path
    runs: tuple[str, ...]
    pages: int
    problems: tuple[str, ...] = ()  # results that could not be read, each with its folder
    left_out: tuple[str, ...] = ()  # what of the previous site was not copied, and why

    def lines(self) -> list[str]:
        """The lines for a terminal: what was published, then every problem."""
        out = [f"published runs {', '.join(self.runs)}: {self.pages} pages in {self.out}"]
        out += [f"problem: {line}" for line in self.problems]
        out += [f"previous site: {line}" for line in self.left_out]
        return out


def cell_page(run: str, cell_id: str) -> str:
    """The page of one cell run, relative to the site root."""
    return f"cells/{run}/{cell_id.replace('/', '~')}.html"


def environment_page(run: str, report: str) -> str:
    """Where a run's environment report (its path in the run folder) is, from the site root."""
    return f"{ENVIRONMENT_DIR}/{run}/{report.removeprefix(ENVIRONMENT_DIR + '/')}"


def read_runs(folders: Sequence[Path]) -> tuple[tuple[Run, ...], tuple[str, ...]]:
    """Read every run folder as one run (a merge of shards too), named by ``run_name``, and
    say every problem of each folder (a result that could not be read is named, not dropped).

    A run's name is part of its pages' paths, so one that is no run id (a folder's
    name, when its results name no run) is refused.
    """
    cells: dict[str, list[Judged]] = defaultdict(list)
    excerpts: dict[str, dict[str, str]] = defaultdict(dict)
    problems: list[str] = []
    environments: dict[str, dict[str, str]] = defaultdict(dict)
    for folder in folders:
        loaded = read_run(folder)
        problems += [f"{folder}/{problem}" for problem in loaded.problems]
        judged = judge_all(loaded.results)
        ids = sorted({j.result.run_id for j in judged if j.result.run_id})
        run = run_name(ids, folder.resolve().name)
        if judged and (why := check_run_id(run)) is not None:
            raise UsageError(
                f"{folder}: its results name no run, and the folder's name {run!r} is not a "
                f"run id ({why}): rename the folder"
            )
        cells[run] += judged
        excerpts[run].update(load_excerpts(folder, judged, EXCERPT_LIMITS, EXCERPT_BUDGET))
        environments[run].update(read_environments(folder, judged))
    runs = tuple(
        Run(r, tuple(cells[r]), excerpts[r], environments[r]) for r in sorted(cells) if cells[r]
    )
    return runs, tuple(problems)


def read_environments(folder: Path, judged: Sequence[Judged]) -> dict[str, str]:
    """The environment reports the results of ``folder`` point at, where they are readable."""
    found = {}
    for report in sorted({j.result.environment for j in judged if j.result.environment}):
        text = read_environment(folder, report)
        if text is not None:
            found[report] = text
    return found


def publish(
    folders: Sequence[Path], out: Path, options: ReportOptions, previous: Path | None = None
) -> PublishSummary:
    """Build or extend the site in ``out`` from run folders (and a previous site, if given).

    One publish writes a site at a time: a second one is refused while the first holds it.
    """
    runs, problems = read_runs(folders)
    if not runs:
        raise UsageError("no cell results in " + ", ".join(str(f) for f in folders))
    with hold(out, "publish"):
        left_out = _copy_previous(previous, out) if previous is not None else []
        pages = _write_site(runs, out, options)
    return PublishSummary(out, tuple(r.id for r in runs), pages, problems, tuple(left_out))


def _copy_previous(previous: Path, out: Path) -> list[str]:
    """Copy a previous site into ``out`` (its links and special files left out, and said)."""
    if previous.resolve() == out.resolve():
        return []
    history = previous / HISTORY_FILE
    if history.is_symlink() or not history.is_file():
        raise UsageError(f"{previous}: not a published site (no {HISTORY_FILE})")
    return copy_tree(previous, out)


def _write_site(runs: Sequence[Run], out: Path, options: ReportOptions) -> int:
    """Extend the history of ``out`` with ``runs`` and write every page; the number of pages."""
    history = read_history(out)
    findings: dict[str, Findings] = {}
    pages = 0
    for run in runs:
        findings[run.id] = build_findings(run.judged, run.id, options)
        info = RunInfo(run.id, run_date(run.judged), findings[run.id].title, len(run.judged))
        history = extend(
            history,
            info,
            run.judged,
            {j.result.id: cell_page(run.id, j.result.id) for j in run.judged},
        )
    newest = max(runs, key=lambda r: (run_date(r.judged), r.id))
    site = _Site(out, history, options)
    for run in runs:
        pages += site.cell_pages(run)
        site.environments(run)
    pages += site.scenario_pages(newest, findings[newest.id])
    site.index(newest, findings[newest.id])
    atomic_write(inside(out, out / HISTORY_FILE), _json(history.to_json()))
    return pages + 1


def publish_staged(
    folders: Sequence[Path],
    site: Path,
    options: ReportOptions,
    extra: Callable[[History, PublishSummary], Mapping[str, bytes]] | None = None,
) -> PublishSummary:
    """``publish`` into a copy of ``site``, put in its place only once whole: whatever fails
    on the way (bad input, a full disk, an interrupt) leaves the published site as it was.
    ``extra`` gives more files for the new site (path -> bytes) from its history."""
    staging, old = site.with_name(f".{site.name}.staging"), site.with_name(f".{site.name}.old")
    if old.is_dir() and not site.exists():  # a swap cut between its two renames
        old.rename(site)
    shutil.rmtree(staging, ignore_errors=True)
    if site.is_dir():
        shutil.copytree(site, staging, symlinks=True)
    try:
        summary = publish(folders, staging, options)
        for page, data in (extra(read_history(staging), summary) if extra else {}).items():
            atomic_write(inside(staging, staging / page), data)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    if site.exists():
        site.rename(old)
    staging.rename(site)
    shutil.rmtree(old, ignore_errors=True)
    return PublishSummary(site, summary.runs, summary.pages)


def _json(document: Mapping[str, Any]) -> bytes:
    import json  # noqa: PLC0415

    text = json.dumps(document, indent=1, ensure_ascii=False, allow_nan=False)
    return (escape_json(text) + "\n").encode()


def _href(prefix: str) -> Callable[[str, str], str]:
    return lambda run, cell_id: prefix + cell_page(run, cell_id)


class _Site:
    """Renders pages into one site folder."""

    def __init__(self, out: Path, history: History, options: ReportOptions) -> None:
        self.out = out
        self.history = history
        self.options = options
        self.env = environment()

    def _write(self, page: str, template: str, **values: Any) -> None:
        depth = page.count("/")
        html = self.env.get_template(template).render(
            root="../" * depth,
            **values,
        )
        write_page(inside(self.out, self.out / page), html)

    def index(self, run: Run, findings: Findings) -> None:
        """The front page: the newest run's upgrade view, evidence and heat map."""
        href = _href("")
        self._write(
            "index.html",
            "site_index.html.j2",
            title=findings.title,
            findings=findings,
            heat_maps=heat_maps(run.judged),
            cell_href=lambda cell_id: href(run.id, cell_id),
            environment_href=lambda report: environment_page(run.id, report),
            runs=list(reversed(self.history.runs)),
            scenarios=sorted({_part(c, 5) for c in self.history.cells}),
            changed=self._changed(run),
        )

    def _changed(self, run: Run) -> list[tuple[str, Point]]:
        """Cells of the newest run whose outcome changed since an earlier run."""
        out = []
        for item in run.judged:
            since = self.history.since(item.result.id)
            first = self.history.cells[item.result.id][0]
            if since is not None and since is not first:
                out.append((item.result.id, since))
        return sorted(out)

    def cell_pages(self, run: Run) -> int:
        """One page per cell of ``run``."""
        for item in run.judged:
            r = item.result
            self._write(
                cell_page(run.id, r.id),
                "site_cell.html.j2",
                title=f"{r.id} · run {run.id}",
                judged=item,
                excerpt=run.excerpts.get(r.id),
                since=self.history.since(r.id),
                points=self.history.cells.get(r.id, ()),
                scenario_page=f"scenarios/{r.scenario}.html",
                environment_page=self._environment_page(run, r.environment),
                gpus=[gpu_words(gpu) for gpu in r.runner_gpus],
            )
        return len(run.judged)

    @staticmethod
    def _environment_page(run: Run, report: str | None) -> str | None:
        """The site's copy of a cell's environment report, when the run folder had it."""
        if report is None or report not in run.environments:
            return None
        return environment_page(run.id, report)

    def environments(self, run: Run) -> None:
        """The run's environment reports, as text files beside the pages."""
        for report, text in run.environments.items():
            page = environment_page(run.id, report)
            atomic_write(inside(self.out, self.out / page), text.encode("utf-8"))

    def scenario_pages(self, newest: Run, findings: Findings) -> int:
        """One page per scenario in the history."""
        evidence = {r.scenario: r for r in findings.ranges}
        by_scenario: dict[str, list[str]] = defaultdict(list)
        for cell_id in self.history.cells:
            by_scenario[_part(cell_id, 5)].append(cell_id)
        for scenario, cells in sorted(by_scenario.items()):
            strips = self.strips(cells)
            self._write(
                f"scenarios/{scenario}.html",
                "site_scenario.html.j2",
                title=f"{scenario} · {findings.title}",
                scenario=scenario,
                documented=self.options.documents.get(scenario),
                evidence=evidence.get(scenario),
                strips=strips,
                configurations=sorted({s.configuration for s in strips}),
                runs=self.history.runs,
            )
        return len(by_scenario)

    def strips(self, cells: Sequence[str]) -> list[Strip]:
        """Timeline strips of a scenario's trigger and baseline cells, per image over runs."""
        runs = [r.id for r in self.history.runs]
        strips = []
        for cell_id in sorted(cells, key=_strip_key):
            if _part(cell_id, 6).split("@")[0] not in (TRIGGER, "baseline"):
                continue
            by_run = {p.run: p for p in self.history.cells[cell_id]}
            parts = cell_id.split("/")
            configuration = Configuration(parts[0], parts[2], parts[3], parts[4])
            level = " (probe)" if cell_id.endswith("@probe") else ""
            strips.append(
                Strip(
                    parts[1] + level,
                    f"{configuration.lane}/{configuration.label}",
                    cell_id,
                    tuple(by_run.get(r) for r in runs),
                    self.history.since(cell_id),
                )
            )
        return strips


def _part(cell_id: str, index: int) -> str:
    parts = cell_id.split("/")
    return parts[index] if len(parts) > index else ""


def _strip_key(cell_id: str) -> tuple[Any, ...]:
    from repromatrix.reports.table import tag_key  # noqa: PLC0415

    parts = cell_id.split("/")
    return (parts[0], parts[2:5], tag_key(parts[1]), cell_id)
