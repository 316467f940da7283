"""The heat map: images against scenarios for one configuration, one coloured square each.

Pure: judged cells in, one ``HeatMap`` per configuration out. A square shows
the scenario's documented trigger on that image (the engine level where it
ran, else the probe), so a reader sees at a glance where along the versions a
crash starts and stops; healthy baselines get a column too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from repromatrix.judgement import Outcome, label
from repromatrix.reports.table import Configuration, tag_key
from repromatrix.reports.upgrade import BASELINE, TRIGGER
from repromatrix.results.verdicts import Judged, shorten
from repromatrix.values import Level


@dataclass(frozen=True)
class HeatSquare:
    """One square: the observed outcome, the verdict, a tooltip and the cell shown."""

    outcome: str
    verdict: str
    title: str
    cell: str


@dataclass(frozen=True)
class HeatMap:
    """One configuration's images (rows) against its scenarios (columns)."""

    configuration: Configuration
    tags: tuple[str, ...]
    scenarios: tuple[str, ...]
    squares: Mapping[tuple[str, str], HeatSquare]

    @property
    def key(self) -> str:
        """A stable name for filters: ``lane/gpu/model/flagset``."""
        c = self.configuration
        return f"{c.lane}/{c.gpu}/{c.model}/{c.flagset}"

    def square(self, tag: str, scenario: str) -> HeatSquare | None:
        """The square at a row and column, or None."""
        return self.squares.get((tag, scenario))


def heat_maps(judged: Iterable[Judged]) -> tuple[HeatMap, ...]:
    """One heat map per configuration, in configuration order."""
    chosen: dict[Configuration, dict[tuple[str, str], Judged]] = defaultdict(dict)
    for item in judged:
        r = item.result
        if r.variant not in (TRIGGER, BASELINE) or r.outcome is Outcome.SKIPPED:
            continue
        configuration = Configuration(r.lane, r.gpu, r.model, r.flagset)
        key = (r.image_tag, r.scenario)
        current = chosen[configuration].get(key)
        if current is None or (current.level is Level.PROBE and item.level is Level.ENGINE):
            chosen[configuration][key] = item
    return tuple(_map(c, chosen[c]) for c in sorted(chosen))


def _map(configuration: Configuration, chosen: Mapping[tuple[str, str], Judged]) -> HeatMap:
    squares = {
        key: HeatSquare(
            item.result.outcome.value,
            item.verdict.value,
            f"{key[0]} · {key[1]}: {label(item.result.outcome)}"
            + (f" ({item.level.value})" if item.level is Level.PROBE else "")
            + (f": {shorten(item.cause, 100)}" if item.cause else ""),
            item.result.id,
        )
        for key, item in chosen.items()
    }
    return HeatMap(
        configuration,
        tuple(sorted({t for t, _ in chosen}, key=tag_key)),
        tuple(sorted({s for _, s in chosen})),
        MappingProxyType(squares),
    )
