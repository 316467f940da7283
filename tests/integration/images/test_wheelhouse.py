"""The debootstrap base rootfs, imported into a real Docker engine."""

from __future__ import annotations

import uuid

import docker
import pytest

from repromatrix.images.wheelhouse import (
    make_base_rootfs,
    rootfs_tar_stream,
)
from support.factories import base_image


@pytest.mark.docker
@pytest.mark.root
@pytest.mark.program("debootstrap")
def test_debootstrap_base_imports_and_has_what_cpu_vllm_needs() -> None:
    client = docker.from_env(timeout=10)
    rootfs = make_base_rootfs(base_image())  # cached under .cache/rootfs: about a minute once
    assert make_base_rootfs(base_image()) == rootfs  # second call: the cache
    tag = f"repromatrix/base-test:{uuid.uuid4().hex[:8]}"
    repository, _, version = tag.rpartition(":")
    client.api.import_image_from_stream(rootfs_tar_stream(rootfs), repository, tag=version)
    try:
        check = (
            "import ctypes.util, sysconfig, venv;"
            "assert ctypes.util.find_library('numa'), 'no libnuma';"
            "print(sysconfig.get_python_version())"
        )
        out = client.containers.run(tag, ["python3", "-c", check], network_mode="none", remove=True)
        assert out.decode().strip() == "3.11"  # the host wheelhouse's Python
        out = client.containers.run(tag, ["g++", "--version"], network_mode="none", remove=True)
        assert b"g++" in out
    finally:
        client.images.remove(tag, force=True)
