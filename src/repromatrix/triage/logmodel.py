"""Lines of a vLLM log: its bytes as UTF-8 text, cut into lines, and what each line says.

Logs reach triage in odd encodings: PowerShell's ``>`` writes UTF-16 with a
byte order mark, some tools write it without one, ``logrotate copytruncate``
leaves a run of NUL bytes where the old log was, and a user may pass a binary
file by mistake. ``ByteSource`` looks at the first bytes, decides, and from
then on hands on plain UTF-8 bytes (or nothing, for binary input).

A pasted or streamed log carries more than vLLM printed: docker compose and
``docker logs --timestamps`` wrappers, CI time stamps, ANSI colours, carriage
return progress bars. ``parse_line`` peels those off and then reads vLLM's own
structure: the process prefix (``(EngineCore_DP0 pid=7)``, ``(RayWorkerWrapper
pid=7, ip=10.0.0.2)``, ``[rank0]:``...), the logger header (``ERROR 11-29
18:28:58 [core.py:1510]``, the older ``core.py:632]``, glog, NCCL, uvicorn) and
the message. The verbatim line is kept beside the cleaned one: a root cause is
reported exactly as it appeared.

A product that wraps vLLM may put anything before each line (``[worker-3] ``,
``12:00:01.123 w3> ``). A line that ends in ``Traceback (most recent call
last):`` with no level and no known prefix shows such a prefix: the text before
``Traceback``. ``PrefixLearner`` learns its shape (the text with each run of
digits free, since time stamps and counters change from line to line), and
later lines that start with the same shape are read without it, so the
traceback's frames and its exception line are read as such.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import AnyStr

MAX_LINE_BYTES = 16 * 1024  # longer lines are cut: a gigantic line must not fill memory

# Lines at these levels never state a cause; they are only searched for scenario
# signatures and readiness markers.
QUIET_LEVELS = frozenset({"INFO", "DEBUG"})

# The cheap test the fast path runs on every line, still undecoded, before any other
# work: a vLLM, uvicorn, glog or NCCL line at INFO or DEBUG, under any prefix or wrapper.
QUIET = re.compile(
    rb"(?:\([^()]*\) )?(?:INFO|DEBUG) +\d\d-\d\d \d"  # the common case first: faster
    rb"|(?:\d{4}-\d\d-\d\dT[\d:.]+Z? )?"
    rb"(?:[A-Za-z0-9][\w.-]*\s*\|\s?)?"
    rb"(?:\([^()]*\) |\[rank\d+\]:)*"
    rb"(?:(?:INFO|DEBUG) +(?:\d{4}-)?\d\d-\d\d[T ]\d"
    rb"|INFO:\s"
    rb"|I\d{4} \d\d:"
    rb"|[\w.-]+:\d+:\d+ \[\d+\] NCCL INFO )"
)

_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: titles, hyperlinks
    r"|\x1b_[^\x07\x1b]*(?:\x07|\x1b\\)?"  # APC: Buildkite's time stamps
    r"|\x1b[@-Z\\-_]"
    r"|\^\[\[[0-9;]*[A-Za-z]"  # pasted with the escape shown as ^[
    r"|\[[0-9]{1,3}(?:;[0-9]{1,3})*m"  # pasted with the escape lost
)
_COLOUR_LOST = re.compile(r"\[[0-9]{1,3}[;m]")  # what _ANSI's escape-lost form starts with
_WRAPPER = re.compile(
    # docker --timestamps, CI runners, a logger's time first ("... | ", "... - "), and the
    # container runtime's own log files under Kubernetes ("... stderr F ")
    r"(?:\d{4}-\d\d-\d\d[T ])?\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
    r"(?:\s*[|-]\s+|\s+)(?:(?:stdout|stderr) [FP] )?"
    r"|\[\d{4}-\d\d-\d\d[T ][\d:.,]+(?:Z|[+-][\d:]+)?\]\s*"
    r"|_bk;t=\d+\x07?"  # Buildkite's time stamp, its escape lost
    r"|(?!(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\s*\|)"
    r"[A-Za-z0-9][\w.-]*\s*\|(?: |$)"  # docker compose: "vllm-1  | "
    r"|\[pod/[^\]]+\] "  # kubectl logs --prefix
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [\w.@-]+(?:\[\d+\])?: "  # syslog, journald
)
_PROCESS = re.compile(r"\(([^()]{1,120})\) ?")
_RANK = re.compile(r"\[rank(\d+)\]: ?")
_VLLM_HEADER = re.compile(
    r"(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) +"
    r"(?:(?:\d{4}-)?\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)? +)?"
    r"(?:\[([^\]\s]+)\]|([\w.-]+:\d+)\]) ?"
)
_LOGGING_HEADER = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL):(?:([\w.]+):|\s+)")
# Loggers of products that wrap vLLM: loguru ("ERROR    | module:function:42 - "), Python
# logging's "name - LEVEL - ", bracketed levels ("[ERROR] [engine.py:45] "), Ray's driver
# ("INFO worker.py:1832 -- "), GitHub's "##[error]" annotations.
_LEVELS = "DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL"
_OTHER_HEADERS = (
    re.compile(rf"({_LEVELS}) *\| *(?:([\w.<>-]+(?::[\w<>]+)?:\d+) +- +)?"),
    re.compile(rf"[\w.<>-]+ +- +({_LEVELS}) +- +()"),
    re.compile(rf"\[({_LEVELS})\] *(?:\[([\w.-]+:\d+)\] *)?"),
    re.compile(rf"({_LEVELS}) +([\w.-]+:\d+) -- "),
    re.compile(r"##\[(debug|notice|warning|error)\]()"),
)
# Dumps of the configuration, the arguments or the scheduler's state: they name every
# feature in use, so they are never evidence of a cause.
DUMP = re.compile(
    r"with config: |[Nn]on-default args: |Dumping (?:input data|scheduler|model)"
    r"|\bargs: Namespace\(|^Namespace\("
    r"|\b(?:SchedulerOutput|SchedulerStats|EngineArgs|VllmConfig)\("
)
# A C/C++ or CUDA compiler's own error, as GCC, Clang and nvcc print it: at a source line
# ("file.cpp:31:10: fatal error: ...", "kernel.cu(31): error: ..."), or the driver's own
# ("g++: fatal error: ..."). Warnings and notes are not errors.
_SOURCE = r"\S+\.(?:c|cc|cp|cpp|cxx|c\+\+|h|hh|hpp|hxx|inc|ipp|tcc|cu|cuh|s|S)"
_COMPILER_ERROR = re.compile(
    rf"{_SOURCE}(?::\d+(?::\d+)?:|\(\d+\):) (?:fatal |catastrophic )?error: \S"
    r"|(?:\S*/)?(?:gcc|g\+\+|cc|c\+\+|clang|clang\+\+|cc1|cc1plus|nvcc)(?:-[\d.]+)?: "
    r"fatal error: \S"
)
# A web server's access line: '"POST /v1/completions HTTP/1.1" 400 Bad Request'.
_ACCESS = re.compile(
    rb'"(?:GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) [^" ]+ HTTP/[0-9.]+" ([1-5][0-9][0-9])\b'
)
# The items a dump lists: "name=value, ", "'name': value". A piece of a dump that a paste
# hard-wrapped onto a line of its own holds at least one.
_DUMP_ITEMS = re.compile(r"\w=|, |': ")
_GLOG_HEADER = re.compile(
    r"\[?([IWEF])(?:\d{3,4} \d\d:\d\d:\d\d\.\d+ +(?:\d+ )?| )([\w.-]+:\d+)\] ?"
)
_NCCL_HEADER = re.compile(r"[\w.-]+:\d+:\d+ \[\d+\] (?=NCCL (INFO|WARN|ERROR) )")
_PY_WARNING = re.compile(r"\S+\.pyx?:\d+: \w*Warning: ")
_GLOG_LEVELS = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
_NCCL_LEVELS = {"INFO": "INFO", "WARN": "WARNING", "ERROR": "ERROR"}

# A progress bar (tqdm's, vLLM's "NN% Completed | n/total [elapsed<left, rate]"): the
# percentage, a bar or a bar's separator, and the time elapsed and left. It states no cause.
PROGRESS_BAR = re.compile(rb"[0-9]{1,3}%(?: Completed)? ?\|[^\[\n]*\[[0-9:]+<[0-9:?]+[^\]\n]*\]")
_PROGRESS_TEXT = re.compile(PROGRESS_BAR.pattern.decode())
BAR_REACH = 512  # a bar's label and its figures: where a bar is looked for in a line
# Carriage returns that end no "\r\n": in a log of them, each ends a line.
_LONE_RETURN = re.compile(rb"\r+(?=[^\r\n])")
SNIFF_BYTES = 512  # enough to tell; little held back from a live stream
BINARY_SHARE = 0.10  # of control bytes among the first bytes: more means not a text log
# Control bytes that text logs do not contain (tab, newlines, form feed and ESC they do).
_CONTROL = bytes(b for b in range(32) if b not in b"\t\n\r\x0b\x0c\x1b") + b"\x7f"

MAX_PREFIXES = 4
MAX_PREFIX_CHARS = 80
TRACEBACK_HEADER = "Traceback (most recent call last):"
# A prefix ends in a separator; a sentence ending in ": " ("hit an exception: ") is a message.
_PREFIX_END = re.compile(r"(?:[\]>|)}#]|[^\s:,]\s*-)\s*$")


@dataclass(frozen=True, slots=True)
class Line:
    """One line of a log, verbatim and as vLLM meant it."""

    number: int  # 1-based
    raw: str  # decoded, line terminator stripped, nothing else changed
    text: str  # the message: wrappers, process prefix and logger header removed
    stream: str | None  # who printed it: the pid, or the prefix text; None when unprefixed
    process: str | None  # the process name as printed: "EngineCore_DP0", "Worker_TP0"
    level: str | None  # DEBUG | INFO | WARNING | ERROR | CRITICAL; None without a header
    origin: str | None  # the logger location ("core.py:632"); lines of one record share it

    @property
    def record(self) -> tuple[str | None, str | None, str | None]:
        """The key shared by the lines of one multi-line log record (a logged traceback)."""
        return (self.stream, self.level, self.origin)


def is_quiet(raw: bytes) -> bool:
    """Whether ``raw`` is an INFO or DEBUG line (the fast path skips those)."""
    return QUIET.match(raw) is not None


def decode(raw: bytes) -> str:
    """A line as text: UTF-8 (bytes that are not become U+FFFD), its ``\\r`` terminator gone.

    All trailing ``\\r`` go: a terminal's output copied through a pty ends lines in
    ``\\r\\r\\n``, and nobody sees those characters.
    """
    return raw.decode("utf-8", "replace").rstrip("\r")


def parse_line(number: int, raw: str) -> Line:
    """Read one verbatim line (terminator already stripped) into a ``Line``."""
    raw = raw[:MAX_LINE_BYTES]  # the splitter cut it already; text fed in another way too
    return _parse(number, raw, visible_text(raw))


def reparse(line: Line, text: str) -> Line:
    """``line`` read again from ``text``, what is left once a learnt prefix is removed."""
    return _parse(line.number, line.raw, text)


def _parse(number: int, raw: str, text: str) -> Line:
    text = _strip_wrappers(text)
    text, stream, process = _strip_processes(text)
    level, origin, text = _strip_header(text)
    return Line(number, raw, text, stream, process, level, origin)


def visible_text(raw: str) -> str:
    """What a terminal shows: the last carriage-return segment, without ANSI escapes."""
    text = raw.rstrip("\r")
    if "\r" in text:
        segments = [s for s in text.split("\r") if s.strip()]
        text = segments[-1] if segments else ""
    if "\x1b" in text or "^[" in text or _COLOUR_LOST.search(text):
        text = _ANSI.sub("", text)
    return text


def _strip_wrappers(text: str) -> str:
    # Wrappers stack (a CI time stamp around a compose prefix), so peel a few.
    for _ in range(3):
        match = _WRAPPER.match(text)
        if match is None or match.end() == 0:
            break
        text = text[match.end() :]
    return text


def _strip_processes(text: str) -> tuple[str, str | None, str | None]:
    stream = process = None
    # Prefixes nest ("(Worker pid=613) (Worker_TP3 pid=613) ERROR ..."); the innermost names.
    while True:
        match = _PROCESS.match(text)
        if match is not None and _is_process(match.group(1)):
            stream, process = _process_identity(match.group(1))
        else:
            match = _RANK.match(text)
            if match is None:
                return text, stream, process
            stream = process = f"rank{match.group(1)}"
        text = text[match.end() :]


def _is_process(inner: str) -> bool:
    return "pid=" in inner or "ip=" in inner or inner in ("raylet", "gcs_server")


def _process_identity(inner: str) -> tuple[str, str]:
    name = re.split(r",? *(?:pid|ip)=", inner, maxsplit=1)[0].strip(" ,")
    pid = re.search(r"pid=(\d+)", inner)
    stream = f"pid={pid.group(1)}" if pid else inner
    return stream, name or stream


# Every match of ``DUMP`` holds one of these: a long line is scanned for them, not tried by
# the regex at each of its characters.
_DUMP_LITERALS = (
    "with config: ",
    "on-default args: ",
    "Dumping ",
    "Namespace(",
    "SchedulerOutput(",
    "SchedulerStats(",
    "EngineArgs(",
    "VllmConfig(",
)


def after_progress_bar(text: str) -> str | None:
    """What follows the progress bars a message starts with, when it starts with one (None
    when not): a bar's updates, each within ``BAR_REACH`` characters of the last.

    A bar states no cause, whatever words its label holds; what a stream printed right
    after the bar's last update, without a line break, is a line of its own.
    """
    end = _bars_end(_PROGRESS_TEXT, text) if "%" in text else None
    return None if end is None else text[end:]


def is_bare_progress_bar(key: bytes) -> bool:
    """Whether an undecoded line is progress bars and nothing after them."""
    end = _bars_end(PROGRESS_BAR, key) if b"%" in key else None
    return end is not None and not key[end:].strip()


def _bars_end(bar: re.Pattern[AnyStr], text: AnyStr) -> int | None:
    """Where the progress bars at the start of ``text`` end (None: it starts with none)."""
    end = None
    while (found := bar.search(text, end or 0, (end or 0) + BAR_REACH)) is not None:
        end = found.end()
    return end


def is_dump(text: str) -> bool:
    """Whether a message dumps the configuration, the arguments or the scheduler's state."""
    if not any(map(text.__contains__, _DUMP_LITERALS)):
        return False
    return DUMP.search(text) is not None


