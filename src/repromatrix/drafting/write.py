"""A scenario draft as YAML text, from a log's diagnosis and its launch record.

Pure: values in, text out. Every string is written as a JSON string (valid YAML that can
never become a tag, an anchor or anything a shell reads); numbers and booleans as
themselves; keys only where they pass the flag and name grammars. Where the log is silent
the draft says so in a comment at the place the value would go.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from repromatrix.drafting.defaults import set_in_dump
from repromatrix.drafting.signature import signature_pattern
from repromatrix.secret_env import redact_text
from repromatrix.triage import Diagnosis, FlagFix
from repromatrix.triage.catalogue import Cause, Role, builtin_catalogue
from repromatrix.triage.diagnosis import RootCause
from repromatrix.triage.facts import LaunchRecord
from repromatrix.triage.fixes import Bounds, Direction, FlagChange, step
from repromatrix.vllm_processes import KNOWN_PROCESSES, same_process

# Arguments about where and how the server is reached, not about the engine: left out.
DEPLOYMENT = frozenset(
    {
        "host", "port", "model", "model_tag", "served_model_name", "api_key", "hf_token",
        "uvicorn_log_level", "root_path", "allowed_origins", "allowed_methods",
        "allowed_headers", "allow_credentials", "ssl_keyfile", "ssl_certfile", "ssl_ca_certs",
        "ssl_cert_reqs", "middleware", "disable_log_requests", "disable_log_stats",
        "log_error_stack", "enable_log_requests", "uds", "headless", "download_dir",
    }
)  # fmt: skip
_SECRET = re.compile(r"(?:^|_)(?:key|token|secret|password)(?:$|_)", re.IGNORECASE)
_FLAG = re.compile(r"[a-z][a-z0-9_]*")
_ID = re.compile(r"[a-z0-9][a-z0-9._-]*")
Scalar = bool | int | float | str


@dataclass(frozen=True)
class Draft:
    """A drafted scenario: its id and its file's text."""

    id: str
    text: str


def draft_id(diagnosis: Diagnosis) -> str:
    """``draft-<category>`` (or ``draft-<exception>``) in the cell-id grammar."""
    cause = diagnosis.root_cause
    what = (cause.category or cause.exception or "crash") if cause else "crash"
    name = re.sub(r"[^a-z0-9]+", "-", what.rsplit(".", 1)[-1].lower()).strip("-")
    return f"draft-{name or 'crash'}"


def engine_flags(record: LaunchRecord) -> tuple[dict[str, Scalar], list[str]]:
    """The engine flags a draft keeps from the record, and a note for each one left out.

    From an argument dump (every argument, set or not) only the flags
    ``defaults.set_in_dump`` shows set are kept; a note says how many others were left.
    """
    dump = record.source == "argument dump"
    kept: dict[str, Scalar] = {}
    notes: list[str] = []
    for name, value in record.args.items():
        if name in DEPLOYMENT or _FLAG.fullmatch(name) is None:
            continue
        if dump and not set_in_dump(name, value):
            continue
        if _SECRET.search(name) or redact_text(name) != name:
            notes.append(f"{redact_text(name)}: left out (a secret)")
        elif isinstance(value, str) and redact_text(value) != value:
            notes.append(f"{name}: left out (its value holds a secret)")
        elif isinstance(value, bool | int | float | str):
            kept[name] = value
        elif value is not None:
            notes.append(f"{name}: left out (a {type(value).__name__} value: fill it in by hand)")
    return kept, notes + (_dump_notes(record, len(kept)) if dump else [])


def _dump_notes(record: LaunchRecord, kept: int) -> list[str]:
    left = len(record.args) - kept
    notes = [
        f"from the log's argument dump: {left} other arguments left out (deployment ones,"
        " vLLM's defaults, or flags whose default the draft does not know)"
    ]
    if record.unread:
        names = ", ".join(record.unread)
        notes.append(f"not read (no literal value in the dump): {names}")
    return notes


