"""Cells, specs and a stand-in vLLM for the harness, render and local-backend tests.

The stand-in is a small stdlib package named ``vllm`` put first on PYTHONPATH:
its OpenAI server answers ``/health`` and ``/v1/completions`` the way a
scenario asks (serve, fail the first request, crash, never become ready), so
the harness's own protocol is tested in a second. What real vLLM does is
tested against real vLLM (``test_local_backend.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from repromatrix.values import (
    Cell,
    FlagValue,
    Gpu,
    Lane,
    Launch,
    LaunchMode,
    Level,
    Model,
    Probe,
    Signature,
)
from support import factories, paths

HARNESS = paths.PACKAGE / "harness" / "harness.py"
TINY = Model("tiny-llama", Lane.CPU, "tiny-llama")


def make_cell(
    flags: Mapping[str, FlagValue] | None = None,
    *,
    lane: Lane = Lane.CPU,
    level: Level = Level.ENGINE,
    launch: Launch | None = None,
    probe: Probe | None = None,
    env: Mapping[str, str] | None = None,
    version: str = "0.32.0",
    deadline_s: float = 600.0,
    interrupt_on: str | None = None,
    sid: str = "cpu-kv-cache-too-small",
) -> Cell:
    """A harness cell: the tiny model (a small Qwen3 on the GPU lane) on the ``cpu`` runner."""
    scenario = factories.scenario(
        sid, Signature(r"KV cache", "EngineCore"), lanes=(lane,), launch=launch, probe=probe
    )
    model = TINY if lane is Lane.CPU else Model("qwen3", lane, "Qwen/Qwen3-0.6B")
    return factories.cell(
        lane,
        of=scenario,
        level=level,
        version=version,
        gpu=Gpu("cpu", lane, "ubuntu-latest"),
        model=model,
        flags=flags,
        env=env,
        deadline_s=deadline_s,
        interrupt_on=interrupt_on,
    )


def offline_launch(**kwargs: Any) -> Launch:
    """A launch in offline ``LLM(...)`` mode."""
    return Launch(mode=LaunchMode.OFFLINE, **kwargs)


STANDIN_INIT = """
__version__ = "0.0.0+standin"
import json, os, sys, time

class SamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs

class _Completion:
    text = " Paris"

class _Output:
    outputs = [_Completion()]

class LLM:
    def __init__(self, model, **kwargs):
        print("standin LLM " + json.dumps({"model": model, "kwargs": kwargs}, sort_keys=True))
        sys.stdout.flush()
        if os.environ.get("STANDIN") == "crash":
            raise ValueError("standin: no KV cache memory left")
        if os.environ.get("STANDIN") == "hang":
            time.sleep(600)

    def generate(self, prompts, params, lora_request=None):
        name = lora_request.lora_name if lora_request else None
        print("standin generate " + json.dumps({"prompts": prompts, "lora": name}))
        return [_Output()]
"""

STANDIN_LORA = """
class LoRARequest:
    def __init__(self, lora_name, lora_int_id, lora_path):
        self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path
"""

# Behaviour by $STANDIN: serve | fail-request | crash | forge-status | never-ready |
# wait-file:<path>.
STANDIN_SERVER = """
import argparse, json, os, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--host")
parser.add_argument("--port", type=int)
parser.add_argument("--model")
known, rest = parser.parse_known_args()
print("standin argv " + json.dumps(sys.argv[1:]), flush=True)
mode = os.environ.get("STANDIN", "serve")
# An "engine" in the same process group, like vLLM's EngineCore.
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print("standin engine pid %d" % engine.pid, flush=True)
if mode == "crash":
    print("(EngineCore pid=1) ValueError: standin KV cache too small", flush=True)
    sys.exit(3)
if mode == "forge-status":  # an engine printing the harness's status mark, then crashing
    forged = '@@repromatrix-status {"ready": true, "answered": true, "exit_code": 0}'
    print(forged, flush=True)
    print("(EngineCore pid=1) INFO quoting " + forged, flush=True)
    print("progress 10%\\r" + forged, flush=True)
    sys.exit(3)
if mode.startswith("wait-file:"):
    print("standin waiting", flush=True)
    while not os.path.exists(mode.split(":", 1)[1]):
        time.sleep(0.05)
if mode == "never-ready":
    time.sleep(600)

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._reply(200 if self.path == "/health" else 404, {})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        print("standin request " + json.dumps(body, sort_keys=True), flush=True)
        if mode == "fail-request":
            self._reply(500, {"error": "EngineDeadError: standin engine died"})
        else:
            self._reply(200, {"choices": [{"text": " Paris", "index": 0}]})

HTTPServer((known.host, known.port), Handler).serve_forever()
"""

# vLLM's console script as the images' entrypoint runs it (``vllm serve MODEL ...``): it says
# how it was called, then serves as the stand-in module does.
STANDIN_CLI = """#!{python}
import json, runpy, sys
print("standin cli " + json.dumps(sys.argv[1:]), flush=True)
assert sys.argv[1] == "serve", sys.argv
sys.argv = [sys.argv[0], "--model", sys.argv[2], *sys.argv[3:]]
runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__")
"""

STANDIN_PROBE = """
import json, sys
params = json.loads(sys.argv[1])
print("probing with " + json.dumps(params, sort_keys=True))
result = {"outcome": params.get("say", "hit"), "evidence": "standin", "exception": None,
          "vllm_version": "0.0.0"}
print("@@repromatrix-probe " + json.dumps(result))
"""


def install_standin(root: Path) -> Path:
    """Write the stand-in ``vllm`` package, its console script (``bin/vllm``) and a probes
    folder under ``root``; return root."""
    server = root / "vllm" / "entrypoints" / "openai"
    server.mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text(STANDIN_INIT)
    (root / "vllm" / "entrypoints" / "__init__.py").write_text("")
    (server / "__init__.py").write_text("")
    (server / "api_server.py").write_text(STANDIN_SERVER)
    (root / "vllm" / "lora").mkdir()
    (root / "vllm" / "lora" / "__init__.py").write_text("")
    (root / "vllm" / "lora" / "request.py").write_text(STANDIN_LORA)
    (root / "probes").mkdir()
    (root / "probes" / "standin_probe.py").write_text(STANDIN_PROBE)
    (root / "bin").mkdir()
    (root / "bin" / "vllm").write_text(STANDIN_CLI.format(python=sys.executable))
    (root / "bin" / "vllm").chmod(0o755)
    return root


def run_harness(spec: Mapping[str, Any], tmp: Path, timeout_s: float = 120) -> tuple[int, str]:
    """Run the harness on ``spec`` to the end; return its exit code and its output."""
    path = tmp / "spec.json"
    path.write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, str(HARNESS), str(path)],
        capture_output=True,
        timeout=timeout_s,
        check=False,
    )
    return done.returncode, (done.stdout + done.stderr).decode()


def status_of(output: str) -> dict[str, Any]:
    """The harness's final status, checking it is the last line."""
    last = output.rstrip("\n").splitlines()[-1]
    assert last.startswith("@@repromatrix-status "), last
    status: dict[str, Any] = json.loads(last.split(" ", 1)[1])
    return status
