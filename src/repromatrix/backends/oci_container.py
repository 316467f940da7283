"""The Docker adapter: the only module that talks to a container engine (via the docker SDK).

``DockerBackend`` executes the plans of ``container_plan``: it builds or pulls
images, then runs each cell in a labelled container under the cell's own
deadline, streaming its output to the watcher, stopping early when the watcher
says so, and always removing what it started.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, DockerException, ImageNotFound
from docker.models.containers import Container
from docker.types import DeviceRequest
from requests.exceptions import RequestException

from repromatrix.backends.base import Execution, Prepared, Watcher
from repromatrix.backends.docker_calls import (
    RUN_LABEL,
    VERSION_ARGV,
    ContainerCall,
    ContainerSettings,
    ImageBuild,
    Mount,
    container_call,
    split_ref,
    tool_plan,
)
from repromatrix.build import wheelhouse as images
from repromatrix.errors import InfraError, RepromatrixError
from repromatrix.matrix.lanes import BaseImage
from repromatrix.model import Cell, Image, Lane
from repromatrix.secret_env import redact, redacting_watcher

# Errors that mean "the engine or the host failed", never "vLLM failed".
ENGINE_ERRORS = (DockerException, RequestException, OSError)
# After a kill, how long the log stream may take to deliver its last bytes.
DRAIN_S = 5.0
CONFLICT = 409
BUILD_TAIL = 20  # lines of build output kept in a failed image's error


class _ImageFailed(Exception):
    """A pull, build or import that failed; its message becomes ``Prepared.error``."""


def connect(timeout_s: float = 10.0) -> docker.DockerClient:
    """Return a client for the local engine, or raise ``InfraError`` when none answers."""
    try:
        client = docker.from_env(timeout=int(timeout_s))
        client.ping()
    except ENGINE_ERRORS as exc:
        raise InfraError(f"no Docker engine answers ({_one_line(exc)})") from exc
    return client


def engine_available() -> bool:
    """Whether a Docker engine answers on this host."""
    try:
        connect(timeout_s=3.0).close()
    except InfraError:
        return False
    return True


def docker_kwargs(plan: ContainerCall, environ: Mapping[str, str]) -> dict[str, Any]:
    """The plan's create arguments with docker SDK types where the SDK wants them."""
    kwargs = plan.create_kwargs(environ)
    if "device_requests" in kwargs:
        kwargs["device_requests"] = [DeviceRequest(**r) for r in kwargs["device_requests"]]
    return kwargs


def debootstrap_stream(base: BaseImage) -> Iterable[bytes]:
    """The base root file system as a tar stream, made with debootstrap (cached on the host)."""
    rootfs = images.make_base_rootfs(base, images.BASE_ROOT)
    return images.rootfs_tar_stream(rootfs)


def _redacting(watch: Watcher, secrets: Mapping[str, str]) -> Watcher:
    """``watch``, given the joined stream with the secret values replaced."""
    return redacting_watcher(watch, secrets)


