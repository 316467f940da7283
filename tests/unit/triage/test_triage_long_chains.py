"""A chain of lookup errors replaced "during handling" is followed to its end, however long
(issue 34: a chain of 20,000 ``KeyError``s was cut where a rank's 32 kept findings ran out).
"""

from __future__ import annotations

import pytest

from repromatrix.triage import Triager

DURING = "\nDuring handling of the above exception, another exception occurred:\n\n"


def _link(number: int, exception: str) -> str:
    return (
        "Traceback (most recent call last):\n"
        f'  File "/app/lookup.py", line {number}, in get\n'
        "    return values[key]\n"
        f"{exception}\n"
    )


def _diagnose(text: str) -> tuple[str, int | None]:
    triager = Triager()
    triager.feed(text.encode())
    diagnosis = triager.diagnose()
    assert diagnosis.root_cause is not None
    return diagnosis.root_cause.line, diagnosis.line_number


@pytest.mark.parametrize("length", [3, 33, 40, 2000])
def test_a_chain_of_lookup_errors_ends_at_its_last(length: int) -> None:
    links = [_link(i, f"KeyError: 'k{i}'") for i in range(length)]
    line, number = _diagnose(DURING.join(links))
    assert line == f"KeyError: 'k{length - 1}'"
    assert number == 7 * length - 3


@pytest.mark.parametrize("length", [2, 40, 2000])
def test_the_first_replacement_that_is_no_lookup_error_states_the_cause(length: int) -> None:
    links = [_link(i, f"KeyError: 'k{i}'") for i in range(length)]
    links.append(_link(length, "RuntimeError: the tokenizer has no chat template"))
    links.append(_link(length + 1, "KeyError: 'after'"))
    line, _ = _diagnose(DURING.join(links))
    assert line == "RuntimeError: the tokenizer has no chat template"


def test_a_direct_cause_is_not_control_flow() -> None:
    links = [_link(i, f"KeyError: 'k{i}'") for i in range(40)]
    text = links[0] + "\nThe above exception was the direct cause of the following exception:\n\n"
    line, _ = _diagnose(text + DURING.join(links[1:]))
    assert line == "KeyError: 'k0'"
