"""Placement that follows the runner's topology: a tensor-parallel cell stays inside one NVLink
island, PCIe switch or NUMA node of the captured 8-GPU machines (``Planner._gpus_for``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repromatrix.host import nvidia_smi
from repromatrix.host.runner import detect_runner, gpu_groups
from repromatrix.run.schedule import Capacity, Job, Need, Planner, capacity_of, simulate
from support.nvidia_smi import TOPOLOGIES, captured, machine

EIGHT = tuple(str(i) for i in range(8))
B300 = "topo-8x-b300-nv18-8nic-bond.txt"  # all NVLink; NUMA 0: GPUs 0-3, 1: 4-7
RTX4090 = "topo-8x-rtx4090-pcie-sys-nic.txt"  # no NVLink; NUMA 0: GPUs 0-3, 1: 4-7
P100 = "topo-8x-p100-pcie-pix-phb.txt"  # one NUMA node; PCIe switches 0-3 and 4-7


def capacity(topology: str, ids: tuple[str, ...] = EIGHT) -> Capacity:
    """The capacity a run on this machine gives its planner, read as a run reads it."""
    runner = detect_runner(",".join(ids), environ={}, smi=machine({nvidia_smi.TOPOLOGY: topology}))
    return capacity_of(runner)


def job(key: str, gpus: int, estimate: float = 60.0) -> Job:
    return Job(key, Need(gpus=gpus), estimate)


def placed(planner: Planner, now: float = 0.0) -> dict[str, tuple[str, ...]]:
    return {start.job.key: start.allocation.gpu_ids for start in planner.starts(now)}


@pytest.mark.parametrize("topology", [B300, RTX4090, P100])
def test_a_tp4_cell_gets_one_half_never_the_middle(topology: str):
    assert placed(Planner([job("tp4", 4)], capacity(topology))) == {"tp4": ("0", "1", "2", "3")}
    # Two of them at once: both halves.
    both = placed(Planner([job("a", 4), job("b", 4)], capacity(topology)))
    assert sorted(both.values()) == [("0", "1", "2", "3"), ("4", "5", "6", "7")]


@pytest.mark.parametrize("topology", [B300, RTX4090, P100])
def test_a_narrow_cell_leaves_a_half_whole_for_a_wide_one(topology: str):
    planner = Planner([job("one", 1, estimate=600.0), job("tp4", 4)], capacity(topology))
    assert placed(planner) == {"one": ("0",), "tp4": ("4", "5", "6", "7")}


def test_narrow_cells_fill_one_half_first():
    planner = Planner([job(f"n{i}", 1, 100.0 - i) for i in range(5)], capacity(RTX4090))
    assert list(placed(planner).values()) == [("0",), ("1",), ("2",), ("3",), ("4",)]


def test_across_numa_nodes_without_nvlink_a_tp4_cell_waits_for_a_whole_node():
    narrow = [job(f"n{i}", 1, 600.0) for i in range(8)]
    planner = Planner([*narrow, job("tp4", 4, 60.0)], capacity(RTX4090))
    holder = {ids: key for key, ids in placed(planner).items()}
    for gpu in "123567":
        planner.finish(holder[(gpu,)])
    # GPUs 0 and 4 still held: six are free, but no NUMA node has four.
    assert placed(planner, 600.0) == {}
    planner.finish(holder[("4",)])
    assert placed(planner, 601.0) == {"tp4": ("4", "5", "6", "7")}


def test_an_nvlink_island_holds_a_tp4_cell_across_numa_nodes():
    # On the B300 every GPU is NVLinked to every other: with 0 and 4 held, the island still
    # holds a TP4 cell (the next best after a NUMA node), so it does not wait.
    planner = Planner([job("a", 1, 600.0), job("b", 1, 500.0), job("tp4", 4)], capacity(B300))
    planner.starts(0.0)
    held = {key: run.allocation.gpu_ids for key, run in planner.running.items()}
    assert held["a"] == ("0",) and held["b"] == ("1",)  # narrow ones fill node 0 first
    assert held["tp4"] == ("4", "5", "6", "7")


def test_a_cell_wider_than_every_group_takes_any_ids():
    planner = Planner([job("tp8", 8)], capacity(RTX4090))
    assert placed(planner) == {"tp8": EIGHT}


def test_without_a_topology_ids_go_in_order():
    assert placed(Planner([job("one", 1, 600.0), job("tp4", 4)], Capacity(EIGHT))) == {
        "one": ("0",),
        "tp4": ("1", "2", "3", "4"),
    }


def test_the_run_reads_the_topology_only_where_there_is_something_to_keep_together():
    asked: list[tuple[str, ...]] = []

    def smi(args):
        asked.append(tuple(args))
        return captured(B300) if tuple(args) == nvidia_smi.TOPOLOGY else ""

    assert detect_runner("3", environ={}, smi=smi).gpu_groups == ()
    assert nvidia_smi.TOPOLOGY not in asked
    assert detect_runner("3,4", environ={}, smi=smi).gpu_groups == (("3", "4"),)


@settings(max_examples=150, deadline=None)
@given(
    topology=st.sampled_from([t for t in TOPOLOGIES if "8x" in t]),
    needs=st.lists(st.sampled_from((1, 1, 2, 4, 8)), min_size=1, max_size=12),
    durations=st.lists(st.floats(1, 600), min_size=12, max_size=12),
)
def test_every_wide_cell_stays_in_one_group_and_every_cell_runs(topology, needs, durations):
    cap = capacity(topology)
    groups = gpu_groups(nvidia_smi.parse_topology(captured(topology)), EIGHT)
    jobs = [job(f"c{i}", n, durations[i]) for i, n in enumerate(needs)]
    spans = simulate(Planner(jobs, cap), lambda j: j.estimate_s).spans
    assert {span.key for span in spans} == {j.key for j in jobs}  # no deadlock
    for span in spans:
        ids = set(span.allocation.gpu_ids)
        if 1 < len(ids) <= max(len(g) for g in groups):
            assert any(ids <= set(g) for g in groups), f"{span.key} got {sorted(ids)}"
