"""Images as jobs of the cell pool: cells start as their own image is ready, builds overlap.

The recording backend of ``support.pool`` stands behind the ``Backend``
interface: ``make`` decides what each image job gets and when. Real builds and
pulls through the same stage are exercised by the integration tests of the run.
"""

from __future__ import annotations

import io
import signal
import threading
from pathlib import Path

import pytest

from repromatrix.backends.base import Execution, Prepared
from repromatrix.errors import UsageError
from repromatrix.judgement import Outcome
from repromatrix.results import store
from repromatrix.run.cell import NOT_RUN, CellContext, CellOutcome, CellRun, cell_result
from repromatrix.run.folder import RunFolder
from repromatrix.run.images import image_job, job_key, ready_line
from repromatrix.run.main import LATEST, Pacing, RunOptions, durations_folder, measured_s
from repromatrix.values import Cell, Image
from support.pool import GUARD_S, Recorder, resources, run, run_making_images, saved
from support.runner import cell

OLD, NEW = cell(version="0.31.0", variant="old"), cell(version="0.32.0", variant="new")


def test_a_cell_runs_while_another_image_is_still_being_made(tmp_path: Path):
    # The old image is made only once the new image's cell has run: with every image made
    # before any cell (the stage as it was), this run could never end.
    new_ran = threading.Event()

    def make(image: Image) -> Prepared:
        if image.key == OLD.image.key and not new_ran.wait(GUARD_S):
            return Prepared(image.key, "", error="the new image's cell never ran")
        return Prepared(image.key, f"img-{image.key}")

    def hold(one: Cell, _stop: threading.Event) -> Execution:
        new_ran.set()
        return Execution(0, b"")

    backend = Recorder(hold=hold, make=make)
    counts, _ = run_making_images(
        tmp_path, backend, [NEW, OLD], resources(cores=4), pacing=Pacing(image_jobs=2)
    )
    assert counts == {"other_failure": 2}, saved(tmp_path)  # both ran (no root cause seen)
    # Each cell ran with the value its own image job handed it.
    assert {r.version for r in saved(tmp_path).values()} == {
        f"version-in-{OLD.image.key}",
        f"version-in-{NEW.image.key}",
    }


def test_a_failed_image_fails_only_its_own_cells(tmp_path: Path):
    def make(image: Image) -> Prepared:
        if image.key == OLD.image.key:
            return Prepared(image.key, "", error="pull of vllm/vllm-openai:v0.31.0 failed: 404")
        return Prepared(image.key, f"img-{image.key}")

    out = io.StringIO()
    run_making_images(tmp_path, Recorder(make=make), [OLD, NEW], resources(), out)
    results = saved(tmp_path)
    assert results[OLD.id].outcome is Outcome.INFRA_ERROR
    assert "image not available" in results[OLD.id].reason and "404" in results[OLD.id].reason
    assert results[NEW.id].outcome is Outcome.OTHER_FAILURE  # it ran
    assert "failed: pull of vllm/vllm-openai:v0.31.0 failed: 404" in out.getvalue()


def test_an_image_job_that_raises_fails_only_the_cells_waiting_for_it(tmp_path: Path):
    def make(image: Image) -> Prepared:
        if image.key == OLD.image.key:
            raise RuntimeError("a bug in the image job")
        return Prepared(image.key, f"img-{image.key}")

    counts, _ = run_making_images(tmp_path, Recorder(make=make), [OLD, NEW], resources())
    results = saved(tmp_path)
    assert results[OLD.id].outcome is Outcome.INFRA_ERROR
    assert "a bug in the image job" in results[OLD.id].reason
    assert results[NEW.id].outcome is Outcome.OTHER_FAILURE
    assert sum(counts.values()) == 2


def test_image_jobs_caps_the_builds_at_once(tmp_path: Path):
    cells = [cell(version=v, variant=f"v{v}") for v in ("0.29.0", "0.30.0", "0.31.0", "0.32.0")]
    lock, busy, most = threading.Lock(), [0], [0]
    pair = threading.Barrier(2, timeout=GUARD_S)

    def make(image: Image) -> Prepared:
        with lock:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
        pair.wait()  # two at once, or this breaks (and the cells end as infra errors)
        with lock:
            busy[0] -= 1
        return Prepared(image.key, f"img-{image.key}")

    counts, _ = run_making_images(
        tmp_path, Recorder(make=make), cells, resources(), pacing=Pacing(image_jobs=2)
    )
    assert most[0] == 2
    assert counts == {"other_failure": 4}


def test_cells_of_two_images_share_one_tiny_model_made_once_with_every_rank(tmp_path: Path):
    backend = Recorder()
    _, needs = run_making_images(
        tmp_path, backend, [OLD, NEW], resources(), pacing=Pacing(image_jobs=2)
    )
    [(name, _image, ranks)] = backend.models
    assert name == OLD.model.name and ranks == needs[name].ranks
    results = saved(tmp_path)
    assert results[NEW.id].version == f"version-in-{NEW.image.key}"
    assert results[OLD.id].version == f"version-in-{OLD.image.key}"


