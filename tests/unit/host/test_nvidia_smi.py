"""nvidia-smi's outputs parsed (``host.nvidia_smi``), tested on real captured outputs."""

from __future__ import annotations

import pytest

from repromatrix.host import nvidia_smi
from repromatrix.host.nvidia_smi import DriverVersion, SliceMemory
from repromatrix.host.runner import gpu_groups, read_gpus
from support.nvidia_smi import (
    A100_MIG,
    H100,
    H200_MIG,
    L40S,
    TITAN_V_RTX_5880,
    captured,
    machine,
)

A100_GPU0 = "GPU-513536b6-7d19-9063-b049-1e69664bb298"


# -- the query forms ----------------------------------------------------------------------------


def test_a_query_is_read_by_its_header_whatever_else_it_asks_for():
    # The exporter's capture asks for 212 fields; the ones we ask for are found by name.
    (row,) = nvidia_smi.parse_csv(captured("csv-query-gpu-h100-80gb-hbm3.txt"))
    assert {field: row[field] for field in nvidia_smi.GPU_FIELDS} == {
        "index": "0",
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "name": "NVIDIA H100 80GB HBM3",
        "memory.total": "81559",  # "81559 MiB" under "memory.total [MiB]"
        "compute_cap": "9.0",
        "mig.mode.current": "Disabled",
        "driver_version": "590.48.01",
    }
    assert row["memory.used"] == "19818"
    assert row["hostname"] is None  # [N/A]
    assert row["clocks.applications.memory"] is None  # [Requested functionality has been ...]


def test_a_query_of_other_columns_leaves_ours_absent():
    rows = nvidia_smi.parse_csv(captured("csv-query-gpu-compute-cap-2x-mixed.txt"))
    assert [(r["index"], r["name"], r["compute_cap"]) for r in rows] == [
        ("0", "NVIDIA TITAN V", "7.0"),
        ("1", "NVIDIA RTX 5880 Ada Generation", "8.9"),
    ]
    assert "memory.total" not in rows[0]


def test_compute_processes_by_gpu():
    rows = nvidia_smi.parse_csv(captured("csv-query-compute-apps-h100-mig.txt"))
    assert [(r["pid"], r["process_name"], r["used_gpu_memory"]) for r in rows] == [
        ("21180", "/root/tools/memhog", "2296"),
        ("21181", "/root/tools/memhog", "1272"),
        ("21198", "./gpu_burn", "7484"),
    ]
    # A query that lists nothing is only its header; one that failed is nothing at all.
    assert nvidia_smi.parse_csv("gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n") == ()
    assert nvidia_smi.parse_csv("") == ()


def test_the_header_names_what_nvidia_smi_printed_not_what_was_asked():
    # Asked for `name`, printed `process_name`: the query we send asks for the printed names.
    rows = nvidia_smi.parse_csv(captured("csv-query-compute-apps-2gpu-vgpu.txt"))
    assert [r["process_name"] for r in rows] == ["vgpu"] * 3
    asked = nvidia_smi.QUERY_APPS[0]
    assert "process_name" in asked and "used_gpu_memory" in asked


# -- -L, --version, -q -x -------------------------------------------------------------------------


def test_the_listing_gives_each_gpu_and_its_mig_slices():
    gpus = nvidia_smi.parse_list(captured("list-4x-a100-sxm4-80gb-mig-on-gpu0.txt"))
    assert [(g.index, g.name, len(g.slices)) for g in gpus] == [
        ("0", "NVIDIA A100-SXM4-80GB", 4),
        ("1", "NVIDIA A100-SXM4-80GB", 0),
        ("2", "NVIDIA A100-SXM4-80GB", 0),
        ("3", "NVIDIA A100-SXM4-80GB", 0),
    ]
    assert gpus[0].uuid == A100_GPU0
    first = gpus[0].slices[0]
    assert (first.device, first.profile, first.uuid) == (
        0,
        "1g.20gb",
        "MIG-ce861fb0-a248-58ce-a9a8-f9adbc22a66a",
    )


def test_compute_instance_profiles_are_kept_whole():
    (gpu,) = nvidia_smi.parse_list(captured("list-h200-mig.txt"))
    assert [s.profile for s in gpu.slices] == [
        "1c.3g.71gb",
        "2c.3g.71gb",
        "2g.35gb",
        "1g.18gb",
        "1g.18gb",
    ]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("version-590.48.01-h100.txt", DriverVersion("590.48.01", "13.1")),
        # 610 renamed both and left the old names saying "Deprecated".
        ("version-610.57.04-kmd.txt", DriverVersion("610.57.04", "13.3")),
    ],
)
def test_the_drivers_cuda_version(name: str, expected: DriverVersion):
    assert nvidia_smi.parse_version(captured(name)) == expected


def test_a_mig_slices_own_memory_from_the_xml_report():
    memory = nvidia_smi.parse_mig_memory(captured("xml-a100-sxm4-80gb-mig.xml"))
    assert memory == {(A100_GPU0, n): SliceMemory(total=19968, used=12) for n in range(4)}
    assert nvidia_smi.parse_mig_memory("not xml") == {}


# -- the runner's GPUs read from them -------------------------------------------------------------


