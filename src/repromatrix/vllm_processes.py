"""How vLLM names its processes in line prefixes, and which names are the same process.

Process names vary across vLLM versions (``EngineCore_DP0``, ``VllmWorker-0``,
``Worker_TP1``, ``RayWorkerWrapper``), so they are compared by family. The
scenario loader (``matrix``) checks a signature's process with ``same_process``
and triage matches it against a line's prefix with the same function.
"""

from __future__ import annotations

# How vLLM names its processes in line prefixes, ``(EngineCore_DP0 pid=7)``, across the
# versions in tests/data/logs: a signature's ``process`` must be able to match one of them
# (``same_process``), or it could never match a line.
KNOWN_PROCESSES = (
    "APIServer",
    "EngineCore",
    "EngineCore_0",
    "EngineCore_DP0",
    "Worker",
    "Worker_TP0",
    "Worker_PP0_TP0_EP0",
    "VllmWorker-0",
    "VllmWorkerProcess",
    "RayWorkerWrapper",
)
_FAMILIES = (
    ("enginecore", "enginecore"),
    ("apiserver", "apiserver"),
    ("worker", "worker"),
    ("vllmworker", "worker"),
    ("rayworker", "worker"),
    ("rank", "worker"),
)


def same_process(wanted: str | None, actual: str | None) -> bool:
    """Whether a line printed by ``actual`` satisfies a signature's ``wanted`` process."""
    if wanted is None or actual is None:
        return True
    return actual.lower().startswith(wanted.lower()) or _family(actual) == _family(wanted)


def _family(name: str) -> str:
    lowered = name.lower()
    for prefix, family in _FAMILIES:
        if lowered.startswith(prefix):
            return family
    return lowered
