"""Where the cells ran: each runner, its GPUs, the images and models it ran, for the reports.

Pure: judged cells in, one ``RunnerSummary`` per runner out (a runner is the
host a result names). Its GPUs are the distinct GPUs its cells were given,
each as the runner read it; its images are the image tags it ran with the
digests, vLLM versions and environment reports its results record; its
models are the revisions its cells read. A merge of shards from a fleet has
one summary per machine, so a verdict can always be traced to the machine and
software that gave it. Skipped cells ran nowhere and are left out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from repromatrix.judgement import Outcome
from repromatrix.results.schema import CellResult, GpuFact
from repromatrix.results.verdicts import Judged

UNKNOWN_HOST = "unknown host"


@dataclass(frozen=True)
class ImageOnRunner:
    """One image tag as a runner ran it."""

    lane: str
    tag: str
    digests: tuple[str, ...]
    versions: tuple[str, ...]
    environments: tuple[str, ...]  # environment reports, relative to the run folder
    cells: int

    @property
    def words(self) -> str:
        """The image for people: ``gpu v0.32.0: vLLM 0.32.0, sha256:…, 6 cell(s)``."""
        return image_words(self)


@dataclass(frozen=True)
class RunnerSummary:
    """One runner: its GPUs that cells were given, the images and model revisions it ran."""

    host: str
    gpus: tuple[Mapping[str, GpuFact], ...]
    images: tuple[ImageOnRunner, ...]
    models: tuple[tuple[str, str], ...]  # (model, revision read), for models with one
    cells: int

    @property
    def gpu_lines(self) -> tuple[str, ...]:
        """Each GPU for people (``gpu_words``)."""
        return tuple(gpu_words(gpu) for gpu in self.gpus)


def runner_summaries(judged: Iterable[Judged]) -> tuple[RunnerSummary, ...]:
    """One summary per runner that ran cells, by host name."""
    by_host: dict[str, list[CellResult]] = defaultdict(list)
    for item in judged:
        if item.result.outcome is not Outcome.SKIPPED:
            by_host[item.result.host or UNKNOWN_HOST].append(item.result)
    return tuple(_summary(host, by_host[host]) for host in sorted(by_host))


def _summary(host: str, results: Sequence[CellResult]) -> RunnerSummary:
    gpus: dict[str, Mapping[str, GpuFact]] = {}
    for result in results:
        for gpu in result.runner_gpus:
            gpus.setdefault(str(gpu.get("uuid") or gpu.get("index")), gpu)
    models = {(r.model, r.model_revision) for r in results if r.model_revision}
    return RunnerSummary(
        host,
        tuple(gpus[key] for key in sorted(gpus)),
        _images(results),
        tuple(sorted((model, str(revision)) for model, revision in models)),
        len(results),
    )


def _images(results: Sequence[CellResult]) -> tuple[ImageOnRunner, ...]:
    grouped: dict[tuple[str, str], list[CellResult]] = defaultdict(list)
    for result in results:
        grouped[result.lane, result.image_tag].append(result)
    return tuple(
        ImageOnRunner(
            lane,
            tag,
            _distinct(r.image_digest for r in grouped[lane, tag]),
            _distinct(r.version for r in grouped[lane, tag]),
            _distinct(r.environment for r in grouped[lane, tag]),
            len(grouped[lane, tag]),
        )
        for lane, tag in sorted(grouped)
    )


def _distinct(values: Iterable[str | None]) -> tuple[str, ...]:
    return tuple(sorted({value for value in values if value}))


def gpu_words(gpu: Mapping[str, GpuFact]) -> str:
    """One GPU for people: ``NVIDIA H100 80GB HBM3 (GPU-5fd…, 81559 MiB, driver 550.54.15,
    CUDA 12.4)`` with whatever the runner read of it."""
    name = str(gpu.get("name") or f"GPU {gpu.get('index', '?')}")
    facts = [str(gpu["uuid"])] if gpu.get("uuid") else []
    if gpu.get("mig_profile"):
        facts.append(f"MIG {gpu['mig_profile']}")
    if gpu.get("memory_mib"):
        facts.append(f"{gpu['memory_mib']} MiB")
    if gpu.get("compute_capability"):
        facts.append(f"compute {gpu['compute_capability']}")
    if gpu.get("driver_version"):
        facts.append(f"driver {gpu['driver_version']}")
    if gpu.get("cuda_version"):
        facts.append(f"CUDA {gpu['cuda_version']}")
    return name + (f" ({', '.join(facts)})" if facts else "")


def image_words(image: ImageOnRunner) -> str:
    """One image on a runner for people: ``gpu v0.32.0: vLLM 0.32.0, sha256:…, 6 cell(s)``."""
    parts = [f"vLLM {', '.join(image.versions)}" if image.versions else "vLLM unknown"]
    parts += list(image.digests) or ["no digest recorded"]
    parts.append(f"{image.cells} cell(s)")
    return f"{image.lane} {image.tag}: " + ", ".join(parts)


def runners_json(summaries: Sequence[RunnerSummary]) -> list[dict[str, Any]]:
    """The runners as compat.json lists them."""
    return [
        {
            "host": s.host,
            "cells": s.cells,
            "gpus": [dict(gpu) for gpu in s.gpus],
            "images": [
                {
                    "lane": i.lane,
                    "image_tag": i.tag,
                    "digests": list(i.digests),
                    "versions": list(i.versions),
                    "environment": list(i.environments),
                    "cells": i.cells,
                }
                for i in s.images
            ],
            "models": [{"model": model, "revision": rev} for model, rev in s.models],
        }
        for s in summaries
    ]
