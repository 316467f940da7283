"""``plan --format buildkite``: the plan as a dynamic Buildkite pipeline.

One command step per job (see ``fleet.jobs``) on the agent queue named by its
GPU's runner label, each uploading its results as artifacts. A GPU job first
fetches the models and adapters its cells read into the runner's HF cache
(``repromatrix prepare``: the one command that keeps ``HF_TOKEN`` from the
agent's environment) and checks that the cache holds them all (``prepare
--check``), then runs its cells with every secret taken out of the
environment; a ``wait`` that
continues past failures; then one step that downloads every shard, merges
them, annotates the build with the compatibility table and, given a baseline
and a candidate, runs the upgrade gate and annotates its answer, failing the
build only after the answer is on the page.

Buildkite interpolates ``$NAME`` when the pipeline is uploaded, so variables
meant for the step's own shell are written ``$$NAME``, and every value from
the matrix or the command line has each ``$`` doubled (``buildkite_literal``):
the step reads the very path, package and tags the plan read. The build
number is left to the upload, which knows it.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from repromatrix.fleet.jobs import FleetJob, run_arguments
from repromatrix.grammars import buildkite_literal
from repromatrix.secret_env import SECRET_ENV
from repromatrix.values import Lane

VENV = ".repromatrix-venv"
RUN_PREFIX = "bk-${BUILDKITE_BUILD_NUMBER}"
REPORT_QUEUE = "default"
# What `prepare` downloads with (the `prepare` extra of pyproject.toml; a test keeps them equal).
HUB_CLIENT = "huggingface_hub>=0.20"
# Every command after `prepare` runs without the secrets the agent's environment holds.
WITHOUT_SECRETS = "env " + " ".join(f"-u {name}" for name in SECRET_ENV)


@dataclass(frozen=True)
class PipelineInputs:
    """What every step is given, so that the plan and its shards always agree."""

    matrix: str
    scenarios: tuple[str, ...] = ()  # folders (--scenarios each); none: the shipped scenarios/
    package: str = "."  # the pip requirement that installs repromatrix
    job_minutes: int = 360
    baseline: str | None = None
    candidate: str | None = None
    report_queue: str = REPORT_QUEUE
    lock: str | None = None  # the lock file of the follow rules, uploaded by the plan step


def install_commands(package: str, *extra: str) -> list[str]:
    """Return the commands that install repromatrix (and ``extra`` requirements) into a
    virtualenv (PEP 668 safe)."""
    wanted = " ".join(_quoted(item) for item in (package, *extra))
    return [f"python3 -m venv {VENV}", f"{VENV}/bin/pip install -q {wanted}"]


def scenario_arguments(folders: tuple[str, ...]) -> str:
    """``--scenarios DIR`` for each folder (none: the default), each followed by a space."""
    return "".join(f"--scenarios {_quoted(folder)} " for folder in folders)


def job_step(index: int, job: FleetJob, inputs: PipelineInputs) -> dict[str, Any]:
    """Return the command step that runs one job's cells on its GPU's agent queue."""
    run_id = f"{RUN_PREFIX}-{index}"
    lock = f"--lock {_quoted(inputs.lock)} " if inputs.lock else ""
    cells = (
        f"--matrix {_quoted(inputs.matrix)} {lock}{scenario_arguments(inputs.scenarios)}"
        f"{buildkite_literal(run_arguments(job.only))}"
    )
    run = f"{VENV}/bin/repromatrix run --lane {job.lane} --run-id {run_id} {cells}"
    # Every shard reads the lock the plan step resolved, never the registry again.
    fetch = [f"buildkite-agent artifact download {_quoted(inputs.lock)} ."] if inputs.lock else []
    if job.lane == Lane.GPU.value:
        commands = [*install_commands(inputs.package, HUB_CLIENT), *fetch, *prepare_commands(cells)]
        commands.append(f"{WITHOUT_SECRETS} {run}")
    else:
        commands = [*install_commands(inputs.package), *fetch, run]
    return {
        "label": f":test_tube: {buildkite_literal(job.name)}",
        "key": f"cells-{index}",
        "agents": {"queue": buildkite_literal(job.runner)},
        "timeout_in_minutes": inputs.job_minutes,
        "commands": commands,
        "artifact_paths": [f"results/{run_id}/**/*"],
    }


def prepare_commands(cells: str) -> list[str]:
    """A GPU runner's models and adapters, before its ``cells`` run: fetched into its HF
    cache (the one command given ``HF_TOKEN``), then the pre-flight that the cache holds
    every one of them (it fails the step naming what is missing)."""
    selection = f"--lane {Lane.GPU.value} {cells}"
    return [
        f"{VENV}/bin/repromatrix prepare {selection}",
        f"{WITHOUT_SECRETS} {VENV}/bin/repromatrix prepare --check {selection}",
    ]


def report_command(inputs: PipelineInputs) -> str:
    """The merge-and-report script: the table annotated first, then the gate, then its status."""
    lines = [
        *install_commands(inputs.package),
        f"buildkite-agent artifact download 'results/{RUN_PREFIX}-*/**/*' .",
        "status=0",
        f"{VENV}/bin/repromatrix merge results/{RUN_PREFIX}-* --out merged || status=$$?",
        "if [ -f merged/compat.md ]; then",
        "  buildkite-agent annotate --style info --context compat-matrix < merged/compat.md",
        "fi",
    ]
    if inputs.baseline and inputs.candidate:
        lines += gate_lines(inputs.baseline, inputs.candidate)
    lines.append("exit $$status")
    return "\n".join(lines) + "\n"


def gate_lines(baseline: str, candidate: str) -> list[str]:
    """The upgrade gate: its answer annotated (error style when worse) before the step fails."""
    tags = f"--baseline {_quoted(baseline)} --candidate {_quoted(candidate)}"
    title = _quoted(f"### Upgrade {baseline} -> {candidate}")
    return [
        "gate=0",
        f"{VENV}/bin/repromatrix diff merged {tags} > upgrade.txt 2>&1 || gate=$$?",
        # An indented code block: no line of the diff's text can end it, as one could a fence.
        f"{{ echo {title}; echo; sed 's/^/    /' upgrade.txt; }} > upgrade.md",
        'style=success; [ "$$gate" = 0 ] || style=error',
        'buildkite-agent annotate --style "$$style" --context upgrade-gate < upgrade.md',
        'if [ "$$gate" != 0 ]; then status=$$gate; fi',
    ]


def pipeline(jobs: Sequence[FleetJob], inputs: PipelineInputs) -> dict[str, Any]:
    """Return the pipeline: one step per job, a wait that survives failures, the report."""
    steps: list[dict[str, Any]] = [job_step(i, job, inputs) for i, job in enumerate(jobs)]
    steps.append({"wait": None, "continue_on_failure": True})
    steps.append(
        {
            "label": ":bar_chart: Merge and report",
            "key": "report",
            "agents": {"queue": buildkite_literal(inputs.report_queue)},
            "command": report_command(inputs),
            "artifact_paths": ["merged/**/*"],
        }
    )
    return {"steps": steps}


def _quoted(value: str) -> str:
    """``value`` quoted for the step's shell, then for Buildkite's interpolation at upload."""
    return buildkite_literal(shlex.quote(value))


class _Dumper(yaml.SafeDumper):
    """Writes multi-line scripts as literal blocks, as a person would."""


def _text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _text)


def format_buildkite(jobs: Sequence[FleetJob], inputs: PipelineInputs) -> str:
    """Return the pipeline as YAML for ``buildkite-agent pipeline upload``."""
    return yaml.dump(pipeline(jobs, inputs), Dumper=_Dumper, sort_keys=False, width=1000)