@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_does_not_wait_for_an_image_still_being_made(tmp_path: Path):
    main, release, built = threading.get_ident(), threading.Event(), threading.Event()

    def make(image: Image) -> Prepared:
        if image.key == OLD.image.key:
            release.wait(GUARD_S)  # a build that would take minutes more
            built.set()
        return Prepared(image.key, f"img-{image.key}")

    def hold(one: Cell, _stop: threading.Event) -> Execution:
        signal.pthread_kill(main, signal.SIGINT)
        return Execution(0, b"")

    try:
        with pytest.raises(KeyboardInterrupt):
            run_making_images(
                tmp_path, Recorder(hold=hold, make=make), [NEW, OLD], resources(),
                pacing=Pacing(image_jobs=2),
            )  # fmt: skip
        assert not built.is_set()  # the run ended while the build still ran
        # The new cell's result is kept unless Ctrl-C came before its callable returned.
        found, _ = store.read_results(tmp_path)
        assert OLD.id not in {result.id for result in found}
    finally:
        release.set()


def test_measured_durations_order_the_cells_longest_first(tmp_path: Path):
    cells = [cell(variant=name) for name in ("short", "long", "middle")]
    measured = {cells[0].id: 10.0, cells[1].id: 300.0, cells[2].id: 100.0}
    order: list[str] = []

    def hold(one: Cell, _stop: threading.Event) -> Execution:
        order.append(one.variant.name)
        return Execution(0, b"")

    run(tmp_path, Recorder(hold=hold), cells, resources(), pacing=Pacing(1, measured=measured))
    assert order == ["long", "middle", "short"]
    order.clear()
    run(tmp_path / "unmeasured", Recorder(hold=hold), cells, resources(), pacing=Pacing(1))
    assert order == ["short", "long", "middle"]  # alike by estimate: the plan's order


def test_durations_come_from_an_earlier_run_folder(tmp_path: Path):
    earlier = tmp_path / "results" / "earlier"
    ran = CellRun(CellOutcome(Outcome.HIT, "seen"), Execution(1, b"", total_s=42.5))
    context = CellContext(Prepared(OLD.image.key, "img"), "/m")
    when = "2026-11-30T20:00:00+00:00"
    result = cell_result(OLD, ran, context=context, run_id="earlier", started_at=when)
    store.write_result(earlier, result, b"")
    skipped = CellRun(CellOutcome(Outcome.SKIPPED, "no GPU"), NOT_RUN)
    never = cell_result(NEW, skipped, context=context, run_id="earlier", started_at=when)
    store.write_result(earlier, never, b"")
    notes: list[str] = []
    here = RunFolder("now", tmp_path / "results" / "now")
    found = durations_folder(RunOptions(durations_from=earlier), here)
    assert measured_s(found, notes.append) == {OLD.id: 42.5}
    assert notes == [f"cells ordered by the durations measured in {earlier}/ (1 cells)"]
    assert durations_folder(RunOptions(), here) is None
    assert measured_s(None, notes.append) is None
    with pytest.raises(UsageError, match="not a run folder"):
        durations_folder(RunOptions(durations_from=tmp_path / "results"), here)


def test_durations_from_latest_reads_the_latest_earlier_run_or_nothing(tmp_path: Path):
    results = tmp_path / "results"
    latest = RunOptions(results=results, durations_from=LATEST)

    def folder(run_id: str) -> RunFolder:
        return RunFolder(run_id, results / run_id)

    assert durations_folder(latest, folder("20261130-120000")) is None  # no earlier run
    for run_id, took in (("20261130-100000", 10.0), ("20261130-110000", 20.0)):
        ran = CellRun(CellOutcome(Outcome.HIT, "seen"), Execution(1, b"", total_s=took))
        context = CellContext(Prepared(OLD.image.key, "img"), "/m")
        when = "2026-11-30T10:00:00+00:00"
        store.write_result(
            results / run_id,
            cell_result(OLD, ran, context=context, run_id=run_id, started_at=when),
            b"",
        )
    assert durations_folder(latest, folder("20261130-120000")) == results / "20261130-110000"
    # A resumed run does not read its own folder: the one before it.
    assert durations_folder(latest, folder("20261130-110000")) == results / "20261130-100000"
    # A later folder with no cells (a --prepare-only run's image logs) measured nothing.
    (results / "20261130-113000" / "images").mkdir(parents=True)
    assert durations_folder(latest, folder("20261130-120000")) == results / "20261130-110000"


def test_an_image_job_holds_no_cell_resources_and_says_how_its_image_came():
    job = image_job("k")
    assert job.key == job_key("k") and job.image_task and job.need.slots == 0
    image = OLD.image
    assert "ready (found)" in ready_line(image, Prepared(image.key, "t"))
    built = ready_line(image, Prepared(image.key, "t", build_s=75, built=True))
    assert "built in 1m15s" in built
    failed = ready_line(image, Prepared(image.key, "", error="build failed: x\nStep 3"))
    assert "failed: build failed: x (its cells" in failed
