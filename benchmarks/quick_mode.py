"""``--quick``, every benchmark's small run: the whole path once, in seconds.

The fast test suite runs each ``bench_*.py`` with ``--quick`` (tests/unit/core/test_benchmarks.py),
so a refactor that breaks a benchmark fails there instead of rotting unseen. A quick run uses
small inputs, needs no Docker, vLLM or network (a part that does is skipped, saying so) and
prints the same figures; they are too small to quote.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping

HELP = "small inputs, a few seconds, nothing that needs Docker or vLLM (the test suite runs it)"


def parse_args(parser: argparse.ArgumentParser, quick: Mapping[str, object]) -> argparse.Namespace:
    """Parse the command line with a ``--quick`` option that makes ``quick`` the defaults.

    Options given on the command line still win over the quick defaults.
    """
    parser.add_argument("--quick", action="store_true", help=HELP)
    if parser.parse_known_args()[0].quick:
        parser.set_defaults(**quick)
        print("quick mode: small inputs, figures not to quote", file=sys.stderr)
    return parser.parse_args()


def skipped(what: str, why: str) -> None:
    """Say which part of the benchmark quick mode leaves out, and why."""
    print(f"quick mode skips {what}: {why}")
