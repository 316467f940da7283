"""Hostile input in a real container: a token printed in two writes is still redacted."""

from __future__ import annotations

import hashlib
import json

import docker
import pytest

from repromatrix.backends.base import Prepared
from repromatrix.backends.docker.calls import ContainerSettings
from repromatrix.backends.docker.engine import DockerBackend
from repromatrix.run.cell import make_listener
from repromatrix.values import Lane
from support.runner import cell, tool_rootfs_tar

TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"

PREFIX = "(EngineCore pid=7) ERROR 11-29 18:28:58 [core.py:1510] "

# A container that prints the token in two writes a second apart, as a crash line.
SPLIT_HARNESS = f"""#!/bin/sh
echo '{PREFIX}Traceback (most recent call last):'
printf '%s' '{PREFIX}ValueError: To serve at least one request with the models max seq len'
printf '%s' ' for {TOKEN[:20]}'
sleep 1
printf '%s\\n' '{TOKEN[20:]}'
exit 1
""".encode()


@pytest.mark.docker
def test_a_container_that_prints_its_token_in_two_writes_is_redacted_for_triage() -> None:
    client = docker.from_env()
    data = tool_rootfs_tar(extra={"harness": SPLIT_HARNESS})
    tag = f"repromatrix-test/split-token:{hashlib.sha256(data).hexdigest()[:12]}"
    repository, _, version = tag.partition(":")
    client.api.import_image_from_data(data, repository=repository, tag=version)
    client.close()
    settings = {Lane.CPU: ContainerSettings(entrypoint=("/bin/sh", "/harness"), shm_size="64m")}
    backend = DockerBackend("test-split-token", settings, environ={"HF_TOKEN": TOKEN})
    chunks: list[bytes] = []
    watch, triager = make_listener(cell())

    def keep(chunk: bytes) -> bool:
        chunks.append(chunk)
        return watch(chunk)

    try:
        execution = backend.execute(cell(), {}, Prepared("k", tag), keep)
    finally:
        backend.close()
    assert execution.exit_code == 1 and TOKEN.encode() not in execution.log
    assert len(chunks) >= 2 and TOKEN.encode() not in b"".join(chunks)
    found = json.dumps(triager.diagnose().to_json())
    assert TOKEN not in found and "for <redacted>" in found
