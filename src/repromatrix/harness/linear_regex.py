"""A regular-expression search in time linear in the text, on the standard library alone.

The programs that run inside images match patterns that come from data: the
harness a spec's ``interrupt_on`` on every line of vLLM's output, a probe a
scenario's ``signature``. Python's ``re`` backtracks, and ``(a|a)*$`` or
``ValueError:(.|\\s)*too small$`` on a 70-character line runs for minutes there.
The host matches such patterns with RE2 (``repromatrix.patterns``), which the
images do not have; this module is their RE2. It parses a pattern with Python's
own parser (so what it accepts, and how it reads it, are ``re``'s), compiles it
into a Thompson NFA and runs every state at once over the text, each character
once: a search takes O(len(text) x states) whatever the pattern. The state sets
met are kept as a lazy DFA (bounded), so a typical line costs a dict look-up a
character.

Only ``search`` answering yes or no is offered: groups match but capture nothing,
and a lazy repeat accepts what its greedy form does. Supported: literals, ``.``,
classes (ranges, ``\\d \\w \\s`` and their negations), ``* + ? {m,n}`` and their
lazy forms, alternation, groups, ``^ $ \\A \\Z \\b \\B`` (and RE2's ``\\z``), the
flags ``i m s x a`` (given, inline or scoped), each with ``re``'s (Unicode) meaning.
Bounded repeats are expanded, up to ``MAX_STATES`` instructions. ``Unsupported`` (an
``re.error``) refuses the rest: backreferences, look-arounds, conditionals,
possessive repeats and atomic groups, which RE2 refuses when the file loads, so
they never arrive.

The harness and the probes may import only their own folder, and run from the
package's folders as they are on the local backend, so each folder keeps this
file; a test keeps the two copies identical.
"""

from __future__ import annotations

import importlib
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    CharTest = Callable[[str], bool]
    Instruction = tuple[int, Any, int, int]

# Python's own parser: ``re._parser`` from 3.11 (``sre_parse`` is deprecated there).
_PARSER: Any = importlib.import_module("re._parser" if sys.version_info >= (3, 11) else "sre_parse")
MAX_STATES = 20_000  # instructions of one program, bounded repeats expanded
# States held in a pattern's cached DFA steps, all together; past it the cache starts again
# (a bound on memory, whatever the pattern: a step's set may hold thousands of states).
CACHE_LIMIT = 200_000

_CHAR, _SPLIT, _JMP, _ASSERT, _MATCH = range(5)
# What an assertion may ask of a position, as bits of its context.
_START, _AFTER_NL, _END, _AT_NL, _BEFORE_FINAL_NL = 1, 2, 4, 8, 16
_PREV_WORD, _NEXT_WORD, _PREV_ASCII_WORD, _NEXT_ASCII_WORD, _EMPTY = 32, 64, 128, 256, 512
_ASCII_SPACE = frozenset(" \t\n\r\f\v")
_REFUSED = {
    "GROUPREF": "a backreference",
    "GROUPREF_EXISTS": "a conditional group",
    "ASSERT": "a look-around",
    "ASSERT_NOT": "a look-around",
    "ATOMIC_GROUP": "an atomic group",
    "POSSESSIVE_REPEAT": "a possessive repeat",
}


class Unsupported(re.error):
    """A valid pattern this matcher does not take (a backreference, a look-around, ...)."""


class Regex:
    """A pattern compiled for ``search``: whether it occurs in a text, in linear time."""

    def __init__(self, pattern: str, flags: int = 0) -> None:
        parsed = _PARSER.parse(_python_spelling(pattern), flags)
        self.pattern = pattern
        self._program = compile_program(parsed.data, parsed.state.flags)
        self._match = len(self._program) - 1
        self._context = _context_reader(self._program)
        self._steps: dict[tuple[frozenset[int], str, int], frozenset[int]] = {}
        self._cached = 0  # states held in the values of ``_steps``

    def search(self, text: str) -> bool:
        """Whether the pattern matches anywhere in ``text`` (``re.search`` is not None)."""
        context = self._context
        states = _closure(self._program, (0,), context(text, 0))
        for index, char in enumerate(text):
            if self._match in states:
                return True
            key = (states, char, context(text, index + 1))
            following = self._steps.get(key)
            if following is None:
                following = self._remember(key, _step(self._program, states, char, key[2]))
            states = following
        return self._match in states

    def _remember(
        self, key: tuple[frozenset[int], str, int], following: frozenset[int]
    ) -> frozenset[int]:
        """``following`` kept as the step from ``key``, within ``CACHE_LIMIT``."""
        if self._cached + len(following) > CACHE_LIMIT:
            self._steps.clear()
            self._cached = 0
        self._steps[key] = following
        self._cached += len(following)
        return following


def search(pattern: str, text: str, flags: int = 0) -> bool:
    """Whether ``pattern`` matches anywhere in ``text``, in time linear in ``text``."""
    return Regex(pattern, flags).search(text)


