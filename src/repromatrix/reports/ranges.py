"""Evidence against the documents: observed versions against a scenario's ``affected`` range.

Pure: judged cells (and, where the scenario files are at hand, their
documented specifiers) in, one ``RangeEvidence`` per scenario out. Only the
scenario's own trigger counts (controls and workarounds change the flags, not
the version range), at either level: a probe of vLLM's own code is evidence
about a version as much as an engine start. Where observations disagree with
the documents the evidence says so in words and suggests the narrowest
specifier that fits them, keeping each documented bound that the observations
do not contradict; ``suggest_patch`` turns the suggestions into a patch for
the scenario files.
"""

from __future__ import annotations

import difflib
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from repromatrix.grammars import check_version_numbers
from repromatrix.judgement import DECISIVE, Expected, Outcome
from repromatrix.results.verdicts import Judged, result_version

TRIGGER = "trigger"


@dataclass(frozen=True)
class Documented:
    """What a scenario file says about versions."""

    scenario: str
    affected: str
    fixed: str | None
    file: str = ""
    title: str = ""
    sources: tuple[str, ...] = ()  # "seed 000_….txt", "vllm issue #…", "vllm PR #…"
    signatures: tuple[str, ...] = ()  # "pattern (in Process)"
    kind: str = "defect"  # the scenario's ``kind``: ``startup-interruption`` is staged


@dataclass(frozen=True)
class RangeEvidence:
    """One scenario's observed versions against its documented range, and a suggestion."""

    scenario: str
    documented: Documented | None
    hit: tuple[str, ...]
    avoided: tuple[str, ...]
    mixed: tuple[str, ...]  # versions seen both hit and avoided (left out of the suggestion)
    outside: tuple[str, ...]  # hit where the documents say unaffected
    missed: tuple[str, ...]  # avoided where the documents say affected
    suggested_affected: str | None
    suggested_fixed: str | None
    words: str
    not_reached: tuple[str, ...] = ()  # versions whose trigger cells did not test the crash

    @property
    def disagrees(self) -> bool:
        """Whether any observation contradicts the documents."""
        return bool(self.outside or self.missed)

    def to_json(self) -> dict[str, Any]:
        """The machine form, for ``compat.json``."""
        documented = self.documented
        return {
            "scenario": self.scenario,
            "documented": None
            if documented is None
            else {
                "affected": documented.affected,
                "fixed": documented.fixed,
                "file": documented.file,
            },
            "hit": list(self.hit),
            "avoided": list(self.avoided),
            "mixed": list(self.mixed),
            "outside_range": list(self.outside),
            "avoided_in_range": list(self.missed),
            "not_reached": list(self.not_reached),
            "agrees": not self.disagrees,
            "suggested": None
            if self.suggested_affected is None
            else {"affected": self.suggested_affected, "fixed": self.suggested_fixed},
            "words": self.words,
        }


def documented_ranges(scenarios: Iterable[Any]) -> dict[str, Documented]:
    """The documented ranges of loaded ``Scenario`` values, by scenario id."""
    return {
        s.id: Documented(
            s.id,
            spec_text(s.affected),
            spec_text(s.fixed) if s.fixed else None,
            s.file,
            s.title,
            _sources(s.source),
            tuple(g.pattern + (f" (in {g.process})" if g.process else "") for g in s.signatures),
            s.kind.value,
        )
        for s in scenarios
        if not s.baseline
    }


def _sources(source: Any) -> tuple[str, ...]:
    seed = (f"seed {source.seed}",) if source.seed else ()
    issues = tuple(f"vLLM issue #{n}" for n in source.issues)
    return seed + issues + tuple(f"vLLM PR #{n}" for n in source.prs)


def spec_text(spec: SpecifierSet) -> str:
    """A specifier set as people write it: lower bounds first (``>=0.31.0,<0.31.1rc0``)."""
    order = {">=": 0, ">": 0, "==": 1, "~=": 1, "!=": 2, "<=": 3, "<": 3}
    parts = sorted(spec, key=lambda s: (order.get(s.operator, 1), str(s)))
    return ",".join(str(s) for s in parts)


