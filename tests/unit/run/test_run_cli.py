"""``repromatrix run`` and ``repromatrix render`` from the command line, as a user runs them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from repromatrix.backends.docker.calls import RUN_LABEL
from repromatrix.backends.docker.preflight import engine_fix
from repromatrix.judgement import Outcome
from repromatrix.results import store as results
from support import paths
from support.cli import repromatrix
from support.matrix import BASELINE, setup
from support.nvidia_smi import L40S, install_program

ROOT = paths.ROOT
TOKEN = "hf_repromatrixDryRunToken42"


def test_dry_run_shows_the_exact_gpu_calls_without_an_engine_or_a_gpu(tmp_path: Path):
    env = {"PATH": "/usr/bin:/bin", "HF_TOKEN": TOKEN, "DOCKER_HOST": "unix:///nonexistent"}
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")  # this checkout, where it is not installed
    done = repromatrix(
        "run", "--lane", "gpu", "--only", "gpu/v0.31.0/{h100,h200x4}/*/default/*/trigger",
        "--dry-run", "--backend", "docker", "--results", str(tmp_path / "r"),
        "--dockerfiles", str(tmp_path / "df"),
        env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert TOKEN not in done.stdout + done.stderr
    plan = json.loads(done.stdout)
    assert plan["host_gpus"] == 0
    builds = {image["image"]: image["calls"] for image in plan["images"]}
    assert [c["call"] for c in builds["gpu-v0.31.0"]] == ["images.pull", "api.build"]
    assert builds["gpu-v0.31.0"][0]["ref"] == "vllm/vllm-openai:v0.31.0"
    by_gpu = {cell["id"].split("/")[2]: cell for cell in plan["cells"]}
    for gpu, count in (("h100", 1), ("h200x4", 4)):
        create = by_gpu[gpu]["create"]
        chosen = f"<{count} of the runner's GPUs, chosen at run time>"
        assert create["device_requests"] == [{"device_ids": chosen, "capabilities": [["gpu"]]}]
        assert create["network_mode"] == "none"
        # The cell is offline: the token is not passed, not even as a redacted name.
        assert "HF_TOKEN" not in create["environment"]
        assert create["environment"]["HF_HUB_OFFLINE"] == "1"
        assert create["entrypoint"] == ["python3", "/opt/repromatrix/harness/harness.py"]
        assert create["labels"][RUN_LABEL] == plan["run_id"]
        assert create["image"].startswith("repromatrix/cell-gpu-v0.31.0:")
        assert "has no GPU" in by_gpu[gpu]["skip"]
        spec = json.loads(create["command"][1])
        assert spec["cell"] == by_gpu[gpu]["id"]
    assert not (tmp_path / "r").exists()  # a dry run writes no results
    assert not (tmp_path / "df").exists()  # nor build contexts


def test_dry_run_without_nvidia_smi_skips_gpu_cells_or_leaves_given_ids_unchecked(tmp_path: Path):
    empty = tmp_path / "bin"  # a PATH with no nvidia-smi on it, whatever this machine has
    empty.mkdir()
    env = {"PATH": str(empty), "DOCKER_HOST": "unix:///nonexistent"}
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    only = ("--only", "gpu/v0.31.0/{h100,h200x4}/*/default/*/trigger")
    common = ("run", "--lane", "gpu", *only, "--dry-run", "--backend", "docker")
    plain = json.loads(repromatrix(*common, "--results", str(tmp_path / "r"), env=env).stdout)
    assert plain["runner_gpus"] == []
    assert {cell["skip"] for cell in plain["cells"]} == {
        "GPU cell needs 1 GPU(s) (h100); this host has no GPU",
        "GPU cell needs 4 GPU(s) (h200x4); this host has no GPU",
    }
    given = repromatrix(*common, "--gpus", "0,1,2,3", "--results", str(tmp_path / "r"), env=env)
    plan = json.loads(given.stdout)
    assert plan["runner_gpus"] == [f"{i}: unchecked" for i in range(4)]
    assert {cell["skip"] for cell in plan["cells"]} == {None}  # nothing to match them against


@pytest.mark.parametrize("backend", ["docker", "local"])
def test_dry_run_of_the_whole_shipped_cpu_lane_describes_every_cell_and_writes_nothing(
    tmp_path: Path, backend: str
):
    dockerfiles = tmp_path / "df"
    (dockerfiles / "mine").mkdir(parents=True)
    (dockerfiles / "mine" / "notes.txt").write_text("a user's file")
    planned = repromatrix("plan", "--lane", "cpu", "--json")
    done = repromatrix(
        "run", "--lane", "cpu", "--dry-run", "--backend", backend,
        "--results", str(tmp_path / "r"), "--dockerfiles", str(dockerfiles),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    described = json.loads(done.stdout)
    assert described["backend"] == backend
    ids = [cell["id"] for cell in json.loads(planned.stdout)]
    assert [cell["id"] for cell in described["cells"]] == ids
    assert any(cell["id"].endswith("@probe") for cell in described["cells"])  # tiny-moe probes
    assert sorted(p.name for p in dockerfiles.rglob("*")) == ["mine", "notes.txt"]
    assert not (tmp_path / "r").exists()


def test_render_writes_the_same_bytes_and_tags_twice(tmp_path: Path):
    first = repromatrix("render", "--lane", "gpu", "--out", str(tmp_path / "a"))
    second = repromatrix("render", "--lane", "gpu", "--out", str(tmp_path / "b"))
    assert first.returncode == 0, first.stderr
    tags = dict(line.split("\t")[:2] for line in first.stdout.splitlines())
    assert tags == dict(line.split("\t")[:2] for line in second.stdout.splitlines())
    assert tags["gpu-v0.31.0"].startswith("repromatrix/cell-gpu-v0.31.0:")
    dockerfile = (tmp_path / "a" / "gpu-v0.31.0" / "Dockerfile").read_text()
    assert dockerfile == (tmp_path / "b" / "gpu-v0.31.0" / "Dockerfile").read_text()
    assert "FROM vllm/vllm-openai:v0.31.0" in dockerfile


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run-id", "../../etc"], "run id"),
        (["--only", "cpu/0.99.0/*"], "matches nothing"),
        (["--matrix", "no-such.yaml"], "no-such.yaml"),
        (["--resume", "--results", "/nonexistent/results"], "no earlier run"),
        (["--jobs", "0"], "at least 1"),
        (["--jobs", "two"], "at least 1"),
    ],
)
def test_bad_input_is_one_clear_message_and_exit_2(args: list[str], message: str):
    done = repromatrix("run", "--dry-run", *args)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unknown_backend_is_refused_by_the_parser():
    done = repromatrix("run", "--backend", "podman")
    assert done.returncode == 2
    assert "invalid choice: 'podman'" in done.stderr


def test_dry_run_of_cpu_cells_shows_base_build_shm_and_the_read_only_models(tmp_path: Path):
    done = repromatrix(
        "run", "--lane", "cpu", "--only", "cpu/0.32.0/cpu/tiny-llama/*", "--dry-run",
        "--backend", "docker", "--results", str(tmp_path / "r"),
        "--dockerfiles", str(tmp_path / "df"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    (image,) = plan["images"]
    assert [c["call"] for c in image["calls"]] == ["base", "api.build"]
    assert image["calls"][0] == {
        "call": "base", "ref": "repromatrix/base:bookworm", "how": "import (debootstrap rootfs)",
        "if": "missing",
    }  # fmt: skip
    assert len(plan["cells"]) == 3
    for cell in plan["cells"]:
        create = cell["create"]
        assert cell["skip"] is None
        assert create["shm_size"] == "2g" and "ipc_mode" not in create
        assert "device_requests" not in create
        ((source, mount),) = create["volumes"].items()
        assert mount == {"bind": source, "mode": "ro"} and source.endswith("/.cache/models")
        spec = json.loads(create["command"][1])
        assert spec["model"].startswith(source + "/tiny-llama-")


def test_a_gpu_shard_on_a_host_that_cannot_run_it_fails_instead_of_going_green(tmp_path: Path):
    # The local backend runs no GPU cell, whatever GPUs the host has: asked for by lane and
    # id, every one of them is skipped, and a run with no evidence must not exit 0.
    done = repromatrix(
        "run", "--lane", "gpu", "--only", "gpu/v0.32.0/h100/*/default/healthy-gpu/*",
        "--backend", "local", "--results", str(tmp_path), "--run-id", "gpu-shard",
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "cannot run on this host" in done.stderr
    assert "cannot run: GPU cell" in done.stderr  # one line per reason, not per cell
    found, problems = results.read_results(tmp_path / "gpu-shard")
    assert problems == [] and found
    assert all(r.outcome is Outcome.SKIPPED for r in found)
    planned, _ = results.read_plan(tmp_path / "gpu-shard")
    assert planned == {r.id for r in found}


def one_h100_matrix(folder: Path) -> Path:
    """The default matrix's GPU lane cut to one 80 GB H100 and Qwen3-30B-A3B at TP1: where
    seed 000's rank-320 cells were planned before they moved to four H200s."""
    body = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    gpu = body["lanes"]["gpu"]
    gpu["images"] = ["v0.31.0"]
    gpu["gpus"] = {"h100": gpu["gpus"]["h100"]}
    gpu["models"] = {"qwen3-30b-a3b": gpu["models"]["qwen3-30b-a3b"]}
    gpu["flagsets"] = {"default": {}}
    body["lanes"] = {"gpu": gpu}
    body.pop("exclude", None)
    body.pop("include", None)
    path = folder / "matrix.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_an_infeasible_cell_is_skipped_with_its_numbers_and_never_makes_only_exit_3(
    tmp_path: Path,
):
    matrix = one_h100_matrix(tmp_path)
    only = "gpu/v0.31.0/h100/qwen3-30b-a3b/default/moe-lora-rank-over-128/trigger"
    args = ("run", "--matrix", str(matrix), "--scenarios", str(ROOT / "scenarios"))
    args += ("--lane", "gpu", "--only", only, "--backend", "local")
    done = repromatrix(*args, "--results", str(tmp_path / "r"), "--run-id", "mem")
    assert done.returncode == 0, done.stderr
    [result] = results.read_results(tmp_path / "r" / "mem")[0]
    assert result.outcome is Outcome.SKIPPED
    assert result.reason.startswith("infeasible: its GPU needs at least 88.7 GiB")
    # Run anyway, it is a cell this host cannot run (no GPU): that is exit 3 again.
    anyway = repromatrix(*args, "--results", str(tmp_path / "r"), "--run-infeasible")
    assert anyway.returncode == 3, anyway.stderr
    assert "cannot run on this host" in anyway.stderr


