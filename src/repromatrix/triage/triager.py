"""``Triager``: read a vLLM log as it streams and name its root cause.

The runner feeds it a container's output chunk by chunk and stops the cell
once ``terminal`` is true; ``repromatrix triage`` feeds it a file through
``triage_path`` or ``triage_stream``, which read whole logs, plain or
gzip-compressed, in bounded chunks. Memory is bounded whatever the input: a
partial line is capped, each process keeps a few recent lines, and only the
first findings of each tier are kept.

Speed comes from a fast path: INFO and DEBUG lines (most of any log) are
recognised by one anchored regex and skipped before any other work. They can
only matter through scenario signatures and readiness markers, and those are
searched once per block of lines; a block with a hit is read line by line.

WARNING lines that cannot matter are told apart on the undecoded bytes too
(``WarningFilter``): a log made mostly of vLLM WARNING lines would otherwise
cost a full parse and a catalogue search per line. A WARNING line can matter
only through the catalogue's entries that apply at warning level (causes
marked ``as_warning``, consequences, weak evidence, noise), or as part of a
traceback logged at warning level. So a line with vLLM's WARNING header whose
message contains none of those entries' required literals, and does not look
like a traceback line (a frame, a source line, an exception line, a chain
marker), is skipped like an INFO line.

The literal test runs on the message with every digit read as ``0`` (both in
the message and in the literals): a literal present in the message is still
present then, so nothing that matters is skipped, and warnings repeated with
other numbers (counters, sizes, ids) share one cached answer.

Once the server is up, a failure may belong to one request rather than to the
server: the server answers that request next, and an answer in the 4xx range means
the API server refused it and went on serving. Such failures are request errors,
kept apart from the candidates for a root cause. The answer is the next access
line (an INFO line): while a failure waits for it, blocks that may hold one are
read line by line, and the rest of the current block is searched for it.
"""

from __future__ import annotations

import functools
import json
import re
import zlib
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import compress, repeat
from operator import is_not, not_
from pathlib import Path
from typing import BinaryIO

from repromatrix.harness.harness import OOM_PREFIX, PROTOCOL_PREFIX
from repromatrix.harness.oomwatch import KILL_WORDS, line_of
from repromatrix.harness.oomwatch import LINE_PREFIX as HARNESS_LINE
from repromatrix.patterns import LiteralSet
from repromatrix.triage import facts, reasoning, repeats
from repromatrix.triage.catalogue import (
    Catalogue,
    Cause,
    Role,
    builtin_catalogue,
    required_literals,
)
from repromatrix.triage.diagnosis import Diagnosis, OomKill, RequestError
from repromatrix.triage.dumps import MIN_WRAP, is_dump_piece
from repromatrix.triage.evidence import Finding, Kind, Relation, Tier
from repromatrix.triage.logmodel import (
    QUIET,
    QUIET_LEVELS,
    TRACEBACK_HEADER,
    ByteSource,
    Line,
    LineSplitter,
    PrefixLearner,
    after_progress_bar,
    decode,
    http_status,
    is_bare_progress_bar,
    is_compiler_error,
    is_dump,
    is_quiet,
    parse_line,
    reparse,
)
from repromatrix.triage.signatures import ScenarioSignatures, reached_lines
from repromatrix.triage.tracebacks import Raised, RecordKey, TracebackReader
from repromatrix.values import FactTest, Scenario
from repromatrix.vllm_processes import same_process

MAX_PER_TIER = 32
MAX_REQUEST_ERRORS = 16  # refused requests kept for the answer (all are counted)
MAX_UNANSWERED = 64  # failures after start-up waiting for the server's answer
MAX_LAST_ERRORS = 12
RECENT_LINES = 8
# The server is up once one of these is printed; a failure after it happened on a request.
READY_MARKERS = (
    "Application startup complete",
    "Uvicorn running on",
    "Starting vLLM API server",
    "init engine (profile, create kv cache, warmup model) took",
)
_READY_BYTES = tuple(m.encode() for m in READY_MARKERS)
# The API server is up and start-up is over: uvicorn says so once everything (the engine, the
# LoRA modules, the multimodal warm-up) is done. Facts and reached lines are start-up's.
SERVING_MARKERS = (b"Application startup complete", b"Uvicorn running on")
# The engine core ended its own loop in order (vLLM 0.22.1 v1/engine/core.py:1289, after
# "Shutdown initiated" at :1266): a process's end reported after it is that shutdown's.
SHUTDOWN_MARKER = b"Shutdown complete"
_OWN_PROTOCOL = PROTOCOL_PREFIX
_OOM_RECORD = OOM_PREFIX.encode()  # a kill, as data: read, never matched
# The same kill in words, for people: not read once a record said it (the harness prints the
# record first). A log of an earlier harness has the words alone, and they are read.
_HARNESS_KILL = HARNESS_LINE + KILL_WORDS
_LISTING = re.compile(r"-+> *\d+ ")
READ_CHUNK = 1 << 20  # what a whole log is read in: memory stays bounded
MAX_CACHED = 4096  # WARNING lines the filter remembers its answer for
# A warning's header (vLLM's, glog's, Python's warnings module) under the wrappers and
# prefixes the INFO fast path knows.
WARNING_HEADER = re.compile(
    rb"(?:\d{4}-\d\d-\d\dT[\d:.]+Z? )?"
    rb"(?:[A-Za-z0-9][\w.-]*\s*\|\s?)?"
    rb"(?:\([^()]*\) |\[rank\d+\]:)*"
    rb"(?:(?:WARNING|WARN) +(?:\d{4}-)?\d\d-\d\d[T ][\d:.,]+ +(?:\[[^\]\s]+\]|[\w.-]+:\d+\]) ?"
    rb"|\[?W\d{4} \d\d:\d\d:\d\d\.\d+ +(?:\d+ )?[\w.-]+:\d+\] ?"
    rb"|\S+\.pyx?:\d+: \w*Warning: )"
)
# Messages that may be a traceback's line: indented (frames, sources), empty, one word that
# may be an exception's name (alone or before a colon; a warning's category is none), a
# chain marker.
_TRACEBACK_LIKE = (
    rb"\s|$|(?![\w.]*Warning:)[\w.]+(?:\[[^\]]*\])?(?:\([\w.]*\))?(?::|$)"
    rb"|The above exception|During handling"
)
# A warning whose message may be nothing but a warning (one match decides both).
_PLAIN_WARNING = re.compile(WARNING_HEADER.pattern + rb"(?!" + _TRACEBACK_LIKE + rb")")
# Text that the slow path's reading changes (escapes, carriage returns), or that opens or
# ends a traceback wherever it stands.
_STRUCTURAL = (b"\x1b", b"^[", b"\r", b"Traceback (most recent", b"what():")
_DIGITS = bytes.maketrans(b"123456789", b"000000000")


