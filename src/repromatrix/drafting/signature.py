"""A root cause's line generalised into a signature pattern: the same crash with other
numbers, sizes, paths, pids, addresses or object reprs matches; the words stay literal.

A signature keeps what names the failing thing (the exception, the op, the symbol, the
kernel's source file, the flag) and drops or generalises what changes from one launch to
the next: addresses and object reprs (``<... object at 0x...>``), pydantic's echo of the
input (``input_value=ArgsKwargs(...)``, the whole launch), directories, sizes and counts.
A path keeps its file name where that names code (``custom_all_reduce.cuh``,
``_C.abi3.so``): another file is another crash. The text is cut at ``MAX_TEXT``
characters of words, a generalised part counting as one, so a long path never pushes
out the symbol after it.

The pattern keeps to the subset ``re`` and ``grep -E`` share (literals, bracket classes,
``+`` and ``*`` on one class), which RE2 takes (``patterns.regex_problem``): every
signature is matched by RE2.
"""

from __future__ import annotations

import re

from repromatrix.secret_env import REDACTED, redact_text
from repromatrix.triage.diagnosis import RootCause

MAX_TEXT = 120  # characters of words kept: enough to tell one crash from another
_TOKENS = re.compile(
    rf"(?P<secret>{re.escape(REDACTED)})"
    r"|(?P<repr><[A-Za-z_][\w.]* object at 0x[0-9a-fA-F]+>)"
    r"|(?P<address>0x[0-9a-fA-F]+)"
    r"|(?P<path>(?<![\w.])/[^\s'\"(),:;\]]*)"
    r"|(?P<hex>\b(?=[0-9a-f]{6})[0-9a-f]*[0-9][0-9a-f]*[a-f][0-9a-f]*\b)"
    r"|(?P<size>(?<![A-Za-z0-9_])[0-9]+(?:[.,][0-9]+)* ?[KMGT]i?B\b)"
    r"|(?P<number>(?<![A-Za-z0-9_])[0-9]+(?:[.,][0-9]+)*)"
)
_GENERAL = {
    "secret": "[^ '\"]+",  # a token the log held: any, as the log never shows it
    "repr": "<[^>]*>",
    "address": "0x[0-9a-fA-F]+",
    "path": "/[^ '\"]*",
    "hex": "[0-9a-f]+",
    "size": "[0-9][0-9.,]* ?[KMGT]i?B",
    "number": "[0-9][0-9.,]*",
}
# A file name that names code: kept after the generalised directories.
_CODE_FILE = re.compile(r"[A-Za-z_][\w.+-]*\.(?:py|pyx|c|cc|cpp|cu|cuh|h|hpp|so(?:\.[0-9]+)*)")
# Where an echo of the caller's input starts: everything after it is dropped.
_ECHO = re.compile(r",? *input_value=|,? *input_type=")
_SPECIAL = re.compile(r"([.^$*+?{}\[\]\\|()])")


def cause_text(cause: RootCause) -> str:
    """The part of the cause's line the signature is made of: from its exception type (where
    the line shows ``Type: message``), else its message, else the whole line; without an
    echo of the input; cut to ``MAX_TEXT`` characters of words at a word's end. A secret the
    line holds is redacted first, so its shape is found whole, before generalising could cut
    it apart."""
    line = redact_text(cause.line)
    start = -1
    if cause.exception:
        start = line.find(f"{cause.exception}: ")
    if start < 0 and cause.message:
        start = line.find(redact_text(cause.message)[:40])
    text = line[start:] if start >= 0 else line.strip()
    echo = _ECHO.search(text)
    if echo is not None and echo.start() > 0:
        text = text[: echo.start()]
    return _cut(text.rstrip())


def _cut(text: str) -> str:
    """``text`` up to ``MAX_TEXT`` characters of words (each generalised part counts one)."""
    used = 0
    at = 0
    for match in _TOKENS.finditer(text):
        gap = match.start() - at
        if used + gap > MAX_TEXT:
            return _at_word(text, at, at + MAX_TEXT - used)
        used += gap + 1
        at = match.end()
    if used + len(text) - at <= MAX_TEXT:
        return text
    return _at_word(text, at, at + MAX_TEXT - used)


def _at_word(text: str, start: int, end: int) -> str:
    """``text`` cut at ``end``, back to the last space after ``start`` when there is one;
    a word after a colon (``undefined symbol: NAME``) is the name of the thing: kept whole."""
    space = text.rfind(" ", start, end + 1)
    if space <= start:
        return text[:end]
    if text[:space].endswith(":"):
        after = text.find(" ", space + 1)
        return text if after < 0 else text[:after]
    return text[:space]


def generalise(text: str) -> str:
    """``text`` as a pattern: numbers, sizes, paths, hex ids, addresses and object reprs as
    classes (a code file's name kept), the rest escaped literally."""
    parts: list[str] = []
    at = 0
    for match in _TOKENS.finditer(text):
        parts.append(_literal(text[at : match.start()]))
        parts.append(_general(match))
        at = match.end()
    parts.append(_literal(text[at:]))
    return "".join(parts)


def _general(match: re.Match[str]) -> str:
    kind = match.lastgroup or "number"
    if kind == "path":
        folder, _, name = match.group().rpartition("/")
        if folder and _CODE_FILE.fullmatch(name):
            return f"/[^ '\"]*/{generalise(name)}"
    return _GENERAL[kind]


def _literal(text: str) -> str:
    return _SPECIAL.sub(r"\\\1", text)


def signature_pattern(cause: RootCause) -> str:
    """The signature pattern of a root cause."""
    return generalise(cause_text(cause))