@pytest.mark.parametrize("folder", ["missing", "not-a-run"])
def test_a_dry_run_checks_durations_from_too(tmp_path: Path, folder: str) -> None:
    # A dry run reads no durations, but a wrong folder is the same mistake it will be in the run.
    (tmp_path / "not-a-run").mkdir()
    done = repromatrix(
        "run", "--dry-run", "--lane", "cpu", "--only", "cpu/0.32.0/cpu/tiny-llama/*",
        "--results", str(tmp_path / "r"), "--durations-from", str(tmp_path / folder),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--durations-from" in done.stderr and "not a run folder" in done.stderr


L40S_TEAM = """
lanes:
  gpu:
    images: [v0.31.0]
    gpus:
      l40s: {runner: team-l40s, name: "*L40S", count: 1, memory_gib: 48, usable_memory_mib: 46068}
      l40sx4: {runner: team-l40sx4, name: "*L40S", count: 4, usable_memory_mib: 46068}
      h100: {runner: gpu-h100, name: "H100*", count: 1, usable_memory_mib: 81559}
    models:
      llama-8b: &llama
        source: meta-llama/Llama-3.1-8B-Instruct
        hidden_size: 4096
        intermediate_size: 14336
        num_hidden_layers: 32
        num_attention_heads: 32
        num_key_value_heads: 8
        head_dim: 128
        max_position_embeddings: 131072
        num_parameters: 8030261248
      llama-70b:
        <<: *llama
        source: meta-llama/Llama-3.1-70B-Instruct
        hidden_size: 8192
        intermediate_size: 28672
        num_hidden_layers: 80
        num_attention_heads: 64
        num_parameters: 70553706496
"""


def test_a_dry_run_on_an_l40s_runner_shows_every_cell_it_would_skip_and_why(tmp_path: Path):
    """A stand-in nvidia-smi reports two L40S (a real capture): the dry run of the whole lane
    exits 0 and shows each cell as a real run would skip it (too few GPUs, another kind of GPU,
    too big for its GPU's memory), and chooses devices only for the cells it would run."""
    setup(tmp_path, L40S_TEAM, {"healthy": BASELINE.replace("[gpu, cpu]", "[gpu]")})
    install_program(tmp_path / "bin", L40S)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "DOCKER_HOST": "unix:///nonexistent"}
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    done = repromatrix(
        "run", "--lane", "gpu", "--dry-run", "--backend", "docker",
        "--matrix", str(tmp_path / "matrix.yaml"), "--scenarios", str(tmp_path / "scenarios"),
        "--results", str(tmp_path / "r"), "--dockerfiles", str(tmp_path / "df"), env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    plan = json.loads(done.stdout)
    assert plan["runner_gpus"] == ["GPU 0: NVIDIA L40S (45.0 GiB)", "GPU 1: NVIDIA L40S (45.0 GiB)"]
    skips = {"/".join(cell["id"].split("/")[2:4]): cell for cell in plan["cells"]}
    assert len(skips) == 6
    runs = skips.pop("l40s/llama-8b")
    assert runs["skip"] is None
    assert runs["create"]["device_requests"][0]["device_ids"] == ["0"]
    assert "needs 4 GPU(s) (l40sx4); this host has 2 GPU(s)" in skips["l40sx4/llama-8b"]["skip"]
    assert "its name is not H100*" in skips["h100/llama-8b"]["skip"]
    for gpu in ("l40s", "l40sx4", "h100"):  # too big on any runner: that reason wins
        assert skips[f"{gpu}/llama-70b"]["skip"].startswith("infeasible: its GPU needs at least")
    for cell in skips.values():  # a cell no run starts here is given no GPU of this runner
        assert cell["create"]["device_requests"][0]["device_ids"].startswith("<")
    assert "2 of the cells asked for (--lane/--only) cannot run on this host" in done.stderr
    assert "a real run here would exit 3" in done.stderr
    assert not (tmp_path / "r").exists()


def test_a_dry_run_of_the_default_gpu_lane_on_an_l40s_runner_skips_each_cell_with_a_reason(
    tmp_path: Path,
):
    """The shipped matrix names no L40S, and its h200x4 cells need four GPUs of the two here:
    every cell is shown skipped with the reason a real run would save, and the dry run ends 0."""
    install_program(tmp_path / "bin", L40S)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "DOCKER_HOST": "unix:///nonexistent"}
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    done = repromatrix(
        "run", "--lane", "gpu", "--dry-run", "--backend", "docker",
        "--results", str(tmp_path / "r"), env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    cells = json.loads(done.stdout)["cells"]
    planned = json.loads(repromatrix("plan", "--lane", "gpu", "--json").stdout)
    assert [cell["id"] for cell in cells] == [cell["id"] for cell in planned]
    assert all(cell["skip"] for cell in cells)
    wide = [cell["skip"] for cell in cells if "/h200x4/" in cell["id"]]
    assert wide and all("needs 4 GPU(s) (h200x4); this host has 2 GPU(s)" in s for s in wide)
    unfit = [cell for cell in cells if not cell["skip"].startswith("infeasible")]
    assert f"{len(unfit)} of the cells asked for (--lane/--only) cannot run" in done.stderr


def test_backend_docker_fails_fast_naming_why_and_auto_says_which_backend_and_why(
    tmp_path: Path,
):
    env = {"PATH": "/usr/bin:/bin", "DOCKER_HOST": "unix:///nonexistent", "HOME": str(tmp_path)}
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    results = tmp_path / "r"
    done = repromatrix(
        "run", "--backend", "docker", "--lane", "cpu", "--results", str(results), env=env
    )
    assert done.returncode == 3, done.stderr
    assert "--backend docker cannot run here: no Docker engine answers" in done.stderr
    assert f"to enable it: `{engine_fix()}`" in done.stderr
    assert "wheelhouse" not in done.stderr and not results.exists()  # nothing was made
    # auto: the local backend, said once in the first lines with why Docker was not taken.
    dry = repromatrix("run", "--dry-run", "--lane", "cpu", "--results", str(results), env=env)
    assert dry.returncode == 0, dry.stderr
    said = [line for line in dry.stderr.splitlines() if "backend local" in line]
    assert len(said) == 1 and "; not docker: no Docker engine answers" in said[0]
    assert json.loads(dry.stdout)["backend"] == "local"
