"""This runner (``host.runner``): the GPUs a run may use, cores, free memory, read once."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from repromatrix.errors import InfraError, UsageError
from repromatrix.host.runner import (
    MIB,
    Runner,
    SlurmJob,
    available_memory,
    detect_runner,
    parse_gpu_ids,
    read_gpus,
    select_devices,
    slurm_job,
)

SMI = """\
GPU 0: NVIDIA H200 (UUID: GPU-0a1b2c3d-0000-0000-0000-000000000000)
GPU 1: NVIDIA H200 (UUID: GPU-1a1b2c3d-0000-0000-0000-000000000001)
  MIG 3g.71gb     Device  0: (UUID: MIG-5c6d7e8f-0000-0000-0000-000000000000)
GPU 2: NVIDIA H200 (UUID: GPU-2a1b2c3d-0000-0000-0000-000000000002)
GPU 3: NVIDIA H200 (UUID: GPU-3a1b2c3d-0000-0000-0000-000000000003)
"""
EIGHT = "".join(f"GPU {i}: NVIDIA H100 (UUID: GPU-{i}0000000-0000)\n" for i in range(8))
UUID_2 = "GPU-2a1b2c3d-0000-0000-0000-000000000002"
NO_MEMINFO = Path(os.devnull)


def listing(text: str) -> Callable[[Sequence[str]], str]:
    """An nvidia-smi that answers ``-L`` with ``text`` and nothing else (every query fails)."""
    return lambda args: text if tuple(args) == ("-L",) else ""


def gpu_ids(env: Mapping[str, str], option: str | None = None, smi: str = SMI) -> tuple[str, ...]:
    """The GPUs a run may use on a host whose ``nvidia-smi -L`` prints ``smi``."""
    return detect_runner(option, environ=env, smi=listing(smi), meminfo=NO_MEMINFO).gpu_ids


# -- the grammar of --gpus and the visible-devices variables ---------------------------------


@pytest.mark.parametrize("text", ["0,,1", "gpu0", "0;1", "1,1", "device=0,2"])
def test_bad_gpu_lists_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError, match="--gpus"):
        parse_gpu_ids(text)


def test_none_and_all() -> None:
    assert parse_gpu_ids("none") == ()
    assert parse_gpu_ids("all") is None
    assert parse_gpu_ids(" 0, 3 ") == ("0", "3")


def test_a_bad_variable_is_a_usage_error_naming_it() -> None:
    with pytest.raises(UsageError, match="NVIDIA_VISIBLE_DEVICES: 'gpu0' is no GPU id"):
        gpu_ids({"NVIDIA_VISIBLE_DEVICES": "gpu0"})


# -- which GPUs a run may use ----------------------------------------------------------------


def test_nvidia_smi_lists_gpus_then_mig_slices() -> None:
    gpus = read_gpus(listing(SMI))
    assert [g.index for g in gpus] == ["0", "1", "2", "3", "1:0"]
    assert gpus[2].uuid == UUID_2 and gpus[2].name == "NVIDIA H200"
    assert gpus[4].mig_profile == "3g.71gb" and gpus[4].uuid.startswith("MIG-5c6d7e8f")


def test_a_mig_slice_is_usable_only_when_named() -> None:
    assert "1:0" not in gpu_ids({})
    mig = "MIG-5c6d7e8f-0000-0000-0000-000000000000"
    assert gpu_ids({"NVIDIA_VISIBLE_DEVICES": f"{mig},0"}) == ("1:0", "0")


def test_all_gpus_without_any_restriction() -> None:
    assert gpu_ids({}) == ("0", "1", "2", "3")
    assert gpu_ids({"NVIDIA_VISIBLE_DEVICES": "all"}) == ("0", "1", "2", "3")


def test_cuda_visible_devices_narrows_and_orders() -> None:
    assert gpu_ids({"CUDA_VISIBLE_DEVICES": "3,1"}) == ("3", "1")


def test_the_command_line_wins_over_the_environment() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "2,3", "NVIDIA_VISIBLE_DEVICES": "0"}
    assert gpu_ids(env, "5,6", smi=EIGHT) == ("5", "6")
    assert gpu_ids(env, smi=EIGHT) == ("2", "3")
    assert gpu_ids(env, "all", smi=EIGHT) == tuple(str(i) for i in range(8))


def test_cuda_wins_over_nvidia_and_the_option_over_both() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0", "NVIDIA_VISIBLE_DEVICES": "1,2"}
    assert gpu_ids(env) == ("0",)
    assert gpu_ids({"NVIDIA_VISIBLE_DEVICES": "1,2"}) == ("1", "2")
    assert gpu_ids(env, "3") == ("3",)


def test_a_uuid_is_the_same_gpu_as_its_index() -> None:
    assert gpu_ids({"CUDA_VISIBLE_DEVICES": f"{UUID_2},2"}) == ("2",)
    assert gpu_ids({}, f"1,{UUID_2}") == ("1", "2")


@pytest.mark.parametrize("value", ["", "none", "void", "-1", "NoDevFiles"])
def test_hidden_devices_leave_no_gpu(value: str) -> None:
    assert gpu_ids({"CUDA_VISIBLE_DEVICES": value}) == ()


def test_an_id_nvidia_smi_does_not_list_is_kept_as_given() -> None:
    # A dry-run host without nvidia-smi, a MIG instance: Docker says whether it exists.
    assert gpu_ids({"NVIDIA_VISIBLE_DEVICES": "GPU-1a2b,GPU-3c4d"}, smi="") == (
        "GPU-1a2b",
        "GPU-3c4d",
    )
    assert gpu_ids({}, "MIG-4f1c,GPU-1a1b2c3d-0000-0000-0000-000000000001,7") == (
        "MIG-4f1c",
        "1",
        "7",
    )


def test_no_nvidia_smi_means_no_gpu() -> None:
    assert gpu_ids({}, smi="") == ()
    assert gpu_ids({"CUDA_VISIBLE_DEVICES": "all"}, smi="") == ()


# -- the runner value ------------------------------------------------------------------------


def test_free_memory_is_mem_available() -> None:
    text = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n"
    assert available_memory(text) == 20000000 * 1024
    assert available_memory("MemTotal: 1 kB\n") == 0


def test_detect_reads_gpus_cores_and_memory_once(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemAvailable: 1048576 kB\n")
    calls: list[tuple[str, ...]] = []

    def smi(args: Sequence[str]) -> str:
        calls.append(tuple(args))
        return listing(SMI)(args)

    env = {"CUDA_VISIBLE_DEVICES": "1,2"}
    runner = detect_runner(environ=env, rehearse=True, smi=smi, meminfo=meminfo)
    assert len(calls) == len(set(calls)) == 5  # -L, --version, --query-gpu, -q -x, topo -m
    assert runner.gpu_ids == ("1", "2") and runner.gpu_count == 2
    assert [g.index for g in runner.gpus] == ["0", "1", "2", "3", "1:0"]  # the host's, all
    assert runner.free_memory == 1 << 30 and runner.rehearse
    assert runner.core_ids == tuple(sorted(os.sched_getaffinity(0)))


def test_a_missing_meminfo_means_no_free_memory(tmp_path: Path) -> None:
    runner = detect_runner(environ={}, smi=lambda _args: "", meminfo=tmp_path / "missing")
    assert runner == Runner(core_ids=runner.core_ids)


def test_uuids_are_the_listed_gpus_own() -> None:
    runner = detect_runner("MIG-4f1c,2", environ={}, smi=listing(SMI), meminfo=NO_MEMINFO)
    assert runner.uuid_of("2") == UUID_2
    assert runner.uuid_of("MIG-4f1c") is None and runner.uuid_of("7") is None


# -- which of them a cell gets ---------------------------------------------------------------


def test_a_cell_takes_specific_free_ids_never_the_first_n_of_the_host() -> None:
    usable = gpu_ids({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, smi=EIGHT)
    first = select_devices(2, usable)
    second = select_devices(2, usable, busy=first)
    assert (first, second) == (("4", "5"), ("6", "7"))
    with pytest.raises(InfraError, match=r"may use \[4, 5, 6, 7\] and 0 of them are free"):
        select_devices(1, usable, busy={*first, *second})


# -- inside a Slurm job ----------------------------------------------------------------------


def test_outside_slurm_there_is_no_job() -> None:
    assert slurm_job({"CUDA_VISIBLE_DEVICES": "0"}) is None


@pytest.mark.parametrize(
    "env, cpus, memory",
    [
        (
            {"SLURM_CPUS_PER_TASK": "4", "SLURM_CPUS_ON_NODE": "8", "SLURM_MEM_PER_NODE": "3000"},
            4,
            3000,
        ),
        ({"SLURM_CPUS_ON_NODE": "2", "SLURM_MEM_PER_CPU": "1024"}, 2, 2048),
        ({"SLURM_CPUS_ON_NODE": "2", "SLURM_MEM_PER_NODE": "0"}, 2, None),  # --mem=0: the node
        ({}, None, None),
    ],
)
def test_a_slurm_job_is_its_cores_and_memory(env: dict[str, str], cpus: int, memory: int) -> None:
    job = slurm_job({"SLURM_JOB_ID": "12", **env})
    assert job == SlurmJob("12", cpus, memory * MIB if memory else None)


def test_in_a_slurm_job_the_runner_is_what_slurm_allocated(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemAvailable: 20000000 kB\n")
    env = {"SLURM_JOB_ID": "12", "SLURM_CPUS_ON_NODE": "1", "SLURM_MEM_PER_NODE": "3000"}
    runner = detect_runner(environ=env, smi=lambda _args: "", meminfo=meminfo)
    assert len(runner.core_ids) == 1  # this sandbox binds no task to its cores: counted
    assert runner.free_memory == runner.memory_limit == 3000 * MIB
    assert Runner().memory_limit is None
