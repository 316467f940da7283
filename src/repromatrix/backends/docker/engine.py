"""The Docker adapter: the only module that talks to a container engine (via the docker SDK).

``DockerBackend`` executes the calls of ``calls.container_call``: it builds or
pulls images (reading the CUDA version a GPU image is built for), then runs
each cell in a labelled container under the cell's own deadline, streaming its
output to the listener, stopping early when the listener says so, and always
removing what it started. Before a GPU cell it checks the cell's GPUs idle
(``host.idle``, naming the container that holds one), and at the start of a run
it removes the containers of runs that are no longer alive (``owners``).
"""

from __future__ import annotations

import io
import os
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, DockerException, ImageNotFound
from docker.models.containers import Container
from docker.types import DeviceRequest
from requests.exceptions import RequestException

from repromatrix.backends.base import EnvironmentReport, Execution, Placement, Prepared
from repromatrix.backends.docker import owners
from repromatrix.backends.docker.calls import (
    CELL_LABEL,
    RUN_LABEL,
    ContainerCall,
    ContainerSettings,
    ImageBuild,
    Mount,
    container_call,
    environment_call,
    split_ref,
    tool_plan,
)
from repromatrix.backends.docker.owners import Owner, this_process
from repromatrix.backends.docker.preflight import HostFacts
from repromatrix.backends.harness_spec import ENVIRONMENT_ARGV, VERSION_ARGV, server_launcher
from repromatrix.backends.output import BoundedLog
from repromatrix.errors import InfraError, RepromatrixError
from repromatrix.files import replace_file
from repromatrix.heartbeat import heartbeat
from repromatrix.host import idle
from repromatrix.host.nvidia_smi import Smi, run_nvidia_smi
from repromatrix.host.runner import Runner
from repromatrix.images import wheelhouse
from repromatrix.images.render import CONTAINER_ROOT
from repromatrix.matrix.lanes import BaseImage, pulled_base
from repromatrix.models import tinymodel
from repromatrix.models.tinymodel import TinyModel
from repromatrix.secret_env import OutputListener, redact, redacting_listener, secrets_from
from repromatrix.values import Cell, Image, Lane, Model

# Errors that mean "the engine or the host failed", never "vLLM failed".
ENGINE_ERRORS = (DockerException, RequestException, OSError)
# After a kill, how long the log stream may take to deliver its last bytes.
DRAIN_S = 5.0
CONFLICT = 409
GENERATOR_IN_IMAGE = f"{CONTAINER_ROOT}/harness/{tinymodel.GENERATOR}"
BUILD_TAIL = 20  # lines of build output kept in a failed image's error
ENVIRONMENT_DEADLINE_S = 300.0  # collect_env imports torch and vLLM and runs a few tools


class _ImageFailed(Exception):
    """A pull, build or import that failed; its message becomes ``Prepared.error``."""


def connect(timeout_s: float = 10.0) -> docker.DockerClient:
    """Return a client for the local engine, or raise ``InfraError`` when none answers."""
    try:
        client = docker.from_env(timeout=int(timeout_s))
        client.ping()
    except ENGINE_ERRORS as exc:
        raise InfraError(f"no Docker engine answers ({one_line(exc)})") from exc
    return client


def engine_available() -> bool:
    """Whether a Docker engine answers on this host."""
    try:
        connect(timeout_s=3.0).close()
    except InfraError:
        return False
    return True