def render_draft(
    diagnosis: Diagnosis,
    record: LaunchRecord,
    scenario_id: str,
    log: str,
    bounds: Mapping[str, Bounds] | None = None,
) -> str:
    """The scenario YAML drafted from ``diagnosis`` and ``record`` of the log named ``log``;
    a workaround's value stays inside ``bounds`` (default: the builtin catalogue's)."""
    bounds = builtin_catalogue().bounds if bounds is None else bounds
    cause = diagnosis.root_cause
    if cause is None:
        raise ValueError("no root cause to draft a scenario from")
    flags, notes = engine_flags(record)
    out = _Lines()
    out.comment(f"Drafted by `repromatrix scenario draft` from {log}: check every value.")
    out.comment(f"Root cause: {cause.line}")
    out.add(f"id: {_text(scenario_id)}")
    out.add(f"title: {_text(_title(diagnosis))}")
    _lanes(out, record)
    entry = builtin_catalogue().category(cause.category) if cause.category else None
    _trigger(out, flags, record, named_flags(cause, entry, flags))
    _launch(out, flags, notes)
    _signature(out, diagnosis, entry)
    _versions(out, diagnosis)
    _setting(out, record)
    out.lines.extend(_variants(diagnosis.fix_flags, flags, bounds))
    out.add(f"avoided: {_text('The engine starts and answers a completion; no ' + _short(cause))}")
    return out.text()


