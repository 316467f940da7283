"""``vllm/vllm-openai:<tag>`` look-alikes, built from the matching vllm-cpu image and pushed.

A published vLLM image runs as root, has vLLM's Python first on PATH and
starts the OpenAI server; the look-alike is the CPU lane's image of the same
vLLM version with those three things set, so the GPU lane's render, pull,
digest and mount path meet the image they expect. ``stamp`` becomes a label:
a new stamp is a new image under the same tag (a moved tag).
"""

from __future__ import annotations

from collections.abc import Callable

import docker

from repromatrix.backends.docker.engine import build_text, push, untag

DOCKERFILE = """FROM {base}
USER root
ENV PATH=/opt/venv/bin:$PATH
LABEL org.repromatrix.rehearsal={stamp}
ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]
"""


def publish(
    client: docker.DockerClient,
    base: str,
    ref: str,
    stamp: str,
    note: Callable[[str], None] = lambda _line: None,
) -> str:
    """Build ``ref`` on ``base``, push it, forget the local tag (a run must pull it); return
    the digest the registry reports."""
    build_text(client, DOCKERFILE.format(base=base, stamp=stamp), ref)
    note(f"pushing {ref} (the first push of a version sends every layer)")
    digest = push(client, ref)
    untag(client, ref)
    note(f"{ref} is {digest} in the local registry")
    return digest
