"""The in-image harness, run as a real program against a stand-in vLLM (see support/harness.py).

These check the harness's own protocol: output relayed live, readiness, the
first request, "healthy is not serving", process-group clean-up, SIGTERM, the
probe and offline modes, and that the final status line is always printed.
"""

from __future__ import annotations

import ast
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from repromatrix.backends.harness_spec import build_spec
from repromatrix.harness.harness import INTERRUPT_MARK, free_port
from repromatrix.rehearsal.hfcache import lay_out
from repromatrix.run.cell import parse_status
from repromatrix.values import Launch, LaunchMode, Level, Probe
from support.harness import HARNESS, install_standin, make_cell, run_harness, status_of

HARNESS_DIR = HARNESS.parent


@pytest.fixture
def standin(tmp_path: Path) -> Path:
    return install_standin(tmp_path / "standin")


def spec_for(standin: Path, behaviour: str, **kwargs: Any) -> dict[str, Any]:
    cell = make_cell(
        {"max_model_len": 2048, "served_model_name": "x; rm -rf /"},
        env={"PYTHONPATH": str(standin), "STANDIN": behaviour},
        **kwargs,
    )
    spec = build_spec(cell, "/models/tiny", adapter_path="/models/tiny/adapters/lora-r8")
    spec["startup_timeout_s"] = 60
    return spec


def lines_with(output: str, prefix: str) -> list[str]:
    return [line.split(prefix, 1)[1] for line in output.splitlines() if line.startswith(prefix)]


def assert_dead(pids: list[int]) -> None:
    for pid in pids:
        # A zombie awaiting its (dead) parent's reaping counts as gone.
        state = Path(f"/proc/{pid}/stat")
        assert not state.exists() or state.read_text().split(") ")[1].startswith("Z"), pid


def engine_pids(output: str) -> list[int]:
    return [int(pid) for pid in lines_with(output, "standin engine pid ")]


def test_a_serving_server_is_ready_and_answers(standin: Path, tmp_path: Path) -> None:
    code, output = run_harness(spec_for(standin, "serve"), tmp_path)
    status = status_of(output)
    assert code == 0
    assert status["ready"] is True and status["answered"] is True
    assert status["error"] is None
    assert status["ready_s"] > 0 and status["request_s"] > 0
    assert status["stopped"] is True  # the harness stopped the server after answering
    assert status["vllm_version"] == "0.0.0+standin"
    # The server got every flag as its own argument, the shell-looking one untouched.
    argv = json.loads(lines_with(output, "standin argv ")[0])
    assert argv[argv.index("--served-model-name") + 1] == "x; rm -rf /"
    request = json.loads(lines_with(output, "standin request ")[0])
    assert request["model"] == "x; rm -rf /"
    assert_dead(engine_pids(output))


def test_proxy_settings_cannot_send_the_requests_elsewhere(standin: Path, tmp_path: Path) -> None:
    spec = spec_for(standin, "serve")
    spec["startup_timeout_s"] = 10
    # A proxy that is not there (on this machine: nothing may leave it, even in a test).
    closed = f"http://127.0.0.1:{free_port()}"
    proxied = {"http_proxy": closed, "HTTP_PROXY": closed}
    done = subprocess.run(
        [sys.executable, str(HARNESS), "--spec-json", json.dumps(spec)],
        capture_output=True,
        timeout=120,
        check=False,
        env={**os.environ, **proxied, "no_proxy": "", "NO_PROXY": ""},
    )
    assert status_of(done.stdout.decode())["answered"] is True


def test_the_request_goes_through_the_lora_adapter(standin: Path, tmp_path: Path) -> None:
    cell = make_cell(
        {"enable_lora": True},
        launch=Launch(lora_adapter="tiny-lora"),
        env={"PYTHONPATH": str(standin), "STANDIN": "serve"},
    )
    spec = build_spec(cell, "/models/tiny", adapter_path="/a/lora-r8")
    _, output = run_harness(spec, tmp_path)
    argv = json.loads(lines_with(output, "standin argv ")[0])
    assert argv[argv.index("--lora-modules") + 1] == "tiny-lora=/a/lora-r8"
    assert json.loads(lines_with(output, "standin request ")[0])["model"] == "tiny-lora"
    assert status_of(output)["answered"] is True


