"""Each distinct image of a plan as a build context: a Dockerfile, the harness, the probes.

``render_files`` is pure: an image and the runtime settings in, the context's
files (path → bytes) out; the same input gives the same bytes. The image tag
is a hash of those bytes (``repromatrix/cell-<key>:<sha256[:16]>``), so every
cell sharing a render shares one build, and an unchanged matrix builds nothing.
``render_image`` writes a context to ``<out_root>/<image-key>/``.

CPU-lane contexts also need the host wheelhouses (``wheelhouse.stage_wheelhouses``
links them into ``wheelhouse/``); they are not part of the render or its tag,
because the pinned versions in the Dockerfile already name them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Protocol

import jinja2

from repromatrix.errors import ConfigError, Problem
from repromatrix.files import folder_inside, inside, replace_file
from repromatrix.grammars import check_apt_package, check_image_reference
from repromatrix.harness.harness import OFFLINE_ENV
from repromatrix.images.wheelhouse import (
    REST,
    SHARED,
    TORCH_VERSION,
    UNINSTALL,
    WheelhouseRef,
    cpu_requirement,
)
from repromatrix.values import Cell, Image, Lane

CONTAINER_ROOT = "/opt/repromatrix"
ENTRYPOINT = ("python3", f"{CONTAINER_ROOT}/harness/harness.py")
WHEELHOUSE_DIR = "wheelhouse"  # inside a context; left alone by re-renders
USER_ID = 10001
FILE_MODE = 0o644  # fixed, so that COPY layers do not depend on the host's umask
# Every value rendered into a Dockerfile is one line of printable text (see ``_one_line``).
LINE_BREAK_OR_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class BaseImageSpec(Protocol):
    """What rendering needs of ``config.BaseImage``: the CPU lane's base image."""

    @property
    def source(self) -> str:
        """``debootstrap`` (a local rootfs imported as ``ref``) or ``image`` (pulled as ``ref``)."""

    @property
    def ref(self) -> str:
        """The base image's tag."""

    @property
    def packages(self) -> Sequence[str]:
        """Debian packages the CPU image needs (libnuma1, g++, python3-dev, ...)."""


class RuntimeSpec(Protocol):
    """What rendering needs of ``config.Runtime``."""

    @property
    def base(self) -> BaseImageSpec | None:
        """The CPU lane's base image (None on the GPU lane)."""


@dataclass(frozen=True)
class RenderedImage:
    """One rendered build context and the tag its build gets."""

    key: str
    lane: Lane
    tag: str
    context: Path
    dockerfile: str
    base: str  # the image the Dockerfile starts FROM
    files: tuple[str, ...]  # paths in the context, Dockerfile included
    wheelhouses: tuple[WheelhouseRef, ...] = ()  # what the build copies from the host


def render_all(cells: Iterable[Cell], runtime: RuntimeSpec, out_root: Path) -> list[RenderedImage]:
    """Render every distinct image of ``cells`` into ``out_root``, sorted by image key."""
    images = {cell.image.key: cell.image for cell in cells}
    return [render_image(images[key], runtime, out_root) for key in sorted(images)]


def render_image(image: Image, runtime: RuntimeSpec, out_root: Path) -> RenderedImage:
    """Render ``image`` and write its context to ``out_root/<image.key>/``."""
    files = render_files(image, runtime)
    # A key is one path segment by the tag grammar; resolve-and-check keeps the write (and
    # the deletions ``write_context`` makes) below ``out_root`` whatever a key says.
    context = folder_inside(out_root, out_root / image.key)
    write_context(files, context)
    wheelhouses: tuple[WheelhouseRef, ...] = ()
    if image.lane is Lane.CPU:
        package, version = cpu_requirement(image)
        wheelhouses = (
            WheelhouseRef(f"{WHEELHOUSE_DIR}/torch", "torch", TORCH_VERSION),
            WheelhouseRef(f"{WHEELHOUSE_DIR}/shared", package, version, SHARED),
            WheelhouseRef(f"{WHEELHOUSE_DIR}/vllm", package, version, REST),
        )
    return RenderedImage(
        key=image.key,
        lane=image.lane,
        tag=image_tag(image.key, files),
        context=context,
        dockerfile=files["Dockerfile"].decode(),
        base=_base_ref(image, runtime),
        files=tuple(sorted(files)),
        wheelhouses=wheelhouses,
    )


def render_files(image: Image, runtime: RuntimeSpec) -> dict[str, bytes]:
    """The context's files for ``image``: ``Dockerfile``, ``harness/*``, ``probes/*``."""
    files = {"Dockerfile": dockerfile(image, runtime).encode()}
    for folder in ("harness", "probes"):
        # An empty folder would make its COPY fail; a marker keeps it in the context.
        files.update(_package_files(folder) or {f"{folder}/.empty": b""})
    return dict(sorted(files.items()))