@dataclass
class _Stream:
    """What one process printed lately."""

    recent: deque[str] = field(default_factory=lambda: deque(maxlen=RECENT_LINES))
    awaiting: list[Finding] = field(default_factory=list)  # findings still collecting lines
    pending_error: Finding | None = None  # an ERROR line that may introduce a traceback
    introducing: Finding | None = None  # an ERROR line whose traceback has not ended yet
    introduced: RecordKey | None = None  # the record of that traceback


class Triager:
    """Reads a vLLM log in chunks of any size and diagnoses its root cause."""

    def __init__(
        self, scenarios: Sequence[Scenario] = (), catalogue: Catalogue | None = None
    ) -> None:
        self._catalogue = catalogue or builtin_catalogue()
        self._signatures = ScenarioSignatures(scenarios)
        # What shows a scenario's code path entered: lines searched like signatures, and
        # tests of the facts the engine states (``triage.facts``), judged at the end.
        self._reached_lines = ScenarioSignatures(scenarios, reached_lines)
        self._reached_facts = tuple(
            (s.id, test) for s in scenarios for test in s.reached if isinstance(test, FactTest)
        )
        self._facts = facts.FactReader()
        self._warnings = WarningFilter(self._catalogue)
        self._splitter = LineSplitter()
        self._reader = TracebackReader()
        self._prefixes = PrefixLearner()
        self._streams: dict[str | None, _Stream] = {}
        self._findings: list[Finding] = []
        self._kept: Counter[Tier] = Counter()
        self._tier_of: dict[int, Tier] = {}  # the tier each kept finding was counted in
        self._seq = 0
        self._unanswered: deque[Finding] = deque(maxlen=MAX_UNANSWERED)
        self._refused: list[Finding] = []
        self._refusals = 0
        self._dump_end = 0  # the last line that belongs to a dump
        self._wrap_width = 0  # the width a paste hard-wrapped this log's lines at, once seen
        self._last_raw = b""  # the last line of the previous block (fast path)
        # The last message (a finding, or a consequence as a finding with seq -1) and the
        # number of its last line: the next line of the same record may continue it.
        self._message: Finding | None = None
        self._message_end = 0
        self._prev: Line | None = None  # the previous line read in full
        self._adjacent = 0  # lines up to this one follow ``_prev`` directly (blanks between)
        self._number = 0
        self._source = ByteSource()
        self._bytes_read = 0
        self._ready_line: int | None = None
        self._serving_line: int | None = None  # the line that says the server serves
        self._shutdown_line: int | None = None  # the engine's own orderly shutdown ended
        self._died_line: int | None = None  # the engine's first fatal end after that line
        self._fatal_seen = False
        self._cause_seen = False
        self._final_error: str | None = None
        self._last_errors: deque[str] = deque(maxlen=MAX_LAST_ERRORS)
        self._scenarios_seen: dict[str, None] = {}
        self._reached_seen: dict[str, None] = {}
        self._kills: list[str] = []  # the harness's records of OOM kills, in the kernel's words

    @property
    def kills(self) -> tuple[str, ...]:
        """Each OOM kill the harness recorded (``@@repromatrix-oom``), in the kernel's words."""
        return tuple(self._kills)

    @property
    def terminal(self) -> bool:
        """A root cause has been seen, and a consequence saying the engine start is over."""
        return self._fatal_seen and self._cause_seen

    @property
    def bytes_read(self) -> int:
        """How many bytes of the log have been fed so far."""
        return self._bytes_read

    def feed(self, data: bytes) -> None:
        """Read the next chunk of the log (a partial last line waits for the next chunk)."""
        self._bytes_read += len(data)
        text = self._source.push(data)
        if text:
            self._split(text)

    def diagnose(self, *, oom: OomKill | None = None) -> Diagnosis:
        """The diagnosis of everything fed so far; a partial last line is read as complete.

        An OOM kill, as the harness recorded it (its ``@@repromatrix-oom`` records, read as
        data) and as the runner hands it over (``oom``: the container's OOMKilled state, a
        kill the harness did not outlive), makes the host running out of memory the cause
        unless the log names another; the scenarios whose signatures the kill's words match
        are shown.
        """
        rest = self._source.finish()
        if rest:
            self._split(rest)
        tail = self._splitter.flush()
        if tail is not None:
            self._read_facts(tail)
            self._lines([tail])
        findings = [*self._findings, *self._truncated()]
        reading = self._reading()
        diagnosis = reasoning.diagnose(findings, reading, self._catalogue, self._signatures)
        kill = OomKill(
            (*self._kills, *(oom.lines if oom else ())), container=oom is not None and oom.container
        )
        if not kill.lines and not kill.container:
            return diagnosis
        shown = tuple(
            dict.fromkeys(hit for line in kill.lines for hit in self._signatures.text_hits(line))
        )
        return reasoning.with_oom_kill(diagnosis, self._catalogue, kill, shown)

    # -- reading ----------------------------------------------------------------------

    def _split(self, data: bytes) -> None:
        head, block = self._splitter.split(data)
        if head is not None:
            self._read_facts(head)
            self._lines([head])
        if block is None:
            return
        if not repeats.dense(block):
            self._block(block)
            return
        done = 0
        for start, unit, copies in repeats.repeats(block):
            # Read copies until they fill every window the state keeps, the last one alone:
            # what it adds to the counts is what each further copy would add.
            lines = block.count(b"\n", start, start + unit)
            read = repeats.copies_to_read(lines)
            last = start + unit * (read - 1)
            self._block(block[done : last - 1])
            refusals = self._refusals
            self._block(block[last : last + unit - 1])
            self._skip(lines, copies - read, self._refusals - refusals)
            done = start + unit * copies
        if done <= len(block):
            self._block(block[done:])

    def _skip(self, lines: int, copies: int, refusals: int) -> None:
        """Count ``copies`` more copies of the ``lines`` lines just read, without reading them.

        Every line number the state keeps from the copy just read moves to the same line
        of the last copy, and what the copy added to the count of refused requests is
        added again for each, as if each copy had been read (``triage.repeats``).
        """
        old = self._number
        shift = lines * copies
        first = old - lines + 1

        def moved(number: int) -> int:
            return number + shift if first <= number <= old else number

        self._number = old + shift
        self._adjacent, self._message_end = moved(self._adjacent), moved(self._message_end)
        self._dump_end = moved(self._dump_end)
        if self._prev is not None and first <= self._prev.number <= old:
            self._prev = replace(self._prev, number=moved(self._prev.number))
        self._refusals += refusals * copies

    def _block(self, block: bytes) -> None:
        """Read a block of whole lines (joined by ``\\n``, without the last terminator)."""
        self._read_facts(block)
        lines = block.split(b"\n")
        if self._block_needs_lines(block):
            self._lines(lines)
            return
        # The fast path: only the lines that are not INFO or DEBUG reach Python code, and
        # of those, WARNING lines that cannot matter go no further (no signature can hit).
        base, previous = self._number, self._last_raw
        answer: tuple[int, int | None] = (-1, None)  # the next access line: index, status
        for index in self._warnings.loud(block, lines):
            self._line(base + index + 1, lines[index], lines[index - 1] if index else previous)
            if self._unanswered:
                if answer[0] <= index:
                    answer = _next_answer(lines, index + 1)
                if answer[1] is not None:
                    self._answered(answer[1])
        self._number = base + len(lines)
        self._last_raw = lines[-1]

    def _block_needs_lines(self, block: bytes) -> bool:
        """Whether a quiet line of ``block`` may matter (a readiness marker, a signature, a
        reached line)."""
        if self._ready_line is None and any(m in block for m in _READY_BYTES):
            return True
        if self._unanswered and b"HTTP/" in block:
            return True
        if self._starting and any(m in block for m in SERVING_MARKERS):
            return True
        if self._shutdown_line is None and SHUTDOWN_MARKER in block:
            return True
        return self._watched and self._may_hit(block.decode("utf-8", "replace"))

    @property
    def _watched(self) -> bool:
        """Whether any line pattern is watched for (signatures or reached lines)."""
        return bool(self._signatures) or bool(self._reached_lines)

    @property
    def _starting(self) -> bool:
        """Whether the server has not said it is serving yet (``SERVING_MARKERS``).

        The engine states what it chose and sized, and enters a crash's code path, while
        it starts; after that, facts and reached lines are no longer searched for (a log
        can be gigabytes of requests). Lines are judged in order, whatever the chunks.
        """
        return self._serving_line is None

    def _read_facts(self, lines: bytes) -> None:
        """Read the facts of ``lines`` before the line that says the server is serving."""
        if not self._starting:
            return
        serving = [at for at in map(lines.find, SERVING_MARKERS) if at >= 0]
        if serving:
            lines = lines[: lines.rfind(b"\n", 0, min(serving)) + 1]
        self._facts.feed(lines)

    def _note_serving(self, number: int, raw: bytes) -> None:
        if self._serving_line is None and any(m in raw for m in SERVING_MARKERS):
            self._serving_line = number

    def _may_hit(self, text: str) -> bool:
        if self._signatures.block_may_hit(text):
            return True
        return self._starting and self._reached_lines.block_may_hit(text)

    def _lines(self, lines: list[bytes]) -> None:
        """Read every line, quiet ones included."""
        number, before = self._number, self._last_raw
        for raw in lines:
            number += 1
            if is_quiet(raw) or self._skippable_warning(raw):
                self._quiet(number, raw)
            else:
                self._line(number, raw, before)
            before = raw
        self._number, self._last_raw = number, before

    def _recorded_kill(self, text: str) -> None:
        """Read one of the harness's records of an OOM kill (JSON; a broken one is no kill)."""
        try:
            record = json.loads(text)
        except ValueError:
            return
        said = line_of(record) if isinstance(record, dict) else None
        if said is not None:
            self._kills.append(said)
            self._cause_seen = True  # a cause: a live triage may stop once the engine ends

    def _skippable_warning(self, raw: bytes) -> bool:
        if not self._warnings.skippable(raw):
            return False
        return not self._watched or not self._may_hit(decode(raw))

    def _quiet(self, number: int, raw: bytes) -> None:
        if self._ready_line is None and any(m in raw for m in _READY_BYTES):
            self._ready_line = number
        if self._shutdown_line is None and SHUTDOWN_MARKER in raw:
            self._shutdown_line = number
        if self._unanswered:
            status = http_status(raw)
            if status is not None:
                self._answered(status)
        self._note_serving(number, raw)
        if self._watched:
            line = parse_line(number, decode(raw))
            self._saw_scenarios(self._signatures.line_hits(line, quiet=True))
            if self._starting:
                self._saw_reached(self._reached_lines.line_hits(line, quiet=True))

    def _line(self, number: int, raw: bytes, before: bytes | None = None) -> None:
        """Read a line that is not INFO or DEBUG; ``before`` is the raw line before it."""
        line = parse_line(number, decode(raw))
        if self._prefixes and line.level is None and line.stream is None:
            rest = self._prefixes.remove(line.text)
            line = reparse(line, rest) if rest is not None else line
        glued = after_progress_bar(line.text)
        if glued is not None:
            if not glued.strip():
                self._quiet(number, raw)
                return
            line = reparse(line, glued)  # the line printed after the bar, without a break
        if line.level in QUIET_LEVELS:
            self._quiet(number, raw)
            return
        if raw.startswith(_OOM_RECORD):  # the line's own start, not one after a "\r"
            self._recorded_kill(decode(raw[len(_OOM_RECORD) :]))
            return
        if line.raw.startswith(_OWN_PROTOCOL) or (
            self._kills and line.raw.startswith(_HARNESS_KILL)
        ):
            return  # a kill recorded as data is not read again from its words for people
        if self._ready_line is None and any(m in line.raw for m in READY_MARKERS):
            self._ready_line = number
        self._note_serving(number, raw)
        if self._dump_piece(line, before):
            return
        hits = self._signatures.line_hits(line, quiet=False) if self._signatures else ()
        self._saw_scenarios(hits)
        if self._reached_lines and self._starting:
            self._saw_reached(self._reached_lines.line_hits(line, quiet=False))
        adjacent = number == self._adjacent + 1
        if not line.text.strip():
            # Blank lines (doubled in many pastes) neither end a message nor start one.
            self._adjacent = number if adjacent else self._adjacent
            return
        stream = self._stream(line.stream)
        stream.awaiting = [f for f in stream.awaiting if f.add_after(line.raw)]
        # The harness speaks for itself, even inside a traceback a kill cut short (its line
        # would otherwise be read as the last frame's source line).
        own = line.raw.startswith(HARNESS_LINE)
        step = self._reader.cut(line) if own else self._reader.read(line)
        if step.opened:
            self._prefixes.learn(line)
        if step.opened and stream.pending_error is not None:
            # V0 and plain logging print the message first, then its traceback: the two are
            # one failure, stated by the exception once the traceback ends.
            stream.introducing, stream.introduced = stream.pending_error, line.record
        elif step.opened and self._wraps(line):
            # An exception whose message goes on with a traceback of its own (another
            # runtime's, serialized): a wrapper, stated by the exception ending that body.
            stream.introducing, stream.introduced = self._message, line.record
        elif stream.pending_error is not None:
            self._cause_seen = True  # the ERROR line stood alone
        stream.pending_error = None
        for raised in step.raised:
            self._raised(raised, line, stream)
        if not step.consumed and not (adjacent and self._continues(line)):
            if self._fragment(line, before, adjacent=adjacent):
                return
            self._plain(line, stream, bool(hits))
        stream.recent.append(line.raw)
        self._prev, self._adjacent = line, number

    def _wraps(self, line: Line) -> bool:
        """Whether the traceback ``line`` opens is the body of the exception just read.

        Python prints a chained exception after a marker line and its own header; a
        frame that follows an exception's message (or its continuation lines, such as
        ``Traceback of TorchScript, serialized code (...):``) directly, in the same
        record, is that exception's body: a wrapper that carried another runtime's
        traceback up, whose last exception states the failure.
        """
        head = self._message
        if head is None or head.seq < 0 or head.kind is not Kind.EXCEPTION:
            return False
        if head.line.record != line.record or self._message_end != self._prev_number():
            return False
        return not line.text.rstrip().endswith(TRACEBACK_HEADER)

    def _dump_piece(self, line: Line, before: bytes | None) -> bool:
        """Read ``line`` as a piece of a dump, if it is one (``_dump_cut``)."""
        cut = self._dump_cut(line, before)
        if cut is None:
            return False
        self._learn_wrap(cut)
        if self._dump_end != line.number - 1:
            self._withdraw(line.number - 1)  # the dump began there, its marker cut short
        self._dump_end, self._prev, self._adjacent = line.number, line, line.number
        return True

    def _dump_cut(self, line: Line, before: bytes | None) -> str | None:
        """The line that ``line`` continues, when ``line`` is a piece of a dump that a paste
        or a terminal hard-wrapped onto a line of its own; None when it is not.

        A piece follows the dump (or its previous piece) directly, carries no prefix
        or header of its own, holds the dump's items (``name=value``, ``'name':
        value``), and is no line of a traceback nor the harness's. The cut may fall
        inside the words that mark the dump (``non-default ar`` + ``gs: {...``).
        """
        if not is_dump_piece(line):
            return None
        if self._dump_end == line.number - 1 and self._prev is not None:
            return self._prev.raw
        if before is None:
            return None
        cut = decode(before)
        return cut if is_dump(cut + line.text) else None

    def _withdraw(self, number: int) -> None:
        """Line ``number``, taken for a finding, turned out to begin a dump: it states nothing."""
        last = self._findings[-1] if self._findings else None
        if last is None or last.line.number != number:
            return
        self._findings.pop()
        self._kept[self._tier_of.pop(last.seq)] -= 1
        self._unanswered = deque((f for f in self._unanswered if f is not last), MAX_UNANSWERED)
        if self._last_errors and self._last_errors[-1] == last.line.raw:
            self._last_errors.pop()
        stream = self._stream(last.line.stream)
        if stream.pending_error is last:
            stream.pending_error = None
        self._absorb(last.line)

    def _continues(self, line: Line) -> bool:
        """A continuation line of the last message (same record, right after it)."""
        head = self._message
        if head is None or head.kind is Kind.ASSERT or self._message_end != self._prev_number():
            return False
        # The harness speaks for itself: its line after a bare traceback (both without a
        # process prefix) is a new message, not the end of the exception's.
        if head.line.record != line.record or line.raw.startswith(HARNESS_LINE):
            return False
        if head.seq >= 0:
            head.add_detail(line)
        self._message_end = line.number
        return True

    def _fragment(self, line: Line, before: bytes | None, *, adjacent: bool) -> bool:
        """Read ``line`` as the hard-wrapped rest of the line before it, if it is one."""
        prev = self._prev if adjacent else self._skipped(line, before)
        if prev is None or not self._is_fragment(line, prev):
            return False
        self._learn_wrap(prev.raw)
        if adjacent:
            self._join_fragment(line)
        self._adjacent = line.number
        return True

    def _is_fragment(self, line: Line, prev: Line) -> bool:
        """The rest of ``prev``, the line before it, hard-wrapped by a paste at a fixed width.

        In a log whose lines carry process prefixes, a bare line right after a
        long prefixed one that says nothing on its own is taken as its remainder.
        Once the width the paste cut lines at is known, a bare line after a line of
        exactly that width is its remainder whatever it says, and is read at that
        line's level: the rest of an INFO line states nothing, the rest of a warning
        only what a warning can.
        """
        if prev.stream is None or len(prev.raw) < MIN_WRAP:
            return False
        if line.stream is not None or line.level is not None:
            return False
        if len(prev.raw) != self._wrap_width:
            return self._catalogue.match(line.text) is None
        if prev.level in QUIET_LEVELS:
            return True
        return self._catalogue.match(line.text, warning=prev.level == "WARNING") is None

    def _skipped(self, line: Line, before: bytes | None) -> Line | None:
        """The line right before ``line`` when the fast path skipped it unread and it is
        exactly as wide as this paste cuts lines: read now, as the line ``line`` may end."""
        if before is None or not self._wrap_width:
            return None
        text = decode(before)
        return parse_line(line.number - 1, text) if len(text) == self._wrap_width else None

    def _learn_wrap(self, cut: str) -> None:
        """A line was cut at ``len(cut)`` characters: the width of this paste, when long."""
        if len(cut) >= MIN_WRAP:
            self._wrap_width = len(cut)

    def _join_fragment(self, line: Line) -> None:
        head = self._message
        if head is not None and head.seq >= 0 and self._message_end == self._prev_number():
            if head.detail:
                head.detail[-1] += line.text
            elif head.kind is not Kind.ASSERT:
                head.message += line.text

    def _prev_number(self) -> int:
        return self._prev.number if self._prev is not None else 0

    def _plain(self, line: Line, stream: _Stream, signature_hit: bool) -> None:
        """A line outside any traceback: an ERROR, a catalogued message, or nothing.

        Indented lines and numbered source listings (IPython's ``---> 241 ...``)
        continue or illustrate something else: they never state a cause alone.
        """
        if is_dump(line.text):
            self._absorb(line)  # its continuation lines are the dump too
            self._dump_end = line.number
            return
        level = line.level
        cause = self._catalogue.match(line.text, warning=level == "WARNING")
        if cause is not None and cause.after_shutdown_noise and self._shutdown_line is not None:
            return  # the engine's own orderly shutdown ended it
        if cause is not None and cause.role in (Role.CONSEQUENCE, Role.NOISE):
            if cause.role is Role.CONSEQUENCE:
                self._consequence(line, fatal=cause.fatal)
            return
        if line.text[:1].isspace() or _LISTING.match(line.text):
            return
        erring = level in ("ERROR", "CRITICAL")
        # A compiler's own error states a cause, whatever prefix it lacks (gcc writes
        # straight to the process's stderr).
        recognised = cause is not None or signature_hit or is_compiler_error(line.text)
        if not recognised:
            if erring:
                stream.pending_error = self._store(self._finding(line, Kind.ERROR, stream))
            return
        kind = Kind.ERROR if erring else Kind.MATCH
        finding = self._finding(line, kind, stream)
        finding.signature = signature_hit
        self._store(finding)
        if kind is Kind.ERROR:
            stream.pending_error = finding

    def _raised(self, raised: Raised, line: Line, stream: _Stream) -> None:
        finding = _of_raised(raised, self._next_seq(), stream, raised.relation)
        if stream.introducing is not None and stream.introduced == line.record:
            stream.introducing.header, stream.introducing = True, None
        if raised.announced_by is not None:
            self._introduced_by(raised.announced_by)
        if raised.line is not line:
            finding.after.append(line.raw)
        self._store(finding)
        self._message, self._message_end = finding, line.number

    def _introduced_by(self, announcing: Line) -> None:
        """The exception on ``announcing`` only introduced the one its message announced."""
        for finding in reversed(self._findings):
            if finding.line is announcing:
                finding.header = True
                return

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq - 1

    def _finding(self, line: Line, kind: Kind, stream: _Stream) -> Finding:
        return Finding(
            seq=self._next_seq(),
            line=line,
            kind=kind,
            process=line.process,
            message=line.text.strip(),
            before=tuple(stream.recent),
        )

    def _store(self, finding: Finding) -> Finding:
        tier = reasoning.rank(finding, self._catalogue)
        if tier is Tier.CONSEQUENCE:
            self._consequence(finding.line, fatal=self._is_fatal(finding))
            return finding
        if tier is Tier.REQUEST:
            self._refuse(finding)
            self._message, self._message_end = finding, finding.line.number
            self._await_answer(finding)
            return finding
        if tier is not Tier.WAITING:  # a statement of what it waits for is no error
            self._last_errors.append(finding.line.raw)
            if finding.kind is not Kind.ERROR:
                self._cause_seen = True
        self._drop_replaced_lookup(finding)
        if self._kept[tier] < MAX_PER_TIER:
            self._kept[tier] += 1
            self._tier_of[finding.seq] = tier
            self._findings.append(finding)
            self._message, self._message_end = finding, finding.line.number
            stream = self._stream(finding.line.stream)
            stream.awaiting = [*stream.awaiting[-3:], finding]
            self._await_answer(finding)
        return finding

    def _drop_replaced_lookup(self, finding: Finding) -> None:
        """A lookup error replaced "during handling" by ``finding`` stops being kept when it
        was itself a replacement in its chain: rule 4 walks from the chain's first exception
        past every lookup error to the first that is not one (or the last), and only that
        walk's ends matter. So a chain of any length keeps two findings, not one per link,
        and is never cut at the number of findings a rank keeps."""
        if finding.relation is not Relation.CONTEXT or finding.chain is None:
            return
        last = next((f for f in reversed(self._findings) if f.chain == finding.chain), None)
        if last is None or last.relation is not Relation.CONTEXT:
            return  # the chain's first exception, where the walk starts, stays
        if not reasoning.is_lookup_error(last):
            return
        self._findings = [f for f in self._findings if f is not last]
        self._kept[self._tier_of.pop(last.seq)] -= 1

    def _await_answer(self, finding: Finding) -> None:
        """A failure after start-up waits for the server's answer to the request it was in."""
        if self._ready_line is not None and finding.line.number > self._ready_line:
            self._unanswered.append(finding)

    def _answered(self, status: int) -> None:
        """The server answered the request the waiting failures belong to with ``status``.

        A 4xx answer means the API server refused that request and went on serving: its
        own failures are request errors, no longer candidates for the root cause.
        """
        if status >= 500 and self._serving_line is not None and self._died_line is None:
            self._died_line = self._number  # the server failed a request: a failure of it
        for finding in self._unanswered:
            finding.status = status
            candidate = any(f is finding for f in self._findings)
            if candidate and 400 <= status < 500 and same_process("APIServer", finding.process):
                self._findings = [f for f in self._findings if f is not finding]
                self._kept[self._tier_of.pop(finding.seq)] -= 1
                self._refuse(finding)
        self._unanswered.clear()

    def _refuse(self, finding: Finding) -> None:
        if finding.header:
            return  # the ERROR line that introduced a refused request's traceback
        self._refusals += 1
        if len(self._refused) < MAX_REQUEST_ERRORS:
            self._refused.append(finding)

    def _is_fatal(self, finding: Finding) -> bool:
        cause = self._catalogue.match(finding.statement(), finding.exception)
        return cause is not None and cause.fatal

    def _absorb(self, line: Line) -> None:
        """Make ``line`` the last message without a finding: its continuation lines go too."""
        self._message = Finding(seq=-1, line=line, kind=Kind.MATCH, process=line.process)
        self._message_end = line.number

    def _consequence(self, line: Line, *, fatal: bool) -> None:
        self._absorb(line)
        if fatal:
            self._final_error, self._fatal_seen = line.raw, True
            if self._serving_line is not None and self._died_line is None:
                self._died_line = line.number
        repeated = bool(self._last_errors) and self._last_errors[-1] == line.raw
        if not line.text[:1].isspace() and not repeated:
            self._last_errors.append(line.raw)

    def _stream(self, key: str | None) -> _Stream:
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream()
        return stream

    def _saw_scenarios(self, ids: tuple[str, ...]) -> None:
        for scenario_id in ids:
            self._scenarios_seen[scenario_id] = None

    def _saw_reached(self, ids: tuple[str, ...]) -> None:
        for scenario_id in ids:
            self._reached_seen[scenario_id] = None

    def _truncated(self) -> list[Finding]:
        """Asserts that end tracebacks the log cut off (read at the end, not kept)."""
        found: list[Finding] = []
        for raised in self._reader.pending():
            stream = self._stream(raised.line.stream)
            found.append(_of_raised(raised, self._next_seq(), stream, None))
        return found

    def _reading(self) -> reasoning.LogReading:
        notes: tuple[str, ...] = ()
        if self._source.binary:
            notes = ("the input is not text: it holds binary data",)
        if self._reader.open_tracebacks():
            notes += ("the log ends inside a traceback: it was cut off before its exception",)
        # A refused request's message that turned out to introduce its traceback (V0 prints
        # the message first) is not listed apart: the exception ending it is.
        shown = [f for f in self._refused if not f.header]
        stated = self._facts.facts
        by_fact = [sid for sid, test in self._reached_facts if facts.holds(test, stated)]
        return reasoning.LogReading(
            request_errors=tuple(_request_error(f) for f in shown),
            requests_refused=self._refusals - (len(self._refused) - len(shown)),
            lines_read=self._number,
            ready_line=self._ready_line,
            final_error=self._final_error,
            last_errors=tuple(self._last_errors),
            signature_seen=bool(self._scenarios_seen),
            scenarios_seen=tuple(self._scenarios_seen),
            notes=notes,
            facts=stated,
            reached_seen=tuple(dict.fromkeys([*self._reached_seen, *by_fact])),
            serving_line=self._serving_line,
            died_line=self._died_line,
            binary=self._source.binary,
            nul_bytes=self._source.nul_bytes,
            ends_in_traceback=self._reader.open_tracebacks(),
        )


