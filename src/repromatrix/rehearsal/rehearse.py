"""``repromatrix rehearse``: the GPU lane's whole path, for real, on a host without GPUs.

1. The CPU lane's images and tiny model for the chosen vLLM versions are made
   (or found) as a normal ``run --prepare-only`` would.
2. A local registry starts; a ``vllm/vllm-openai:v<version>`` look-alike of
   each version is pushed to it, and its local tag removed, so the run must
   pull it. The tiny model and its adapter are laid out as Hugging Face cache
   repositories.
3. A normal ``run --lane gpu --rehearse`` of a generated matrix (that registry,
   that cache, the shipped scenarios) writes a normal run folder.
4. The first version's tag is moved (a new image pushed under it) and its cells
   run again with ``--pull always``: the new digest must be what they record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import docker
import yaml

from repromatrix.errors import InfraError
from repromatrix.images.wheelhouse import CACHE_ROOT
from repromatrix.matrix.config import load_matrix
from repromatrix.models.tinymodel import LORA_RANK, tiny_model_for
from repromatrix.rehearsal import hfcache
from repromatrix.rehearsal.lookalike import publish
from repromatrix.rehearsal.registry import LocalRegistry, local_registry
from repromatrix.run.main import Mode, RunOptions, RunSummary, execute_run
from repromatrix.run.progress import Progress
from repromatrix.values import Lane

REPOSITORY = "vllm/vllm-openai"
# The rehearsal's own scenarios, added to the catalogue for its GPU-lane runs.
SCENARIOS = Path(str(resources.files("repromatrix.rehearsal") / "scenarios"))
MODEL_REPO = "repromatrix/tiny-llama"
ADAPTER_REPO = f"repromatrix/tiny-llama-lora-r{LORA_RANK}"
CPU_MODEL = "tiny-llama"
KV_SCENARIO = "kv-cache-memory-too-small"  # in SCENARIOS: the rehearsal's GPU-lane hit


@dataclass(frozen=True)
class RehearsalOptions:
    """What to rehearse and where results go."""

    versions: tuple[str, ...] = ("0.32.0",)
    matrix: Path = Path("matrix.yaml")  # its CPU lane makes the images the look-alikes start from
    scenarios: Path = Path("scenarios")
    results: Path = Path("results")
    run_id: str | None = None
    port: int = 5000
    move_tag: bool = True
    cache: Path = CACHE_ROOT


@dataclass(frozen=True)
class Rehearsal:
    """What the rehearsal did: its runs and the digests pushed before and after the move."""

    runs: tuple[RunSummary, ...]
    pushed: Mapping[str, str]  # image ref -> digest pushed first
    moved: Mapping[str, str] = field(default_factory=dict)  # image ref -> digest after the move


def rehearse(options: RehearsalOptions, progress: Progress) -> Rehearsal:
    """Prepare, push, run, move a tag and run again; every run a normal run folder."""
    bases = cpu_images(options, progress)
    root = (options.cache / "rehearsal").resolve()
    client = docker.from_env()
    try:
        with local_registry(root / "registry", options.port) as registry:
            refs = {v: f"{registry.host}/{REPOSITORY}:v{v}" for v in options.versions}
            pushed = {
                ref: publish(client, bases[v], ref, "1", progress.note) for v, ref in refs.items()
            }
            matrix = write_matrix(root, registry, options, hf_cache(root, options))
            first = execute_run(_run_options(options, matrix), _progress_like(progress))
            runs, moved = [first], {}
            if options.move_tag:
                ref = refs[options.versions[0]]
                moved[ref] = publish(client, bases[options.versions[0]], ref, "2", progress.note)
                again = _run_options(options, matrix, first.folder.run_id, options.versions[0])
                runs.append(execute_run(again, _progress_like(progress)))
    finally:
        client.close()
    return Rehearsal(tuple(runs), pushed, moved)


def _progress_like(progress: Progress) -> Progress:
    """A fresh count of cells for the next run, printed where ``progress`` prints."""
    return Progress(0, out=progress.out)


def cpu_images(options: RehearsalOptions, progress: Progress) -> dict[str, str]:
    """The CPU lane's image of each version (built, or found built) and its tiny model."""
    only = tuple(f"cpu/{v}/cpu/{CPU_MODEL}/*" for v in options.versions)
    summary = execute_run(
        RunOptions(
            matrix=options.matrix,
            scenarios=options.scenarios,
            lane=Lane.CPU,
            only=only,
            backend="docker",
            mode=Mode.PREPARE_ONLY,
            cache=options.cache,
        ),
        progress,
    )
    images: dict[str, str] = {}
    for cell in summary.todo:
        ready = summary.images.get(cell.image.key)
        if ready is None or ready.error:
            why = ready.error if ready else "not prepared"
            raise InfraError(f"the CPU image of {cell.image.tag} is not available: {why}")
        images[cell.image.tag] = ready.prepared.ref
    return images


