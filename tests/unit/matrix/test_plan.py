"""plan output: table, JSON and the GitHub Actions matrix (exact coverage, at most 256 jobs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repromatrix.cli import main
from repromatrix.errors import UsageError
from repromatrix.fleet.jobs import JobBudget, brace_glob, github_matrix
from repromatrix.fleet.listing import format_json, format_table, summary
from repromatrix.matrix.expand import expand
from repromatrix.matrix.selector import Selector
from repromatrix.values import Cell
from support import paths
from support.matrix import GPU_LANE, setup

ROOT = paths.ROOT
DAY = JobBudget(job_minutes=24 * 60)  # each small test group fits one job


def covered(jobs: list[dict[str, object]], everything: list[str]) -> list[str]:
    """The ids the jobs would run: each job's --only globs applied to the whole plan."""
    ran: list[str] = []
    for job in jobs:
        only = job["only"]
        assert isinstance(only, list)
        selector = Selector(only)
        ran += [i for i in everything if selector.matches(i)]
    return ran


def test_json_fields(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path)
    cells = list(expand(matrix, scenarios))
    data = json.loads(format_json(cells))
    first = next(d for d in data if d["id"] == "gpu/v0.31.1rc0/h100/moe/default/moe-rank/trigger")
    assert first["image"] == "vllm/vllm-openai:v0.31.1rc0" and first["version"] == "0.31.1rc0"
    assert (first["gpu"], first["runner"], first["model"], first["flagset"]) == (
        "h100",
        "gpu-h100",
        "moe",
        "default",
    )
    assert (first["scenario"], first["variant"], first["expected"]) == (
        "moe-rank",
        "trigger",
        "avoided",
    )
    assert (first["level"], first["lane"]) == ("engine", "gpu")
    assert first["flags"] == {"enable_lora": True, "max_lora_rank": 320}
    assert first["flag_sources"] == {"enable_lora": "scenario", "max_lora_rank": "scenario"}
    assert (first["expected_scenario"], first["predicted"], first["same_as"]) == (None, [], [])
    nightly = next(d for d in data if d["image_tag"] == "nightly")
    assert nightly["version"] is None


def test_table_and_summary(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path)
    cells = [c for c in expand(matrix, scenarios) if "/h100/moe/default/moe-rank/" in c.id]
    lines = format_table(cells).splitlines()
    assert lines[0].split() == [
        "lane", "image", "gpu", "model", "flagset", "scenario", "variant", "level", "expected",
        "memory", "flags",
    ]  # fmt: skip
    # The test model gives no memory facts: its need is unknown, against 80 GiB x 0.92.
    assert lines[1].split() == [
        "gpu", "v0.31.0", "h100", "moe", "default", "moe-rank", "trigger", "engine", "hit",
        "unknown:?+?+?=?/73.6/GPU,x1", "enable_lora=true[s]", "max_lora_rank=320[s]",
    ]  # fmt: skip
    control = next(line for line in lines if "/rank-128" in line or " rank-128 " in line)
    assert control.split()[-1] == "max_lora_rank=128[v]"
    assert lines[-3].startswith("flag sources: [f] flag set")
    assert lines[-2].startswith("memory (GiB, per GPU): weights+LoRA buffers+KV cache")
    assert lines[-1] == "12 cells: 1 hit, 10 avoided, 1 unknown (gpu 12)"
    assert summary(cells[:1]) == "1 cell: 1 hit, 0 avoided, 0 unknown (gpu 1)"


def test_github_matrix_groups_by_runner_and_covers_exactly(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path)
    cells = list(expand(matrix, scenarios))
    everything = [c.id for c in cells]
    jobs = github_matrix(cells, everything, DAY)["include"]
    assert len(jobs) == 4 * 2  # one per image and GPU
    assert sorted(covered(jobs, everything)) == sorted(everything)  # each cell exactly once
    for job in jobs:
        runners = {c.gpu.runner_label for c in cells if Selector(job["only"]).matches(c.id)}
        assert runners == {job["runner"]}
        assert job["args"] == " ".join(f"--only '{glob}'" for glob in job["only"])
    assert {"gpu/v0.31.0/h100/*"} <= {g for job in jobs for g in job["only"]}