def _next_answer(lines: Sequence[bytes], start: int) -> tuple[int, int | None]:
    """The first access line from ``start`` on: its index and status (none: the end, None)."""
    for index in range(start, len(lines)):
        status = http_status(lines[index])
        if status is not None:
            return index, status
    return len(lines), None


def _request_error(finding: Finding) -> RequestError:
    line = finding.line
    return RequestError(line.raw, line.number, finding.headline(), finding.status)


def _of_raised(raised: Raised, seq: int, stream: _Stream, relation: Relation | None) -> Finding:
    """A finding for an exception the traceback reader completed, with the lines before it."""
    return Finding(
        seq=seq,
        line=raised.line,
        kind=raised.kind,
        process=raised.process,
        exception=raised.exception,
        message=raised.message,
        frames=raised.frames,
        chain=raised.chain,
        relation=relation,
        before=tuple(stream.recent),
    )


def triage_stream(stream: BinaryIO, scenarios: Sequence[Scenario] = ()) -> Diagnosis:
    """Diagnose a whole log read from a binary stream (gzip-compressed or not)."""
    triager = Triager(scenarios)
    for chunk in _chunks(stream):
        triager.feed(chunk)
    return triager.diagnose()


def triage_path(path: Path | str, scenarios: Sequence[Scenario] = ()) -> Diagnosis:
    """Diagnose the log in a file; raises ``OSError`` when it cannot be read."""
    with open(path, "rb") as handle:
        return triage_stream(handle, scenarios)