def host_facts(bases: Collection[BaseImage], timeout_s: float = 5.0) -> HostFacts:
    """What the Docker path needs of this host for ``bases``, asked in seconds: the engine,
    the bases it has, debootstrap and root, and (only where a base is missing and may be
    pulled) whether the engine's registry answers for it."""
    debootstrap = shutil.which("debootstrap") is not None
    root = os.geteuid() == 0
    cached = frozenset(
        base.ref
        for base in bases
        if wheelhouse.is_complete(wheelhouse.BASE_ROOT / wheelhouse.rootfs_key(base))
    )
    try:
        client = connect(timeout_s=timeout_s)
    except InfraError as exc:
        why = one_line(exc.__cause__) if exc.__cause__ is not None else str(exc)
        return HostFacts(why, debootstrap=debootstrap, root=root, rootfs_cached=cached)
    try:
        refs = {base.ref for base in bases} | {
            pulled_base(b).ref for b in bases if b.source == "auto"
        }
        present = frozenset(ref for ref in refs if _has_image(client, ref))
        missing = [base for base in bases if base.ref not in present]
        asked = [ref for base in missing if (ref := _pull_ref(base, debootstrap and root))]
        registry_error = _registry_error(client, asked[0]) if asked else "not asked"
    finally:
        client.close()
    return HostFacts(None, present, debootstrap, root, cached, registry_error)


def _has_image(client: docker.DockerClient, ref: str) -> bool:
    try:
        client.images.get(ref)
    except ImageNotFound:
        return False
    return True


def _pull_ref(base: BaseImage, debootstraps: bool) -> str | None:
    """What a missing ``base`` would pull here (None: debootstrap makes it)."""
    if base.source == "image":
        return base.ref
    return pulled_base(base).ref if base.source == "auto" and not debootstraps else None


def _registry_error(client: docker.DockerClient, ref: str) -> str | None:
    """None where the engine's registry answers for ``ref`` (its manifest is read, nothing
    pulled), else what went wrong, in one line."""
    try:
        client.api.inspect_distribution(ref)  # type: ignore[no-untyped-call]
    except ENGINE_ERRORS as exc:
        return one_line(exc)
    return None


def docker_kwargs(plan: ContainerCall) -> dict[str, Any]:
    """The plan's create arguments with docker SDK types where the SDK wants them."""
    kwargs = plan.create_kwargs()
    if "device_requests" in kwargs:
        kwargs["device_requests"] = [DeviceRequest(**r) for r in kwargs["device_requests"]]
    return kwargs


def debootstrap_stream(base: BaseImage) -> Iterable[bytes]:
    """The base root file system as a tar stream, made with debootstrap (cached on the host)."""
    rootfs = wheelhouse.make_base_rootfs(base, wheelhouse.BASE_ROOT)
    return wheelhouse.rootfs_tar_stream(rootfs)


def _kill(container: Container) -> None:
    """SIGKILL the container; one that has just exited on its own is fine too."""
    try:
        container.kill()
    except APIError as exc:
        if exc.status_code != CONFLICT:  # 409: the container is not running any more
            raise


def _short_id(image_id: str | None) -> str:
    """The first 12 hex digits of an image id (``sha256:...``), for tags."""
    return (image_id or "none").removeprefix("sha256:")[:12]


def one_line(exc: BaseException) -> str:
    """``exc`` as one line: its type and the first line of what it says."""
    # An APIError's own text leads with the HTTP call to the engine; its explanation is what
    # the engine said (``Get "https://registry-1.docker.io/v2/": ... no such host``).
    said = exc.explanation if isinstance(exc, APIError) and exc.explanation else str(exc)
    text = str(said).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


Chunks = queue.Queue[bytes | BaseException | None]


def _pump(container: Container) -> tuple[Chunks, threading.Thread]:
    """Read ``container``'s output on a thread into a queue (None marks the end), so the
    caller keeps its own clock: the cell's deadline, not the stream's."""
    chunks: Chunks = queue.Queue()

    def read() -> None:
        try:
            for chunk in container.logs(stream=True, follow=True):
                chunks.put(chunk)
        except BaseException as exc:  # handed to the caller's thread
            chunks.put(exc)
        finally:
            chunks.put(None)

    thread = threading.Thread(target=read, name="repromatrix-logs", daemon=True)
    thread.start()
    return chunks, thread