def load_documents(directory: Path | None) -> dict[str, Documented]:
    """Read the scenario files of ``directory`` (default: the scenarios shipped with the
    package, then ``./scenarios`` where it is another folder: a scenario there wins over the
    shipped one of its id, as an edited copy of the project's folder does).

    An explicit directory with errors raises ``ConfigError``; the default ones are
    only a convenience, so a folder with errors there is left out.
    """
    from repromatrix.errors import ConfigError  # noqa: PLC0415
    from repromatrix.matrix.inputs import default_scenario_dirs  # noqa: PLC0415
    from repromatrix.matrix.scenarios import load_scenarios  # noqa: PLC0415

    if directory is not None:
        return documented_ranges(load_scenarios(directory))
    documents: dict[str, Documented] = {}
    for folder in default_scenario_dirs(Path("matrix.yaml")):
        try:
            documents.update(documented_ranges(load_scenarios(folder)))
        except ConfigError:
            continue
    return documents


def range_evidence(
    judged: Sequence[Judged], documents: Mapping[str, Documented]
) -> tuple[RangeEvidence, ...]:
    """One ``RangeEvidence`` per scenario with a decisive or a not-reached trigger cell, by
    scenario id."""
    seen: dict[str, dict[Version, set[Outcome]]] = defaultdict(lambda: defaultdict(set))
    expected: dict[str, dict[Version, set[Expected]]] = defaultdict(lambda: defaultdict(set))
    unreached: dict[str, set[Version]] = defaultdict(set)
    for item in judged:
        r = item.result
        version = result_version(r)
        if r.variant != TRIGGER or version is None:
            continue
        if r.outcome is Outcome.NOT_REACHED:
            unreached[r.scenario].add(version)
        elif r.outcome in DECISIVE:
            seen[r.scenario][version].add(r.outcome)
            expected[r.scenario][version].add(r.expected)
    return tuple(
        _with_unreached(
            _evidence(name, seen[name], expected[name], documents.get(name)),
            unreached[name] - set(seen[name]),
        )
        for name in sorted({*seen, *unreached})
    )


def _with_unreached(evidence: RangeEvidence, versions: set[Version]) -> RangeEvidence:
    """The evidence with the versions whose trigger cells only did not test the crash."""
    if not versions:
        return evidence
    names = tuple(str(v) for v in sorted(versions))
    words = f"not reached on {_list(sorted(versions))} (no evidence either way)"
    decided = evidence.hit or evidence.avoided or evidence.mixed
    return replace(
        evidence,
        not_reached=names,
        words=f"{evidence.words}; {words}" if decided else words,
    )


def _evidence(
    scenario: str,
    seen: Mapping[Version, set[Outcome]],
    expected: Mapping[Version, set[Expected]],
    documented: Documented | None,
) -> RangeEvidence:
    hit = sorted(v for v, o in seen.items() if o == {Outcome.HIT})
    avoided = sorted(v for v, o in seen.items() if o == {Outcome.AVOIDED})
    mixed = sorted(v for v, o in seen.items() if len(o) > 1)
    spec = _spec(documented)
    outside = [v for v in hit if _unaffected(v, spec, expected[v])]
    missed = [v for v in avoided if _affected(v, spec, expected[v])]
    affected = fixed = None
    if outside or missed:
        affected, fixed = suggest(hit, avoided, spec, documented)
    words = _words(hit, outside, missed, documented, affected)
    if mixed:
        words += f"; hit and avoided on {_list(mixed)} (cells of one version disagree)"
    names = [tuple(str(v) for v in vs) for vs in (hit, avoided, mixed, outside, missed)]
    return RangeEvidence(
        scenario,
        documented,
        hit=names[0],
        avoided=names[1],
        mixed=names[2],
        outside=names[3],
        missed=names[4],
        suggested_affected=affected,
        suggested_fixed=fixed,
        words=words,
    )


def _spec(documented: Documented | None) -> SpecifierSet | None:
    if documented is None or check_version_numbers(documented.affected) is not None:
        return None
    try:
        return SpecifierSet(documented.affected)
    except InvalidSpecifier:
        return None


def _unaffected(version: Version, spec: SpecifierSet | None, expected: set[Expected]) -> bool:
    if spec is not None:
        return not spec.contains(version, prereleases=True)
    return Expected.AVOIDED in expected


