"""Python tracebacks in a log, followed line by line for every process at once.

Each multi-line log record has its own traceback state, keyed by
``Line.record`` (process, level, logger location): the lines of a traceback
logged by ``logger.exception`` in the EngineCore all carry the same prefix and
header, while a raw traceback printed by the interpreter carries none, and the
two may interleave with other processes' lines. The reader accepts Python 3.8
to 3.14 layouts: ``^^^``/``~~~^^^`` markers, ``...<3 lines>...`` elisions,
tracebacks with no ``Traceback`` header (a pasted fragment), frames whose
indentation was lost in a paste, and typographic quotes.

An exception's message may continue on the next lines, and one that ends in a colon
announces what follows: torch's ``BackendCompilerFailed: backend='inductor' raised:``
is followed by the ``AssertionError: ...`` it wraps. That next line is read as the
exception that ended the traceback (its frames, its chain, its process), and it names
the exception that announced it, which only introduced it.
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from dataclasses import dataclass, field, replace

from repromatrix.triage.evidence import Frame, Kind, Relation
from repromatrix.triage.logmodel import TRACEBACK_HEADER, Line

MAX_FRAMES = 48  # the innermost frames are the ones that matter

_FRAME = re.compile(r"(\s*)(?:\| )?File [\"“”](.+?)[\"“”], line (\d+)(?:, in (.+?))?\s*")
_NOISE = re.compile(
    r"\s*(?:[~^]+[\s~^]*|\.\.\.<\d+ lines?>\.\.\.|\[Previous line repeated \d+ more times?\]"
    r"|\.{3,}|…+)\s*"
)
_EXCEPTION = re.compile(
    r"(?P<type>(?:[A-Za-z_]\w*\.)*(?P<name>[A-Z]\w*)(?:\[[^\]]*\])?(?:\([\w.]*\))?)"
    r"(?::(?: +(?P<message>.*))?)?"
)
# Names that end like an exception: enough to tell `KeyboardInterrupt: terminated` from a
# source line when a paste lost the traceback's indentation.
_EXCEPTION_NAME = re.compile(
    r"(?:Error|Exception|Interrupt|Exit|Failure|Fault|Failed|Iteration|Timeout|Resources"
    r"|Unsupported|Compiler|Denied|Exceeded|Aborted)$"
)
_NOT_NAMES = frozenset({"None", "True", "False"})
# An uncaught C++ exception: "terminate called after throwing an instance of 'T'", then
# "  what():  <message>", which states the cause.
_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']+)'")
_WHAT = re.compile(r"\s*what\(\):\s+(.*)")
_PROCESS_MARK = re.compile(r"Process ([\w.-]+):")
_CHAINS = {
    "The above exception was the direct cause of the following exception:": Relation.CAUSE,
    "During handling of the above exception, another exception occurred:": Relation.CONTEXT,
}

RecordKey = tuple[str | None, str | None, str | None]


@dataclass(frozen=True)
class Raised:
    """An exception the reader saw end a traceback (or an ``assert`` a truncated one ends on)."""

    line: Line  # where to report it: the exception line, or the `assert ...` source line
    kind: Kind
    exception: str
    message: str
    frames: tuple[Frame, ...]
    chain: int
    relation: Relation | None
    process: str | None
    announced_by: Line | None = None  # the exception line whose message announced this one


@dataclass(frozen=True)
class _Announcement:
    """An exception whose message ended in a colon: the next line may be what it wraps."""

    line: Line
    frames: tuple[Frame, ...]
    chain: int
    process: str | None


@dataclass(frozen=True)
class Step:
    """What one line meant to the traceback reader."""

    consumed: bool = False  # part of a traceback: not to be read as a message of its own
    opened: bool = False  # a traceback starts here (the ERROR line before it was its header)
    raised: tuple[Raised, ...] = ()


@dataclass
class _Traceback:
    owner: str | None
    chain: int
    relation: Relation | None
    frames: deque[Frame] = field(default_factory=lambda: deque(maxlen=MAX_FRAMES))
    base: int | None = None  # indentation of the exception line (a paste may indent it all)
    indented: bool = False  # frames and sources sit deeper (not a flattened paste)
    expecting_source: bool = False
    frame_indent: int = 0


class TracebackReader:
    """Follows tracebacks across interleaved processes; feed it every non-quiet line."""

    def __init__(self) -> None:
        self._open: dict[RecordKey, _Traceback] = {}
        self._last_chain: dict[RecordKey, int] = {}
        self._relation: dict[RecordKey, Relation] = {}
        self._owner: dict[str | None, str] = {}
        self._thrown: dict[str | None, str] = {}  # C++ exception type awaiting its what()
        self._announcing: dict[RecordKey, _Announcement] = {}
        self._chain_ids = itertools.count(1)

    def read(self, line: Line) -> Step:
        """Advance the traceback of ``line``'s record by one line."""
        text = line.text
        stripped = text.strip()
        key = line.record
        tb = self._open.get(key)
        announced = self._announcing.pop(key, None) if self._announcing else None
        # Also ", Traceback (...)" and "EngineCore hit an exception: Traceback (...)": vLLM
        # has logged tracebacks inside a longer message.
        if stripped.endswith(TRACEBACK_HEADER):
            closed = self._close(key)
            tb = self._open[key] = self._new(line)
            tb.base = len(text) - len(text.lstrip())
            return Step(consumed=True, opened=True, raised=closed)
        if stripped in _CHAINS:
            closed = self._close(key)
            self._relation[key] = _CHAINS[stripped]
            return Step(consumed=True, raised=closed)
        frame = _FRAME.fullmatch(text)
        if frame is not None:
            return self._frame(line, key, frame)
        if tb is None:
            return self._outside(line, stripped, announced)
        return self._inside(line, key, tb, stripped)

    def cut(self, line: Line) -> Step:
        """``line`` is not part of any traceback: end the one open in its record (what the
        traceback had raised so far is returned) and leave the line to be read on its own."""
        return Step(raised=self._close(line.record))

    def open_tracebacks(self) -> bool:
        """Whether a traceback has begun and not ended (at the end of a log: it was cut)."""
        return bool(self._open)

    def pending(self) -> tuple[Raised, ...]:
        """Failed asserts that end tracebacks still open (a log cut off mid-traceback)."""
        found = (_truncated(tb) for tb in self._open.values())
        return tuple(r for r in found if r is not None)

    def _new(self, line: Line) -> _Traceback:
        key = line.record
        relation = self._relation.pop(key, None)
        chain = self._last_chain.get(key) if relation else None
        owner = self._owner.pop(line.stream, None) if line.level is None else None
        return _Traceback(
            owner=owner or line.process,
            chain=chain if chain is not None else next(self._chain_ids),
            relation=relation,
        )

    def _close(self, key: RecordKey) -> tuple[Raised, ...]:
        tb = self._open.pop(key, None)
        raised = _truncated(tb) if tb is not None else None
        return (raised,) if raised is not None else ()

    def _frame(self, line: Line, key: RecordKey, match: re.Match[str]) -> Step:
        tb = self._open.get(key)
        opened = tb is None
        if tb is None:
            tb = self._open[key] = self._new(line)
        indent = len(match.group(1))
        if tb.base is None:
            tb.base = max(indent - 2, 0)
        tb.frames.append(Frame(match.group(2), int(match.group(3)), match.group(4) or "?"))
        tb.expecting_source, tb.frame_indent = True, indent
        tb.indented = tb.indented or indent > tb.base
        return Step(consumed=True, opened=opened)

    def _outside(self, line: Line, stripped: str, announced: _Announcement | None) -> Step:
        mark = _PROCESS_MARK.fullmatch(stripped)
        if mark is not None and line.level is None:
            self._owner[line.stream] = mark.group(1)
            return Step(consumed=True)
        thrown = _TERMINATE.search(stripped)
        if thrown is not None:
            self._thrown[line.stream] = thrown.group(1)
            return Step()
        what = _WHAT.fullmatch(line.text)
        if what is not None:
            return self._what(line, what.group(1))
        if text_is_noise(line.text):
            return Step()
        match = _EXCEPTION.fullmatch(line.text)
        if match is None or not _standalone(match):
            return Step()
        key = line.record
        if announced is not None:
            self._last_chain[key] = announced.chain
            raised = _raised(
                line,
                match,
                frames=announced.frames,
                chain=announced.chain,
                process=announced.process,
                announced_by=announced.line,
            )
            return Step(consumed=True, raised=(raised,))
        chain = self._last_chain[key] = next(self._chain_ids)
        raised = _raised(line, match, chain=chain, process=line.process)
        return Step(consumed=True, raised=(raised,))

    def _what(self, line: Line, message: str) -> Step:
        exception = self._thrown.pop(line.stream, "std::exception")
        chain = self._last_chain[line.record] = next(self._chain_ids)
        raised = Raised(
            line, Kind.EXCEPTION, exception, message.strip(), (), chain, None, line.process
        )
        return Step(consumed=True, raised=(raised,))

    def _inside(self, line: Line, key: RecordKey, tb: _Traceback, stripped: str) -> Step:
        text = line.text
        if not stripped or text_is_noise(text):
            return Step(consumed=True)
        indent = len(text) - len(text.lstrip())
        if indent <= (tb.base or 0):
            match = _EXCEPTION.fullmatch(stripped)
            if match is not None and _ends_traceback(match, tb.indented):
                del self._open[key]
                self._last_chain[key] = tb.chain
                frames = tuple(tb.frames)
                if stripped.endswith(":"):
                    self._announcing[key] = _Announcement(line, frames, tb.chain, tb.owner)
                raised = _raised(
                    line,
                    match,
                    frames=frames,
                    chain=tb.chain,
                    relation=tb.relation,
                    process=tb.owner,
                )
                return Step(consumed=True, raised=(raised,))
        if tb.expecting_source:
            tb.frames[-1] = replace(tb.frames[-1], source=line)
            tb.expecting_source = False
            tb.indented = tb.indented or indent > tb.frame_indent
            return Step(consumed=True)
        # Further lines of a multi-line statement (3.13 prints them all); in a flattened
        # paste they sit at column 0 too, so only an indented traceback can tell them apart.
        return Step(consumed=indent > tb.frame_indent or not tb.indented)


