"""The backend kinds by name: the one place that lists them.

Adding a backend (podman, Kubernetes Jobs, ...) is one module that provides a
``BackendKind`` and one entry in ``KINDS``; ``auto`` takes the first kind in
this order that is available on the host.
"""

from __future__ import annotations

from repromatrix.backends import docker, local
from repromatrix.backends.base import BackendKind
from repromatrix.errors import UsageError

KINDS: dict[str, BackendKind] = {kind.name: kind for kind in (docker.KIND, local.KIND)}
AUTO = "auto"
CHOICES = (AUTO, *KINDS)


def choose(requested: str) -> BackendKind:
    """The kind named ``requested``; ``auto`` takes the first one available on this host."""
    if requested == AUTO:
        for kind in KINDS.values():
            if kind.available():
                return kind
        raise UsageError("no backend is available on this host")
    try:
        return KINDS[requested]
    except KeyError:
        names = ", ".join(CHOICES)
        raise UsageError(f"--backend must be one of {names}, not {requested!r}") from None
