"""Text from logs and user files, made safe to show on a terminal.

A vLLM log or a matrix value may hold escape sequences (OSC sets the window
title or the clipboard, CSI clears the screen, BEL rings) or characters that
reorder what follows (bidi overrides). Everything repromatrix echoes from such
text goes through ``visible``, which writes each of them as a Python-style
escape (``\\x1b``, ``\\x9b``, ``\\u202e``) so a person sees it and the terminal
does not act on it. Colour codes (SGR, ``\x1b[1;36m``), which vLLM prints
around process names, are dropped: they change no text, and escaped they
would only clutter the line.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls, bidi marks, embeddings, overrides and
# isolates, line and paragraph separators, and the byte-order mark.
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]"
)
_UNSAFE_IN_LINE = re.compile(f"{_UNSAFE.pattern}|\n")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, *, multiline: bool = False) -> str:
    """``text`` with every control character written as a visible escape.

    A newline is kept when ``multiline`` (a whole report), and escaped
    otherwise (one line: a progress line, a log line shown on its own).
    """
    return (_UNSAFE if multiline else _UNSAFE_IN_LINE).sub(_escape, _COLOUR.sub("", text))


def escape_json(text: str) -> str:
    """JSON text with the controls ``json.dumps(ensure_ascii=False)`` leaves raw escaped.

    They become ``\\uXXXX``, so the JSON still reads back to the same values.
    """
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