def is_traceback_line(text: str) -> bool:
    """Whether ``text`` reads as a line of a traceback: its header, a frame, a chain marker or
    an exception line (the test the reader applies, without its state)."""
    stripped = text.strip()
    if stripped.endswith(TRACEBACK_HEADER) or stripped in _CHAINS:
        return True
    if _FRAME.fullmatch(text) is not None:
        return True
    match = _EXCEPTION.fullmatch(stripped)
    return match is not None and _standalone(match)


def text_is_noise(text: str) -> bool:
    """Caret markers, elisions and ellipses: traceback decoration with no content."""
    return _NOISE.fullmatch(text) is not None


def _exception_like(name: str) -> bool:
    # `ValueError`, not a bare `Error:` or `Failed:` (C++ and shell messages say those).
    suffix = _EXCEPTION_NAME.search(name)
    return name == "Exception" or (suffix is not None and suffix.start() > 0)


def _standalone(match: re.Match[str]) -> bool:
    name = match.group("name")
    return not name.endswith("Warning") and _exception_like(name)


def _ends_traceback(match: re.Match[str], indented: bool) -> bool:
    name = match.group("name")
    if name in _NOT_NAMES:
        return False
    if _exception_like(name):
        return True
    # Any class name ends an indented traceback (InvalidCxxCompiler, OutOfResources...),
    # provided it is dotted or has a message: a bare word may be a stray line.
    loose = "." in match.group("type") or match.group("message") is not None
    return indented and loose


def _raised(
    line: Line,
    match: re.Match[str],
    *,
    frames: tuple[Frame, ...] = (),
    chain: int,
    relation: Relation | None = None,
    process: str | None,
    announced_by: Line | None = None,
) -> Raised:
    exception, message = match.group("type"), (match.group("message") or "").strip()
    source = frames[-1].source if frames else None
    if match.group("name") == "AssertionError" and not message and _is_assert(source):
        assert source is not None
        line, kind, message = source, Kind.ASSERT, source.text.strip()
    else:
        kind = Kind.EXCEPTION
    return Raised(line, kind, exception, message, frames, chain, relation, process, announced_by)


def _truncated(tb: _Traceback) -> Raised | None:
    """A traceback cut off after a failing ``assert`` line still names its cause."""
    source = tb.frames[-1].source if tb.frames else None
    if source is None or not _is_assert(source):
        return None
    message = source.text.strip()
    frames = tuple(tb.frames)
    return Raised(
        source, Kind.ASSERT, "AssertionError", message, frames, tb.chain, tb.relation, tb.owner
    )


def _is_assert(source: Line | None) -> bool:
    return source is not None and re.match(r"\s*assert\b", source.text) is not None
