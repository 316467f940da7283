"""The result schema, version 3: facts, reached and the verdict; results of versions 1 and 2
still read."""

from __future__ import annotations

import json

import pytest

from repromatrix.judgement import Outcome
from repromatrix.results.schema import SCHEMA_VERSION, ResultProblem, parse_result
from repromatrix.results.store import read_run, write_result
from support import paths
from support.reach import NOT_COMPILED, decided

# A result.json exactly as a real run of schema version 1 wrote it (tests/data/cpu-run).
STORED_V1 = (
    paths.DATA / "cpu-run/ci-cpu-matrix/cells/cpu/0.31.0/cpu/tiny-llama/default"
    "/cpu-kv-cache-too-small/trigger/result.json"
)


def test_the_stored_result_is_one_of_version_1() -> None:
    assert json.loads(STORED_V1.read_text())["schema_version"] == 1
    assert "facts" not in STORED_V1.read_text()


def test_a_result_of_version_1_reads_with_no_facts_and_no_claim() -> None:
    result = parse_result(STORED_V1.read_bytes())
    assert result.outcome is Outcome.HIT
    assert result.facts == {}
    assert result.reached is None
    assert result.schema_version == SCHEMA_VERSION == 3


def test_version_1_runs_read_whole() -> None:
    loaded = read_run(paths.DATA / "cpu-run" / "ci-cpu-matrix")
    assert loaded.problems == ()
    assert {r.outcome for r in loaded.results} == {Outcome.HIT, Outcome.AVOIDED}


def test_facts_and_reached_are_written_and_read_back(tmp_path) -> None:
    result = decided("0.32.0", NOT_COMPILED)
    folder = write_result(tmp_path, result, b"log\n")
    data = json.loads((folder / "result.json").read_text())
    assert data["schema_version"] == 3
    assert data["outcome"] == "not_reached"
    assert data["reached"] is False
    assert data["facts"]["compilation_mode"] == "NONE"
    assert data["facts"]["kv_cache_tokens"] == "65536"
    back = parse_result((folder / "result.json").read_bytes())
    assert (back.facts, back.reached, back.outcome) == (
        result.facts,
        False,
        Outcome.NOT_REACHED,
    )


def test_a_result_of_version_2_reads_as_it_was(tmp_path) -> None:
    """Version 3 only added the written verdict and the ``not_reached`` expectation."""
    result = decided("0.32.0", NOT_COMPILED)
    folder = write_result(tmp_path, result, b"log\n")
    data = json.loads((folder / "result.json").read_text())
    data["schema_version"] = 2
    del data["verdict"]
    back = parse_result(json.dumps(data).encode())
    assert (back.facts, back.reached, back.outcome) == (result.facts, False, Outcome.NOT_REACHED)


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("facts", ["NONE"], "`facts` must be an object of fact names and text, not a list"),
        ("facts", {"kv_cache_tokens": 65536}, "`facts` must be an object of fact names and text"),
        ("reached", "yes", "`reached` must be true or false, not text"),
    ],
)
def test_malformed_facts_or_reached_are_named(field: str, value: object, said: str) -> None:
    data = decided("0.32.0", NOT_COMPILED).to_json()
    data[field] = value
    with pytest.raises(ResultProblem) as raised:
        parse_result(json.dumps(data).encode())
    assert said in str(raised.value)
