"""The secrets a cell may need (``HF_TOKEN``), and how they are kept out of everything written.

Secrets are read from the host environment when a cell starts and handed to
it as environment variables only: never to a spec, a Dockerfile, a layer, a
log, a result or the dry-run output. Whatever a cell prints is redacted
before triage or the log file see it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN")
REDACTED = "<redacted>"


def secrets_from(environ: Mapping[str, str], names: Iterable[str] = SECRET_ENV) -> dict[str, str]:
    """The secret variables among ``names`` that ``environ`` sets to a non-empty value."""
    return {name: environ[name] for name in names if environ.get(name)}


def redact(data: bytes, secrets: Mapping[str, str]) -> bytes:
    """Replace every secret value in ``data`` with a marker."""
    for value in secrets.values():
        if value:
            data = data.replace(value.encode(), REDACTED.encode())
    return data