@dataclass
class _Streamed:
    """What happened while a cell's output streamed."""

    log: BoundedLog = field(default_factory=BoundedLog)
    timed_out: bool = False
    stopped_early: bool = False
    stream_error: str | None = None


class DockerBackend:
    """Runs cells in containers of a local Docker engine; see ``backend.Backend``."""

    name = "docker"

    def __init__(
        self,
        run_id: str,
        settings: Mapping[Lane, ContainerSettings],
        builds: Iterable[ImageBuild] = (),
        *,
        client: docker.DockerClient | None = None,
        environ: Mapping[str, str] | None = None,
        log: Callable[[str], None] = lambda _line: None,
        base_stream: Callable[[BaseImage], Iterable[bytes]] | None = None,
        build_logs: Path | None = None,
        runner: Runner | None = None,
        smi: Smi = run_nvidia_smi,
        owner: Owner | None = None,
    ) -> None:
        self.run_id = run_id
        self.owner = owner or this_process()
        # Every container it makes names its owner, whoever built the settings.
        self.settings = {
            lane: replace(given, labels={**given.labels, **self.owner.labels()})
            for lane, given in settings.items()
        }
        self.runner = runner or Runner()  # its GPUs, to check them idle before a cell
        self.smi = smi
        self.builds = {b.key: b for b in builds}
        self.client = client if client is not None else connect()
        self.environ = dict(os.environ if environ is None else environ)
        self.log = log
        self.base_stream = base_stream or debootstrap_stream
        self.build_logs = build_logs  # each build's whole output goes to <key>.log here
        self.failed: dict[str, Prepared] = {}  # images that failed before their build (staging)
        self._closed = False
        self._stopped: set[str] = set()  # cells asked to stop: a container made later goes too
        self._bases: dict[str, str | None] = {}  # each base image's error (None: it is there)
        self._bases_lock = threading.Lock()  # image jobs run prepare() from several threads

    def prepare(self, images: Sequence[Image]) -> Mapping[str, Prepared]:
        """Make each image once: reuse an existing tag, else pull and build; failures recorded."""
        prepared: dict[str, Prepared] = {}
        for image in images:
            build = self.builds.get(image.key)
            if image.key in self.failed:
                prepared[image.key] = self.failed[image.key]
                continue
            if build is None:
                prepared[image.key] = Prepared(image.key, "", error="image was not rendered")
                continue
            base_error = self._base(build.base) if build.base is not None else None
            if base_error is not None:
                prepared[image.key] = Prepared(image.key, build.tag, error=base_error)
                continue
            prepared[image.key] = self._prepare_one(build)
        return prepared

    def _prepare_one(self, build: ImageBuild) -> Prepared:
        started = time.monotonic()
        try:
            digest = self._fetch(build.pull, build.pull_policy)
            tag = build.tag
            launcher: tuple[str, ...] = ()  # a CPU image runs the harness's module form
            if build.pull is not None:
                # Keyed by the base it is built on too: a moved tag (nightly, a re-pushed
                # rc) that was pulled again is built again, never served from the old build.
                tag = f"{build.tag}-{_short_id(self._image_id(build.pull))}"
                launcher = server_launcher(self._entrypoint(build.pull))
            if self._image_id(tag) is not None:
                found = digest or self._image_id(tag)
                found_prepared = Prepared(
                    build.key, tag, digest=found, built=False, launcher=launcher
                )
                return self._with_cuda(found_prepared)
            built = self._build(replace(build, tag=tag))
            elapsed = time.monotonic() - started
            made = Prepared(
                build.key,
                tag,
                digest=digest or built,
                build_s=elapsed,
                built=True,
                launcher=launcher,
            )
            made = self._with_cuda(made)
        except (_ImageFailed, *ENGINE_ERRORS) as exc:
            error = str(exc) if isinstance(exc, _ImageFailed) else one_line(exc)
            return Prepared(build.key, build.tag, error=error, build_s=time.monotonic() - started)
        return made

    def _with_cuda(self, prepared: Prepared) -> Prepared:
        """``prepared`` with what its image's configuration says of CUDA (a GPU image inherits
        ``CUDA_VERSION`` and ``NVIDIA_REQUIRE_CUDA`` from its CUDA base image)."""
        env = self.client.images.get(prepared.ref).attrs.get("Config", {}).get("Env") or []
        values = dict(str(item).partition("=")[::2] for item in env)
        return replace(
            prepared,
            cuda_version=values.get("CUDA_VERSION") or None,
            cuda_requirement=values.get("NVIDIA_REQUIRE_CUDA") or None,
        )

    def _entrypoint(self, ref: str) -> list[str] | None:
        """The entrypoint in the configuration of the local image ``ref``."""
        config = self.client.images.get(ref).attrs.get("Config") or {}
        entrypoint = config.get("Entrypoint")
        return [str(part) for part in entrypoint] if isinstance(entrypoint, list) else None

    def _repo_digest(self, ref: str) -> str | None:
        """The registry digest of a local copy of ``ref``, when there is one."""
        try:
            digests = self.client.images.get(ref).attrs.get("RepoDigests") or []
        except ImageNotFound:
            return None
        return str(digests[0]) if digests else None

    def _image_id(self, ref: str) -> str | None:
        try:
            return str(self.client.images.get(ref).id)
        except ImageNotFound:
            return None

    def _fetch(self, ref: str | None, policy: str) -> str | None:
        """Make ``ref`` present as ``policy`` says; return its registry digest (or image id)."""
        if ref is None:
            return None
        local = self._image_id(ref)
        if policy == "always" or (policy == "missing" and local is None):
            self._pull(ref)
        elif local is None:
            raise _ImageFailed(f"{ref} is not present and the pull policy is `never`")
        return self._repo_digest(ref) or self._image_id(ref)

    def _pull(self, ref: str) -> None:
        """Pull ``ref`` from its registry, saying how many bytes are in (a failure is the
        image's error)."""
        repository, tag = split_ref(ref)
        have: dict[str, int] = {}
        total: dict[str, int] = {}
        with heartbeat(self.log, f"pull of {ref}") as beat:
            try:
                for event in self.client.api.pull(repository, tag=tag, stream=True, decode=True):
                    if "error" in event:
                        raise _ImageFailed(f"pull of {ref} failed: {event['error']}")
                    detail = event.get("progressDetail") or {}
                    if event.get("status") == "Downloading" and detail.get("total"):
                        have[event["id"]] = int(detail.get("current", 0))
                        total[event["id"]] = int(detail["total"])
                        beat.progress(sum(have.values()), sum(total.values()))
            except DockerException as exc:
                raise _ImageFailed(f"pull of {ref} failed: {one_line(exc)}") from exc

    def _build(self, build: ImageBuild) -> str:
        """Build ``build.context`` with the legacy builder; steps go to ``log``, all to a file."""
        lines: list[str] = []
        stream = self.client.api.build(
            path=str(build.context), tag=build.tag, rm=True, forcerm=True, decode=True
        )
        # Its end is the image's ready line (``run.images.ready_line``): one figure per build.
        with (
            heartbeat(self.log, f"build of {build.tag}", says_end=False),
            self._kept(build.key, lines),
        ):
            for event in stream:
                text = str(event.get("stream") or event.get("status") or "").rstrip()
                if text:
                    lines.append(text)
                    if text.startswith("Step "):
                        self.log(f"[build {build.key}] {text}")
                if "error" in event:
                    tail = "\n".join(lines[-BUILD_TAIL:])
                    raise _ImageFailed(f"build of {build.tag} failed: {event['error']}\n{tail}")
        image_id = self._image_id(build.tag)
        if image_id is None:
            raise _ImageFailed(f"build of {build.tag} finished without an image")
        return image_id

    @contextmanager
    def _kept(self, key: str, lines: list[str]) -> Iterator[None]:
        """Keep a build's whole output in ``<build_logs>/<key>.log``, also when it fails."""
        try:
            yield
        finally:
            if self.build_logs is not None:
                log = self.build_logs / f"{key}.log"
                replace_file(log, ("\n".join(lines) + "\n").encode("utf-8"))

    def _base(self, base: BaseImage) -> str | None:
        """The base image made once per run (image jobs of one base wait for the first)."""
        with self._bases_lock:
            if base.ref not in self._bases:
                self._bases[base.ref] = self._ensure_base(base)
            return self._bases[base.ref]

    def _ensure_base(self, base: BaseImage) -> str | None:
        """Make the base image when missing: pull it, or import a debootstrap root file system."""
        try:
            if self._image_id(base.ref) is not None:
                return None
            if base.source == "image":
                self._pull(base.ref)
                return None
            repository, tag = split_ref(base.ref)
            with heartbeat(self.log, f"base image {base.ref} (debootstrap, about a minute)"):
                stream = self.base_stream(base)
                self.client.api.import_image_from_stream(stream, repository=repository, tag=tag)
            if self._image_id(base.ref) is None:
                return f"import of base image {base.ref} left no image"
        except _ImageFailed as exc:
            return str(exc)
        except RepromatrixError as exc:
            return f"base image {base.ref} could not be made: {exc}"
        except ENGINE_ERRORS as exc:
            return f"base image {base.ref} could not be made: {one_line(exc)}"
        return None

    def execute(
        self,
        cell: Cell,
        spec: Mapping[str, Any],
        prepared: Prepared,
        listener: OutputListener,
        placement: Placement | None = None,
    ) -> Execution:
        """Run ``cell``'s harness in a fresh container; engine failures become ``infra_error``."""
        return self.run_plan(
            self.call_for(cell, spec, prepared, placement), cell.deadline_s, listener
        )

    def call_for(
        self,
        cell: Cell,
        spec: Mapping[str, Any],
        prepared: Prepared,
        placement: Placement | None = None,
    ) -> ContainerCall:
        """The container ``execute`` creates: on the scheduler's GPUs when it placed the cell."""
        ids = placement.gpu_ids if placement is not None else None
        settings = self.settings[cell.lane]
        return container_call(cell, spec, prepared.ref, settings, self.run_id, device_ids=ids)

    def stop(self, cell_id: str) -> None:
        """Kill and remove this run's containers of ``cell_id`` (found by their labels)."""
        self._stopped.add(cell_id)  # before the listing: see ``_container``
        labels = [f"{RUN_LABEL}={self.run_id}", f"{CELL_LABEL}={cell_id}"]
        with suppress(*ENGINE_ERRORS):
            for container in _listed(self.client, label=labels):
                self._remove(container)

    def run_tool(
        self, image: str, argv: Sequence[str], mounts: Sequence[Mount], deadline_s: float = 900.0
    ) -> Execution:
        """Run a one-off program in ``image`` (the tiny model generator) as a labelled container."""
        program = Path(argv[1] if len(argv) > 2 and argv[1] != "-c" else argv[0]).name
        labels = self.owner.labels()
        plan = tool_plan(image, argv, mounts, self.run_id, name=f"tool:{program}", labels=labels)
        return self.run_plan(plan, deadline_s, lambda _chunk: False)

    def vllm_version(self, prepared: Prepared) -> str | None:
        """vLLM's version as installed in the image (package metadata; vLLM is not imported)."""
        done = self.run_tool(prepared.ref, VERSION_ARGV, (), deadline_s=120.0)
        text = done.log.decode(errors="replace").strip()
        return text.splitlines()[-1] if done.exit_code == 0 and text else None

    def environment_report(self, prepared: Prepared) -> EnvironmentReport:
        """vLLM's environment report in the image, with the GPUs its lane's cells may get."""
        build = self.builds.get(prepared.image_key)
        gpu = build is not None and build.pull is not None  # GPU images start from a pull
        settings = self.settings.get(Lane.GPU if gpu else Lane.CPU, ContainerSettings())
        plan = environment_call(prepared.ref, settings, self.run_id, gpu=gpu)
        done = self.run_plan(plan, ENVIRONMENT_DEADLINE_S, lambda _chunk: False)
        text = done.log.decode("utf-8", errors="replace")
        if done.exit_code == 0 and text.strip():
            return EnvironmentReport(text)
        last = text.strip().splitlines()[-1] if text.strip() else "no output"
        why = done.infra_error or f"exit code {done.exit_code}"
        return EnvironmentReport(None, f"{' '.join(ENVIRONMENT_ARGV)} failed ({why}): {last}")

    def alive(self) -> bool:
        """Whether the engine still answers."""
        try:
            return bool(self.client.ping())
        except ENGINE_ERRORS:
            return False

    def busy_reason(self, placement: Placement) -> str | None:
        """Why the listed GPUs of ``placement`` are not idle, as nvidia-smi sees them now, with
        each process's container where this engine runs it; None in a rehearsal (no device)."""
        if not self.settings.get(Lane.GPU, ContainerSettings()).devices:
            return None
        gpus = [gpu for i in placement.gpu_ids or () if (gpu := self.runner.gpu(i)) is not None]
        if not gpus:
            return None  # ids nvidia-smi did not list: nothing to ask it about
        use = idle.read_use(self.smi, slices=any(g.mig_profile for g in gpus))
        if use is None:
            return idle.unreadable(gpus)
        found = idle.busy(gpus, self.runner, use)
        if not found:
            return None
        pids = {p.pid for one in found for p in one.processes if p.pid is not None}
        return idle.describe(found, self.holders(pids))

    def holders(self, pids: Collection[int]) -> dict[int, str]:
        """The container of this engine that runs each of the host processes ``pids``, in words:
        ``container <name> (run <id>, cell <id>)`` (a process of none is left out)."""
        found: dict[int, str] = {}
        if not pids:
            return found
        with suppress(*ENGINE_ERRORS):
            for container in _listed(self.client, running_only=True):
                for pid in _pids_in(container.top()) & set(pids):
                    found[pid] = _container_words(container)
        return found

    def sweep_stale(self) -> int:
        """Remove the containers of this tool whose run is no longer alive (``owners.stale``),
        saying which; return how many were removed. A live run's are never touched."""
        try:
            ours = _listed(self.client, label=RUN_LABEL)
        except ENGINE_ERRORS:
            return 0  # the engine failing now fails the run's first cell, in its own words
        stale = [
            container
            for container in ours
            if _labels_of(container).get(RUN_LABEL) != self.run_id
            and owners.stale(_labels_of(container), self.owner, owners.process_started)
        ]
        for container in stale:
            self._remove(container)
        if stale:
            runs = sorted({str(_labels_of(c).get(RUN_LABEL)) for c in stale})
            self.log(
                f"removed {len(stale)} container(s) of runs no longer alive on this host "
                f"(run {', '.join(runs)}): {', '.join(sorted(_name_of(c) for c in stale))}"
            )
        return len(stale)

    def make_model(
        self,
        model: Model,
        prepared: Prepared,
        models_root: Path,
        lora_ranks: Sequence[int] = (tinymodel.LORA_RANK,),
    ) -> TinyModel:
        """Generate the tiny model (an adapter per rank) inside the image, once."""
        tiny = tinymodel.tiny_model_for(model, models_root)
        models_root.mkdir(parents=True, exist_ok=True)
        root = str(models_root)
        argv = tinymodel.generator_argv(
            model, str(tiny.path), script=GENERATOR_IN_IMAGE, lora_ranks=lora_ranks
        )
        done = self.run_tool(prepared.ref, argv, [Mount(root, root, read_only=False)])
        if not (done.exit_code == 0 and tiny.complete):
            tail = done.log.decode(errors="replace")[-wheelhouse.OUTPUT_TAIL :]
            why = done.infra_error or f"exit code {done.exit_code}"
            raise InfraError(f"generating the tiny model {model.name} failed ({why}):\n{tail}")
        return tiny

    def run_plan(
        self, plan: ContainerCall, deadline_s: float, listener: OutputListener
    ) -> Execution:
        """Create, start, stream, stop at the deadline or when the listener asks, inspect,
        remove."""
        # No secret goes into a container; one the host has is still redacted wherever the
        # output goes, should a program in the image print it (a token baked into an image).
        secrets = secrets_from(self.environ)
        started = time.monotonic()
        seen = _Streamed()
        try:
            with self._container(plan) as container:
                container.start()
                start_s = time.monotonic() - started
                # The listener keeps what it reads (a root-cause line goes into the result).
                seen = self._follow(container, started + deadline_s, listener, secrets)
                state = self._final_state(container)
                log = self._logs(container, secrets) if seen.stream_error else bytes(seen.log)
        except ENGINE_ERRORS as exc:
            stopped = plan.labels.get(CELL_LABEL) in self._stopped
            why = "stopped on request" if stopped else f"Docker engine failed: {one_line(exc)}"
            return Execution(
                exit_code=None,
                log=redact(bytes(seen.log), secrets),
                infra_error=why,
                total_s=time.monotonic() - started,
            )
        return Execution(
            exit_code=state.get("ExitCode"),
            log=redact(log, secrets),
            oom_killed=bool(state.get("OOMKilled")),
            timed_out=seen.timed_out,
            stopped_early=seen.stopped_early,
            start_s=start_s,
            total_s=time.monotonic() - started,
        )

    @contextmanager
    def _container(self, plan: ContainerCall) -> Iterator[Container]:
        container: Container | None = None
        try:
            container = self.client.containers.create(**docker_kwargs(plan))
            if self._closed:
                # An image job left running by an interrupt: close() has swept the run.
                raise InfraError("the run was closed before this container started")
            if plan.labels.get(CELL_LABEL) in self._stopped:
                # Made after ``stop`` listed this cell's containers: it must not run to its
                # deadline while the run waits for the cell's thread.
                raise InfraError("the cell was stopped before its container started")
            yield container
        finally:
            if container is not None:
                self._remove(container)

    def _follow(
        self,
        container: Container,
        deadline: float,
        listener: OutputListener,
        secrets: Mapping[str, str],
    ) -> _Streamed:
        """Stream the output to the listener and the kept log, both redacted on the joined
        stream; stop at the deadline or when the listener asks."""
        seen = _Streamed(log=BoundedLog(secrets=secrets))
        redacted = redacting_listener(listener, secrets)
        self._stream(container, deadline, redacted, seen)
        seen.log.finish()
        redacted.flush()  # the last bytes held back reach triage too
        return seen

    def _stream(
        self, container: Container, deadline: float, listener: OutputListener, seen: _Streamed
    ) -> None:
        chunks, reader = _pump(container)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                seen.timed_out = True
                break
            try:
                item = chunks.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
            if item is None:
                return
            if isinstance(item, BaseException):
                seen.stream_error = one_line(item)
                return
            seen.log.add(item)
            if listener(item):
                seen.stopped_early = True
                break
        _kill(container)
        reader.join(DRAIN_S)  # the stream ends with the container: keep its last bytes
        while not chunks.empty():
            item = chunks.get_nowait()
            if isinstance(item, bytes):
                seen.log.add(item)

    @staticmethod
    def _logs(container: Container, secrets: Mapping[str, str]) -> bytes:
        """The container's whole output read again (the live stream broke), kept bounded."""
        kept = BoundedLog(secrets=secrets)
        for chunk in container.logs(stream=True, follow=False):
            kept.add(chunk)
        kept.finish()
        return bytes(kept)

    @staticmethod
    def _final_state(container: Container) -> dict[str, Any]:
        container.wait(timeout=60)
        container.reload()
        state: dict[str, Any] = container.attrs.get("State", {})
        return state

    def _remove(self, container: Container) -> None:
        # When the engine is gone, sweep() removes it by label once the engine is back.
        with suppress(*ENGINE_ERRORS):
            container.remove(force=True)

    def sweep(self) -> int:
        """Remove every container labelled with this run; return how many were removed."""
        found = _listed(self.client, label=f"{RUN_LABEL}={self.run_id}")
        for container in found:
            self._remove(container)
        return len(found)

    def close(self) -> None:
        """Remove this run's containers and release the client; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        with suppress(*ENGINE_ERRORS):
            self.sweep()
        self.client.close()


def _pids_in(top: Mapping[str, Any]) -> set[int]:
    """The host pids ``docker top`` lists (its ``PID`` column)."""
    titles = list(top.get("Titles") or [])
    if "PID" not in titles:
        return set()
    column = titles.index("PID")
    rows = top.get("Processes") or []
    return {int(row[column]) for row in rows if len(row) > column and str(row[column]).isdigit()}


def _listed(
    client: docker.DockerClient, *, label: str | list[str] | None = None, running_only: bool = False
) -> list[Container]:
    """The engine's containers (with ``label``) as its list call gives them."""
    # sparse: docker-py would inspect each one listed, and one removed in between (a cell's,
    # as it ends) fails the whole listing with 404. Read its labels and name with the two below.
    filters: dict[str, str | list[str] | bool] = {} if label is None else {"label": label}
    found: list[Container] = client.containers.list(
        all=not running_only, filters=filters, sparse=True
    )
    return found


