"""The one place a bisect runs cells: through the run's own main job, into a normal run folder.

``run_cells`` is the seam to ``repromatrix.run``: everything else in this
package is pure or reads files. The cells come already planned from a matrix
extended in memory (versions matrix.yaml does not list), and ``execute_run``
takes that plan instead of reading the matrix file; every step after it is
the run's own, and the folder it writes is one ``report``, ``merge`` and
``diff`` read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from repromatrix.bisect.answer import VersionEvidence
from repromatrix.bisect.cells import evidence
from repromatrix.matrix.config import Matrix
from repromatrix.results import store
from repromatrix.run.main import RunOptions, execute_run
from repromatrix.run.progress import Progress
from repromatrix.values import Cell


@dataclass(frozen=True)
class BisectRun:
    """Where and how a bisect's cells run: one run folder that every round adds to."""

    results: Path  # the results root; the run folder is results/<run_id>/
    run_id: str
    backend: str = "auto"
    matrix: Path = Path("matrix.yaml")
    scenarios: Path | None = None  # None: the shipped scenarios (and any beside the matrix)
    cache: Path = Path(".cache")
    dockerfiles: Path = Path("dockerfiles")

    @property
    def run_dir(self) -> Path:
        """The run folder every round of the bisect writes to."""
        return self.results / self.run_id


def run_cells(
    matrix: Matrix, cells: Sequence[Cell], where: BisectRun
) -> Mapping[str, VersionEvidence]:
    """Run ``cells`` (one lane) as one batch; return each cell's evidence by cell id."""
    options = RunOptions(
        matrix=where.matrix,
        scenarios=where.scenarios,
        lane=cells[0].lane,
        only=tuple(cell.id for cell in cells),
        backend=where.backend,
        results=where.results,
        run_id=where.run_id,
        resume=True,  # later rounds add cells to the same folder
        dockerfiles=where.dockerfiles,
        cache=where.cache,
    )
    execute_run(options, Progress(len(cells)), planned=(matrix, cells))
    return read_back(where.run_dir, {cell.id for cell in cells})


def read_back(run_dir: Path, ids: set[str]) -> dict[str, VersionEvidence]:
    """The evidence of the cells ``ids`` from a run folder (a cell without a result is absent)."""
    found, _problems = store.read_results(run_dir)
    return {result.id: evidence(result, run_dir) for result in found if result.id in ids}