def test_partial_groups_list_their_ids(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path)
    everything = [c.id for c in expand(matrix, scenarios)]
    selector = Selector(only=["*/trigger"], skip=["*/eager/*"])
    cells = list(expand(matrix, scenarios, selector=selector))
    jobs = github_matrix(cells, everything)["include"]
    assert sorted(covered(jobs, everything)) == sorted(c.id for c in cells)
    assert all("{" in job["only"][0] for job in jobs if job["cells"] > 1)


def test_brace_glob_is_exact() -> None:
    ids = ["gpu/a/h/m/d/s/trigger", "gpu/a/h/m/d/s/x", "gpu/a/h/n/d/s/trigger@probe"]
    glob = brace_glob(ids)
    assert glob == "gpu/a/h/{m/d/s/trigger,m/d/s/x,n/d/s/trigger@probe}"
    assert [i for i in [*ids, "gpu/a/h/m/d/s/y"] if Selector([glob]).matches(i)] == ids
    assert brace_glob(["only/one"]) == "only/one"


def many_groups(tmp_path: Path, tags: int, gpus: int) -> list[Cell]:
    images = ", ".join(f"v0.{i}.0" for i in range(tags))
    gpu_lines = "".join(f"      g{i}: {{runner: runner-{i % 3}, count: 1}}\n" for i in range(gpus))
    text = GPU_LANE.replace("[v0.31.0, v0.31.1rc0, v0.32.0, nightly]", f"[{images}]")
    start, end = text.index("    gpus:\n"), text.index("    models:")
    text = text[:start] + "    gpus:\n" + gpu_lines + text[end:]
    matrix, scenarios = setup(tmp_path, text)
    return list(expand(matrix, scenarios))


def test_github_matrix_stays_within_256_jobs(tmp_path: Path) -> None:
    cells = many_groups(tmp_path, tags=30, gpus=12)  # 360 image/GPU groups on 3 runners
    everything = [c.id for c in cells]
    jobs = github_matrix(cells, everything, DAY)["include"]
    assert len(jobs) <= 256
    assert sorted(covered(jobs, everything)) == sorted(everything)
    assert {job["runner"] for job in jobs} == {"runner-0", "runner-1", "runner-2"}
    assert sum(job["cells"] for job in jobs) == len(cells)
    roomy = JobBudget(job_minutes=10**6)  # room to pack every group of a runner in one job
    small = github_matrix(cells, everything, roomy, max_jobs=5)["include"]
    assert len(small) <= 5 and sorted(covered(small, everything)) == sorted(everything)
    with pytest.raises(UsageError, match="on 3 runner labels, above the 2-job limit"):
        github_matrix(cells, everything, roomy, max_jobs=2)
    with pytest.raises(UsageError, match="above the 5-job limit: raise --job-minutes"):
        github_matrix(cells, everything, max_jobs=5)  # 6-hour jobs cannot hold it in five


def test_the_command_prints_each_format(capsys: pytest.CaptureFixture[str]) -> None:
    common = ["plan", "--matrix", str(ROOT / "matrix.yaml"), "--scenarios", str(ROOT / "scenarios")]
    assert main([*common, "--only", "*/moe-lora-rank-over-128/trigger", "--lane", "gpu"]) == 0
    table = capsys.readouterr().out
    assert "v0.31.0     h200x4" in table and table.rstrip().endswith("(gpu 6)")
    rows = {tuple(line.split()[1:3]): line.split()[8] for line in table.splitlines()[1:-4]}
    assert rows[("v0.31.0", "h200x4")] == "hit"
    assert rows[("v0.31.1rc0", "h200x4")] == rows[("v0.32.0", "h200x4")] == "avoided"
    assert main([*common, "--json", "--lane", "cpu"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data and {d["lane"] for d in data} == {"cpu"}
    assert main([*common, "--format", "github", "--skip", "gpu/*"]) == 0
    jobs = json.loads(capsys.readouterr().out)["include"]
    assert {job["runner"] for job in jobs} == {"ubuntu-latest"}
    assert all(job["only"] == [f"cpu/{job['name'].split()[1]}/cpu/*"] for job in jobs)