def _labels_of(listed: Container) -> dict[str, str]:
    """The labels of a container ``_listed`` gave."""
    labels: dict[str, str] = listed.attrs.get("Labels") or {}
    return labels


def _name_of(listed: Container) -> str:
    """The name of a container ``_listed`` gave."""
    names = listed.attrs.get("Names") or [listed.short_id]
    return str(names[0]).lstrip("/")


def _container_words(container: Container) -> str:
    labels = _labels_of(container)
    words = f"container {_name_of(container)}"
    if RUN_LABEL in labels:
        words += f" (run {labels[RUN_LABEL]}, cell {labels.get(CELL_LABEL, '?')})"
    return words


PUSHED_DIGEST = re.compile(r"digest: (sha256:[0-9a-f]{64})")


def build_text(client: docker.DockerClient, dockerfile: str, tag: str) -> None:
    """Build a context-free ``dockerfile`` as ``tag``; raise ``InfraError`` when it fails."""
    try:
        client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    except ENGINE_ERRORS as exc:
        raise InfraError(f"build of {tag} failed: {one_line(exc)}") from exc


def push(client: docker.DockerClient, ref: str) -> str:
    """Push the local image ``ref`` to its registry; return the digest the registry reports."""
    repository, tag = split_ref(ref)
    try:
        output = client.images.push(repository, tag=tag)
    except ENGINE_ERRORS as exc:
        raise InfraError(f"push of {ref} failed: {one_line(exc)}") from exc
    found = PUSHED_DIGEST.search(output)
    if found is None or '"error"' in output:
        raise InfraError(f"push of {ref} did not report a digest:\n{output[-1000:]}")
    return found.group(1)


def untag(client: docker.DockerClient, ref: str) -> None:
    """Remove the local tag ``ref`` (not its layers): only a pull can bring it back."""
    with suppress(ImageNotFound):
        client.images.remove(ref, noprune=True)
