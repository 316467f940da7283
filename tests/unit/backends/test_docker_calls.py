"""The container plan: the exact create call for CPU and GPU cells, never a secret (no engine)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import docker
import pytest
from docker.errors import APIError
from docker.models.containers import _create_container_args

from repromatrix.backends.base import Prepared
from repromatrix.backends.docker.calls import (
    CELL_LABEL,
    RUN_LABEL,
    ContainerCall,
    ContainerSettings,
    ImageBuild,
    Mount,
    container_call,
    environment_call,
    split_ref,
    tool_plan,
)
from repromatrix.backends.docker.engine import DockerBackend, docker_kwargs, one_line
from repromatrix.backends.docker.kind import KIND, container_settings
from repromatrix.backends.docker.owners import HOST_LABEL, PID_LABEL, Owner
from repromatrix.backends.harness_spec import container_adapter_path, container_model_path
from repromatrix.errors import InfraError
from repromatrix.host.runner import Runner, detect_runner
from repromatrix.matrix.config import load_matrix
from repromatrix.matrix.lanes import Runtime
from repromatrix.run.cell import placement_of
from repromatrix.run.schedule import Allocation
from repromatrix.secret_env import REDACTED, redact
from repromatrix.values import Adapter, Lane, Launch
from support import paths
from support.factories import cell as factories_cell
from support.factories import default_model, scenario
from support.runner import cell

SPEC = {"mode": "server", "argv": ["--max-model-len", "2048", "--served-model-name", "$(rm -rf /)"]}
TOKEN = "hf_secretvalue123"


def engine_body(kwargs: dict[str, object]) -> dict[str, object]:
    """What docker-py would POST to /containers/create for ``kwargs``: its own code, no engine."""
    api = docker.APIClient(base_url="unix:///nonexistent.sock", version="1.41")
    args = _create_container_args({**kwargs, "version": "1.41"})
    return dict(api.create_container_config(**args))


def test_cpu_cell_runs_the_harness_in_exec_form_without_network():
    settings = ContainerSettings(shm_size="2g", mounts=(Mount("/cache/models", "/cache/models"),))
    plan = container_call(cell(), SPEC, "repromatrix/cell-0.32.0:abc", settings, "run1")
    body = engine_body(docker_kwargs(plan))
    host = body["HostConfig"]
    assert isinstance(host, dict)
    assert body["Entrypoint"] == ["python3", "/opt/repromatrix/harness/harness.py"]
    assert body["Cmd"][0] == "--spec-json"
    # The flags stay one JSON argument: nothing is ever interpreted by a shell.
    assert json.loads(body["Cmd"][1]) == SPEC
    assert host["NetworkMode"] == "none"
    assert host["ShmSize"] == 2 * 1024**3
    assert "DeviceRequests" not in host
    assert host["Binds"] == ["/cache/models:/cache/models:ro"]
    assert body["Labels"] == {RUN_LABEL: "run1", CELL_LABEL: cell().id}


def test_gpu_cell_requests_exactly_its_gpus_and_mounts_the_hf_cache_read_only():
    gpu_cell = cell(Lane.GPU, gpus=4, version="0.31.0")
    settings = ContainerSettings(hf_cache="/data/hf", gpu_ids=("2", "3", "5", "7", "1"))
    plan = container_call(gpu_cell, SPEC, "repromatrix/cell-v0.31.0:abc", settings, "run1")
    body = engine_body(docker_kwargs(plan))
    host = body["HostConfig"]
    assert isinstance(host, dict)
    assert host["DeviceRequests"] == [
        {
            "Driver": "",
            "Count": 0,
            "DeviceIDs": ["2", "3", "5", "7"],
            "Capabilities": [["gpu"]],
            "Options": {},
        }
    ]
    assert "NVIDIA_VISIBLE_DEVICES=2,3,5,7" in body["Env"]
    assert host["IpcMode"] == "host"
    assert "ShmSize" not in host
    assert host["Binds"] == ["/data/hf:/root/.cache/huggingface:ro"]
    # The cell is offline: no secret, not even by name (prepare alone gets HF_TOKEN).
    assert not any(line.startswith("HF_") and "TOKEN" in line for line in body["Env"])


def test_dry_run_description_names_the_devices_to_be_chosen_and_no_secret():
    plan = container_call(cell(Lane.GPU, gpus=2), SPEC, "img", ContainerSettings(), "run1")
    described = plan.describe()
    assert "TOKEN" not in json.dumps(described)
    assert described["device_requests"] == [
        {"device_ids": "<2 of the runner's GPUs, chosen at run time>", "capabilities": [["gpu"]]}
    ]


def test_a_gpu_cell_gets_the_device_ids_it_is_given():
    plan = container_call(
        cell(Lane.GPU, gpus=2), SPEC, "img", ContainerSettings(), "run1", device_ids=["4", "6"]
    )
    kwargs = plan.create_kwargs()
    assert kwargs["device_requests"] == [{"device_ids": ["4", "6"], "capabilities": [["gpu"]]}]
    assert kwargs["environment"]["NVIDIA_VISIBLE_DEVICES"] == "4,6"


def test_a_gpu_cell_without_device_ids_cannot_be_created():
    plan = container_call(cell(Lane.GPU, gpus=2), SPEC, "img", ContainerSettings(), "run1")
    with pytest.raises(InfraError, match="needs 2 GPU"):
        plan.create_kwargs()
    wrong = container_call(
        cell(Lane.GPU, gpus=2), SPEC, "img", ContainerSettings(), "run1", device_ids=["1"]
    )
    with pytest.raises(InfraError, match=r"device ids \['1'\]"):
        wrong.create_kwargs()


def test_gpu_containers_take_the_runners_gpus_or_leave_them_to_run_time(tmp_path: Path):
    lanes = load_matrix(paths.ROOT / "matrix.yaml").lanes
    runtimes = {lane: config.runtime for lane, config in lanes.items()}
    known = container_settings(runtimes, tmp_path, Runner(gpu_ids=("4", "6")))
    assert known[Lane.GPU].gpu_ids == ("4", "6") and known[Lane.GPU].devices
    assert known[Lane.CPU].gpu_ids is None
    # No GPU known here (a dry run on a machine without them): ids are chosen at run time.
    unknown = container_settings(runtimes, tmp_path, Runner())
    assert unknown[Lane.GPU].gpu_ids is None and unknown[Lane.GPU].devices


def test_the_environment_report_runs_offline_with_the_gpus_the_lane_lends():
    settings = ContainerSettings(gpu_ids=("0", "1"))
    gpu = environment_call("img", settings, "run1", gpu=True).create_kwargs()
    assert gpu["entrypoint"] == ["python3", "-m", "vllm.collect_env"]
    assert gpu["network_mode"] == "none" and "user" not in gpu  # the image's own user
    assert gpu["device_requests"] == [{"device_ids": ["0", "1"], "capabilities": [["gpu"]]}]
    assert gpu["environment"]["NVIDIA_VISIBLE_DEVICES"] == "0,1"
    assert gpu["environment"]["HF_HUB_OFFLINE"] == "1"
    assert gpu["labels"][RUN_LABEL] == "run1"  # swept with the run
    cpu = environment_call("img", settings, "run1", gpu=False).create_kwargs()
    rehearsed = environment_call("img", replace(settings, devices=False), "r", gpu=True)
    assert "device_requests" not in cpu and "device_requests" not in rehearsed.create_kwargs()


def test_redact_replaces_every_occurrence():
    log = f"token={TOKEN}\nagain {TOKEN}\n".encode()
    assert redact(log, {"HF_TOKEN": TOKEN}) == f"token={REDACTED}\nagain {REDACTED}\n".encode()
    assert redact(log, {"HF_TOKEN": ""}) == log


def test_image_build_description_lists_pull_then_build(tmp_path: Path):
    build = ImageBuild("v0.31.0", "repromatrix/cell-v0.31.0:1234", tmp_path, pull="vllm/x:v1")
    calls = build.describe()["calls"]
    assert [c["call"] for c in calls] == ["images.pull", "api.build"]
    assert calls[1]["tag"] == "repromatrix/cell-v0.31.0:1234"


def test_image_references_split_into_repository_and_tag():
    assert split_ref("vllm/vllm-openai:v0.31.0") == ("vllm/vllm-openai", "v0.31.0")
    assert split_ref("127.0.0.1:5000/vllm/vllm-openai:v1") == (
        "127.0.0.1:5000/vllm/vllm-openai",
        "v1",
    )
    assert split_ref("127.0.0.1:5000/vllm") == ("127.0.0.1:5000/vllm", "latest")
    assert split_ref("python") == ("python", "latest")


@pytest.mark.parametrize(
    ("model_path", "adapter_path"),
    [("/models/m", "/models/m"), ("/models/m", "/models/m/lora"), ("/models/m", "/adapters/a")],
)
def test_a_model_and_its_adapter_are_both_in_the_container_wherever_they_are(
    model_path: str, adapter_path: str
) -> None:
    # One folder for both used to become one mount (the volumes are keyed by source):
    # the model was then missing in the cell.
    adapter = Adapter("tiny-lora", path=adapter_path)
    model = replace(
        default_model(Lane.GPU), source=model_path, path=model_path, adapters=(adapter,)
    )
    of = scenario("cpu-kv-cache-too-small", launch=Launch(lora_adapter="tiny-lora"))
    gpu_cell = factories_cell(Lane.GPU, of=of, model=model, flags={"enable_lora": True})
    settings = ContainerSettings(gpu_ids=("0", "1", "2", "3"))
    plan = container_call(gpu_cell, SPEC, "repromatrix/cell-v0.32.0:abc", settings, "r1")
    binds = engine_body(docker_kwargs(plan))["HostConfig"]["Binds"]  # type: ignore[index]
    inside = {bind.split(":")[1]: bind.split(":")[0] for bind in binds}

    def host_of(path: str) -> str:
        target = max((t for t in inside if path == t or path.startswith(t + "/")), key=len)
        return inside[target] + path.removeprefix(target)

    assert host_of(container_model_path(gpu_cell)) == model_path
    assert host_of(str(container_adapter_path(gpu_cell))) == adapter_path


def test_every_container_names_the_process_that_made_it(tmp_path: Path):
    owner = Owner("runner-1", "boot-a", 4242, "1000")
    runtimes = {
        lane: c.runtime for lane, c in load_matrix(paths.ROOT / "matrix.yaml").lanes.items()
    }
    settings = container_settings(runtimes, tmp_path, Runner(), owner)
    plan = container_call(cell(), SPEC, "img", settings[Lane.CPU], "run1")
    assert body_labels(plan) == {**owner.labels(), RUN_LABEL: "run1", CELL_LABEL: cell().id}
    tool = tool_plan("img", ["python3", "-c", "1"], (), "run1", "tool:x", labels=owner.labels())
    assert body_labels(tool) == {**owner.labels(), RUN_LABEL: "run1", CELL_LABEL: "tool:x"}
    # The engine labels its containers with its own owner, whatever settings it was given.
    backend = DockerBackend("run1", {Lane.CPU: ContainerSettings()}, client=object(), owner=owner)  # type: ignore[arg-type]
    made = backend.call_for(cell(), SPEC, Prepared("k", "img"))
    assert made.labels[PID_LABEL] == "4242" and made.labels[HOST_LABEL] == "runner-1"


def body_labels(plan: ContainerCall) -> object:
    return engine_body(docker_kwargs(plan))["Labels"]


def test_a_reference_pinned_by_digest_is_pulled_by_its_digest():
    digest = "sha256:" + "b" * 64
    # the engine reads a digest in the tag's place as the digest to pull; a tag beside it
    # names nothing more
    assert split_ref(f"127.0.0.1:5000/vllm/vllm-openai@{digest}") == (
        "127.0.0.1:5000/vllm/vllm-openai",
        digest,
    )
    assert split_ref(f"vllm/vllm-openai:v0.32.0@{digest}") == ("vllm/vllm-openai", digest)


# -- a cell in a Slurm task ------------------------------------------------------------------

# Two GPUs Slurm gave the task under device constraints: the job numbers them 0 and 1, and
# nvidia-smi inside the job lists only them, from 0 too; they are the host's GPUs 2 and 3.
RENUMBERED_SMI = """\
GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-cccccccc-0000-0000-0000-000000000002)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-dddddddd-0000-0000-0000-000000000003)
"""
SLURM_TASK_ENV = {
    "SLURM_JOB_ID": "41",
    "SLURM_JOB_GPUS": "2,3",
    "CUDA_VISIBLE_DEVICES": "0,1",
    "SLURM_CPUS_ON_NODE": "8",
    "SLURM_MEM_PER_NODE": "65536",
}


def slurm_task_runner(listed: str) -> Runner:
    """The runner of a task whose ``nvidia-smi -L`` prints ``listed`` (every query fails)."""

    def smi(args: Sequence[str]) -> str:
        return listed if tuple(args) == ("-L",) else ""

    return detect_runner(environ=SLURM_TASK_ENV, smi=smi, meminfo=Path(os.devnull))


def test_renumbered_gpus_reach_docker_by_the_uuids_nvidia_smi_gives_inside_the_task():
    runner = slurm_task_runner(RENUMBERED_SMI)
    assert runner.gpu_ids == ("0", "1")
    placement = placement_of(Allocation(gpu_ids=("0", "1")), runner)
    gpu_cell = cell(Lane.GPU, gpus=2)
    settings = container_settings(runtimes(), Path("/models"), runner)[Lane.GPU]
    call = container_call(gpu_cell, SPEC, "img", settings, "run1", device_ids=placement.gpu_ids)
    host = engine_body(docker_kwargs(call))["HostConfig"]
    assert isinstance(host, dict)
    uuids = ["GPU-cccccccc-0000-0000-0000-000000000002", "GPU-dddddddd-0000-0000-0000-000000000003"]
    assert host["DeviceRequests"][0]["DeviceIDs"] == uuids  # never the host's GPUs 0 and 1
    assert KIND.skip_reason(gpu_cell, runner) is None


def test_a_gpu_cell_in_a_slurm_task_without_uuids_is_skipped_with_why():
    runner = slurm_task_runner("")  # no nvidia-smi inside the task
    reason = KIND.skip_reason(cell(Lane.GPU, gpus=2), runner)
    assert reason is not None
    assert "Slurm job 41 numbers its GPUs its own way" in reason and "GPU 0" in reason
    outside = detect_runner(environ={"CUDA_VISIBLE_DEVICES": "0,1"}, smi=lambda _args: "")
    assert KIND.skip_reason(cell(Lane.GPU, gpus=2), outside) is None  # host indexes: fine


def test_every_container_of_a_slurm_task_is_held_to_the_tasks_memory():
    runner = slurm_task_runner(RENUMBERED_SMI)
    settings = container_settings(runtimes(), Path("/models"), runner)
    call = container_call(cell(), SPEC, "img", settings[Lane.CPU], "run1")
    host = engine_body(docker_kwargs(call))["HostConfig"]
    assert isinstance(host, dict)
    assert host["Memory"] == host["MemorySwap"] == 65536 * 1024 * 1024
    unlimited = container_settings(runtimes(), Path("/models"), Runner())
    assert unlimited[Lane.CPU].mem_limit is None


def runtimes() -> dict[Lane, Runtime]:
    lanes = load_matrix(paths.ROOT / "matrix.yaml").lanes
    return {lane: config.runtime for lane, config in lanes.items()}


def test_an_engine_error_is_said_in_the_engines_own_words():
    # What a fresh Docker host without a registry says when a base would be pulled.
    said = 'Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io: no host'
    exc = APIError(
        "500 Server Error for http+docker://localhost/v1.41/distribution", explanation=said
    )
    assert one_line(exc) == f"APIError: {said}"
    assert one_line(OSError("no socket\nmore")) == "OSError: no socket"