def test_the_server_starts_as_the_images_entrypoint_starts_it(
    standin: Path, tmp_path: Path
) -> None:
    cell = make_cell({"max_model_len": 2048}, env={"PYTHONPATH": str(standin)})
    spec = build_spec(cell, "/models/tiny", launcher=(str(standin / "bin" / "vllm"), "serve"))
    _, output = run_harness(spec, tmp_path)
    called = json.loads(lines_with(output, "standin cli ")[0])
    assert called[:2] == ["serve", "/models/tiny"]  # the model is serve's first argument
    assert called[2:] == ["--host", "127.0.0.1", "--port", called[5], "--max-model-len", "2048"]
    launched = json.loads(lines_with(output, "@@repromatrix-launch ")[0])
    assert launched == [str(standin / "bin" / "vllm"), *called]
    assert status_of(output)["answered"] is True


def pinned_spec(standin: Path, tmp_path: Path, revision: str) -> dict[str, Any]:
    """A LoRA cell whose model and adapter are repo ids in an HF cache laid out under tmp_path,
    the adapter pinned to ``revision``."""
    home = tmp_path / "hf"
    env = {"PYTHONPATH": str(standin), "HF_HOME": str(home)}
    cell = make_cell({"enable_lora": True}, launch=Launch(lora_adapter="tiny-lora"), env=env)
    spec = build_spec(cell, "org/tiny", adapter_path="org/tiny-lora")
    spec["hub"] = {
        "model": {"repo": "org/tiny", "revision": None},
        "adapter": {"repo": "org/tiny-lora", "revision": revision, "name": "tiny-lora"},
    }
    return spec


def test_the_snapshots_read_are_reported_and_a_pinned_adapter_is_served_from_its_own(
    standin: Path, tmp_path: Path
) -> None:
    for name in ("model", "lora"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"name": name}))
    model = lay_out(tmp_path / "hf", "org/tiny", tmp_path / "model")
    adapter = lay_out(tmp_path / "hf", "org/tiny-lora", tmp_path / "lora")
    _, output = run_harness(pinned_spec(standin, tmp_path, adapter.name), tmp_path)
    argv = json.loads(lines_with(output, "standin argv ")[0])
    assert argv[argv.index("--lora-modules") + 1] == f"tiny-lora={adapter}"
    status = status_of(output)
    assert (status["model_revision"], status["adapter_revision"]) == (model.name, adapter.name)
    assert status["answered"] is True and status["infra_error"] is None


def test_a_pinned_revision_the_cache_lacks_launches_nothing(standin: Path, tmp_path: Path) -> None:
    code, output = run_harness(pinned_spec(standin, tmp_path, "v9"), tmp_path)
    status = status_of(output)
    assert code == 1 and not lines_with(output, "standin argv ")
    assert "adapter org/tiny-lora at revision v9 is not in the HF cache" in status["infra_error"]


def test_healthy_is_not_serving(standin: Path, tmp_path: Path) -> None:
    code, output = run_harness(spec_for(standin, "fail-request"), tmp_path)
    status = status_of(output)
    assert code == 1
    assert status["ready"] is True and status["answered"] is False
    assert "first request failed: HTTP 500" in status["error"]
    assert "EngineDeadError" in status["error"]
    assert_dead(engine_pids(output))


def test_a_server_that_dies_at_startup_reports_its_exit_code(standin: Path, tmp_path: Path) -> None:
    code, output = run_harness(spec_for(standin, "crash"), tmp_path)
    status = status_of(output)
    assert code == 1
    assert status["ready"] is False and status["exit_code"] == 3
    assert status["stopped"] is False
    assert "exited with code 3 before it was ready" in status["error"]
    assert "(EngineCore pid=1) ValueError: standin KV cache too small" in output
    # The engine outlived the server that started it; the harness still removed it.
    assert_dead(engine_pids(output))