def _kill(container: Container) -> None:
    """SIGKILL the container; one that has just exited on its own is fine too."""
    try:
        container.kill()
    except APIError as exc:
        if exc.status_code != CONFLICT:  # 409: the container is not running any more
            raise


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
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
class _Watch:
    """What happened while a cell's output streamed."""

    log: bytearray = field(default_factory=bytearray)
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
    ) -> None:
        self.run_id = run_id
        self.settings = dict(settings)
        self.builds = {b.key: b for b in builds}
        self.client = client if client is not None else connect()
        self.environ = dict(os.environ if environ is None else environ)
        self.log = log
        self.base_stream = base_stream or debootstrap_stream
        self.build_logs = build_logs  # each build's whole output goes to <key>.log here
        self._closed = False

    def prepare(self, images: Sequence[Image]) -> Mapping[str, Prepared]:
        """Make each image once: reuse an existing tag, else pull and build; failures recorded."""
        prepared: dict[str, Prepared] = {}
        bases: dict[str, str | None] = {}
        for image in images:
            build = self.builds.get(image.key)
            if build is None:
                prepared[image.key] = Prepared(image.key, "", error="image was not rendered")
                continue
            if build.base is not None and build.base.ref not in bases:
                bases[build.base.ref] = self._ensure_base(build.base)
            base_error = bases.get(build.base.ref) if build.base is not None else None
            if base_error is not None:
                prepared[image.key] = Prepared(image.key, build.tag, error=base_error)
                continue
            prepared[image.key] = self._prepare_one(build)
        return prepared

    def _prepare_one(self, build: ImageBuild) -> Prepared:
        started = time.monotonic()
        try:
            existing = self._image_id(build.tag)
            if existing is not None:
                digest = self._repo_digest(build.pull) if build.pull else None
                return Prepared(build.key, build.tag, digest=digest or existing, built=False)
            pulled = self._pull(build.pull) if build.pull else None
            built = self._build(build)
        except (_ImageFailed, *ENGINE_ERRORS) as exc:
            error = str(exc) if isinstance(exc, _ImageFailed) else _one_line(exc)
            return Prepared(build.key, build.tag, error=error, build_s=time.monotonic() - started)
        elapsed = time.monotonic() - started
        self.log(f"built {build.tag} in {elapsed:.0f} s")
        return Prepared(build.key, build.tag, digest=pulled or built, build_s=elapsed, built=True)

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

    def _pull(self, ref: str) -> str:
        """Pull ``ref`` unless a local copy exists; return its registry digest (or image id)."""
        try:
            image = self.client.images.get(ref)
        except ImageNotFound:
            repository, tag = split_ref(ref)
            try:
                image = self.client.images.pull(repository, tag=tag)
            except DockerException as exc:
                raise _ImageFailed(f"pull of {ref} failed: {_one_line(exc)}") from exc
        digests = image.attrs.get("RepoDigests") or []
        return str(digests[0]) if digests else str(image.id)

    def _build(self, build: ImageBuild) -> str:
        """Build ``build.context`` with the legacy builder; steps go to ``log``, all to a file."""
        lines: list[str] = []
        stream = self.client.api.build(
            path=str(build.context), tag=build.tag, rm=True, forcerm=True, decode=True
        )
        try:
            for event in stream:
                text = str(event.get("stream") or event.get("status") or "").rstrip()
                if text:
                    lines.append(text)
                    if text.startswith("Step "):
                        self.log(f"[build {build.key}] {text}")
                if "error" in event:
                    tail = "\n".join(lines[-BUILD_TAIL:])
                    raise _ImageFailed(f"build of {build.tag} failed: {event['error']}\n{tail}")
        finally:
            self._keep_build_log(build.key, lines)
        image_id = self._image_id(build.tag)
        if image_id is None:
            raise _ImageFailed(f"build of {build.tag} finished without an image")
        return image_id

    def _keep_build_log(self, key: str, lines: list[str]) -> None:
        if self.build_logs is not None:
            self.build_logs.mkdir(parents=True, exist_ok=True)
            (self.build_logs / f"{key}.log").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def _ensure_base(self, base: BaseImage) -> str | None:
        """Make the base image when missing: pull it, or import a debootstrap root file system."""
        try:
            if self._image_id(base.ref) is not None:
                return None
            if base.source == "image":
                self._pull(base.ref)
                return None
            self.log(f"[base] making {base.ref} with debootstrap (about a minute)")
            repository, tag = split_ref(base.ref)
            stream = self.base_stream(base)
            self.client.api.import_image_from_stream(stream, repository=repository, tag=tag)
            if self._image_id(base.ref) is None:
                return f"import of base image {base.ref} left no image"
        except _ImageFailed as exc:
            return str(exc)
        except RepromatrixError as exc:
            return f"base image {base.ref} could not be made: {exc}"
        except ENGINE_ERRORS as exc:
            return f"base image {base.ref} could not be made: {_one_line(exc)}"
        return None

    def execute(
        self, cell: Cell, spec: Mapping[str, Any], prepared: Prepared, watch: Watcher
    ) -> Execution:
        """Run ``cell``'s harness in a fresh container; engine failures become ``infra_error``."""
        plan = container_call(cell, spec, prepared.ref, self.settings[cell.lane], self.run_id)
        return self.run_plan(plan, cell.deadline_s, watch)

    def run_tool(
        self, image: str, argv: Sequence[str], mounts: Sequence[Mount], deadline_s: float = 900.0
    ) -> Execution:
        """Run a one-off program in ``image`` (the tiny model generator) as a labelled container."""
        program = Path(argv[1] if len(argv) > 2 and argv[1] != "-c" else argv[0]).name
        plan = tool_plan(image, argv, mounts, self.run_id, name=f"tool:{program}")
        return self.run_plan(plan, deadline_s, lambda _chunk: False)

    def vllm_version(self, image: str) -> str | None:
        """vLLM's version as installed in ``image`` (package metadata; vLLM is not imported)."""
        done = self.run_tool(image, VERSION_ARGV, (), deadline_s=120.0)
        text = done.log.decode(errors="replace").strip()
        return text.splitlines()[-1] if done.exit_code == 0 and text else None

    def run_plan(self, plan: ContainerCall, deadline_s: float, watch: Watcher) -> Execution:
        """Create, start, stream, stop at the deadline or when ``watch`` asks, inspect, remove."""
        secrets = plan.secrets(self.environ)
        started = time.monotonic()
        seen = _Watch()
        try:
            with self._container(plan) as container:
                container.start()
                start_s = time.monotonic() - started
                # The watcher keeps what it reads (a root-cause line goes into the result).
                seen = self._follow(container, started + deadline_s, _redacting(watch, secrets))
                state = self._final_state(container)
                log = bytes(seen.log) if seen.stream_error is None else container.logs()
        except ENGINE_ERRORS as exc:
            return Execution(
                exit_code=None,
                log=redact(bytes(seen.log), secrets),
                infra_error=f"Docker engine failed: {_one_line(exc)}",
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
            container = self.client.containers.create(**docker_kwargs(plan, self.environ))
            yield container
        finally:
            if container is not None:
                self._remove(container)

    def _follow(self, container: Container, deadline: float, watch: Watcher) -> _Watch:
        seen = _Watch()
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
                return seen
            if isinstance(item, BaseException):
                seen.stream_error = _one_line(item)
                return seen
            seen.log += item
            if watch(item):
                seen.stopped_early = True
                break
        _kill(container)
        reader.join(DRAIN_S)  # the stream ends with the container: keep its last bytes
        while not chunks.empty():
            item = chunks.get_nowait()
            seen.log += item if isinstance(item, bytes) else b""
        return seen

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
        found = self.client.containers.list(
            all=True, filters={"label": f"{RUN_LABEL}={self.run_id}"}
        )
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