def _python_spelling(pattern: str) -> str:
    """``pattern`` with RE2's ``\\z`` (the very end) written as ``re`` reads it: ``\\Z``."""
    # Escapes are read pairwise from the left, so an escaped backslash before a z stays.
    return re.sub(r"\\(.)", lambda m: "\\Z" if m[1] == "z" else m[0], pattern, flags=re.DOTALL)


def compile_program(items: Sequence[Any], flags: int) -> tuple[Instruction, ...]:
    """The NFA of a parsed pattern: ``(op, test, x, y)`` instructions, ending in a match."""
    program: list[list[Any]] = []
    _emit_sequence(program, items, flags)
    _add(program, [_MATCH, None, 0, 0])
    return tuple((op, test, x, y) for op, test, x, y in program)


def _add(program: list[list[Any]], instruction: list[Any]) -> int:
    if len(program) >= MAX_STATES:
        raise Unsupported(f"the pattern needs more than {MAX_STATES} states")
    program.append(instruction)
    return len(program) - 1


def _emit_sequence(program: list[list[Any]], items: Sequence[Any], flags: int) -> None:
    for op, value in items:
        _emit_item(program, op.name, value, flags)


def _emit_item(program: list[list[Any]], name: str, value: Any, flags: int) -> None:
    if name in ("LITERAL", "NOT_LITERAL", "ANY", "IN"):
        _add(program, [_CHAR, _char_test(name, value, flags), 0, 0])
    elif name == "AT":
        words = value.name in ("AT_BOUNDARY", "AT_NON_BOUNDARY")
        _add(program, [_ASSERT, _at_test(value.name, flags), int(words), 0])
    elif name == "BRANCH":
        _emit_branch(program, value[1], flags)
    elif name == "SUBPATTERN":
        _group, add_flags, del_flags, body = value
        _emit_sequence(program, body.data, (flags | add_flags) & ~del_flags)
    elif name in ("MAX_REPEAT", "MIN_REPEAT"):
        _emit_repeat(program, value, flags)
    else:
        what = _REFUSED.get(name, name.lower().replace("_", " "))
        raise Unsupported(f"{what} is not supported (RE2 refuses it too)")


def _emit_branch(program: list[list[Any]], alternatives: Sequence[Any], flags: int) -> None:
    """``a|b|c``: split to each alternative in turn, each jumping to the end."""
    jumps = []
    for alternative in alternatives[:-1]:
        split = _add(program, [_SPLIT, None, len(program) + 1, 0])
        _emit_sequence(program, alternative.data, flags)
        jumps.append(_add(program, [_JMP, None, 0, 0]))
        program[split][3] = len(program)
    _emit_sequence(program, alternatives[-1].data, flags)
    for jump in jumps:
        program[jump][2] = len(program)


def _emit_repeat(program: list[list[Any]], value: Any, flags: int) -> None:
    """``x{m,n}`` as m copies of ``x``, then ``x*`` or n - m nested optional copies."""
    least, most, body = value
    for _ in range(least):
        _emit_sequence(program, body.data, flags)
    if most == _PARSER.MAXREPEAT:
        loop = _add(program, [_SPLIT, None, len(program) + 1, 0])
        _emit_sequence(program, body.data, flags)
        _add(program, [_JMP, None, loop, 0])
        program[loop][3] = len(program)
        return
    splits = []
    for _ in range(most - least):
        splits.append(_add(program, [_SPLIT, None, len(program) + 1, 0]))
        _emit_sequence(program, body.data, flags)
    for split in splits:
        program[split][3] = len(program)


def _char_test(name: str, value: Any, flags: int) -> CharTest:
    """The test of one character against ``.``, a literal or a class, under ``flags``."""
    if name == "ANY":
        return _anything if flags & re.DOTALL else _not_newline
    if name == "IN":
        negated = bool(value) and value[0][0].name == "NEGATE"
        tests = [_class_item(op.name, item, flags) for op, item in value[negated:]]
        test = _any_of(tests)
    else:
        negated = name == "NOT_LITERAL"
        test = _literal(value, flags)
    if flags & re.IGNORECASE:
        test = _case_folded(test, bool(flags & re.ASCII))
    return _negation(test) if negated else test


def _class_item(name: str, value: Any, flags: int) -> CharTest:
    if name == "LITERAL":
        return _literal(value, flags)
    if name == "RANGE":
        low, high = value
        return lambda char: low <= ord(char) <= high
    if name == "CATEGORY":
        return _category(value.name, bool(flags & re.ASCII))
    raise Unsupported(f"{name.lower()} in a class is not supported")


def _literal(code: int, flags: int) -> CharTest:
    if flags & re.IGNORECASE:
        return _case_variants(chr(code), bool(flags & re.ASCII)).__contains__
    return chr(code).__eq__


def _category(name: str, ascii_only: bool) -> CharTest:
    """``\\d \\s \\w`` (and ``\\D \\S \\W``) as ``re`` reads them: Unicode unless ASCII."""
    negated = name.startswith("CATEGORY_NOT_")
    kind = name.replace("CATEGORY_NOT_", "").replace("CATEGORY_", "")
    tests: dict[str, CharTest] = {
        "DIGIT": _ascii_digit if ascii_only else str.isdecimal,
        "SPACE": _ASCII_SPACE.__contains__ if ascii_only else str.isspace,
        "WORD": _ascii_word if ascii_only else _word,
        "LINEBREAK": "\n".__eq__,
    }
    if kind not in tests:
        raise Unsupported(f"the category {name} is not supported")
    return _negation(tests[kind]) if negated else tests[kind]


