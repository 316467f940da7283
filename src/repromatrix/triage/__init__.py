"""Triage: name the real root cause in a whole vLLM log.

``Triager`` reads a log as it streams (the runner feeds it a container's
output); ``triage_stream`` and ``triage_path`` read a whole log with bounded
memory. Both return a ``Diagnosis``: the verbatim line that states the root
cause, the process that printed it, its category in the catalogue of causes
(``data/triage_causes.yaml``), the documented scenario it matches, and what to do,
in prose and as flag changes (``FlagFix``); and apart from the cause, the requests
the running server refused (``RequestError``).
"""

from repromatrix.triage.catalogue import Catalogue, Cause, Role, builtin_catalogue, load_catalogue
from repromatrix.triage.diagnosis import Diagnosis, RequestError
from repromatrix.triage.fixes import Direction, FlagChange, FlagFix
from repromatrix.triage.triager import Triager, triage_path, triage_stream

__all__ = [
    "Catalogue",
    "Cause",
    "Diagnosis",
    "Direction",
    "FlagChange",
    "FlagFix",
    "RequestError",
    "Role",
    "Triager",
    "builtin_catalogue",
    "load_catalogue",
    "triage_path",
    "triage_stream",
]