class _Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, line: str) -> None:
        self.lines.append(line)

    def comment(self, text: str, indent: str = "") -> None:
        self.lines.append(f"{indent}# {_comment_text(text)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _comment_text(text: str) -> str:
    """One line of comment: no line break, no control character, secrets redacted."""
    flat = "".join(ch if ch.isprintable() else " " for ch in redact_text(text))
    return flat[:300]


def _text(value: str) -> str:
    return json.dumps(redact_text(value), ensure_ascii=True)


def _value(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return json.dumps(value)
    return _text(str(value))  # NaN and infinities are no YAML number: written as text


def _title(diagnosis: Diagnosis) -> str:
    cause = diagnosis.root_cause
    assert cause is not None
    what = diagnosis.title or cause.exception or "a start-up crash"
    return f"{what} (drafted from a log)"


def _short(cause: RootCause) -> str:
    return f"{cause.exception} at start-up." if cause.exception else "such error at start-up."


def _lanes(out: _Lines, record: LaunchRecord) -> None:
    if record.platform == "cpu":
        out.add("lanes: [cpu]")
    elif record.platform is not None:
        out.add(f"lanes: [gpu]  # the log says it ran on {_comment_text(record.platform)}")
    else:
        out.comment("the log does not say which platform it ran on: both lanes")
        out.add("lanes: [cpu, gpu]")


def _trigger(
    out: _Lines, flags: Mapping[str, Scalar], record: LaunchRecord, named: Sequence[str]
) -> None:
    if not flags:
        out.comment(_silent(record, "trigger"))
        out.add("trigger: {}")
        return
    kept = {name: value for name, value in flags.items() if name in named}
    rest = [
        f"{name}={_comment_text(str(value))}" for name, value in flags.items() if name not in kept
    ]
    if rest:
        out.comment(
            "the reporter's launch also set (in launch.flags, not conditions: neither the root"
            f" cause nor the catalogue names them): {', '.join(rest)}"
        )
    if not kept:
        out.comment("trigger: neither the root cause nor the catalogue names a flag of the launch")
        out.add("trigger: {}")
        return
    out.add("trigger:")
    for name, value in kept.items():
        out.add(f"  flags.{name}: {{eq: {_value(value)}}}")


def named_flags(cause: RootCause, entry: Cause | None, names: Iterable[str]) -> tuple[str, ...]:
    """The flags of ``names`` that plausibly cause the crash: those the root cause line or the
    catalogue's entry for it (its explanation, its fix, its ``fix_flags``) names, as
    ``max_model_len`` or ``--max-model-len``."""
    texts = [cause.line]
    if entry is not None:
        texts += [entry.explanation, entry.fix]
        texts += [c.name for fix in entry.fix_flags for c in (*fix.flags, *fix.env)]
    text = "\n".join(texts)
    return tuple(name for name in names if _names(text, name))


def _names(text: str, flag: str) -> bool:
    forms = (flag, "--" + flag.replace("_", "-"))
    return any(re.search(rf"(?<![\w-]){re.escape(form)}(?![\w-])", text) for form in forms)


def _silent(record: LaunchRecord, what: str) -> str:
    if record.source is None:
        return (
            f"{what}: the log records no engine arguments"
            " (no non-default args, no argument dump, no command line)"
        )
    if record.source == "argument dump":
        return f"{what}: the log's argument dump sets no engine flag the draft knows the default of"
    return f"{what}: the log's {record.source} hold no engine argument beyond deployment ones"


def _launch(out: _Lines, flags: Mapping[str, Scalar], notes: Sequence[str]) -> None:
    out.add("launch:")
    out.add("  mode: server")
    for note in notes:
        out.comment(note, "  ")
    if flags:
        out.add("  flags:")
        for name, value in flags.items():
            out.add(f"    {name}: {_value(value)}")
    out.add("  startup_timeout_s: 600")


def _signature(out: _Lines, diagnosis: Diagnosis, entry: Cause | None) -> None:
    cause = diagnosis.root_cause
    assert cause is not None
    if entry is not None and entry.role is Role.WEAK:
        out.comment(
            f"the root cause is weak evidence ({entry.category}): a symptom other crashes print"
            " too, so this signature is not specific; find the first error above it"
        )
    out.add("signatures:")
    out.add(f"  - pattern: {_text(signature_pattern(cause))}")
    process = cause.process
    if process and any(same_process(process, known) for known in KNOWN_PROCESSES):
        out.add(f"    process: {_text(process)}")
    elif process:
        out.comment(f"printed by {process}, a process name the loader does not know", "    ")
    else:
        out.comment("the line names no process that printed it", "    ")


def _versions(out: _Lines, diagnosis: Diagnosis) -> None:
    version = diagnosis.facts.get("vllm_version")
    if version and re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version):
        out.comment("the log's vLLM version; the affected range is not known yet")
        out.add(f"affected: {_text('==' + version)}")
    else:
        out.comment("the log states no vLLM version: the affected range is not known")
        out.add('affected: "all"')
    out.add("fixed: null  # not known yet")


def _setting(out: _Lines, record: LaunchRecord) -> None:
    model = f"the log names the model {record.model}" if record.model else "the log names no model"
    gpu = f"the log names the GPU {record.gpu}" if record.gpu else "the log names no GPU"
    out.comment(f"{model}; the matrix's models are what cells serve")
    out.comment(f"{gpu}; the matrix's GPUs are what cells run on")


def _variants(
    fixes: Sequence[FlagFix], flags: Mapping[str, Scalar], bounds: Mapping[str, Bounds]
) -> list[str]:
    """The ``variants:`` lines; a comment for each fix not drafted, saying why."""
    out = _Lines()
    made: list[tuple[str, list[str]]] = []
    for fix in fixes:
        variant, why = _variant(fix, flags, bounds)
        if variant is None:
            out.comment(f"not drafted: {fix.describe()} ({why})")
        elif variant[0] not in {name for name, _ in made}:
            made.append(variant)
    if not fixes:
        out.comment("the triage catalogue has no flag change for this cause: no workaround")
    if not made:
        out.add("variants: []")
        return out.lines
    out.add("variants:")
    for name, body in made:
        out.add(f"  - name: {_text(name)}")
        out.add("    kind: workaround")
        out.lines.extend(f"    {line}" for line in body)
    return out.lines


def _variant(
    fix: FlagFix, flags: Mapping[str, Scalar], bounds: Mapping[str, Bounds]
) -> tuple[tuple[str, list[str]] | None, str]:
    """The variant's name and body lines, or None and why not."""
    body: list[str] = []
    names: list[str] = []
    for part, changes in (("flags", fix.flags), ("env", fix.env)):
        env = part == "env"
        values: list[Scalar] = []
        for change in changes:
            value, why = _changed(change, flags, bounds, env=env)
            if value is None:
                return None, why
            values.append(value)
        if changes:
            pairs = ", ".join(
                f"{c.name}: {_value(v)}" for c, v in zip(changes, values, strict=True)
            )
            body.append(f"{part}: {{{pairs}}}")
            names += [f"{c.name}-{v}" for c, v in zip(changes, values, strict=True)]
    name = re.sub(r"[^a-z0-9.]+", "-", "-".join(names).lower()).strip("-.")
    if not body or _ID.fullmatch(name) is None:
        return None, "no variant name can be made of it"
    body.append(f"description: {_text('from the triage catalogue: ' + fix.describe())}")
    return (name, body), ""


def _changed(
    change: FlagChange, flags: Mapping[str, Scalar], bounds: Mapping[str, Bounds], *, env: bool
) -> tuple[Scalar | None, str]:
    """The value a change sets, or None and why there is none."""
    if change.direction is None:
        return change.value, ""
    now = None if env else flags.get(change.name)
    if isinstance(now, bool) or not isinstance(now, int | float):
        return None, "the log states no value to change from"
    limits = bounds.get(change.name)
    # Halving or doubling the value that crashed is a first try, kept inside vLLM's range.
    changed = step(now, change.direction, limits)
    if changed is None:
        where = limits.describe() if limits is not None else "its range"
        return None, (
            f"{change.name} is {_value(now)} and vLLM accepts {where}:"
            f" no valid value is {'lower' if change.direction is Direction.LOWER else 'higher'}"
        )
    return (int(changed) if isinstance(now, int) else changed), ""
