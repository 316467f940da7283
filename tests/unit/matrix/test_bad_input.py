"""Bad input never ends in a traceback: every problem at once, with file:line:column, exit 2."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repromatrix.cli import main
from repromatrix.errors import EXIT_USAGE, ConfigError, RepromatrixError
from repromatrix.matrix.config import load_matrix
from repromatrix.matrix.expand import plan
from repromatrix.matrix.scenarios import load_scenario, load_scenarios
from support import paths

ROOT = paths.ROOT
MATRIX = ROOT / "matrix.yaml"
SCENARIOS = ROOT / "scenarios"
YAML_CHARS = ":-[]{},&*!|>'\"#%@`?\t\n <=.0123456789abcxyz"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A copy of the default matrix and catalogue to break."""
    shutil.copy(MATRIX, tmp_path / "matrix.yaml")
    shutil.copytree(SCENARIOS, tmp_path / "scenarios")
    return tmp_path


def run_cli(workdir: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(
        [
            "plan",
            "--matrix",
            str(workdir / "matrix.yaml"),
            "--scenarios",
            str(workdir / "scenarios"),
            *args,
        ]
    )
    return code, capsys.readouterr().err


def where(path: Path, needle: str) -> str:
    """Return ``file:line:column`` of the first occurrence of ``needle`` in ``path``."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if needle in line:
            return f"{path}:{number}:{line.index(needle) + 1}"
    raise AssertionError(f"{needle!r} not in {path}")


def replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_every_problem_of_both_files_at_once(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replace(workdir / "matrix.yaml", "    images:\n", "    imagse:\n")
    replace(workdir / "matrix.yaml", "count: 4", "count: four")
    replace(
        workdir / "scenarios" / "moe-lora-rank-over-128.yaml",
        'affected: ">=0.22.0',
        'affected: "=>0.22.0',
    )
    code, err = run_cli(workdir, capsys=capsys)
    assert code == EXIT_USAGE
    assert "Traceback" not in err
    matrix = workdir / "matrix.yaml"
    scenario = workdir / "scenarios" / "moe-lora-rank-over-128.yaml"
    imagse = "unknown key `imagse` in lane `gpu`. Perhaps you meant `images`?"
    assert f"{where(matrix, 'imagse')}: {imagse}" in err
    assert f"{where(matrix, 'four')}: `count` must be a whole number, not the text 'four'" in err
    specifier = "`affected` `=>0.22.0,<0.31.1rc0` is not a version specifier set"
    at = where(scenario, '"=>0.22.0')
    assert f"{at}: {specifier}" in err


def test_unknown_references_in_rules(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    replace(
        workdir / "matrix.yaml",
        "  - model: qwen3.5-122b-a10b\n    gpu: [h100,",
        "  - model: qwen3.5-122b\n    gpu: [h10,",
    )
    code, err = run_cli(workdir, capsys=capsys)
    assert code == EXIT_USAGE
    assert "unknown model `qwen3.5-122b`. Perhaps you meant `qwen3.5-122b-a10b`?" in err
    assert "unknown gpu `h10`. Perhaps you meant `h100`?" in err


def test_unknown_scenario_and_variant_in_rules(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replace(
        workdir / "matrix.yaml",
        "  - scenario: moe-lora-rank-over-128\n",
        "  - scenario: moe-lora-rank-over-129\n    variant: rank-12\n",
    )
    code, err = run_cli(workdir, capsys=capsys)
    assert code == EXIT_USAGE
    unknown = "unknown scenario `moe-lora-rank-over-129` in a rule."
    assert f"{unknown} Perhaps you meant `moe-lora-rank-over-128`?" in err
    assert "unknown variant `rank-12` in a rule." in err


def test_duplicate_ids(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(
        workdir / "scenarios" / "healthy-cpu.yaml", workdir / "scenarios" / "healthy-cpu.yml"
    )
    replace(workdir / "matrix.yaml", '"0.30.0", ', '"0.30.0", "0.30.0", ')
    code, err = run_cli(workdir, capsys=capsys)
    assert code == EXIT_USAGE
    assert "duplicate scenario id `healthy-cpu`" in err
    assert "duplicate image `0.30.0`" in err


def test_yaml_syntax_error(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (workdir / "scenarios" / "healthy-cpu.yaml").write_text("id: healthy-cpu\ntitle: [x\n")
    code, err = run_cli(workdir, capsys=capsys)
    assert code == EXIT_USAGE
    assert f"{workdir / 'scenarios' / 'healthy-cpu.yaml'}:3:1: YAML syntax error" in err


def test_empty_selection_is_one_clear_message(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_cli(workdir, "--only", "gpu/*/h100/qwen3-30b/*", capsys=capsys)
    assert code == EXIT_USAGE
    assert "the selection matches none of the" in err
    assert "Perhaps you meant `qwen3-30b-a3b`?" in err
    code, err = run_cli(workdir, "--skip", "*", capsys=capsys)
    assert code == EXIT_USAGE and "--skip '*' removes every cell left" in err
    code, err = run_cli(workdir, "--only", "", capsys=capsys)
    assert code == EXIT_USAGE and "--only needs a glob" in err


def test_missing_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(tmp_path, capsys=capsys)
    assert code == EXIT_USAGE
    assert f"{tmp_path / 'matrix.yaml'}: no such file" in err
    assert f"{tmp_path / 'scenarios'}: no such scenario folder" in err


def test_no_traceback_from_the_real_command(workdir: Path) -> None:
    replace(workdir / "matrix.yaml", "lanes:", "lanes: [")
    result = subprocess.run(
        [sys.executable, "-m", "repromatrix", "plan", "--matrix", str(workdir / "matrix.yaml")],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == EXIT_USAGE
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"repromatrix: error: {workdir / 'matrix.yaml'}:")


@st.composite
def mangled(draw: st.DrawFn, text: str) -> str:
    """The text with a few random edits: deletions, insertions of YAML syntax, line shuffles."""
    for _ in range(draw(st.integers(1, 4))):
        edit = draw(st.sampled_from(["delete", "insert", "swap", "indent"]))
        at = draw(st.integers(0, len(text)))
        if edit == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 40)) :]
        elif edit == "insert":
            text = (
                text[:at] + draw(st.text(alphabet=YAML_CHARS, min_size=1, max_size=8)) + text[at:]
            )
        else:
            lines = text.split("\n")
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            if edit == "swap":
                lines[i], lines[j] = lines[j], lines[i]
            else:
                lines[i] = " " * draw(st.integers(0, 6)) + lines[i].lstrip()
            text = "\n".join(lines)
    return text


def assert_clean(load: Callable[[Path], object], path: Path) -> None:
    try:
        load(path)
    except ConfigError as exc:
        assert exc.problems
        for problem in exc.problems:
            assert problem.file == str(path)
            assert problem.message and "Traceback" not in problem.message
            assert problem.line >= 0 and problem.column >= 0


SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SETTINGS
@given(data=st.data())
def test_mangled_matrix_gives_a_clean_error(tmp_path: Path, data: st.DataObject) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(data.draw(mangled(MATRIX.read_text())))
    assert_clean(load_matrix, path)


@SETTINGS
@given(data=st.data(), name=st.sampled_from(sorted(p.name for p in SCENARIOS.glob("*.yaml"))))
def test_mangled_scenario_gives_a_clean_error(
    tmp_path: Path, data: st.DataObject, name: str
) -> None:
    path = tmp_path / name
    path.write_text(data.draw(mangled((SCENARIOS / name).read_text())))
    assert_clean(load_scenario, path)


@SETTINGS
@given(text=st.text(alphabet=YAML_CHARS, max_size=200))
def test_random_yaml_gives_a_clean_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    assert_clean(load_matrix, path)
    scenario = tmp_path / "x.yaml"
    scenario.write_text(text)
    assert_clean(load_scenario, scenario)


@SETTINGS
@given(data=st.data())
def test_a_mangled_matrix_that_loads_also_plans_cleanly(
    tmp_path: Path, data: st.DataObject
) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(data.draw(mangled(MATRIX.read_text())))
    try:
        matrix = load_matrix(path)
    except ConfigError:
        return
    try:
        plan(matrix, load_scenarios(SCENARIOS))
    except RepromatrixError as exc:
        assert str(exc)
