"""``plan --format buildkite``: the plan as a dynamic Buildkite pipeline.

One command step per job (see ``ci_jobs``) on the agent queue named by its
GPU's runner label, each uploading its results as artifacts; a ``wait`` that
continues past failures; then one step that downloads every shard, merges
them, annotates the build with the compatibility table and, given a baseline
and a candidate, runs the upgrade gate and annotates its answer, failing the
build only after the answer is on the page.

Buildkite interpolates ``$NAME`` when the pipeline is uploaded, so variables
meant for the step's own shell are written ``$$NAME``; the build number is
left to the upload, which knows it.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from repromatrix.fleet.jobs import FleetJob, run_arguments

VENV = ".repromatrix-venv"
RUN_PREFIX = "bk-${BUILDKITE_BUILD_NUMBER}"
REPORT_QUEUE = "default"


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


def install_commands(package: str) -> list[str]:
    """Return the commands that install repromatrix into a virtualenv (PEP 668 safe)."""
    return [f"python3 -m venv {VENV}", f"{VENV}/bin/pip install -q {shlex.quote(package)}"]


def scenario_arguments(folders: tuple[str, ...]) -> str:
    """``--scenarios DIR`` for each folder (none: the default), each followed by a space."""
    return "".join(f"--scenarios {shlex.quote(folder)} " for folder in folders)


def job_step(index: int, job: FleetJob, inputs: PipelineInputs) -> dict[str, Any]:
    """Return the command step that runs one job's cells on its GPU's agent queue."""
    run_id = f"{RUN_PREFIX}-{index}"
    lock = f"--lock {shlex.quote(inputs.lock)} " if inputs.lock else ""
    run = (
        f"{VENV}/bin/repromatrix run --lane {job.lane} --run-id {run_id} "
        f"--matrix {shlex.quote(inputs.matrix)} {lock}{scenario_arguments(inputs.scenarios)}"
        f"{run_arguments(job.only)}"
    )
    # Every shard reads the lock the plan step resolved, never the registry again.
    fetch = (
        [f"buildkite-agent artifact download {shlex.quote(inputs.lock)} ."] if inputs.lock else []
    )
    return {
        "label": f":test_tube: {job.name}",
        "key": f"cells-{index}",
        "agents": {"queue": job.runner},
        "timeout_in_minutes": inputs.job_minutes,
        "commands": [*install_commands(inputs.package), *fetch, run],
        "artifact_paths": [f"results/{run_id}/**/*"],
    }


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
    tags = f"--baseline {shlex.quote(baseline)} --candidate {shlex.quote(candidate)}"
    title = shlex.quote(f"### Upgrade {baseline} -> {candidate}")
    return [
        "gate=0",
        f"{VENV}/bin/repromatrix diff merged {tags} > upgrade.txt 2>&1 || gate=$$?",
        f"{{ echo {title}; echo; echo '```'; cat upgrade.txt; echo '```'; }} > upgrade.md",
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
            "agents": {"queue": inputs.report_queue},
            "command": report_command(inputs),
            "artifact_paths": ["merged/**/*"],
        }
    )
    return {"steps": steps}


class _Dumper(yaml.SafeDumper):
    """Writes multi-line scripts as literal blocks, as a person would."""


def _text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _text)


def format_buildkite(jobs: Sequence[FleetJob], inputs: PipelineInputs) -> str:
    """Return the pipeline as YAML for ``buildkite-agent pipeline upload``."""
    return yaml.dump(pipeline(jobs, inputs), Dumper=_Dumper, sort_keys=False, width=1000)
