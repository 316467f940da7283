"""The containers of HPC sites' launchers (pyxis on srun, Apptainer), rendered from the same
container call Docker creates and read back into what that call gives the container."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from repromatrix.backends.docker.calls import (
    ContainerCall,
    ContainerSettings,
    Mount,
    container_call,
)
from repromatrix.backends.launchers import (
    Command,
    apptainer_command,
    apptainer_image,
    enroot_image,
    launch_of,
    parse_apptainer,
    parse_pyxis,
    pyxis_command,
)
from repromatrix.errors import UsageError
from repromatrix.values import Lane
from support.runner import cell

SPEC = {"mode": "server", "argv": ["--max-model-len", "2048"], "cell": "x"}
UUIDS = ("GPU-cccccccc-0000-0000-0000-000000000002", "GPU-dddddddd-0000-0000-0000-000000000003")
TOKEN = "hf_secretvalue123"


def cpu_call() -> ContainerCall:
    settings = ContainerSettings(
        mounts=(Mount("/cache/models", "/cache/models"),), mem_limit="3073m"
    )
    return container_call(cell(), SPEC, "repromatrix/cell-cpu-0.32.0:abc", settings, "run1")


def gpu_call() -> ContainerCall:
    settings = ContainerSettings(hf_cache="/data/hf")
    return container_call(
        cell(Lane.GPU, gpus=2), SPEC, "registry.example:5000/vllm/cell:v1", settings, "run1",
        device_ids=UUIDS,
    )  # fmt: skip


@pytest.mark.parametrize("make", [cpu_call, gpu_call])
def test_pyxis_gives_the_container_what_docker_would(make: Callable[[], ContainerCall]):
    call = make()
    command = pyxis_command(call)
    assert command.argv[0] == "srun"
    assert parse_pyxis(command) == launch_of(call, enroot_image(call.image))


@pytest.mark.parametrize("make", [cpu_call, gpu_call])
def test_apptainer_gives_the_container_what_docker_would(make: Callable[[], ContainerCall]):
    call = make()
    command = apptainer_command(call)
    assert command.argv[:2] == ("apptainer", "exec")
    assert parse_apptainer(command) == launch_of(call, apptainer_image(call.image))
    assert ("--nv" in command.argv) is (call.gpus_needed > 0)


def test_the_gpus_are_the_cells_own_by_uuid():
    pyxis, apptainer = pyxis_command(gpu_call()), apptainer_command(gpu_call())
    assert pyxis.environment["NVIDIA_VISIBLE_DEVICES"] == ",".join(UUIDS)
    assert f"CUDA_VISIBLE_DEVICES={','.join(UUIDS)}" in apptainer.argv
    assert "--mem=3073M" in pyxis_command(cpu_call()).argv  # the task's memory, as srun says it


def test_no_secret_of_the_host_reaches_a_launcher(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # a cell runs offline: prepare alone reads it
    for command in (pyxis_command(gpu_call()), apptainer_command(gpu_call())):
        text = json.dumps([command.argv, dict(command.environment)])
        assert TOKEN not in text and "HF_TOKEN" not in text


def test_image_references_as_each_launcher_names_them():
    assert (
        enroot_image("registry.example:5000/vllm/cell:v1") == "registry.example:5000#vllm/cell:v1"
    )
    assert (
        enroot_image("repromatrix/cell-cpu-0.32.0:abc")
        == "dockerd://repromatrix/cell-cpu-0.32.0:abc"
    )
    assert enroot_image("vllm/vllm-openai:v0.32.0") == "vllm/vllm-openai:v0.32.0"
    assert apptainer_image("vllm/vllm-openai:v0.32.0") == "docker://vllm/vllm-openai:v0.32.0"
    assert apptainer_image("repromatrix/cell:abc") == "docker-daemon:repromatrix/cell:abc"


def test_another_command_is_not_read_as_one():
    with pytest.raises(ValueError, match="not a `srun` command"):
        parse_pyxis(Command(("sbatch", "x")))


@pytest.mark.parametrize("hf_cache", ["/data/hf,/:/host", "/data/hf:/etc", "/data/a,b"])
def test_a_path_holding_a_mount_lists_separator_is_refused_never_written(hf_cache: str):
    # Written, "/data/hf,/:/host" would add an entry mounting the host's / read-write.
    settings = ContainerSettings(hf_cache=hf_cache)
    call = container_call(cell(Lane.GPU), SPEC, "registry.example:5000/vllm/cell:v1", settings, "r")
    for command in (pyxis_command, apptainer_command):
        with pytest.raises(UsageError, match="their mount lists take as a separator"):
            command(call)