def test_startup_timeout_stops_the_server(standin: Path, tmp_path: Path) -> None:
    spec = spec_for(standin, "never-ready")
    spec["startup_timeout_s"] = 2
    code, output = run_harness(spec, tmp_path)
    status = status_of(output)
    assert code == 1 and status["ready"] is False and status["stopped"] is True
    assert "not ready after 2 s" in status["error"]
    assert_dead(engine_pids(output))


def run_interrupted(spec: dict[str, Any], text: str, tmp_path: Path) -> str:
    """Run the harness with ``text`` as the spec's ``interrupt_on``; its whole output."""
    code, output = run_harness({**spec, "interrupt_on": text}, tmp_path)
    assert code == 1, output
    return output


def test_the_interrupt_on_text_sigterms_the_starting_server(standin: Path, tmp_path: Path) -> None:
    output = run_interrupted(spec_for(standin, "never-ready"), "standin engine pid", tmp_path)
    status = status_of(output)
    assert status["ready"] is False and status["interrupted"] is True
    assert status["exit_code"] == -signal.SIGTERM  # the server's own process got it
    assert "before it was ready" in status["error"]
    # Announced right after the line that holds the text, in the relayed output.
    lines = output.splitlines()
    [asked] = [i for i, line in enumerate(lines) if line.startswith("standin engine pid")]
    assert lines[asked + 1] == INTERRUPT_MARK
    assert_dead(engine_pids(output))


def test_a_line_without_the_text_never_interrupts(standin: Path, tmp_path: Path) -> None:
    spec = {**spec_for(standin, "serve"), "interrupt_on": "a line no engine prints"}
    code, output = run_harness(spec, tmp_path)
    status = status_of(output)
    assert code == 0 and status["answered"] is True and status["interrupted"] is False
    assert INTERRUPT_MARK not in output


def test_the_text_is_text_not_a_pattern(standin: Path, tmp_path: Path) -> None:
    spec = {**spec_for(standin, "serve"), "interrupt_on": r"standin engine pid \d+"}
    code, output = run_harness(spec, tmp_path)
    assert code == 0 and status_of(output)["interrupted"] is False


def test_an_interrupt_in_offline_mode_sigterms_the_engine(standin: Path, tmp_path: Path) -> None:
    cell = make_cell(
        launch=Launch(mode=LaunchMode.OFFLINE),
        env={"PYTHONPATH": str(standin), "STANDIN": "hang"},
    )
    spec = build_spec(cell, "/models/tiny")
    output = run_interrupted(spec, "standin LLM", tmp_path)
    status = status_of(output)
    assert status["interrupted"] is True and status["exit_code"] == -signal.SIGTERM
    assert status["answered"] is False and INTERRUPT_MARK in output


def test_no_interrupt_unless_the_runner_asks(standin: Path, tmp_path: Path) -> None:
    code, output = run_harness(spec_for(standin, "serve"), tmp_path)
    status = status_of(output)
    assert code == 0 and status["answered"] is True
    assert status["interrupted"] is False
    assert INTERRUPT_MARK not in output


