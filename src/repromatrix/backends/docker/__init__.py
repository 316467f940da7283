"""The Docker backend: its kind (what a run asks of it), its engine adapter, its calls as values."""

from repromatrix.backends.docker.kind import KIND

__all__ = ["KIND"]
