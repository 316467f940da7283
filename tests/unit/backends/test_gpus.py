"""GPU pinning: the ids a cell gets come from the GPUs this runner may use."""

from __future__ import annotations

import pytest

from repromatrix.backends.gpus import parse_gpu_ids, runner_gpus, select_devices
from repromatrix.errors import InfraError, UsageError


def test_the_command_line_wins_over_the_environment() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "2,3", "NVIDIA_VISIBLE_DEVICES": "0"}
    assert runner_gpus(env, "5,6", host_count=8) == ("5", "6")
    assert runner_gpus(env, None, host_count=8) == ("2", "3")
    assert runner_gpus({"NVIDIA_VISIBLE_DEVICES": "GPU-1a2b,GPU-3c4d"}) == ("GPU-1a2b", "GPU-3c4d")


def test_an_unrestricted_runner_may_use_every_gpu_of_the_host() -> None:
    assert runner_gpus({}, None, host_count=4) == ("0", "1", "2", "3")
    assert runner_gpus({"NVIDIA_VISIBLE_DEVICES": "all"}, None, host_count=2) == ("0", "1")
    assert runner_gpus({"CUDA_VISIBLE_DEVICES": ""}, None, host_count=2) == ()


def test_a_cell_takes_specific_free_ids_never_the_first_n_of_the_host() -> None:
    usable = runner_gpus({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, None, host_count=8)
    first = select_devices(2, usable)
    second = select_devices(2, usable, busy=first)
    assert (first, second) == (("4", "5"), ("6", "7"))
    with pytest.raises(InfraError, match=r"may use \[4, 5, 6, 7\] and 0 of them are free"):
        select_devices(1, usable, busy={*first, *second})


@pytest.mark.parametrize("text", ["0,,1", "gpu0", "0;1", "1,1"])
def test_bad_gpu_lists_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError, match="--gpus"):
        parse_gpu_ids(text)


def test_none_and_all() -> None:
    assert parse_gpu_ids("none") == ()
    assert parse_gpu_ids("all") is None
    assert parse_gpu_ids(" 0, 3 ") == ("0", "3")