def continues_dump(text: str) -> bool:
    """Whether a line without a header of its own may be a wrapped piece of a dump."""
    return _DUMP_ITEMS.search(text) is not None and not is_compiler_error(text)


def is_compiler_error(text: str) -> bool:
    """Whether a message is a C/C++ or CUDA compiler's own error (not a warning or note)."""
    return _COMPILER_ERROR.match(text) is not None


def http_status(raw: bytes) -> int | None:
    """The status a server answered a request with, when ``raw`` is its access line."""
    if b"HTTP/" not in raw:
        return None
    match = _ACCESS.search(raw)
    return int(match.group(1)) if match is not None else None


def _level(name: str) -> str:
    level = name.upper()
    return {"WARN": "WARNING", "FATAL": "CRITICAL", "NOTICE": "INFO"}.get(level, level)


def _strip_header(text: str) -> tuple[str | None, str | None, str]:
    match = _VLLM_HEADER.match(text)
    if match is not None:
        return _level(match.group(1)), match.group(2) or match.group(3), text[match.end() :]
    match = _GLOG_HEADER.match(text)
    if match is not None:
        return _GLOG_LEVELS[match.group(1)], match.group(2), text[match.end() :]
    match = _NCCL_HEADER.match(text)
    if match is not None:
        return _NCCL_LEVELS[match.group(1)], "nccl", text[match.end() :]
    match = _LOGGING_HEADER.match(text)
    if match is not None:
        return match.group(1), match.group(2), text[match.end() :]
    for header in _OTHER_HEADERS:
        match = header.match(text)
        if match is not None:
            return _level(match.group(1)), match.group(2) or None, text[match.end() :]
    if _PY_WARNING.match(text):
        return "WARNING", None, text
    return None, None, text


