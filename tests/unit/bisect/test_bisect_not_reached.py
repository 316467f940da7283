"""Bisect sets aside a version whose cell did not test the crash: it is never where it was fixed.

The outcomes are decided from real vLLM logs by the runner's own triage and decision: the zoo's
``cpu-compiler-missing`` crashes on 0.30.0 and 0.31.0 and, on 0.32.0, serves in compilation
mode NONE, without ever needing the missing compiler. Read as ``avoided`` (as before
``reached``) that would be a transition, and a suggested ``fixed: >=0.32.0``.
"""

from __future__ import annotations

from collections.abc import Sequence

from repromatrix.bisect.answer import Ranges, suggest_ranges
from repromatrix.bisect.search import bisect
from repromatrix.judgement import Outcome
from support.reach import COMPILED, CRASHED, NOT_COMPILED, decided

LOGS = {"0.30.0": CRASHED, "0.31.0": CRASHED, "0.32.0": NOT_COMPILED}
# A later version whose engine compiled and served: the crash tested, and avoided.
LATER = {**LOGS, "0.33.0": COMPILED}


def oracle(versions: Sequence[str]) -> dict[str, Outcome]:
    return {version: decided(version, LATER[version]).outcome for version in versions}


def test_the_untested_version_is_set_aside_and_no_fix_is_suggested() -> None:
    found = bisect(list(LOGS), oracle)
    assert found.outcomes["0.32.0"] is Outcome.NOT_REACHED
    assert found.transitions == ()
    assert found.skipped == ("0.32.0",)
    assert suggest_ranges(found.versions, found.outcomes) == Ranges(">=0.30.0", None)


def test_the_fix_is_placed_after_the_untested_version_once_one_tests_it() -> None:
    found = bisect(list(LATER), oracle)
    [transition] = found.transitions
    assert (transition.last, transition.first) == ("0.31.0", "0.33.0")
    assert transition.between == ("0.32.0",)
    assert suggest_ranges(found.versions, found.outcomes) == Ranges(">=0.30.0,<0.33.0", ">=0.33.0")
