"""One word for each judgement: only ``judgement`` spells a label, and the old vocabularies
of the upgrade question (``Change``, ``unsafe``, ``workaround``) are gone from the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from repromatrix.judgement import (
    LABELS,
    MOVES_SHOWN,
    STILL_SAFE,
    Expected,
    Outcome,
    Safety,
    SafetyMove,
    Verdict,
    label,
    outcome_safety,
    worst,
)
from support import paths

OWNER = paths.PACKAGE / "judgement.py"
# The labels no prose says by chance (an outcome's, "not reached", is a plain phrase too): a
# module that writes one out spells the label table again.
SPELLED = tuple(label(word) for word in (*Safety, *Verdict) if " " in label(word))
# The words the judgement replaced (reports/diff.Change, reports/upgrade.Safety's values).
OLD_WORDS = ("newly_hit", "still_hit", "still_avoided", "unsafe", "newly hit", "still hit")
UNDERSCORES_TO_SPACES = re.compile(r"""replace\(\s*["']_["']\s*,\s*["'] ["']\s*\)""")


def code_strings(path: Path) -> list[tuple[int, str]]:
    """Every string constant of a module that is not a docstring, with its line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def sources() -> list[Path]:
    return sorted(p for p in paths.PACKAGE.rglob("*.py") if p != OWNER)


def templates() -> list[Path]:
    return sorted((paths.PACKAGE / "reports" / "templates").glob("*.j2"))


def test_no_module_but_judgement_spells_a_label() -> None:
    found = [
        f"{path.relative_to(paths.PACKAGE)}:{line}: {text!r}"
        for path in sources()
        for line, text in code_strings(path)
        if any(spelled in text for spelled in SPELLED) or text in OLD_WORDS
    ]
    assert found == []


def test_no_module_or_template_makes_a_label_of_a_value() -> None:
    found = [
        str(path.relative_to(paths.PACKAGE))
        for path in (*sources(), *templates())
        if UNDERSCORES_TO_SPACES.search(path.read_text(encoding="utf-8"))
    ]
    assert found == []


def test_no_template_spells_a_safety() -> None:
    for path in templates():
        text = path.read_text(encoding="utf-8")
        for safety in Safety:
            if safety is not Safety.SAFE:
                assert f">{label(safety)}<" not in text, path.name
        assert 'value="unsafe"' not in text and "s-workaround" not in text, path.name


def test_every_word_has_one_label() -> None:
    for kind in (Outcome, Expected, Safety, Verdict):
        for word in kind:
            assert label(word) == LABELS[kind, word.value]
    assert label(None) == "no cell"
    # A word in two vocabularies reads the same in each.
    assert label(Outcome.HIT) == label(Expected.HIT) == "hit"
    assert label(Expected.NOT_REACHED) == label(Outcome.NOT_REACHED) == "not reached"
    assert label(Safety.SAFE_WITH_FLAG_CHANGE) == "safe with a flag change"
    assert label(Safety.NOT_SAFE) == "not safe"


def test_what_one_outcome_means_for_an_upgrade() -> None:
    assert outcome_safety(Outcome.AVOIDED) is Safety.SAFE
    for broken in (Outcome.HIT, Outcome.OTHER_FAILURE, Outcome.TIMEOUT):
        assert outcome_safety(broken) is Safety.NOT_SAFE
    for undecided in (Outcome.INFRA_ERROR, Outcome.SKIPPED, Outcome.UNREACHABLE, None):
        assert outcome_safety(undecided) is Safety.UNKNOWN
    assert outcome_safety(Outcome.NOT_REACHED) is Safety.UNKNOWN


def test_safety_moves_in_report_order() -> None:
    worse = SafetyMove(Safety.SAFE, Safety.NOT_SAFE)
    assert worse.worse and worse.label == "safe → not safe" and worse.decided
    assert not SafetyMove(Safety.NOT_SAFE, Safety.NOT_SAFE).worse
    undecided = SafetyMove(Safety.SAFE, Safety.UNKNOWN)
    assert not undecided.decided and not undecided.worse
    ordered = sorted([STILL_SAFE, undecided, *reversed(MOVES_SHOWN)], key=lambda m: m.rank)
    assert ordered == [*MOVES_SHOWN, undecided, STILL_SAFE]
    assert undecided.to_json() == {"baseline": "safe", "candidate": "unknown"}


def test_an_image_answers_with_the_worst_of_its_configurations_in_one_order():
    # One unknown configuration keeps an image from "safe with a flag change"; the run's
    # last lines and watch's answer both take judgement.worst (they disagreed before).
    assert worst([Safety.SAFE_WITH_FLAG_CHANGE, Safety.UNKNOWN]) is Safety.UNKNOWN
    assert worst([Safety.SAFE, Safety.SAFE_WITH_FLAG_CHANGE]) is Safety.SAFE_WITH_FLAG_CHANGE
    assert worst([Safety.UNKNOWN, Safety.NOT_SAFE, Safety.SAFE]) is Safety.NOT_SAFE
    assert worst([]) is Safety.UNKNOWN