def _affected(version: Version, spec: SpecifierSet | None, expected: set[Expected]) -> bool:
    if spec is not None:
        return spec.contains(version, prereleases=True)
    return Expected.HIT in expected


def suggest(
    hit: Sequence[Version],
    avoided: Sequence[Version],
    spec: SpecifierSet | None,
    documented: Documented | None,
) -> tuple[str | None, str | None]:
    """The narrowest ``(affected, fixed)`` that fits the observations, keeping sound bounds.

    ``(None, None)`` when the hits are not one stretch of versions (a crash that
    comes and goes has no single range) or when nothing was hit.
    """
    if not hit:
        return None, None
    low, high = hit[0], hit[-1]
    if any(low < v < high for v in avoided):
        return None, None
    below = max((v for v in avoided if v < low), default=None)
    above = min((v for v in avoided if v > high), default=None)
    lower = _bound(spec, (">=",))
    upper = _bound(spec, ("<",))
    if _moves_lower(spec, lower, low, below):
        lower = low
    if upper is None or not (high < upper and (above is None or above >= upper)):
        upper = above
    parts = ([f">={lower}"] if lower else []) + ([f"<{upper}"] if upper else [])
    fixed = f">={upper}" if upper else None
    if documented and documented.fixed and upper == _bound(spec, ("<",)):
        fixed = documented.fixed
    return ",".join(parts) or None, fixed


def _moves_lower(
    spec: SpecifierSet | None, lower: Version | None, low: Version, below: Version | None
) -> bool:
    """Whether the observations contradict the documented lower bound (or there is none)."""
    if spec is None:
        return True
    if lower is None:
        return below is not None
    return not (lower <= low and (below is None or below < lower))


def _bound(spec: SpecifierSet | None, operators: tuple[str, ...]) -> Version | None:
    if spec is None:
        return None
    found = [Version(s.version) for s in spec if s.operator in operators]
    return (max if operators == (">=",) else min)(found) if found else None


def _words(
    hit: Sequence[Version],
    outside: Sequence[Version],
    missed: Sequence[Version],
    documented: Documented | None,
    suggestion: str | None,
) -> str:
    where = f" `{documented.affected}`" if documented else ""
    sentences = []
    if outside:
        sentences.append(f"hit on {_list(outside)}, outside the documented range{where}")
    if missed:
        sentences.append(f"avoided on {_list(missed)}, inside the documented range{where}")
    if not sentences:
        return (
            f"observations agree with the documented range{where}"
            if hit or documented
            else "never hit"
        )
    if suggestion:
        sentences.append(f"the observations fit `{suggestion}`")
    else:
        sentences.append("the observations are not one range of versions")
    return "; ".join(sentences)


def _list(versions: Sequence[Version]) -> str:
    names = [str(v) for v in versions]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


_KEY = re.compile(r"^(affected|fixed):.*$", re.MULTILINE)


def suggest_patch(evidence: Iterable[RangeEvidence], root: Path) -> str:
    """A unified diff that puts each suggested range into its scenario file under ``root``."""
    chunks: list[str] = []
    for item in evidence:
        documented = item.documented
        if item.suggested_affected is None or documented is None or not documented.file:
            continue
        path = Path(documented.file)
        path = path if path.is_absolute() else root / path
        before = path.read_text(encoding="utf-8")
        after = patched(before, item.suggested_affected, item.suggested_fixed)
        name = _display(path, root)
        chunks += difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            f"a/{name}",
            f"b/{name}",
        )
    return "".join(chunks)


def patched(text: str, affected: str, fixed: str | None) -> str:
    """``text`` with its top-level ``affected:`` and ``fixed:`` set (``fixed`` added if new)."""
    values = {"affected": affected, "fixed": fixed}
    present = set(_KEY.findall(text))

    def put(match: re.Match[str]) -> str:
        key = match.group(1)
        value = values[key]
        line = f'{key}: "{value}"' if value else ""
        if key == "affected" and fixed and "fixed" not in present:
            line += f'\nfixed: "{fixed}"'
        return line

    out = _KEY.sub(put, text)
    return re.sub(r"\n\n\n+", "\n\n", out)


def _display(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()
