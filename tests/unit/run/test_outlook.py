"""The first lines of a run (cells to run vs cells this host cannot run, disk) and the ETA's
correction as cells finish."""

from __future__ import annotations

from pathlib import Path

from repromatrix.backends.docker import KIND as DOCKER
from repromatrix.backends.local import KIND as LOCAL
from repromatrix.host.runner import Runner
from repromatrix.matrix.expand import plan
from repromatrix.matrix.inputs import load_inputs
from repromatrix.matrix.selector import Selector
from repromatrix.run.main import skip_reasons
from repromatrix.run.outlook import GB, disk_line, disk_needed, outlook
from repromatrix.run.pool import pace
from repromatrix.values import Lane
from support import paths


def test_the_first_lines_count_apart_the_cells_this_host_cannot_run(tmp_path: Path):
    matrix, scenarios = load_inputs(paths.ROOT / "matrix.yaml", paths.ROOT / "scenarios")
    cells = plan(matrix, scenarios, None, Selector((), ()))
    skips = skip_reasons(DOCKER, cells, Runner())  # a host without a GPU
    runnable = [cell for cell in cells if cell.id not in skips]
    lines = outlook("run x", runnable, skips, tmp_path, DOCKER.footprint)
    cpu = [cell for cell in cells if cell.lane is Lane.CPU]
    assert runnable == cpu and len(skips) == len(cells) - len(cpu) > 0
    assert lines[0] == f"run x: {len(cpu)} cells to run here, {len(skips)} this host cannot run"
    reasons = [line for line in lines if "cannot run:" in line or "other reason" in line]
    shown = sum(int(line.split()[0]) for line in reasons)
    assert shown == len(skips) and all("has no GPU" in line for line in reasons[:3])
    # The default CPU lane's four images: about 20 GB made from scratch.
    assert disk_needed(runnable, DOCKER.footprint) == 20 * GB
    assert lines[-1].startswith("disk: about 20 GB for the images made from scratch (")
    # The local backend makes virtualenvs, and says so with its own figure.
    local = outlook("run x", runnable, skips, tmp_path, LOCAL.footprint)
    needed = disk_needed(runnable, LOCAL.footprint)
    assert 0 < needed < 20 * GB
    assert local[-1].startswith(f"disk: about {needed / GB:.0f} GB for the virtualenvs made")


def test_the_disk_line_warns_where_less_is_free():
    assert disk_line(20 * GB, 5 * GB).endswith(
        "; warning: less is free than images made from scratch need"
    )
    assert "warning" not in disk_line(20 * GB, 50 * GB)
    assert disk_line(20 * GB, None) == "disk: about 20 GB for the images made from scratch"


def test_the_eta_is_corrected_by_how_long_finished_cells_took_against_their_estimate():
    assert pace([]) == 1.0
    # A loaded machine: cells estimated at 60 s took 180 s, so the rest will take three times.
    assert pace([(180.0, 60.0), (90.0, 30.0)]) == 3.0
    assert pace([(0.0, 60.0)]) == 1.0