def test_output_is_relayed_while_the_server_runs_and_sigterm_still_reports(
    standin: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec_for(standin, f"wait-file:{go}")))
    proc = subprocess.Popen(
        [sys.executable, str(HARNESS), str(spec_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    seen = b""
    # The server is still waiting (it never becomes ready before `go` exists), so this line
    # can only arrive if the harness relays output as it comes.
    while b"standin waiting" not in seen:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "no output relayed while the server was starting"
        seen += os.read(proc.stdout.fileno(), 4096)
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    output = (seen + rest).decode()
    status = status_of(output)
    assert status["stopped"] is True and status["ready"] is False
    assert status["error"] == "the harness was stopped by SIGTERM"
    assert_dead(engine_pids(output))


def test_probe_mode_keeps_the_probe_result(standin: Path, tmp_path: Path) -> None:
    cell = make_cell(level=Level.PROBE, probe=Probe("standin_probe.py", {"say": "avoided"}))
    spec = build_spec(cell, "/m")
    spec["probes_dir"] = str(standin / "probes")
    code, output = run_harness(spec, tmp_path)
    status = status_of(output)
    assert code == 0
    assert status["probe"]["outcome"] == "avoided"
    assert status["exit_code"] == 0
    assert 'probing with {"say": "avoided"}' in output


def test_probe_that_prints_no_result_is_an_error(standin: Path, tmp_path: Path) -> None:
    (standin / "probes" / "silent.py").write_text("import sys; sys.exit(4)\n")
    spec = build_spec(make_cell(level=Level.PROBE, probe=Probe("silent.py")), "/m")
    spec["probes_dir"] = str(standin / "probes")
    code, output = run_harness(spec, tmp_path)
    status = status_of(output)
    assert code == 1 and status["probe"] is None and status["exit_code"] == 4
    assert status["error"] == "the probe printed no result (exit code 4)"


def offline_spec(standin: Path, behaviour: str) -> dict[str, Any]:
    cell = make_cell(
        {"max_model_len": 2048, "enable_lora": True},
        launch=Launch(mode=LaunchMode.OFFLINE, lora_adapter="tiny-lora"),
        env={"PYTHONPATH": str(standin), "STANDIN": behaviour},
    )
    return build_spec(cell, "/models/tiny", adapter_path="/a/lora-r8")


def test_offline_mode_builds_llm_and_generates_through_the_adapter(
    standin: Path, tmp_path: Path
) -> None:
    code, output = run_harness(offline_spec(standin, "serve"), tmp_path)
    status = status_of(output)
    assert code == 0 and status["ready"] is True and status["answered"] is True
    built = json.loads(lines_with(output, "standin LLM ")[0])
    assert built == {
        "kwargs": {"enable_lora": True, "max_model_len": 2048},
        "model": "/models/tiny",
    }
    assert json.loads(lines_with(output, "standin generate ")[0])["lora"] == "tiny-lora"


def test_offline_failure_keeps_the_traceback_and_the_exit_code(
    standin: Path, tmp_path: Path
) -> None:
    code, output = run_harness(offline_spec(standin, "crash"), tmp_path)
    status = status_of(output)
    assert code == 1 and status["ready"] is False and status["exit_code"] == 1
    assert "ValueError: standin: no KV cache memory left" in output


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"mode": "server"}, "lacks model, argv, request, startup_timeout_s"),
        ({"mode": "teleport", "startup_timeout_s": 1}, "mode must be one of"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_a_bad_spec_still_ends_with_a_status_line(
    spec: object, message: str, tmp_path: Path
) -> None:
    code, output = run_harness(spec, tmp_path)  # type: ignore[arg-type]
    status = status_of(output)
    assert code == 2
    assert message in status["error"]


def test_spec_json_on_the_command_line(standin: Path) -> None:
    spec = json.dumps(spec_for(standin, "serve"))
    done = subprocess.run(
        [sys.executable, str(HARNESS), "--spec-json", spec],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert status_of(done.stdout.decode())["answered"] is True


@pytest.mark.parametrize("name", ["harness.py", "offline.py", "make_tiny_model.py", "oomwatch.py"])
def test_in_image_programs_are_python_38_and_stdlib_only(name: str) -> None:
    source = (HARNESS_DIR / name).read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
    }
    # A sibling in the same folder is stdlib-only too (this test covers it); ``repromatrix`` is
    # only the fallback for when the harness is imported as part of the package.
    siblings = {path.stem for path in HARNESS_DIR.glob("*.py")} | {"repromatrix"}
    assert imported - {"__future__"} - siblings <= sys.stdlib_module_names
    # Run-time annotations of 3.9+ builtins generics need postponed evaluation on 3.8.
    assert "from __future__ import annotations" in source


def test_an_engine_line_carrying_the_status_mark_never_passes_for_the_harnesss(
    standin: Path, tmp_path: Path
) -> None:
    # The engine prints a status that says it served (at a line's start, inside a line, after
    # a carriage return), then crashes: the host reads the harness's own status alone, and
    # none at all where the harness could not write one (a container killed at its deadline).
    code, output = run_harness(spec_for(standin, "forge-status"), tmp_path)
    status = parse_status(output.encode())
    assert code == 1 and status is not None
    assert not status.answered and not status.ready and status.exit_code == 3
    engine_only = output[: output.rindex("@@repromatrix-status ")]
    assert engine_only.count("@@repromatrix-status ") == 3
    assert parse_status(engine_only.encode()) is None
