"""Whether the Docker path can make a run's images on this host, decided in seconds.

A run that chooses Docker because an engine answers, and then finds after
minutes of wheelhouses that no base image can be made, gives nothing but infra
errors. So before anything is built the host's facts are read once
(``engine.host_facts``: the engine, the base images it already has, debootstrap
and root, whether its registry answers for a pulled base) and this pure module
decides per lane: ready (and with which base: an ``auto`` base becomes the
present image, debootstrap or ``debian:<suite>-slim`` pulled), or refused with
the reason and the one command that would make Docker work here.

Only the CPU lane builds on a base; the GPU lane pulls published images and its
cells are skipped where the GPUs are missing, so it needs an engine only.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from repromatrix.backends.base import Preflight
from repromatrix.matrix.lanes import BaseImage, Runtime, pulled_base
from repromatrix.values import Lane

DEBOOTSTRAP_FIX = "apt-get install debootstrap"
# The one command that starts an engine, as each platform has it (Docker Desktop elsewhere).
ENGINE_FIXES = {"linux": "sudo systemctl start docker", "darwin": "open -a Docker"}


def engine_fix(platform: str = sys.platform) -> str:
    """The command that would start a Docker engine on ``platform``."""
    return ENGINE_FIXES.get(platform, "start Docker Desktop")


@dataclass(frozen=True)
class HostFacts:
    """What the Docker path depends on here, read once before a run."""

    engine_error: str | None = None  # None: an engine answers
    images: frozenset[str] = frozenset()  # base references the engine already has
    debootstrap: bool = False  # the program is installed
    root: bool = False  # this process may run it
    rootfs_cached: frozenset[str] = frozenset()  # bases (by ref) whose rootfs is made already
    registry_error: str | None = "not asked"  # None: the engine's registry answers


def decide(
    facts: HostFacts, runtimes: Mapping[Lane, Runtime], lanes: Collection[Lane]
) -> Preflight:
    """Whether Docker can make the images of ``lanes`` on a host with ``facts``; each lane's
    base resolved as the host allows (an ``auto`` base follows the host)."""
    if facts.engine_error is not None:
        why = f"no Docker engine answers ({facts.engine_error})"
        return Preflight(runtimes, why, ready=False, fix=engine_fix())
    made = dict(runtimes)
    said: list[str] = []
    for lane in sorted(lanes):
        runtime = runtimes.get(lane)
        if runtime is None or runtime.base is None:
            continue
        choice = base_choice(facts, runtime.base)
        if isinstance(choice, Preflight):
            return replace(choice, runtimes=runtimes)
        base, how = choice
        made[lane] = replace(runtime, base=base)
        said.append(f"{lane} lane base {base.ref}: {how}")
    words = "; ".join(said) if said else "no lane needs a base image"
    return Preflight(made, f"a Docker engine answers; {words}")


def base_choice(facts: HostFacts, base: BaseImage) -> tuple[BaseImage, str] | Preflight:
    """The base this host can have, and how; or the refusal (``Preflight``, not ready)."""
    made = base if base.source != "auto" else replace(base, source="debootstrap")
    if base.ref in facts.images:
        return made, "present in the engine"
    if base.source == "image":
        if facts.registry_error is None:
            return base, "pulled (the registry answers)"
        return _refused(
            f"base image {base.ref} is not in the engine and its registry does not answer "
            f"({facts.registry_error})",
            f"docker pull {base.ref}",
        )
    # A root file system made earlier is imported without debootstrap, but read as root.
    if (base.ref in facts.rootfs_cached or facts.debootstrap) and facts.root:
        return made, "made with debootstrap"
    pulled = pulled_base(base)
    if base.source == "auto" and pulled.ref in facts.images:
        return pulled, f"{pulled.ref}, present in the engine (debootstrap {_why_not(facts)})"
    if base.source == "auto" and facts.registry_error is None:
        return pulled, f"pulled (debootstrap {_why_not(facts)}; the registry answers)"
    return _refused(
        f"base image {base.ref} is not in the engine and cannot be made: debootstrap "
        f"{_why_not(facts)}"
        + ("" if base.source != "auto" else f", and no registry answers ({facts.registry_error})"),
        DEBOOTSTRAP_FIX if not facts.debootstrap else "run as root (sudo)",
    )


def _why_not(facts: HostFacts) -> str:
    return "is not installed" if not facts.debootstrap else "needs root"


def _refused(reason: str, fix: str) -> Preflight:
    return Preflight({}, reason, False, fix)
