"""Probe programs: run inside an image, they call the image's own vLLM on a crash's code path.

Each program runs as ``python3 <program> '<params json>'`` on the image's
python, with only the standard library, the installed vLLM, torch and Triton;
it prints one ``@@repromatrix-probe {json}`` line (see ``probekit``). Nothing
here imports vLLM at import time, so the host can import these modules to test
their pure parts. The harness runs them from the ``probes/`` folder copied
beside its own; the whole folder is needed, as programs share ``probekit`` and
``tritonir``. A probe matches no pattern from data: where vLLM raises, it reports
the exception (``raised``) and the runner matches it against the scenario's
signatures.
"""

from __future__ import annotations

from pathlib import Path

DIRECTORY = Path(__file__).resolve().parent


def programs() -> tuple[str, ...]:
    """The file names of the probe programs (the values a scenario's ``probe.program`` may take)."""
    return tuple(
        sorted(
            path.name
            for path in DIRECTORY.glob("*.py")
            if path.read_text(encoding="utf-8").startswith("#!")
        )
    )
