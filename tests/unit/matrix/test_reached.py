"""``reached`` in a scenario file: read as written, every bad entry named with file and line
before any container starts, and the published schema agreeing with the loader."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
import yaml

from repromatrix.cli import main
from repromatrix.errors import EXIT_USAGE, ConfigError
from repromatrix.matrix.scenarios import load_catalogue, load_scenario
from repromatrix.values import FactTest, Signature
from support import paths

ZOO = paths.ROOT / "scenarios" / "zoo"
SCHEMA = json.loads((paths.ROOT / "schemas" / "scenario.schema.json").read_text())


def with_reached(tmp_path: Path, reached: str) -> Path:
    """The zoo's compiler scenario with its ``reached`` block replaced by ``reached``."""
    text = (ZOO / "cpu-compiler-missing.yaml").read_text()
    head, rest = text.split("reached:\n", 1)
    tail = rest[rest.index("affected:") :]
    path = tmp_path / "cpu-compiler-missing.yaml"
    path.write_text(f"{head}reached:\n{reached}{tail}")
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        load_scenario(path)
    return [str(problem) for problem in raised.value.problems]


def test_the_zoo_file_reads_as_a_fact_test() -> None:
    scenario = load_scenario(ZOO / "cpu-compiler-missing.yaml")
    assert scenario.reached == (
        FactTest(
            "compilation_mode", matches="^(DYNAMO_TRACE_ONCE|VLLM_COMPILE|STOCK_TORCH_COMPILE)$"
        ),
    )


def test_lines_and_facts_read_in_order(tmp_path: Path) -> None:
    path = with_reached(
        tmp_path,
        "  - {pattern: 'Warming up model', process: Worker}\n"
        "  - {fact: kv_cache_tokens, equals: 65536}\n"
        "  - {fact: kv_cache_gib, equals: 0.06}\n",
    )
    assert load_scenario(path).reached == (
        Signature("Warming up model", "Worker"),
        FactTest("kv_cache_tokens", equals="65536"),
        FactTest("kv_cache_gib", equals="0.06"),
    )


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ("{pattern: 'Using (', process: Worker}", "`pattern` is not a valid regular expression"),
        ("{pattern: '(Using)\\1'}", "`pattern` is not a valid regular expression"),
        (
            "{pattern: ok, process: Scheduler}",
            "unknown process `Scheduler`: a `reached` line's process is one vLLM prints",
        ),
        (
            "{fact: kv_cache_token, equals: 1}",
            "unknown fact `kv_cache_token`: triage reads vllm_version, torch_version",
        ),
        ("{fact: kv_cache_tokens}", "a `fact` entry needs exactly one of `equals` or `matches`"),
        (
            "{fact: kv_cache_tokens, equals: 1, matches: x}",
            "a `fact` entry needs exactly one of `equals` or `matches`",
        ),
        ("{fact: kv_cache_tokens, matches: '[x'}", "`matches` is not a valid regular expression"),
        ("{fact: kv_cache_tokens, equals: [1]}", "`equals` must be text or a number, not a list"),
        (
            "{fact: kv_cache_tokens, equals: 1, process: Worker}",
            "`process` belongs to a log line, not to a `fact` entry",
        ),
        ("{process: Worker}", "a `reached` entry needs `pattern` (a log line) or `fact`"),
        ("{pattern: x, fakt: y}", "fakt"),
    ],
)
def test_a_bad_entry_is_named_at_its_line(tmp_path: Path, entry: str, said: str) -> None:
    path = with_reached(tmp_path, f"  - {entry}\n")
    line = path.read_text().splitlines().index(f"  - {entry}") + 1
    [problem] = problems(path)
    assert problem.startswith(f"{path}:{line}:")
    assert said in problem


def test_an_empty_list_is_refused_and_an_absent_one_makes_no_claim(tmp_path: Path) -> None:
    text = (ZOO / "cpu-compiler-missing.yaml").read_text()
    head, rest = text.split("reached:\n", 1)
    path = tmp_path / "cpu-compiler-missing.yaml"
    path.write_text(head + "reached: []\n" + rest[rest.index("affected:") :])
    [problem] = problems(path)
    assert "`reached` must list at least one line or fact (or be left out)" in problem
    path.write_text(head + rest[rest.index("affected:") :])
    assert load_scenario(path).reached == ()


def test_a_baseline_may_not_claim_a_code_path(tmp_path: Path) -> None:
    path = tmp_path / "healthy-cpu.yaml"
    healthy = (paths.ROOT / "scenarios" / "healthy-cpu.yaml").read_text()
    path.write_text(healthy + "reached:\n  - {pattern: ok}\n")
    [problem] = problems(path)
    assert "a baseline expects no crash: remove `reached`" in problem


def test_plan_refuses_it_before_any_container_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "zoo"
    shutil.copytree(ZOO, folder)
    with_reached(folder, "  - {fact: backend, equals: x}\n")
    code = main(["plan", "--lane", "cpu", "--scenarios", str(folder)])
    assert code == EXIT_USAGE
    assert "cpu-compiler-missing.yaml:" in capsys.readouterr().err


def test_every_scenario_file_with_reached_fits_the_published_schema() -> None:
    catalogue = load_catalogue([paths.ROOT / "scenarios", ZOO])
    claiming = [s for s in catalogue if s.reached]
    assert len(claiming) >= 8
    for scenario in claiming:
        jsonschema.validate(yaml.safe_load(Path(scenario.file).read_text()), SCHEMA)


@pytest.mark.parametrize(
    "entry",
    [
        {"fact": "kv_cache_tokens"},
        {"fact": "kv_cache_tokens", "equals": "1", "matches": "x"},
        {"pattern": "x", "fact": "kv_cache_tokens", "equals": "1"},
        {"fact": "no_such_fact", "equals": "1"},
        {"fact": "kv_cache_tokens", "equals": "1", "process": "Worker"},
    ],
)
def test_the_schema_refuses_what_the_loader_refuses(entry: dict[str, str]) -> None:
    document = yaml.safe_load((ZOO / "cpu-compiler-missing.yaml").read_text())
    document["reached"] = [entry]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, SCHEMA)
