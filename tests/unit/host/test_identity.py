"""Is a runner's GPU the one a cell's matrix entry names (``repromatrix.host.identity``)?

The runner GPUs are read from outputs captured on real machines, through the same
parsers a run uses; the entries are the default matrix's own.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from repromatrix.backends.docker.kind import KIND
from repromatrix.host.identity import (
    driver_shortfall,
    forward_compatible,
    mismatch,
    name_matches,
    pattern_problem,
    runner_mismatch,
)
from repromatrix.host.runner import RunnerGpu, detect_runner, read_gpus
from repromatrix.matrix.config import load_matrix
from repromatrix.values import Gpu, Lane
from support import paths
from support.factories import cell
from support.nvidia_smi import A100_MIG, H100, H100_MIG, H200_MIG, L40S, MACHINES, machine

ENTRIES = {gpu.name: gpu for gpu in load_matrix(paths.ROOT / "matrix.yaml").lanes[Lane.GPU].gpus}
CAPTURED = {
    (host, gpu.index): gpu
    for host, answers in MACHINES.items()
    for gpu in read_gpus(machine(answers))
}


def gpu_of(answers, index: str = "0") -> RunnerGpu:
    return next(gpu for gpu in read_gpus(machine(answers)) if gpu.index == index)


def entry(name: str = "h100", **changes) -> Gpu:
    return replace(ENTRIES[name], **changes)


# -- every GPU kind of the default matrix against every captured GPU ------------------------------


def test_the_default_matrix_names_its_gpus():
    assert {name: gpu.name_pattern for name, gpu in ENTRIES.items()} == {
        "h200x4": "H200*",
        "h100": "H100*",
        "rtx-a6000": "RTX A6000",
        "rtx-pro-6000-blackwell": "RTX PRO 6000 Blackwell*",
    }


def test_each_kind_matches_only_its_own_gpu():
    matches = {
        (kind, host, index)
        for kind, wanted in ENTRIES.items()
        for (host, index), gpu in CAPTURED.items()
        if mismatch(wanted, gpu) is None
    }
    assert matches == {("h100", "h100", "0")}
    assert len(CAPTURED) == 24  # 6 hosts: 10 whole GPUs, 14 MIG slices


@pytest.mark.parametrize(
    ("kind", "at", "why"),
    [
        # Name, compute capability and memory (140.4 GiB for 141) agree; MIG mode alone refuses.
        (
            "h200x4",
            ("h200-mig", "0"),
            "it is in MIG mode (name one of its MIG slices: --gpus MIG-<uuid>)",
        ),
        ("h200x4", ("h100", "0"), "its name is not H200*; its memory (79.6 GiB) is not 141 GiB"),
        # 46068 MiB (45.0 GiB, ECC on) is within the tolerance of 48: the name tells them apart.
        ("rtx-a6000", ("l40s", "0"), "its name is not RTX A6000"),
        (
            "rtx-a6000",
            ("titan-v-rtx-5880", "1"),
            "its name is not RTX A6000; its compute capability is 8.9, not 8.6",
        ),
        (
            "rtx-pro-6000-blackwell",
            ("h100", "0"),
            "its name is not RTX PRO 6000 Blackwell*; its compute capability is 9.0, not 12.0; "
            "its memory (79.6 GiB) is not 96 GiB",
        ),
        # A slice of an H100 is an H100, but not an 80 GiB one.
        ("h100", ("h100-mig", "0:0"), "its memory (profile 3g.40gb) is not 80 GiB"),
        ("h100", ("a100-mig", "1"), "its name is not H100*"),  # nothing else of it is known
    ],
)
def test_why_a_gpu_is_not_the_kind(kind, at, why):
    assert mismatch(ENTRIES[kind], CAPTURED[at]) == why


# -- MIG slices: judged by their own profile -------------------------------------------------------


def test_a_mig_slice_is_judged_by_its_profile():
    ten = entry(name_pattern="H100*", memory_gib=10)
    assert [
        i for (host, i), gpu in CAPTURED.items() if host == "h100-mig" and not mismatch(ten, gpu)
    ] == [
        "0:2",
        "0:3",
    ]
    # 19968 MiB (19.5 GiB) reported for an A100's 1g.20gb slice; the profile says 20.
    twenty = entry(name_pattern="A100*", compute_capability=None, memory_gib=20)
    assert mismatch(twenty, gpu_of(A100_MIG, "0:1")) is None
    assert gpu_of(A100_MIG, "0:1").memory_mib == 19968


def test_a_slices_profile_wins_over_the_memory_it_reports():
    # An H200's 1g.18gb slice has 16384 MiB (the MIG table of the same capture): 16 GiB is
    # more than 10% below 18, so judging it by its memory would refuse its own profile.
    slice_18 = replace(gpu_of(H200_MIG, "0:3"), memory_mib=16384)
    assert mismatch(entry(name_pattern="H200*", memory_gib=18), slice_18) is None
    assert mismatch(entry(name_pattern="H200*", memory_gib=16), slice_18) is not None


def test_a_slice_is_never_judged_by_its_gpus_memory():
    whole = entry("h200x4")
    assert "memory (profile 2g.35gb) is not 141 GiB" in (
        mismatch(whole, gpu_of(H200_MIG, "0:2")) or ""
    )


# -- the tolerance -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("memory_mib", "matches"),
    [(81559, True), (73728, True), (73727, False), (90112, True), (90113, False)],
)
def test_memory_is_within_ten_percent(memory_mib: int, matches: bool):
    # 80 GiB +- 8 GiB: 72-88 GiB, i.e. 73728-90112 MiB.
    gpu = replace(gpu_of(H100), memory_mib=memory_mib)
    assert (mismatch(entry(), gpu) is None) is matches


def test_compute_capability_compares_as_numbers():
    gpu = gpu_of(H100)
    assert mismatch(entry(compute_capability="9.0"), gpu) is None
    assert mismatch(entry(compute_capability="9.00"), gpu) is None
    assert (
        mismatch(entry(compute_capability="9.1"), gpu) == "its compute capability is 9.0, not 9.1"
    )


def test_what_the_runner_could_not_read_is_not_compared():
    unknown = RunnerGpu("0", "NVIDIA H100 80GB HBM3")
    assert mismatch(entry(), unknown) is None
    assert mismatch(entry(), replace(unknown, name="NVIDIA L4")) == "its name is not H100*"


# -- name patterns ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("H100*", "NVIDIA H100 80GB HBM3", True),
        ("NVIDIA H100*", "NVIDIA H100 80GB HBM3", True),
        ("h100*", "NVIDIA H100 80GB HBM3", True),
        ("H100", "NVIDIA H100 80GB HBM3", False),  # the whole name
        ("H200*", "NVIDIA GH200 480GB", False),
        ("RTX A6000", "NVIDIA RTX A6000", True),
        ("RTX A6000", "NVIDIA RTX A6000 Ada", False),
        ("Tesla T4", "Tesla T4", True),
        ("/H100 (80GB|PCIe).*/", "NVIDIA H100 80GB HBM3", True),
        ("/H100 (80GB|PCIe).*/", "NVIDIA H100 NVL", False),
        ("/rtx pro 6000 blackwell.*/", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", True),
    ],
)
def test_name_patterns(pattern: str, name: str, matches: bool):
    assert name_matches(pattern, name) is matches


def test_bad_patterns_are_named():
    assert pattern_problem("H100*") is None and pattern_problem("/H1[0-9]0/") is None
    assert pattern_problem(" ") == "it is empty"
    assert "not a valid regular expression" in (pattern_problem("/H100(/") or "")
    assert "no backreferences" in (pattern_problem("/(H100)\\1/") or "")
    assert "look-arounds" in (pattern_problem("/H100(?= )/") or "")


def test_a_name_pattern_that_would_backtrack_forever_matches_at_once():
    # Python's re takes exponential time here; RE2 answers in linear time.
    assert pattern_problem("/(a+)+$/") is None
    assert name_matches("/(a|a)*$/", "a" * 60 + "!") is False


# -- the runner as a whole, and the Docker kind's skip reasons -------------------------------------


def gpu_cell(kind: str):
    return cell(Lane.GPU, gpu=ENTRIES[kind])


def test_a_cell_is_skipped_on_a_runner_of_another_gpu_naming_both():
    runner = detect_runner(environ={}, smi=machine(H100))
    assert KIND.skip_reason(gpu_cell("h100"), runner) is None
    reason = KIND.skip_reason(gpu_cell("rtx-a6000"), runner)
    assert reason == (
        "GPU cell for rtx-a6000 (RTX A6000, compute capability 8.6, 48 GiB), but this runner's "
        "GPU 0: NVIDIA H100 80GB HBM3 (79.6 GiB, compute capability 9.0): its name is not "
        "RTX A6000; its compute capability is 9.0, not 8.6; its memory (79.6 GiB) is not 48 GiB"
    )
    assert KIND.skip_reason(gpu_cell("h200x4"), runner) == (
        "GPU cell needs 4 GPU(s) (h200x4); this host has 1 GPU(s)"
    )


def test_a_mixed_runner_must_be_narrowed_to_the_matching_gpus():
    titan_v_entry = replace(
        ENTRIES["rtx-a6000"],
        name="titan-v",
        name_pattern="TITAN V",
        compute_capability="7.0",
        memory_gib=0,
    )
    runner = detect_runner(environ={}, smi=machine(MACHINES["titan-v-rtx-5880"]))
    reason = runner_mismatch(titan_v_entry, runner) or ""
    assert "GPU 1: NVIDIA RTX 5880 Ada Generation (compute capability 8.9)" in reason
    assert reason.endswith("(1 other(s) match: narrow the run with --gpus)")
    assert (
        runner_mismatch(
            titan_v_entry, detect_runner("0", environ={}, smi=machine(MACHINES["titan-v-rtx-5880"]))
        )
        is None
    )


def test_a_named_mig_slice_is_checked_as_itself():
    slice_uuid = "MIG-00000002-0000-0000-0000-000000000002"  # 1g.10gb
    runner = detect_runner(slice_uuid, environ={}, smi=machine(H100_MIG))
    assert runner.gpu_ids == ("0:2",)
    assert runner_mismatch(entry(memory_gib=10), runner) is None
    assert "MIG 0:2: NVIDIA H100 80GB HBM3 MIG 1g.10gb" in (runner_mismatch(entry(), runner) or "")


def test_ids_nvidia_smi_did_not_list_are_unchecked():
    # A dry run with --gpus on a host without nvidia-smi: nothing to compare, nothing skipped.
    runner = detect_runner("0,1,2,3", environ={}, smi=lambda _args: "")
    assert runner.usable == (None, None, None, None)
    assert KIND.skip_reason(gpu_cell("h200x4"), runner) is None
    assert KIND.skip_reason(gpu_cell("h100"), detect_runner(environ={}, smi=lambda _a: "")) == (
        "GPU cell needs 1 GPU(s) (h100); this host has no GPU"
    )


def test_a_rehearsal_matches_no_gpu():
    runner = detect_runner(environ={}, rehearse=True, smi=machine(L40S))
    assert KIND.skip_reason(gpu_cell("h100"), runner) is None


# -- the driver against the image's CUDA ---------------------------------------------------------

# The shape of a CUDA base image's NVIDIA_REQUIRE_CUDA: CUDA 12.9, or a driver of a branch that
# CUDA's forward compatibility serves (R535, R550) on data-center GPUs.
REQUIRE_12_9 = (
    "cuda>=12.9 brand=unknown,driver>=535,driver<536 brand=tesla,driver>=535,driver<536 "
    "brand=tesla,driver>=550,driver<551"
)


def test_a_driver_new_enough_runs_the_image():
    h100 = [gpu_of(H100)]  # driver 590.48.01, CUDA 13.1
    assert driver_shortfall(h100, "12.9.1") is None
    assert driver_shortfall(h100, "13.1.0") is None
    assert driver_shortfall(h100, None) is None  # an image that says nothing


def test_a_driver_too_old_is_named():
    h100 = [gpu_of(H100)]
    assert driver_shortfall(h100, "13.2.0", REQUIRE_12_9) == (
        "the driver 590.48.01 supports CUDA up to 13.1, and the image is built for CUDA "
        "13.2.0 (its CUDA_VERSION): update the runner's driver"
    )


def test_forward_compatibility_is_left_to_the_nvidia_runtime():
    old = [replace(gpu_of(H100), driver_version="535.129.03", cuda_version="12.2")]
    assert driver_shortfall(old, "12.9.1", REQUIRE_12_9) is None
    assert driver_shortfall(old, "12.9.1", "cuda>=12.9") is not None
    assert forward_compatible(REQUIRE_12_9, "550.90.07")
    assert not forward_compatible(REQUIRE_12_9, "545.23.08")
    assert not forward_compatible(REQUIRE_12_9, "536.0")
