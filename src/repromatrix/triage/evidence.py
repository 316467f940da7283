"""What the log reader collects: findings (exceptions and error lines) and their rank.

A ``Finding`` is one candidate for the root cause: an exception at the end of
a traceback, an ``assert`` that failed, an ERROR line, a compiler's error, or a
line the catalogue recognises. Findings are built while the log streams (a message may continue
on the next lines, the lines after it are kept for the excerpt), so they are
mutable here; ``reasoning`` reads them once the log has ended.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from repromatrix.triage.logmodel import Line, is_compiler_error

MAX_DETAIL = 8  # continuation lines kept for a message
MAX_AFTER = 4  # lines kept after a finding for its excerpt


class Tier(enum.IntEnum):
    """How strongly a finding can be a root cause; the lowest tier present wins."""

    STRONG = 0  # an exception, or a line the catalogue names as a cause
    ERROR = 1  # an ERROR line that names no known cause
    SOFT = 2  # an exception logged at WARNING level or below
    WEAK = 3  # interrupts, signals, timeouts, masking messages: a cause only when alone
    CONSEQUENCE = 4  # re-raises, shutdown messages, known noise: never the root cause
    REQUEST = 5  # a request the running server refused: never a cause, reported apart
    WAITING = 6  # what the engine waited for: the cause only of a start ended from outside


class Kind(enum.StrEnum):
    """What sort of line a finding is."""

    EXCEPTION = "exception"  # the last line of a traceback, or an exception printed alone
    ASSERT = "assert"  # a bare AssertionError, reported at its `assert ...` source line
    ERROR = "error"  # a log line at ERROR level or above
    MATCH = "match"  # a compiler's error, or a line a catalogue or scenario pattern recognised


class Relation(enum.StrEnum):
    """How an exception follows the one before it in the same traceback chain."""

    CAUSE = "cause"  # "The above exception was the direct cause of the following exception"
    CONTEXT = "context"  # "During handling of the above exception, another exception occurred"


@dataclass(frozen=True, slots=True)
class Frame:
    """One ``File "...", line N, in f`` entry of a traceback, with its source line."""

    file: str
    lineno: int
    function: str
    source: Line | None = None

    def lines(self) -> tuple[str, ...]:
        """The frame as Python prints it (for pattern matching)."""
        head = f'File "{self.file}", line {self.lineno}, in {self.function}'
        return (head, self.source.text.strip()) if self.source else (head,)


@dataclass
class Finding:
    """A candidate root cause, as found in the log."""

    seq: int  # order of discovery: earlier findings happened earlier
    line: Line  # the line reported as the root cause
    kind: Kind
    process: str | None
    exception: str | None = None
    message: str = ""
    frames: tuple[Frame, ...] = ()
    chain: int | None = None  # findings of one traceback chain share this id
    relation: Relation | None = None
    # A line that only introduces what follows: an ERROR line before its traceback, or an
    # exception whose message announces the exception it wraps on the next line.
    header: bool = False
    signature: bool = False  # a scenario signature matched this line
    before: tuple[str, ...] = ()  # raw lines of the same process just before it
    detail: list[str] = field(default_factory=list)  # continuation lines of the message
    detail_lines: list[Line] = field(default_factory=list)  # the same, as read
    after: list[str] = field(default_factory=list)
    diagnostic: Line | None = None  # a compiler's error among its continuation lines
    status: int | None = None  # after start-up: the HTTP status the server answered next

    def headline(self) -> str:
        """Exception and message as one line, as the log states them."""
        if self.exception and self.kind is not Kind.ASSERT:
            return f"{self.exception}: {self.message}" if self.message else self.exception
        return self.message or self.line.text

    def statement(self) -> str:
        """The headline and its continuation lines: what the catalogue's patterns search."""
        return "\n".join([self.headline(), *self.detail])

    def evidence(self) -> tuple[str, ...]:
        """Every text that belongs to this failure, for scenario signatures."""
        texts = [self.line.raw, self.line.text, self.statement(), *self.before]
        for frame in self.frames:
            texts.extend(frame.lines())
        return tuple(texts)

    def add_detail(self, line: Line) -> None:
        """Append a continuation line of the message (bounded); note a compiler's error."""
        if self.diagnostic is None and is_compiler_error(line.text.strip()):
            self.diagnostic = line
        if len(self.detail) < MAX_DETAIL:
            self.detail.append(line.text.strip())
            self.detail_lines.append(line)

    def add_after(self, raw: str) -> bool:
        """Keep a line printed after this finding; False once enough are kept."""
        if len(self.after) >= MAX_AFTER:
            return False
        self.after.append(raw)
        return True