def log_lines(stream: BinaryIO) -> Iterator[str]:
    """The lines of a whole log as triage reads them, in bounded memory: gzip-compressed or
    not, UTF-16 or UTF-8 with or without a byte order mark, NUL runs skipped, each line
    cut at ``MAX_LINE_BYTES`` and decoded (its ``\\r`` terminator gone). Binary input has
    none."""
    source, splitter = ByteSource(), LineSplitter()

    def lines(text: bytes) -> Iterator[str]:
        head, block = splitter.split(text)
        if head is not None:
            yield decode(head)
        if block is not None:
            yield from map(decode, block.split(b"\n"))

    for chunk in _chunks(stream):
        yield from lines(source.push(chunk))
    yield from lines(source.finish())
    tail = splitter.flush()
    if tail is not None:
        yield decode(tail)


def _chunks(stream: BinaryIO) -> Iterator[bytes]:
    first = stream.read(READ_CHUNK)
    if first[:2] != b"\x1f\x8b":
        yield first
        yield from iter(lambda: stream.read(READ_CHUNK), b"")
        return
    yield from _gunzip(first, stream)


def _gunzip(first: bytes, stream: BinaryIO) -> Iterator[bytes]:
    """Decompress gzip members as they arrive, never more than a chunk at a time."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    data, started = first, False
    while data:
        while data:
            started = True
            yield inflater.decompress(data, READ_CHUNK)
            data = inflater.unconsumed_tail
            if inflater.eof:
                data, started = inflater.unused_data, False
                inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        data = stream.read(READ_CHUNK)
    if started and not inflater.eof:
        raise EOFError("the gzip data ends before its end-of-stream marker (a truncated file?)")


class WarningFilter:
    """Tells the WARNING lines that no rule of the catalogue or the reader can use, and the
    progress bars (which state no cause whatever their label says)."""

    def __init__(self, catalogue: Catalogue) -> None:
        self._patterns, self._literals, self._runs = _warning_tests(catalogue.causes)
        self._structural = frozenset(range(len(_STRUCTURAL)))
        self._seen: dict[bytes, bool] = {}
        self._mostly_loud = False  # most lines of the last block were neither INFO nor DEBUG

    def skippable(self, raw: bytes) -> bool:
        """Whether ``raw`` is a WARNING line that cannot matter to the diagnosis."""
        key = raw.translate(_DIGITS)
        known = self._seen.get(key)
        return self._decide(key) if known is None else known

    def loud(self, block: bytes, lines: Sequence[bytes]) -> list[int]:
        """The indices of ``lines`` (``block`` split at its line feeds) that are neither INFO
        or DEBUG lines nor skippable, in order.

        Lines already decided cost a translation and a dictionary look-up, both run by C
        code over the whole list; only the others reach ``_decide``. Where most lines of the
        last block were loud (a log of warnings or of progress bars), the look-up comes
        first: a line whose key is known skippable is loud too (whether a line is INFO does
        not depend on its digits), and is not tried by the INFO expression (a microsecond
        a line on a progress bar, which it reads far into).
        """
        return (
            self._loud_by_key(block, lines)
            if self._mostly_loud
            else self._loud_by_level(block, lines)
        )

    def _loud_by_key(self, block: bytes, lines: Sequence[bytes]) -> list[int]:
        keys = block.translate(_DIGITS).split(b"\n")
        unsure = list(
            compress(range(len(lines)), map(is_not, map(self._seen.get, keys), repeat(True)))
        )
        chosen = [index for index in unsure if not QUIET.match(lines[index])]
        quiet = len(unsure) - len(chosen)  # the lines known skippable are loud ones
        self._mostly_loud = (len(lines) - quiet) * 4 > len(lines)
        return [index for index in chosen if not self._decide(keys[index])]

    def _loud_by_level(self, block: bytes, lines: Sequence[bytes]) -> list[int]:
        chosen = list(compress(range(len(lines)), map(not_, map(QUIET.match, lines))))
        self._mostly_loud = len(chosen) * 4 > len(lines)
        if self._mostly_loud:  # most lines: translate the block in one call
            translated = block.translate(_DIGITS).split(b"\n")
            keys = list(map(translated.__getitem__, chosen))
        else:
            keys = list(map(bytes.translate, map(lines.__getitem__, chosen), repeat(_DIGITS)))
        unsure = compress(
            zip(chosen, keys, strict=True), map(is_not, map(self._seen.get, keys), repeat(True))
        )
        return [index for index, key in unsure if not self._decide(key)]

    def _decide(self, key: bytes) -> bool:
        # The whole decision depends on the line with its digits read as 0 (the header's
        # patterns take any digit), so it is cached under that key.
        skippable = self._patterns is not None and _PLAIN_WARNING.match(key) is not None
        skippable = skippable and not self._may_matter(key)
        skippable = skippable or is_bare_progress_bar(key)
        if len(self._seen) >= MAX_CACHED:
            self._seen.clear()
        self._seen[key] = skippable
        return skippable

    def _may_matter(self, key: bytes) -> bool:
        # One pass over the whole line (the header's tag may hold a literal too).
        present = set(self._literals.present(key))
        if not self._structural.isdisjoint(present):
            return True
        return any(present.issuperset(group) for group in self._runs)


@functools.lru_cache(maxsize=16)  # a triager for each log, most with the same catalogue
def _warning_tests(
    causes: tuple[Cause, ...],
) -> tuple[tuple[tuple[bytes, ...], ...] | None, LiteralSet, tuple[tuple[int, ...], ...]]:
    """The warning literals of ``causes``, one set of every literal (the structural ones
    first) and each pattern's literals as indices into it; none of them ever changes."""
    patterns = _warning_literals(causes)
    runs = sorted({run for runs in patterns or () for run in runs})
    literals = LiteralSet(tuple(_STRUCTURAL) + tuple(runs))
    groups = tuple(
        tuple(len(_STRUCTURAL) + runs.index(run) for run in group) for group in patterns or ()
    )
    return patterns, literals, groups


def _warning_literals(causes: Sequence[Cause]) -> tuple[tuple[bytes, ...], ...] | None:
    """For each pattern that applies at warning level, the literals a match must contain.

    None when one of them has no literal of three characters or more to tell it by.
    """
    found: set[tuple[bytes, ...]] = set()
    for cause in causes:
        if cause.role is Role.CAUSE and not cause.as_warning:
            continue
        for pattern in cause.patterns:
            runs = tuple(r.encode().translate(_DIGITS) for r in required_literals(pattern))
            if not runs or len(runs[0]) < 3:
                return None
            found.add(runs)
    return tuple(sorted(found))
