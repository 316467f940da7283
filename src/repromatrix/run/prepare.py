"""Setting a run up on this host: which backend, which cells it can run, images and models.

The runner's stages call these. Nothing here runs a cell: this module decides
(docker or local; GPU cells skipped without enough GPUs), turns the matrix's
``Runtime`` into container settings and renders into image builds, stages the
wheelhouses, and makes each tiny model once, in the first image that can.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from repromatrix.backends.base import Backend, Prepared
from repromatrix.backends.docker_calls import VERSION_ARGV, ContainerSettings, ImageBuild, Mount
from repromatrix.backends.local import LocalBackend
from repromatrix.backends.oci_container import DockerBackend
from repromatrix.build import tinymodel
from repromatrix.build import wheelhouse as images
from repromatrix.build.render import CONTAINER_ROOT, ENTRYPOINT, RenderedImage
from repromatrix.errors import InfraError, RepromatrixError, UsageError
from repromatrix.matrix.config import Matrix
from repromatrix.model import Cell, Image, Lane, Level, Model
from repromatrix.run.cell import CellContext
from repromatrix.secret_env import SECRET_ENV

if TYPE_CHECKING:
    from repromatrix.run.stages import RunState

BACKENDS = ("auto", "docker", "local")
GENERATOR_IN_IMAGE = f"{CONTAINER_ROOT}/harness/{tinymodel.GENERATOR}"
MODEL_DEADLINE_S = 900.0


def host_gpu_count() -> int:
    """How many NVIDIA GPUs this host has (0 without ``nvidia-smi`` or a driver)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def choose_backend(requested: str, docker_answers: bool) -> str:
    """``docker`` or ``local``: ``auto`` takes docker when an engine answers."""
    if requested not in BACKENDS:
        raise UsageError(f"--backend must be one of {', '.join(BACKENDS)}, not {requested!r}")
    if requested == "auto":
        return "docker" if docker_answers else "local"
    return requested


def skip_reason(cell: Cell, backend: str, gpus: int) -> str | None:
    """Why this host and backend cannot run ``cell``, or None when they can."""
    if cell.lane is Lane.CPU:
        return None
    if backend == "local":
        return "GPU cell: the local backend runs the CPU lane only (GPU cells need Docker)"
    if gpus < cell.gpu.count:
        have = "no GPU" if gpus == 0 else f"{gpus} GPU(s)"
        return f"GPU cell needs {cell.gpu.count} GPU(s) ({cell.gpu.name}); this host has {have}"
    return None


def container_settings(matrix: Matrix, models_root: Path) -> dict[Lane, ContainerSettings]:
    """Container settings per lane from the matrix's runtimes.

    The tiny model cache is mounted read-only at its own host path, so a spec
    names the model by the same path whichever backend runs it.
    """
    settings: dict[Lane, ContainerSettings] = {}
    for lane, config in matrix.lanes.items():
        runtime = config.runtime
        root = str(models_root)
        settings[lane] = ContainerSettings(
            shm_size=runtime.shm_size,
            hf_cache=os.path.expanduser(runtime.hf_cache) if runtime.hf_cache else None,
            mounts=(Mount(root, root),) if lane is Lane.CPU else (),
            secret_env=SECRET_ENV,
            entrypoint=ENTRYPOINT,
        )
    return settings


def image_builds(rendered: Iterable[RenderedImage], matrix: Matrix) -> list[ImageBuild]:
    """One build per rendered image: GPU images pull their base first, CPU ones need theirs."""
    return [
        ImageBuild(
            key=render.key,
            tag=render.tag,
            context=render.context,
            pull=render.base if render.lane is Lane.GPU else None,
            base=matrix.lanes[render.lane].runtime.base if render.lane is Lane.CPU else None,
        )
        for render in rendered
    ]


def runnable_images(state: RunState) -> list[Image]:
    """The distinct images of the cells this host and backend can run, in plan order."""
    seen: dict[str, Image] = {}
    for cell in state.todo:
        if skip_reason(cell, state.backend_name, state.gpus) is None:
            seen.setdefault(cell.image.key, cell.image)
    return list(seen.values())


def stage_wheelhouses(
    rendered: Iterable[RenderedImage], cache: Path, note: Callable[[str], None]
) -> dict[str, str]:
    """Link each CPU context's wheelhouses in (downloading them once); return errors by key."""
    errors: dict[str, str] = {}
    for render in rendered:
        if not render.wheelhouses:
            continue
        note(f"wheelhouse for {render.key} (downloaded once into {cache / 'wheelhouse'})")
        try:
            images.stage_wheelhouses(render.wheelhouses, render.context, cache / "wheelhouse")
        except (InfraError, OSError) as exc:
            errors[render.key] = f"wheelhouse for {render.key}: {exc}"
    return errors


