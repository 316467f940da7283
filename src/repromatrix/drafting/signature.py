"""A root cause's line generalised into a signature pattern: the same crash with other
numbers, paths, pids, addresses or sizes matches; the words stay literal.

The pattern keeps to the subset ``re`` and ``grep -E`` share (literals, bracket classes,
``+`` and ``*`` on one class), which RE2 takes (``patterns.regex_problem``): every
signature is matched by RE2.
"""

from __future__ import annotations

import re

from repromatrix.results.store import RootCause
from repromatrix.secret_env import REDACTED, redact_text

MAX_TEXT = 120  # characters of the cause's text kept: enough to tell one crash from another
_TOKENS = re.compile(
    rf"(?P<secret>{re.escape(REDACTED)})"
    r"|(?P<address>0x[0-9a-fA-F]+)"
    r"|(?P<path>(?<![\w.])/[^\s'\"(),:;\]]*)"
    r"|(?P<hex>\b(?=[0-9a-f]{6})[0-9a-f]*[0-9][0-9a-f]*[a-f][0-9a-f]*\b)"
    r"|(?P<number>(?<![A-Za-z_])[0-9]+(?:[.,][0-9]+)*)"
)
_GENERAL = {
    "secret": "[^ '\"]+",  # a token the log held: any, as the log never shows it
    "address": "0x[0-9a-fA-F]+",
    "path": "/[^ '\"]*",
    "hex": "[0-9a-f]+",
    "number": "[0-9][0-9.,]*",
}
_SPECIAL = re.compile(r"([.^$*+?{}\[\]\\|()])")


def cause_text(cause: RootCause) -> str:
    """The part of the cause's line the signature is made of: from its exception type (where
    the line shows ``Type: message``), else its message, else the whole line; cut to
    ``MAX_TEXT`` characters at a word's end. A secret the line holds is redacted first, so
    its shape is found whole, before generalising could cut it apart."""
    line = redact_text(cause.line)
    start = -1
    if cause.exception:
        start = line.find(f"{cause.exception}: ")
    if start < 0 and cause.message:
        start = line.find(redact_text(cause.message)[:40])
    text = line[start:] if start >= 0 else line.strip()
    return _cut(text.rstrip())


def _cut(text: str) -> str:
    if len(text) <= MAX_TEXT:
        return text
    cut = text[:MAX_TEXT]
    space = cut.rfind(" ")
    return cut[:space] if space > MAX_TEXT // 2 else cut


def generalise(text: str) -> str:
    """``text`` as a pattern: numbers, paths, hex ids and addresses as classes, the rest
    escaped literally."""
    parts: list[str] = []
    at = 0
    for match in _TOKENS.finditer(text):
        parts.append(_literal(text[at : match.start()]))
        parts.append(_GENERAL[match.lastgroup or "number"])
        at = match.end()
    parts.append(_literal(text[at:]))
    return "".join(parts)


def _literal(text: str) -> str:
    return _SPECIAL.sub(r"\\\1", text)


def signature_pattern(cause: RootCause) -> str:
    """The signature pattern of a root cause."""
    return generalise(cause_text(cause))
