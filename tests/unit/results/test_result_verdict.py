"""Every result.json carries its cell's verdict, for whoever reads that file alone."""

from __future__ import annotations

import json
from pathlib import Path

from repromatrix.judgement import Expected, Outcome
from repromatrix.results import store
from support.reports import result


def test_every_saved_result_has_its_verdict(tmp_path: Path) -> None:
    cases = [
        (result(), "pass"),
        (
            result(variant="max-model-len-64", outcome=Outcome.HIT, expected=Expected.AVOIDED),
            "outside_range",
        ),
        (result(scenario="healthy-cpu", variant="baseline", outcome=Outcome.SKIPPED), "skipped"),
        (result(scenario="x", outcome=Outcome.AVOIDED, expected=Expected.UNKNOWN), "unknown"),
    ]
    for cell, verdict in cases:
        folder = store.write_result(tmp_path, cell, b"log")
        written = json.loads((folder / store.RESULT_FILE).read_text())
        assert written["verdict"] == verdict
    # Read back, each result is the one saved (the reports judge it again with its run).
    read, problems = store.read_results(tmp_path)
    assert not problems and sorted(r.id for r in read) == sorted(c.id for c, _ in cases)