def open_and_prepare(state: RunState) -> tuple[Backend, dict[str, Prepared]]:
    """Open the chosen backend and prepare every runnable image; failures stay per image."""
    wanted = runnable_images(state)
    if state.backend_name == "local":
        local = LocalBackend(state.options.cache / "venvs")
        return local, dict(local.prepare(wanted))
    assert state.matrix is not None
    keys = {image.key for image in wanted}
    rendered = [r for r in state.rendered if r.key in keys]
    errors = stage_wheelhouses(rendered, state.options.cache, state.progress.note)
    backend = DockerBackend(
        state.run_id,
        container_settings(state.matrix, state.models_root),
        image_builds(rendered, state.matrix),
        log=state.progress.note,
        build_logs=state.run_dir / "images",
    )
    prepared = dict(backend.prepare([image for image in wanted if image.key not in errors]))
    prepared.update({key: Prepared(key, "", error=error) for key, error in errors.items()})
    return backend, prepared


def make_models(state: RunState) -> dict[str, tinymodel.TinyModel | str]:
    """Each CPU model the engine cells need, generated once: the model, or why it failed."""
    models: dict[str, Model] = {}
    first_image: dict[str, Prepared] = {}
    for cell in state.todo:
        prepared = state.prepared.get(cell.image.key)
        if cell.lane is Lane.CPU and cell.level is Level.ENGINE and prepared is not None:
            models.setdefault(cell.model.name, cell.model)
            if prepared.error is None:
                first_image.setdefault(cell.model.name, prepared)
    made: dict[str, tinymodel.TinyModel | str] = {}
    for name, model in models.items():
        try:
            made[name] = _make_model(state, model, first_image.get(name))
        except RepromatrixError as exc:
            made[name] = str(exc)
    return made


def _make_model(state: RunState, model: Model, prepared: Prepared | None) -> tinymodel.TinyModel:
    tiny = tinymodel.tiny_model_for(model, state.models_root)
    if tiny.complete and tiny.has_adapter():
        return tiny
    if prepared is None:
        raise InfraError(f"tiny model {model.name}: no working image to generate it in")
    state.progress.note(f"generating the tiny model {model.name} (once, cached in {tiny.path})")
    if isinstance(state.backend, LocalBackend):
        python = state.backend.python_of(prepared)
        return tinymodel.ensure_tiny_model(model, python, state.models_root)
    assert isinstance(state.backend, DockerBackend)
    state.models_root.mkdir(parents=True, exist_ok=True)
    root = str(state.models_root)
    argv = tinymodel.generator_argv(model, str(tiny.path), script=GENERATOR_IN_IMAGE)
    done = state.backend.run_tool(prepared.ref, argv, [Mount(root, root, read_only=False)])
    if not (done.exit_code == 0 and tiny.complete):
        tail = done.log.decode(errors="replace")[-2000:]
        why = done.infra_error or f"exit code {done.exit_code}"
        raise InfraError(f"generating the tiny model {model.name} failed ({why}):\n{tail}")
    return tiny


def image_versions(state: RunState) -> dict[str, str | None]:
    """vLLM's version in each prepared image, read inside it once (a cell cut short by an
    early stop never prints the harness's status, which otherwise carries it)."""
    versions: dict[str, str | None] = {}
    for key, prepared in state.prepared.items():
        if prepared.error is None:
            versions[key] = _version_of(state.backend, prepared)
    return versions


def _version_of(backend: Backend | None, prepared: Prepared) -> str | None:
    if isinstance(backend, DockerBackend):
        return backend.vllm_version(prepared.ref)
    if isinstance(backend, LocalBackend):
        python = backend.python_of(prepared)
        argv = [python, *VERSION_ARGV[1:]]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        lines = done.stdout.strip().splitlines()
        return lines[-1] if done.returncode == 0 and lines else None
    return None


def cell_contexts(state: RunState) -> dict[str, CellContext]:
    """Every remaining cell's prepared image, model path and (for cells it cannot run) skip."""
    made = make_models(state)
    versions = image_versions(state)
    contexts: dict[str, CellContext] = {}
    for cell in state.todo:
        prepared = state.prepared.get(cell.image.key)
        version = versions.get(cell.image.key)
        context = CellContext(prepared, model_path=cell.model.source, image_version=version)
        model = made.get(cell.model.name) if cell.level is Level.ENGINE else None
        if isinstance(model, str) and prepared is not None and prepared.error is None:
            context = CellContext(Prepared(prepared.image_key, prepared.ref, error=model), "")
        elif isinstance(model, tinymodel.TinyModel):
            adapter = model.adapter_path() if cell.scenario.launch.lora_adapter else None
            path = str(adapter) if adapter else None
            context = CellContext(prepared, str(model.path), path, image_version=version)
        reason = skip_reason(cell, state.backend_name, state.gpus)
        contexts[cell.id] = context if reason is None else CellContext(None, "", None, reason)
    return contexts


def model_path(cell: Cell, models_root: Path) -> str:
    """Where ``cell``'s model is, as the harness sees it (for dry runs: nothing is generated)."""
    if cell.lane is Lane.GPU:
        return cell.model.source
    return str(tinymodel.tiny_model_for(cell.model, models_root).path)
