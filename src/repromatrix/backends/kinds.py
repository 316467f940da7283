"""The backend kinds by name: the one place that lists them.

Adding a backend (podman, Kubernetes Jobs, ...) is one module that provides a
``BackendKind`` and one entry in ``KINDS``; ``auto`` takes the first kind in
this order that is available on the host (``choose``), and for a run the first
whose preflight says it can make what the run needs here (``choose_for_run``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from repromatrix.backends import docker, local
from repromatrix.backends.base import BackendKind, Preflight
from repromatrix.errors import InfraError, UsageError
from repromatrix.matrix.lanes import Runtime
from repromatrix.values import Lane

KINDS: dict[str, BackendKind] = {kind.name: kind for kind in (docker.KIND, local.KIND)}
AUTO = "auto"
CHOICES = (AUTO, *KINDS)


@dataclass(frozen=True)
class BackendChoice:
    """The backend a run takes, the lanes' runtimes as it makes them here, and why: the first
    line a run prints."""

    kind: BackendKind
    runtimes: Mapping[Lane, Runtime]
    reason: str


def choose(requested: str) -> BackendKind:
    """The kind named ``requested``; ``auto`` takes the first one available on this host."""
    if requested == AUTO:
        for kind in KINDS.values():
            if kind.available():
                return kind
        raise UsageError("no backend is available on this host")
    return named(requested)


def named(requested: str) -> BackendKind:
    """The kind named ``requested`` (``UsageError`` for a name that is none)."""
    try:
        return KINDS[requested]
    except KeyError:
        names = ", ".join(CHOICES)
        raise UsageError(f"--backend must be one of {names}, not {requested!r}") from None


def choose_for_run(
    requested: str, runtimes: Mapping[Lane, Runtime], lanes: Collection[Lane]
) -> BackendChoice:
    """The backend for a run of ``lanes``, decided by each kind's preflight before anything is
    built; ``InfraError`` (exit 3) where the kind asked for cannot make the run's images."""
    return pick(requested, lambda kind: kind.preflight(runtimes, lanes))


def pick(requested: str, ask: Callable[[BackendKind], Preflight]) -> BackendChoice:
    """The choice from each kind's preflight answer (``ask``): a named kind must be ready;
    ``auto`` takes the first that is, saying why the ones before it were not."""
    if requested != AUTO:
        kind = named(requested)
        answer = ask(kind)
        if not answer.ready:
            raise InfraError(f"--backend {kind.name} cannot run here: {answer.refusal}")
        return BackendChoice(
            kind, answer.runtimes, f"backend {kind.name} (asked for): {answer.reason}"
        )
    passed: list[str] = []
    for kind in KINDS.values():
        answer = ask(kind)
        if answer.ready:
            instead = "".join(f"; not {words}" for words in passed)
            return BackendChoice(
                kind, answer.runtimes, f"backend {kind.name}: {answer.reason}{instead}"
            )
        passed.append(f"{kind.name}: {answer.refusal}")
    raise InfraError("no backend can run here: " + "; ".join(passed))
