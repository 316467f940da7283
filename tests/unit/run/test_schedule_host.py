"""What a runner may lend (``run.host_resources``): GPU ids allowed, cores, free memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from repromatrix.errors import UsageError
from repromatrix.run.host_resources import (
    allowed_gpu_ids,
    available_memory,
    detect,
    parse_smi_list,
)

SMI = """\
GPU 0: NVIDIA H200 (UUID: GPU-0a1b2c3d-0000-0000-0000-000000000000)
GPU 1: NVIDIA H200 (UUID: GPU-1a1b2c3d-0000-0000-0000-000000000001)
  MIG 3g.71gb     Device  0: (UUID: MIG-5c6d7e8f-0000-0000-0000-000000000000)
GPU 2: NVIDIA H200 (UUID: GPU-2a1b2c3d-0000-0000-0000-000000000002)
GPU 3: NVIDIA H200 (UUID: GPU-3a1b2c3d-0000-0000-0000-000000000003)
"""
GPUS = parse_smi_list(SMI)
UUID_2 = "GPU-2a1b2c3d-0000-0000-0000-000000000002"


def test_nvidia_smi_lists_gpus_not_mig_instances() -> None:
    assert [g.index for g in GPUS] == ["0", "1", "2", "3"]
    assert GPUS[2].uuid == UUID_2 and GPUS[2].name == "NVIDIA H200"


def test_all_gpus_without_any_restriction() -> None:
    assert allowed_gpu_ids(GPUS, {}) == ("0", "1", "2", "3")


def test_cuda_visible_devices_narrows_and_orders() -> None:
    assert allowed_gpu_ids(GPUS, {"CUDA_VISIBLE_DEVICES": "3,1"}) == ("3", "1")


def test_a_uuid_is_the_same_gpu_as_its_index() -> None:
    env = {"CUDA_VISIBLE_DEVICES": f"{UUID_2},2"}
    assert allowed_gpu_ids(GPUS, env) == ("2",)


@pytest.mark.parametrize("value", ["", "none", "void", "-1"])
def test_hidden_devices_leave_no_gpu(value: str) -> None:
    assert allowed_gpu_ids(GPUS, {"CUDA_VISIBLE_DEVICES": value}) == ()


def test_cuda_wins_over_nvidia_and_the_option_over_both() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0", "NVIDIA_VISIBLE_DEVICES": "1,2"}
    assert allowed_gpu_ids(GPUS, env) == ("0",)
    assert allowed_gpu_ids(GPUS, {"NVIDIA_VISIBLE_DEVICES": "1,2"}) == ("1", "2")
    assert allowed_gpu_ids(GPUS, {"NVIDIA_VISIBLE_DEVICES": "all"}) == ("0", "1", "2", "3")
    assert allowed_gpu_ids(GPUS, env, "device=3") == ("3",)


@pytest.mark.parametrize(
    ("option", "ids"),
    [("all", ("0", "1", "2", "3")), ("2", ("0", "1")), ("device=1,3", ("1", "3"))],
)
def test_the_gpus_option_takes_dockers_syntax(option: str, ids: tuple[str, ...]) -> None:
    assert allowed_gpu_ids(GPUS, {}, option) == ids


def test_an_unknown_gpu_is_a_usage_error_naming_what_exists() -> None:
    with pytest.raises(UsageError, match=r"CUDA_VISIBLE_DEVICES: no GPU '7'.*lists: 0, 1, 2, 3"):
        allowed_gpu_ids(GPUS, {"CUDA_VISIBLE_DEVICES": "0,7"})
    with pytest.raises(UsageError, match="Perhaps you meant"):
        allowed_gpu_ids(GPUS, {}, "device=GPU-2a1b2c3d-0000-0000-0000-00000000002")
    with pytest.raises(UsageError, match="this host has 4 GPU"):
        allowed_gpu_ids(GPUS, {}, "6")
    with pytest.raises(UsageError, match="use all, a count"):
        allowed_gpu_ids(GPUS, {}, "gpu0")


def test_free_memory_is_mem_available() -> None:
    text = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n"
    assert available_memory(text) == 20000000 * 1024
    assert available_memory("MemTotal: 1 kB\n") == 0


def test_detect_builds_the_capacity(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemAvailable: 1048576 kB\n")
    host = detect({"CUDA_VISIBLE_DEVICES": "1,2"}, smi=lambda: SMI, meminfo=meminfo)
    capacity = host.capacity(jobs=2)
    assert capacity.gpu_ids == ("1", "2") and capacity.memory == 1 << 30 and capacity.jobs == 2
    assert capacity.core_ids and host.uuid_of("2") == UUID_2
    with pytest.raises(UsageError, match="--jobs must be at least 1"):
        host.capacity(jobs=0)


def test_no_nvidia_smi_means_no_gpu(tmp_path: Path) -> None:
    host = detect({}, smi=lambda: "", meminfo=tmp_path / "missing")
    assert host.gpu_ids == () and host.free_memory == 0
