"""``scenario draft --try`` runs where it can never become the "latest" run of results/."""

from __future__ import annotations

from pathlib import Path

from repromatrix.cli import build_parser
from repromatrix.commands.scenario import TRIES
from repromatrix.results import store
from repromatrix.run.folder import latest_run


def test_a_try_run_never_becomes_the_latest_run(tmp_path: Path) -> None:
    args = build_parser().parse_args(["scenario", "draft", "crash.log", "--try"])
    assert args.results == TRIES and TRIES.parent == Path("results")
    results = tmp_path / "results"
    earlier = results / "20260101-000000"
    tried = tmp_path / TRIES / "20990101-000000"  # a later try, under its default folder
    for run in (earlier, tried):
        (run / store.CELLS_DIR).mkdir(parents=True)
    assert latest_run(results, with_cells=True) == earlier
    assert latest_run(results) == earlier