def _any_of(tests: Sequence[CharTest]) -> CharTest:
    return lambda char: any(test(char) for test in tests)


def _negation(test: CharTest) -> CharTest:
    return lambda char: not test(char)


def _case_folded(test: CharTest, ascii_only: bool) -> CharTest:
    return lambda char: any(test(variant) for variant in _case_variants(char, ascii_only))


def _case_variants(char: str, ascii_only: bool) -> frozenset[str]:
    """``char`` and the one-character forms case-insensitive matching takes for it."""
    if ascii_only and not char.isascii():
        return frozenset(char)
    forms = (char.lower(), char.upper(), char.upper().lower(), char.lower().upper())
    return frozenset([char, *(form for form in forms if len(form) == 1)])


def _anything(char: str) -> bool:
    return True


def _not_newline(char: str) -> bool:
    return char != "\n"


def _ascii_digit(char: str) -> bool:
    return "0" <= char <= "9"


def _word(char: str) -> bool:
    return char.isalnum() or char == "_"


def _ascii_word(char: str) -> bool:
    return char.isascii() and (char.isalnum() or char == "_")


def _at_test(name: str, flags: int) -> Callable[[int], bool]:
    """The test of a position's context for ``^ $ \\A \\Z \\b \\B`` under ``flags``."""
    multiline = bool(flags & re.MULTILINE)
    prev, nxt = (
        (_PREV_ASCII_WORD, _NEXT_ASCII_WORD) if flags & re.ASCII else (_PREV_WORD, _NEXT_WORD)
    )
    masks = {
        "AT_BEGINNING": _START | (_AFTER_NL if multiline else 0),
        "AT_BEGINNING_STRING": _START,
        "AT_END": _END | (_AT_NL if multiline else _BEFORE_FINAL_NL),
        "AT_END_STRING": _END,
    }
    if name in masks:
        mask = masks[name]
        return lambda context: bool(context & mask)
    if name in ("AT_BOUNDARY", "AT_NON_BOUNDARY"):
        wanted = name == "AT_BOUNDARY"
        # As in ``re``: neither holds in an empty text.
        return lambda context: not context & _EMPTY and _at_word_edge(context, prev, nxt) is wanted
    raise Unsupported(f"the assertion {name} is not supported")


def _at_word_edge(context: int, prev: int, nxt: int) -> bool:
    """Whether a word starts or ends here: a word character on one side only."""
    return (not context & prev) != (not context & nxt)


def _context_reader(program: Sequence[Instruction]) -> Callable[[str, int], int]:
    """What reads a position's context for ``program``: no more than its assertions ask."""
    asserts = [words for op, _, words, _ in program if op == _ASSERT]
    if not asserts:
        return _no_context
    return _word_context if any(asserts) else _line_context


def _no_context(text: str, index: int) -> int:
    return 0


def _line_context(text: str, index: int) -> int:
    """Where the position ``index`` is in ``text`` and its lines, as bits."""
    bits = 0 if text else _EMPTY
    if index == 0:
        bits |= _START
    elif text[index - 1] == "\n":
        bits |= _AFTER_NL
    if index == len(text):
        return bits | _END
    if text[index] == "\n":
        bits |= _AT_NL | (_BEFORE_FINAL_NL if index == len(text) - 1 else 0)
    return bits


def _word_context(text: str, index: int) -> int:
    """``_line_context`` and whether a word character is just before and just after."""
    bits = _line_context(text, index)
    if index > 0:
        before = text[index - 1]
        bits |= _PREV_WORD if _word(before) else 0
        bits |= _PREV_ASCII_WORD if _ascii_word(before) else 0
    if index < len(text):
        after = text[index]
        bits |= _NEXT_WORD if _word(after) else 0
        bits |= _NEXT_ASCII_WORD if _ascii_word(after) else 0
    return bits


def _step(
    program: Sequence[Instruction], states: frozenset[int], char: str, context: int
) -> frozenset[int]:
    """The states after ``char``, a new match starting there too (the search is unanchored)."""
    moved = [pc + 1 for pc in states if program[pc][0] == _CHAR and program[pc][1](char)]
    return _closure(program, (*moved, 0), context)


def _closure(program: Sequence[Instruction], seeds: Sequence[int], context: int) -> frozenset[int]:
    """The character tests and the match reachable from ``seeds`` without reading."""
    found: set[int] = set()
    seen: set[int] = set()
    stack = list(seeds)
    while stack:
        pc = stack.pop()
        if pc in seen:
            continue
        seen.add(pc)
        op, test, x, y = program[pc]
        if op == _SPLIT:
            stack += (x, y)
        elif op == _JMP:
            stack.append(x)
        elif op == _ASSERT:
            if test(context):
                stack.append(pc + 1)
        else:
            found.add(pc)
    return frozenset(found)