def dockerfile(image: Image, runtime: RuntimeSpec) -> str:
    """The Dockerfile text for ``image``; raises ``ConfigError`` for unsafe refs or names."""
    env = [f"{name}={value}" for name, value in sorted(OFFLINE_ENV.items())]
    values: dict[str, object] = {
        "image": image,
        "root": CONTAINER_ROOT,
        "entrypoint": list(ENTRYPOINT),
    }
    if image.lane is Lane.GPU:
        _check_ref(image.ref, f"image {image.key}")
        return _template("Dockerfile.gpu.j2").render(values, env=env)
    base = _cpu_base(runtime)
    package, version = cpu_requirement(image)
    packages = _apt_packages(base)
    path = "PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return _template("Dockerfile.cpu.j2").render(
        values,
        env=[path, *env],
        base=base,
        package=package,
        version=version,
        torch_version=TORCH_VERSION,
        uninstall=UNINSTALL,
        uid=USER_ID,
        apt_packages=packages,
        from_base="base" if packages else base.ref,
    )


def image_tag(key: str, files: Mapping[str, bytes]) -> str:
    """``repromatrix/cell-<key>:<hash>``, the hash covering every file's path and bytes."""
    digest = hashlib.sha256()
    for path in sorted(files):
        data = files[path]
        digest.update(f"{path}\0{len(data)}\0".encode())
        digest.update(data)
    name = re.sub(r"[^a-z0-9._-]+", "-", key.lower()).strip("._-") or "image"
    return f"repromatrix/cell-{name}:{digest.hexdigest()[:16]}"


def write_context(files: Mapping[str, bytes], folder: Path) -> None:
    """Make ``folder`` hold exactly ``files`` (``wheelhouse/`` aside); unchanged files stay."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in sorted(_existing(folder) - set(files), reverse=True):
        (folder / path).unlink()
    for path, data in files.items():
        target = inside(folder, folder / path)
        if not _holds(target, data, FILE_MODE):
            replace_file(target, data, FILE_MODE)
    for sub in sorted(folder.rglob("*"), reverse=True):
        folder_only = sub.is_dir() and not sub.is_symlink()
        if folder_only and not any(sub.iterdir()) and sub.name != WHEELHOUSE_DIR:
            shutil.rmtree(sub)


def _holds(path: Path, data: bytes, mode: int) -> bool:
    """Whether ``path`` is a regular file (not a link) holding ``data`` with ``mode``."""
    info = path.lstat() if os.path.lexists(path) else None
    if info is None or not stat.S_ISREG(info.st_mode) or stat.S_IMODE(info.st_mode) != mode:
        return False
    return path.read_bytes() == data


def _existing(folder: Path) -> set[str]:
    keep = folder / WHEELHOUSE_DIR
    return {
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if (path.is_file() or path.is_symlink()) and keep not in path.parents
    }


def _package_files(folder: str) -> dict[str, bytes]:
    """The files of the package folder ``folder`` (sources only), keyed ``folder/name``."""
    root = resources.files("repromatrix") / folder
    if not root.is_dir():
        return {}
    return {
        f"{folder}/{entry.name}": entry.read_bytes()
        for entry in sorted(root.iterdir(), key=lambda e: e.name)
        if entry.is_file() and not entry.name.endswith((".pyc", ".pyo"))
    }


@functools.cache  # compiled once for the process; rendering leaves it as it was
def _template(name: str) -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("repromatrix.images", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        finalize=_one_line,
    )
    env.filters["json"] = json.dumps
    env.globals["site_packages"] = _site_packages
    return env.get_template(name)


def _site_packages(venv: str) -> str:
    """A shell command printing ``venv``'s site-packages (its python version is not known here)."""
    return f"{venv}/bin/python3 -c \"import sysconfig; print(sysconfig.get_path('purelib'))\""


def _base_ref(image: Image, runtime: RuntimeSpec) -> str:
    return image.ref if image.lane is Lane.GPU else _cpu_base(runtime).ref


def _cpu_base(runtime: RuntimeSpec) -> BaseImageSpec:
    if runtime.base is None:
        raise _problem("the CPU lane's runtime has no `base` image")
    _check_ref(runtime.base.ref, "runtime.base.ref")
    return runtime.base


def _apt_packages(base: BaseImageSpec) -> tuple[str, ...]:
    """Packages to apt-get install on a pulled base (a debootstrap rootfs already has them)."""
    bad = [name for name in base.packages if check_apt_package(name) is not None]
    if bad:
        raise _problem(f"runtime.base.packages: {', '.join(map(repr, bad))} are not package names")
    return tuple(sorted(base.packages)) if base.source == "image" else ()


def _check_ref(ref: str, what: str) -> None:
    if (why := check_image_reference(ref)) is not None:
        raise _problem(f"{what}: {ref!r} is not an image reference like name:tag ({why})")


def _one_line(value: object) -> object:
    """The one rule for every value a template renders: one line of printable text.

    A line break would start a new Dockerfile instruction, so a value holding
    one (or any other control character) is refused, whatever checked it before.
    """
    if LINE_BREAK_OR_CONTROL.search(str(value)):
        why = "it holds a line break or a control character"
        raise _problem(f"{str(value)!r} cannot go into a Dockerfile: {why}")
    return value


def _problem(message: str) -> ConfigError:
    return ConfigError([Problem("matrix.yaml", 0, 0, message)])
