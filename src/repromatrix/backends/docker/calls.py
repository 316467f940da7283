"""What the Docker adapter will do, as plain values: the build, pull and create calls per cell.

Pure: ``container_call`` turns a cell, its harness spec and the lane's settings
into the exact ``containers.create`` arguments (``ContainerCall``), and
``ImageBuild`` says how each image is made. A dry run prints these; a real run
hands them to ``engine`` unchanged, so the two never drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from repromatrix.backends.harness_spec import (
    ENVIRONMENT_ARGV,
    MODELS_TARGET,
    container_adapter_path,
    in_model_folder,
)
from repromatrix.errors import InfraError
from repromatrix.harness.harness import OFFLINE_ENV
from repromatrix.host.runner import pending_devices, select_devices
from repromatrix.images.render import ENTRYPOINT
from repromatrix.matrix.lanes import BaseImage
from repromatrix.values import Cell, Lane, PullPolicy

RUN_LABEL = "repromatrix.run"
CELL_LABEL = "repromatrix.cell"
HF_CACHE_TARGET = "/root/.cache/huggingface"


@dataclass(frozen=True)
class ImageBuild:
    """How one matrix image is made: an optional pull or base, then a build of its render."""

    key: str
    tag: str  # the content-hash tag of the render (GPU images add the pulled base's id)
    context: Path  # the rendered folder with its Dockerfile
    pull: str | None = None  # GPU lane: the vllm/vllm-openai image the render starts FROM
    base: BaseImage | None = None  # CPU lane: the base image the render starts FROM
    # GPU lane: when ``pull`` is pulled (``matrix.images.effective_pull``): always, missing
    # (no local image has the reference) or never.
    pull_policy: PullPolicy = PullPolicy.MISSING

    def describe(self) -> dict[str, Any]:
        """The engine calls that make this image, for a dry run."""
        calls: list[dict[str, Any]] = []
        if self.base is not None:
            how = "pull" if self.base.source == "image" else "import (debootstrap rootfs)"
            calls.append({"call": "base", "ref": self.base.ref, "how": how, "if": "missing"})
        if self.pull is not None:
            when = {PullPolicy.ALWAYS: "always", PullPolicy.MISSING: "ref missing"}
            call = {"call": "images.pull", "ref": self.pull, "records": "RepoDigests"}
            if self.pull_policy is PullPolicy.NEVER:
                call = {"call": "images.get", "ref": self.pull, "records": "RepoDigests"}
            else:
                call["if"] = when[self.pull_policy]
            calls.append(call)
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
    # Set on every container too: GPU base images ship entrypoints of their own.
    entrypoint: tuple[str, ...] = ENTRYPOINT
    # The GPU ids this runner may use (``Runner.gpu_ids``); None: not known here (a dry
    # run on a machine without the runner's GPUs), so device ids are chosen at run time.
    gpu_ids: tuple[str, ...] | None = None
    # False in a rehearsal: GPU cells get no device request and vLLM runs on its CPU.
    devices: bool = True
    # Labels every container carries beside its run and cell: the process that made it
    # (``owners.Owner``), so a later run can tell a container of a dead run from a live one's.
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ContainerCall:
    """Exactly what ``containers.create`` receives for one cell.

    No secret is ever part of it: a cell is offline, so ``HF_TOKEN`` could only leak
    (``docker inspect`` shows a container's environment in clear); ``prepare`` alone,
    on the host, is given the token.
    """

    image: str
    entrypoint: tuple[str, ...]
    command: tuple[str, ...]
    labels: Mapping[str, str]
    mounts: tuple[Mount, ...]
    shm_size: str | None = None
    ipc_mode: str | None = None
    gpus_needed: int = 0  # the cell's GPU count
    device_ids: tuple[str, ...] = ()  # exactly which GPUs: never "the first N"
    mem_limit: str | None = None
    network_mode: str = "none"  # the harness talks to vLLM on the container's own loopback
    environment: Mapping[str, str] = field(default_factory=dict)
    user: str | None = None  # None: the image's own (non-root) user

    def create_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``client.containers.create``."""
        kwargs: dict[str, Any] = {
            "image": self.image,
            "entrypoint": list(self.entrypoint),
            "command": list(self.command),
            "labels": dict(self.labels),
            "environment": dict(self.environment),
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
        if self.gpus_needed:
            if len(self.device_ids) != self.gpus_needed:
                raise InfraError(
                    f"{self.labels.get(CELL_LABEL)}: needs {self.gpus_needed} GPU(s) but was "
                    f"given device ids {list(self.device_ids)}"
                )
            kwargs["device_requests"] = [self.device_request(self.device_ids)]
        return kwargs

    def device_request(self, ids: Sequence[str] | str) -> dict[str, Any]:
        """docker-py's DeviceRequest keywords: exactly these GPUs, any driver."""
        return {"device_ids": ids if isinstance(ids, str) else list(ids), "capabilities": [["gpu"]]}

    def describe(self) -> dict[str, Any]:
        """The create call as JSON-ready data.

        Device ids not chosen yet (the runner's GPUs unknown here) show as what will be.
        """
        pending = self.gpus_needed and not self.device_ids
        call = replace(self, gpus_needed=0) if pending else self
        described = call.create_kwargs()
        if pending:
            described["device_requests"] = [self.device_request(pending_devices(self.gpus_needed))]
        return described


def container_call(
    cell: Cell,
    spec: Mapping[str, Any],
    image: str,
    settings: ContainerSettings,
    run_id: str,
    *,
    device_ids: Sequence[str] | None = None,
) -> ContainerCall:
    """Return the container that runs ``cell``'s harness with ``spec`` in ``image``.

    A GPU cell gets ``device_ids`` (the scheduler's pick, from ``runner.select_devices``),
    else the first free ones of ``settings.gpu_ids``; with neither they stay to be chosen.
    """
    mounts = [*settings.mounts, *model_mounts(cell)]
    environment = dict(OFFLINE_ENV)
    if cell.lane is Lane.GPU and settings.hf_cache:
        mounts.append(Mount(settings.hf_cache, HF_CACHE_TARGET))
        environment["HF_HOME"] = HF_CACHE_TARGET
    gpu = cell.lane is Lane.GPU
    # A scenario's own /dev/shm gives GPU cells a private one too, in place of the host's.
    private_shm = not gpu or cell.container.shm_size is not None
    needed = cell.gpu.count if gpu and settings.devices else 0
    ids = _device_ids(needed, device_ids, settings.gpu_ids)
    if ids:
        # The NVIDIA runtime reads this too; inside the container CUDA numbers them from 0.
        environment["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
    return ContainerCall(
        image=image,
        entrypoint=settings.entrypoint,
        command=("--spec-json", json.dumps(spec, sort_keys=True)),
        labels={**settings.labels, RUN_LABEL: run_id, CELL_LABEL: cell.id},
        mounts=tuple(mounts),
        # GPU images share memory between workers through the host IPC namespace, as
        # vLLM's docs run them; CPU cells get a private, larger /dev/shm.
        shm_size=(cell.container.shm_size or settings.shm_size) if private_shm else None,
        ipc_mode=None if private_shm else "host",
        gpus_needed=needed,
        device_ids=ids,
        mem_limit=cell.container.memory or settings.mem_limit,
        environment=environment,
    )


def model_mounts(cell: Cell) -> tuple[Mount, ...]:
    """A GPU cell's local model folder and adapter folder, read-only (repo ids need none)."""
    if cell.lane is not Lane.GPU:
        return ()
    mounts = []
    if cell.model.path is not None:
        mounts.append(Mount(cell.model.path, f"{MODELS_TARGET}/{cell.model.name}"))
    adapter = cell.adapter
    if adapter is not None and adapter.path is not None and not in_model_folder(cell):
        mounts.append(Mount(adapter.path, str(container_adapter_path(cell))))
    return tuple(mounts)


def _device_ids(
    needed: int, given: Sequence[str] | None, usable: tuple[str, ...] | None
) -> tuple[str, ...]:
    if not needed:
        return ()
    if given is not None:
        return tuple(given)
    return select_devices(needed, usable) if usable is not None else ()


def tool_plan(
    image: str,
    argv: Sequence[str],
    mounts: Sequence[Mount],
    run_id: str,
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
) -> ContainerCall:
    """A one-off container running ``argv`` in ``image`` as root (it writes to a host folder);
    ``labels`` as ``ContainerSettings.labels``."""
    return ContainerCall(
        image=image,
        entrypoint=tuple(argv),
        command=(),
        labels={**(labels or {}), RUN_LABEL: run_id, CELL_LABEL: name},
        mounts=tuple(mounts),
        environment=dict(OFFLINE_ENV),
        user="0",
    )


def environment_call(
    image: str, settings: ContainerSettings, run_id: str, *, gpu: bool
) -> ContainerCall:
    """The container that runs vLLM's environment report in ``image``: offline like a cell,
    as the image's own user, with every GPU this runner lends the lane's cells (so the
    report names them; none in a rehearsal, on the CPU lane, or where they are not known)."""
    ids = tuple(settings.gpu_ids or ()) if gpu and settings.devices else ()
    environment = dict(OFFLINE_ENV)
    if ids:
        environment["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
    return ContainerCall(
        image=image,
        entrypoint=ENVIRONMENT_ARGV,
        command=(),
        labels={RUN_LABEL: run_id, CELL_LABEL: "tool:collect_env"},
        mounts=(),
        gpus_needed=len(ids),
        device_ids=ids,
        environment=environment,
    )


def split_ref(ref: str) -> tuple[str, str]:
    """``registry:5000/name:tag`` → (``registry:5000/name``, ``tag``); no tag means latest.
    A reference pinned by digest (``name[:tag]@sha256:...``) gives the digest in the tag's
    place: the engine's pull reads a digest there as the digest to pull."""
    named, at, digest = ref.partition("@")
    if at:
        return split_ref(named)[0], digest
    repository, colon, tag = ref.rpartition(":")
    if not colon or "/" in tag:
        return ref, "latest"
    return repository, tag