def test_an_h100_read_whole():
    (gpu,) = read_gpus(machine(H100))
    assert (gpu.index, gpu.name, gpu.memory_mib, gpu.compute_capability) == (
        "0",
        "NVIDIA H100 80GB HBM3",
        81559,
        "9.0",
    )
    assert (gpu.mig_mode, gpu.mig_profile, gpu.driver_version, gpu.cuda_version) == (
        False,
        None,
        "590.48.01",
        "13.1",
    )
    assert gpu.summary == "GPU 0: NVIDIA H100 80GB HBM3 (79.6 GiB, compute capability 9.0)"


def test_an_h200_in_mig_mode_and_its_slices():
    whole, *slices = read_gpus(machine(H200_MIG))
    assert (whole.name, whole.memory_mib, whole.mig_mode) == ("NVIDIA H200", 143771, True)
    assert [(s.index, s.mig_profile) for s in slices] == [
        ("0:0", "1c.3g.71gb"),
        ("0:1", "2c.3g.71gb"),
        ("0:2", "2g.35gb"),
        ("0:3", "1g.18gb"),
        ("0:4", "1g.18gb"),
    ]
    # A slice has its GPU's name and compute capability; no XML was captured for its memory.
    assert {(s.name, s.compute_capability, s.memory_mib, s.mig_mode) for s in slices} == {
        ("NVIDIA H200", "9.0", None, True)
    }


def test_where_the_query_fails_the_listing_names_the_gpus():
    gpus = read_gpus(machine(A100_MIG))
    assert [(g.index, g.mig_mode, g.memory_mib) for g in gpus[:4]] == [
        ("0", True, None),
        ("1", None, None),
        ("2", None, None),
        ("3", None, None),
    ]
    assert [(g.index, g.mig_profile, g.memory_mib) for g in gpus[4:]] == [
        (f"0:{n}", "1g.20gb", 19968) for n in range(4)
    ]


def test_a_query_without_an_index_column_counts_its_rows():
    gpus = read_gpus(machine(L40S))
    assert [(g.index, g.name, g.memory_mib, g.driver_version) for g in gpus] == [
        ("0", "NVIDIA L40S", 46068, "595.71.05"),
        ("1", "NVIDIA L40S", 46068, "595.71.05"),
    ]


def test_mixed_gpus_keep_their_own_facts():
    gpus = read_gpus(machine(TITAN_V_RTX_5880))
    assert [(g.name, g.compute_capability, g.uuid is None) for g in gpus] == [
        ("NVIDIA TITAN V", "7.0", True),  # the query asked for no uuid
        ("NVIDIA RTX 5880 Ada Generation", "8.9", True),
    ]


def test_no_nvidia_smi_means_no_gpu():
    assert read_gpus(lambda _args: "") == ()


# -- topo -m ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "links", "numa", "groups"),
    [
        # 8x B300, every pair NV18, NUMA nodes 0 (GPUs 0-3) and 1 (4-7); space-aligned.
        (
            "topo-8x-b300-nv18-8nic-bond.txt",
            {("0", "7"): "NV18", ("2", "5"): "NV18"},
            {"0": "0", "3": "0", "4": "1", "7": "1"},
            (("0", "1", "2", "3"), ("4", "5", "6", "7"), tuple("01234567")),
        ),
        # 8x RTX 4090 on PCIe, all SYS; tab-separated, an empty cell before GPU NUMA ID.
        (
            "topo-8x-rtx4090-pcie-sys-nic.txt",
            {("0", "1"): "SYS", ("3", "4"): "SYS"},
            {"3": "0", "4": "1"},
            (("0", "1", "2", "3"), ("4", "5", "6", "7")),
        ),
        # 8x P100: two PCIe switches (PIX) on one NUMA node; the older layout.
        (
            "topo-8x-p100-pcie-pix-phb.txt",
            {("0", "3"): "PIX", ("3", "4"): "PHB"},
            {"7": "0"},
            (("0", "1", "2", "3"), ("4", "5", "6", "7"), tuple("01234567")),
        ),
        (
            "topo-4x-h100-nv18-8nic-phb.txt",
            {("1", "2"): "NV18"},
            {"2": "0"},
            (("0", "1", "2", "3"),),
        ),
        ("topo-2x-nv12-mlx5-named-nics.txt", {("0", "1"): "NV12"}, {"1": "1"}, (("0", "1"),)),
        ("topo-2x-rtx5090-phb.txt", {("1", "0"): "PHB"}, {"0": "0"}, (("0", "1"),)),
    ],
)
def test_topologies(name, links, numa, groups):
    topology = nvidia_smi.parse_topology(captured(name))
    assert topology.gpus == tuple(str(n) for n in range(len(topology.gpus)))
    assert {pair: topology.link(*pair) for pair in links} == links
    assert {gpu: topology.numa[gpu] for gpu in numa} == numa
    assert topology.link("0", "0") == "X"
    assert gpu_groups(topology, topology.gpus) == groups


def test_groups_hold_only_the_gpus_a_run_may_use():
    topology = nvidia_smi.parse_topology(captured("topo-8x-b300-nv18-8nic-bond.txt"))
    usable = ("2", "3", "4", "6")
    assert gpu_groups(topology, usable) == (("2", "3"), ("4", "6"), usable)
    assert gpu_groups(topology, ("3", "4")) == (("3", "4"),)  # one NVLink island
    assert gpu_groups(nvidia_smi.parse_topology(""), ("0", "1")) == ()