def hf_cache(root: Path, options: RehearsalOptions) -> Path:
    """The tiny model and its adapter as Hugging Face cache repositories; the cache's folder."""
    matrix = load_matrix(options.matrix)
    model = next(m for m in matrix.lanes[Lane.CPU].models if m.name == CPU_MODEL)
    tiny = tiny_model_for(model, options.cache.resolve() / "models")
    if not (tiny.complete and tiny.has_adapter()):
        raise InfraError(f"the tiny model {tiny.path} was not made")
    home = root / "huggingface"
    hfcache.lay_out(home, MODEL_REPO, tiny.path, skip=("adapters",))
    hfcache.lay_out(home, ADAPTER_REPO, tiny.adapter_path())
    return home


def write_matrix(
    root: Path, registry: LocalRegistry, options: RehearsalOptions, hf_home: Path
) -> Path:
    """A matrix of one GPU lane: the local registry's look-alikes, the tiny model from the cache."""
    cpu = load_matrix(options.matrix).lanes[Lane.CPU]
    model = next(m for m in cpu.models if m.name == CPU_MODEL)
    shape = {key: getattr(model, key) for key in ("hidden_size", "intermediate_size",
             "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "max_position_embeddings")}  # fmt: skip
    lane: dict[str, Any] = {
        "registry": f"{registry.host}/{REPOSITORY}",
        "runtime": {"deadline_s": 900, "shm_size": "2g", "hf_cache": str(hf_home)},
        "images": [f"v{v}" for v in options.versions],
        "gpus": {"rehearsal": {"runner": "self-hosted", "count": 1,
                               "compute_capability": "9.0", "memory_gib": 80}},
        "models": {CPU_MODEL: {"source": MODEL_REPO, "dtype": model.dtype, **shape}},
        # A fixed KV budget: vLLM on the CPU otherwise wants 90% of the host's memory free.
        "flagsets": {"default": {"kv_cache_memory_bytes": 67108864,
                                 "max_model_len": model.max_position_embeddings}},
    }  # fmt: skip
    # The KV-cache scenario tests a 256 KiB budget, not the flag set's 64 MiB: an include's
    # flags win over the flag set's (a variant's win over both).
    include = [{"scenario": KV_SCENARIO, "flags": {"kv_cache_memory_bytes": 262144}}]
    path = root / "matrix.yaml"
    header = "# Generated by `repromatrix rehearse`: the GPU lane against a local registry.\n"
    body = {"lanes": {"gpu": lane}, "include": include}
    path.write_text(header + yaml.safe_dump(body, sort_keys=False))
    return path


def _run_options(
    options: RehearsalOptions, matrix: Path, after: str | None = None, version: str | None = None
) -> RunOptions:
    """The GPU-lane run of the rehearsal; after a moved tag, that version again, pulled."""
    return RunOptions(
        matrix=matrix,
        scenarios=(options.scenarios, SCENARIOS),
        lane=Lane.GPU,
        # After the move one cell is enough to show the new digest: the healthy baseline.
        only=(f"gpu/v{version}/*/*/*/healthy-gpu/*",) if version else (),
        backend="docker",
        results=options.results,
        run_id=f"{after}-moved" if after else options.run_id,
        rehearse=True,
        pull="always" if after else None,
        cache=options.cache,
    )


def summary(rehearsal: Rehearsal) -> dict[str, Any]:
    """The rehearsal as JSON-ready data: run folders, outcomes, digests before and after."""
    return {
        "runs": [
            {
                "run_id": run.folder.run_id,
                "run_dir": str(run.folder.path),
                "outcomes": dict(run.outcomes),
            }
            for run in rehearsal.runs
        ],
        "pushed": dict(rehearsal.pushed),
        "moved": dict(rehearsal.moved),
    }


def print_summary(rehearsal: Rehearsal) -> None:
    """Print ``summary`` as indented JSON."""
    print(json.dumps(summary(rehearsal), indent=2, sort_keys=True))


__all__: Sequence[str] = ("Rehearsal", "RehearsalOptions", "rehearse", "summary")
