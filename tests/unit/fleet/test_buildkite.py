"""plan --format buildkite: schema-valid, every cell in one step, the report step run for real.

Buildkite interpolates ``$NAME`` at upload; ``uploaded`` does the same (``$$`` is a ``$``) before
a step's script runs under bash with stand-ins for ``buildkite-agent`` and the virtualenv.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import shutil
import tomllib
from pathlib import Path

import pytest
import yaml

from repromatrix.cli import main
from repromatrix.fleet.buildkite import HUB_CLIENT, WITHOUT_SECRETS
from repromatrix.fleet.jobs import IMAGE_SETUP_S, MARGIN
from support.workflow import ROOT, VENV_BIN, check_schema, fake_tool, real_path, run_script

BOOTSTRAP = ROOT / ".buildkite" / "pipeline.yml"
USER_MATRIX = ROOT / "tests" / "data" / "fleet" / "matrix.yaml"
RECORD = 'echo "$0 $*" >> "{log}"\n'


def plan(*args: str) -> str:
    printed = io.StringIO()
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(printed):
        assert main(["plan", *args]) == 0
    return printed.getvalue()


def uploaded(script: str, build: int = 7) -> str:
    """The script as the agent runs it after upload: the build number in, ``$$`` to ``$``."""
    script = script.replace("${BUILDKITE_BUILD_NUMBER}", str(build))
    assert not re.search(r"(?<!\$)\$[A-Za-z{]", script.replace("$$", "")), script
    return script.replace("$$", "$")


@pytest.mark.program("check-jsonschema")
@pytest.mark.parametrize("gate", [[], ["--baseline", "v0.31.0", "--candidate", "v0.32.0"]])
def test_the_pipeline_matches_buildkites_schema(tmp_path: Path, gate: list[str]) -> None:
    path = tmp_path / "pipeline.yml"
    path.write_text(plan("--format", "buildkite", *gate))
    checked = check_schema(path, "vendor.buildkite")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    path.write_text(path.read_text().replace("timeout_in_minutes: 360", "timeout_in_minutes: []"))
    assert check_schema(path, "vendor.buildkite").returncode != 0
    assert check_schema(BOOTSTRAP, "vendor.buildkite").returncode == 0


def test_one_step_per_job_on_its_runners_queue_covers_every_cell() -> None:
    pipeline = yaml.safe_load(plan("--format", "buildkite", "--matrix", str(USER_MATRIX)))
    *jobs, wait, report = pipeline["steps"]
    assert wait == {"wait": None, "continue_on_failure": True}
    assert report["key"] == "report" and "artifact download" in report["command"]
    cells = {c["id"]: c for c in json.loads(plan("--json", "--matrix", str(USER_MATRIX)))}
    seen: list[str] = []
    for index, step in enumerate(jobs):
        run_id = f"bk-${{BUILDKITE_BUILD_NUMBER}}-{index}"
        assert step["artifact_paths"] == [f"results/{run_id}/**/*"]
        argv = shlex.split(step["commands"][-1].removeprefix(WITHOUT_SECRETS + " "))
        assert argv[:6] == [".repromatrix-venv/bin/repromatrix", "run", "--lane", "gpu",
                            "--run-id", run_id]  # fmt: skip
        ran = [c["id"] for c in json.loads(plan("--json", *argv[6:]))]
        assert {cells[i]["runner"] for i in ran} == {step["agents"]["queue"]}
        seconds = sum(cells[i]["deadline_s"] for i in ran)
        seconds += IMAGE_SETUP_S * len({cells[i]["image"] for i in ran})
        assert seconds <= step["timeout_in_minutes"] * 60 * (1 - MARGIN)
        seen += ran
    assert sorted(seen) == sorted(cells)


def venv_with(folder: Path, repromatrix: str) -> Path:
    """A stand-in checkout: ``python3 -m venv`` does nothing, pip nothing, repromatrix as given."""
    fake_tool(folder / "bin", "python3", "exit 0\n")
    fake_tool(folder / ".repromatrix-venv" / "bin", "pip", "exit 0\n")
    fake_tool(folder / ".repromatrix-venv" / "bin", "repromatrix", repromatrix)
    return folder / "bin"


def agent(folder: Path, log: Path) -> None:
    """buildkite-agent: logs each call; annotate keeps its stdin; download makes one shard."""
    fake_tool(
        folder,
        "buildkite-agent",
        RECORD.format(log=log)
        + 'if [ "$1" = annotate ]; then cat > "annotation-$5"; fi\n'
        + 'if [ "$1 $2" = "artifact download" ]; then mkdir -p results/bk-7-0/cells; fi\n'
        + 'if [ "$1 $2" = "pipeline upload" ]; then cp "$3" uploaded.yml; fi\n',
    )


@pytest.mark.parametrize("worse", [False, True])
def test_the_report_step_annotates_the_table_and_the_gates_answer(
    tmp_path: Path, worse: bool
) -> None:
    pipeline = yaml.safe_load(
        plan("--format", "buildkite", "--baseline", "v0.31.0", "--candidate", "v0.32.0")
    )
    log = tmp_path / "calls"
    fake = (
        RECORD.format(log=log)
        + 'if [ "$1" = merge ]; then mkdir -p merged; '
        + 'echo "| image | hit |" > merged/compat.md; fi\n'
        + f'if [ "$1" = diff ]; then echo "the candidate is {"WORSE" if worse else "ok"}"; '
        + f"exit {int(worse)}; fi\n"
    )
    bin_dir = venv_with(tmp_path, fake)
    agent(bin_dir, log)
    env = {"PATH": real_path(bin_dir)}
    ran = run_script(uploaded(pipeline["steps"][-1]["command"]), env, cwd=tmp_path)
    assert ran.returncode == int(worse), ran.stderr
    lines = log.read_text().splitlines()
    assert any(line.endswith("merge results/bk-7-0 --out merged") for line in lines)
    assert (tmp_path / "annotation-compat-matrix").read_text() == "| image | hit |\n"
    upgrade = (tmp_path / "annotation-upgrade-gate").read_text()
    assert upgrade.startswith("### Upgrade v0.31.0 -> v0.32.0\n")
    assert ("WORSE" in upgrade) is worse
    style = "error" if worse else "success"
    assert any(f"annotate --style {style} --context upgrade-gate" in line for line in lines)


@pytest.mark.program("check-jsonschema")
def test_the_bootstrap_step_uploads_the_plan_of_the_builds_inputs(tmp_path: Path) -> None:
    shutil.copy(USER_MATRIX, tmp_path / "team.yaml")
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    real = VENV_BIN / "repromatrix"
    bin_dir = venv_with(tmp_path, f'exec "{real}" "$@"\n')
    log = tmp_path / "calls"
    agent(bin_dir, log)
    env = {
        "PATH": real_path(bin_dir),
        "REPROMATRIX_MATRIX": "team.yaml",
        "REPROMATRIX_SKIP": "*/nightly/* */eager/*",
        "REPROMATRIX_BASELINE": "v0.31.0",
        "REPROMATRIX_CANDIDATE": "v0.32.0",
    }
    [step] = yaml.safe_load(BOOTSTRAP.read_text())["steps"]
    ran = run_script(uploaded(step["command"]), env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert check_schema(tmp_path / "uploaded.yml", "vendor.buildkite").returncode == 0
    pipeline = yaml.safe_load((tmp_path / "uploaded.yml").read_text())
    commands = [s["commands"][-1] for s in pipeline["steps"] if "commands" in s]
    assert commands and all("--matrix team.yaml" in c for c in commands)
    assert not any("nightly" in c or "eager" in c for c in commands)
    assert "--baseline v0.31.0 --candidate v0.32.0" in pipeline["steps"][-1]["command"]


TOKEN = "hf_agentTokenNotReal0123"


def test_a_gpu_step_fetches_checks_then_runs_and_only_the_fetch_keeps_the_token(
    tmp_path: Path,
) -> None:
    pipeline = yaml.safe_load(plan("--format", "buildkite", "--matrix", str(USER_MATRIX)))
    step = pipeline["steps"][0]
    log = tmp_path / "calls"
    # Each stand-in says how it was called and whether the agent's HF_TOKEN reached it.
    recorder = 'echo "$(basename "$0") $1 $2 token:${HF_TOKEN:-none}" >> "' + f'{log}"\n'
    bin_dir = venv_with(tmp_path, recorder)
    fake_tool(tmp_path / ".repromatrix-venv" / "bin", "pip", recorder)
    env = {"PATH": real_path(bin_dir), "HF_TOKEN": TOKEN}  # as the agent's environment hook sets
    ran = run_script(" && ".join(uploaded(c) for c in step["commands"]), env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert log.read_text().splitlines() == [
        f"pip install -q token:{TOKEN}",
        f"repromatrix prepare --lane token:{TOKEN}",
        "repromatrix prepare --check token:none",
        "repromatrix run --lane token:none",
    ]
    assert shlex.split(step["commands"][1])[-1] == HUB_CLIENT
    argv = [shlex.split(c.removeprefix(WITHOUT_SECRETS + " "))[1:] for c in step["commands"][2:]]
    assert argv[0][1:3] == argv[1][2:4] == argv[2][1:3] == ["--lane", "gpu"]
    assert argv[0][3:] == argv[1][4:] == argv[2][5:]  # the same cells: matrix, globs


def test_the_hub_client_is_the_prepare_extras_requirement() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras["prepare"] == [HUB_CLIENT]
    workflow = (ROOT / ".github" / "workflows" / "compat-matrix.yml").read_text()
    assert f"'{HUB_CLIENT}'" in workflow


def test_cpu_steps_fetch_nothing() -> None:
    pipeline = yaml.safe_load(plan("--format", "buildkite", "--lane", "cpu"))
    for step in pipeline["steps"][:-2]:
        assert not any(" prepare " in c or HUB_CLIENT in c for c in step["commands"])


def test_the_gates_answer_is_annotated_as_code_whatever_the_diff_says(tmp_path: Path) -> None:
    pipeline = yaml.safe_load(
        plan("--format", "buildkite", "--baseline", "v0.31.0", "--candidate", "v0.32.0")
    )
    log = tmp_path / "calls"
    # A cause from a result, as the diff prints it: a fence's end, then Markdown of its own.
    fake = (
        RECORD.format(log=log)
        + 'if [ "$1" = merge ]; then mkdir -p merged; echo "| t |" > merged/compat.md; fi\n'
        + "if [ \"$1\" = diff ]; then printf 'cause:\\n```\\n# Forged\\n[x](https://e.example)\\n';"
        + " fi\n"
    )
    bin_dir = venv_with(tmp_path, fake)
    agent(bin_dir, log)
    ran = run_script(
        uploaded(pipeline["steps"][-1]["command"]), {"PATH": real_path(bin_dir)}, cwd=tmp_path
    )
    assert ran.returncode == 0, ran.stderr
    upgrade = (tmp_path / "annotation-upgrade-gate").read_text().splitlines()
    assert upgrade[:2] == ["### Upgrade v0.31.0 -> v0.32.0", ""]
    assert upgrade[2:] == ["    cause:", "    ```", "    # Forged", "    [x](https://e.example)"]
