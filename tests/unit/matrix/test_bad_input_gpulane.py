"""Bad input of the GPU lane's keys: process names in signatures, combined scenario folders,
output paths that are files. Each is one clear message, never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from repromatrix.cli import main
from repromatrix.errors import EXIT_USAGE
from support import paths

ROOT = paths.ROOT

MINE = """
id: my-crash
title: my crash
lanes: [gpu]
trigger: {model.moe: true}
launch: {}
signatures:
  - {pattern: "boom", process: EngineCroe}
  - {pattern: "bang", process: Worker_TP3}
affected: all
avoided: ready
"""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "matrix.yaml", tmp_path / "matrix.yaml")
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    (tmp_path / "mine").mkdir()
    return tmp_path


def plan(workdir: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", "--matrix", str(workdir / "matrix.yaml"), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_an_unknown_process_name_is_refused_with_the_nearest(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = workdir / "mine" / "my-crash.yaml"
    mine.write_text(MINE.lstrip())
    code, _, err = plan(workdir, capsys, "--scenarios", str(workdir / "mine"))
    assert code == EXIT_USAGE
    line = next(n for n, text in enumerate(mine.read_text().splitlines(), 1) if "Croe" in text)
    column = mine.read_text().splitlines()[line - 1].index("EngineCroe") + 1
    assert err == (
        f"repromatrix: error: {mine}:{line}:{column}: unknown process `EngineCroe`: a "
        "signature's process is one vLLM prints, such as APIServer, EngineCore, Worker or "
        "VllmWorker. Perhaps you meant `EngineCore`?\n"
    )  # Worker_TP3 is a real name: only the typo is reported


def test_scenario_folders_combine_with_the_shipped_catalogue(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workdir / "mine" / "my-crash.yaml").write_text(
        MINE.lstrip().replace("EngineCroe", "EngineCore")
    )
    shipped = str(workdir / "scenarios")
    code, out, _ = plan(
        workdir, capsys, "--scenarios", shipped, "--scenarios", str(workdir / "mine"), "--json"
    )
    assert code == 0
    scenarios = {cell["scenario"] for cell in json.loads(out)}
    assert {"my-crash", "moe-lora-rank-over-128", "healthy-gpu"} <= scenarios


def test_an_id_in_two_folders_names_both_files(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copy(workdir / "scenarios" / "healthy-gpu.yaml", workdir / "mine")
    code, _, err = plan(
        workdir,
        capsys,
        "--scenarios",
        str(workdir / "scenarios"),
        "--scenarios",
        str(workdir / "mine"),
    )
    assert code == EXIT_USAGE
    assert err == (
        f"repromatrix: error: {workdir / 'mine' / 'healthy-gpu.yaml'}: duplicate scenario id "
        f"`healthy-gpu` (also in {workdir / 'scenarios' / 'healthy-gpu.yaml'})\n"
    )


@pytest.mark.parametrize(
    ("command", "option"),
    [("render", "--out"), ("run", "--results"), ("prepare", "--hf-cache")],
)
def test_an_output_path_that_is_a_file_is_one_line(
    workdir: Path, capsys: pytest.CaptureFixture[str], command: str, option: str
) -> None:
    blocker = workdir / "a-file"
    blocker.write_text("")
    args = [
        command,
        "--matrix",
        str(workdir / "matrix.yaml"),
        "--scenarios",
        str(workdir / "scenarios"),
    ]
    args += ["--lane", "gpu", "--only", "gpu/v0.31.0/h100/qwen3-30b-a3b/default/healthy-gpu/*"]
    code = main([*args, option, str(blocker / "sub"), *(["--dry-run"] if command == "run" else [])])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert err == (
        f"repromatrix: error: {option} {blocker / 'sub'} is under {blocker}, which is a file, "
        "not a folder\n"
    )