class LineSplitter:
    """Cuts a byte stream, in chunks of any size, into lines (still bytes).

    A partial last line waits for the next chunk. A line longer than
    ``max_line`` bytes keeps its first ``max_line`` bytes; the rest is dropped
    as it arrives, so memory stays bounded however long the line is.
    """

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self._max = max_line
        self._pending = b""
        self._overflow = False

    @property
    def pending_bytes(self) -> int:
        """Bytes held for the unfinished last line (never more than ``max_line``)."""
        return len(self._pending)

    def split(self, data: bytes) -> tuple[bytes | None, bytes | None]:
        """Feed ``data``; return the line it completes (if any) and a block of further lines.

        The block is the whole lines after that one, joined by ``\\n`` without the
        final terminator (``b""`` is one empty line), or None when there are none.
        """
        first_end = data.find(b"\n")
        if first_end < 0:
            self._hold(data)
            return None, None
        head = self._take(data[: min(first_end, self._max)])
        last_end = data.rfind(b"\n")
        self._hold(data[last_end + 1 : last_end + 2 + self._max])  # a copy of what is kept
        if last_end == first_end:
            return head, None
        return head, self._cut(data[first_end + 1 : last_end])

    def flush(self) -> bytes | None:
        """End of input: return the unfinished last line, if there is one."""
        if not self._pending and not self._overflow:
            return None
        return self._take(b"")

    def _cut(self, block: bytes) -> bytes:
        """``block`` with each line longer than ``max_line`` bytes cut to its first ones.

        Whatever reads the block after this (the facts, the filters, the triager) then reads
        a long line's first ``max_line`` bytes only, as it reads a line that came in pieces.
        A line longer than the limit holds a whole window of half of it without a line break:
        a search for a break in each such window finds one (a memchr) or the long line.
        """
        half = max(self._max // 2, 1)
        windows = range(0, len(block) - half + 1, half)
        if all(block.find(b"\n", start, start + half) >= 0 for start in windows):
            return block
        return b"\n".join([line[: self._max] for line in block.split(b"\n")])

    def _hold(self, data: bytes) -> None:
        if self._overflow:
            return
        room = self._max - len(self._pending)
        if len(data) > room:  # only what is kept is copied
            self._pending += data[:room]
            self._overflow = True
        else:
            self._pending += data

    def _take(self, tail: bytes) -> bytes:
        line = self._pending + tail if not self._overflow else self._pending
        self._pending, self._overflow = b"", False
        return line[: self._max]


class ByteSource:
    """Turns a byte stream, chunk by chunk, into UTF-8 bytes fit for the line splitter.

    A log whose lines end in carriage returns alone (the first line break in it is a
    ``\\r`` that ends no ``\\r\\n``) has them made line feeds: each is a line, as an editor
    and a terminal show it. In a log of line feeds a carriage return inside a line is a
    progress bar's update: the line is read as a terminal shows it (``visible_text``).
    """

    def __init__(self) -> None:
        self._head = b""
        self._started = False
        self._decoder: codecs.IncrementalDecoder | None = None
        self._returns = b""  # carriage returns at the end of the last chunk: what follows?
        self._cr_lines: bool | None = None  # lines end in "\r" alone; None: no break seen yet
        self.binary = False
        self.nul_bytes = 0  # NUL bytes skipped (``logrotate copytruncate`` leaves runs of them)

    def push(self, data: bytes) -> bytes:
        """The text of ``data`` as UTF-8 (nothing until the first bytes have been seen)."""
        if not self._started:
            self._head += data
            return self._lines(self._start()) if len(self._head) >= SNIFF_BYTES else b""
        return self._lines(self._convert(data))

    def finish(self) -> bytes:
        """End of input: whatever is still held back."""
        out = b"" if self._started else self._start()
        if self._decoder is not None and not self.binary:
            out += self._decoder.decode(b"", final=True).encode("utf-8")
        return self._lines(out, final=True)

    def _lines(self, data: bytes, *, final: bool = False) -> bytes:
        """``data`` with its line breaks made line feeds, in a log of carriage returns."""
        if self._returns:
            data, self._returns = self._returns + data, b""
        if self._cr_lines is False or b"\r" not in data:
            if self._cr_lines is None and b"\n" in data:
                self._cr_lines = False
            return data
        if not final:  # what follows a last "\r" decides whether it ends a line
            kept = data.rstrip(b"\r")
            data, self._returns = kept, data[len(kept) :]
        if self._cr_lines is None:
            lone, feed = _LONE_RETURN.search(data), data.find(b"\n")
            if lone is None and feed < 0:
                return data
            self._cr_lines = lone is not None and (feed < 0 or lone.start() < feed)
        # Each carriage return ends a line (two in a row: an empty one), one before a line
        # feed as well; replacing bytes runs at memory speed.
        return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n") if self._cr_lines else data

    def _start(self) -> bytes:
        head, self._head, self._started = self._head, b"", True
        encoding = _utf16(head)
        if encoding is not None:
            self._decoder = codecs.getincrementaldecoder(encoding)("replace")
        else:
            head = head.removeprefix(codecs.BOM_UTF8)
            self.binary = looks_binary(head)
        return self._convert(head)

    def _convert(self, data: bytes) -> bytes:
        if self.binary:
            return b""
        if self._decoder is not None:
            return self._decoder.decode(data).encode("utf-8")
        if b"\x00" not in data:
            return data
        kept = data.replace(b"\x00", b"")
        self.nul_bytes += len(data) - len(kept)
        return kept


def looks_binary(sample: bytes) -> bool:
    """Whether ``sample`` holds too many control bytes to be text (NUL runs aside)."""
    text = sample.replace(b"\x00", b"")
    if not text:
        return False
    control = len(text) - len(text.translate(None, _CONTROL))
    return control > BINARY_SHARE * len(text)


def _utf16(head: bytes) -> str | None:
    """``utf-16`` for a byte order mark, ``utf-16-le``/``-be`` for NULs in every other byte."""
    if head[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        return "utf-16"
    pairs = len(head) // 2
    if pairs < 32:
        return None
    even, odd = head[0 : pairs * 2 : 2].count(0), head[1 : pairs * 2 : 2].count(0)
    if odd > 0.4 * pairs and even < 0.05 * pairs:
        return "utf-16-le"
    if even > 0.4 * pairs and odd < 0.05 * pairs:
        return "utf-16-be"
    return None


class PrefixLearner:
    """Learns unknown line prefixes from traceback headers and strips them from later lines."""

    def __init__(self) -> None:
        self._shapes: list[re.Pattern[str]] = []

    def __bool__(self) -> bool:
        return bool(self._shapes)

    def learn(self, line: Line) -> None:
        """Learn the prefix of ``line`` when it is a traceback header under an unknown prefix."""
        if line.level is not None or line.stream is not None:
            return
        text = line.text.rstrip()
        if not text.endswith(TRACEBACK_HEADER):
            return
        prefix = text[: -len(TRACEBACK_HEADER)]
        if not prefix.strip() or len(prefix) > MAX_PREFIX_CHARS or not _PREFIX_END.search(prefix):
            return
        shape = re.compile(re.sub(r"\d+", r"\\d+", re.escape(prefix.rstrip())) + r" ?")
        if all(s.pattern != shape.pattern for s in self._shapes):
            self._shapes = [*self._shapes[-(MAX_PREFIXES - 1) :], shape]

    def remove(self, text: str) -> str | None:
        """``text`` without a learnt prefix, or None when it carries none."""
        for shape in self._shapes:
            match = shape.match(text)
            if match is not None:
                return text[match.end() :]
        return None
