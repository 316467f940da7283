"""The catalogue's fixes as data: which engine flags and environment variables to change.

Each cause of the catalogue says in prose what to do; where vLLM has a flag or an
environment variable for it, ``fix_flags`` says it as data, so a workaround can be
planned (a scenario's workaround variant) rather than read. It is a list of
alternatives; each one is a ``FlagFix`` whose changes are applied together::

    fix_flags:
      - flags: {max_model_len: lower}         # a smaller value than the cell has
      - flags: {gpu_memory_utilization: raise}
      - flags: {enforce_eager: true}          # a value
      - flags: {disable_custom_all_reduce: true}
        env: {NCCL_P2P_DISABLE: '1'}          # both at once

A flag is a vLLM engine argument in snake_case (the project's contract for flags);
its change is a value (true, a number, a string) or a direction: ``lower`` or
``raise`` than the value the failing cell had, for a flag that has one. An
environment variable is named in upper case; its value is a string (a number is
read as one), or a direction.

``parse_fix_flags`` takes the plain YAML value and returns the fixes and the
problems, each with the path of the value it is about (keys and indices inside the
entry), which the catalogue turns into a file and a line.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from repromatrix.errors import suggest

KEY = "fix_flags"
_PARTS = ("flags", "env")
_FLAG_NAME = re.compile(r"[a-z][a-z0-9_]*")
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")

Value = bool | int | float | str
Path = tuple[str | int, ...]  # keys and indices inside one catalogue entry
Issue = tuple[Path, str]  # a problem: where it is, what is wrong


class Direction(enum.StrEnum):
    """A change relative to the value the failing cell had."""

    LOWER = "lower"
    RAISE = "raise"


@dataclass(frozen=True)
class FlagChange:
    """One flag or environment variable a fix sets: to ``value``, or in ``direction``."""

    name: str
    value: Value | None = None
    direction: Direction | None = None

    def describe(self, *, env: bool = False) -> str:
        """``lower max_model_len``, ``enforce_eager=true``, ``env NCCL_P2P_DISABLE=1``."""
        name = f"env {self.name}" if env else self.name
        if self.direction is not None:
            return f"{self.direction} {name}"
        return f"{name}={_shown(self.value)}"

    def to_json(self) -> dict[str, Any]:
        """``{"name": ..., "value": ...}`` or ``{"name": ..., "direction": "lower"}``."""
        if self.direction is not None:
            return {"name": self.name, "direction": str(self.direction)}
        return {"name": self.name, "value": self.value}


@dataclass(frozen=True)
class FlagFix:
    """One workaround for a cause: engine flags and environment variables changed together."""

    flags: tuple[FlagChange, ...] = ()
    env: tuple[FlagChange, ...] = ()

    def describe(self) -> str:
        """The changes in one line: ``disable_custom_all_reduce=true, env NCCL_P2P_DISABLE=1``."""
        changes = [c.describe() for c in self.flags] + [c.describe(env=True) for c in self.env]
        return ", ".join(changes)

    def to_json(self) -> dict[str, Any]:
        """The JSON form: ``{"flags": [...], "env": [...]}``."""
        return {"flags": [c.to_json() for c in self.flags], "env": [c.to_json() for c in self.env]}


def parse_fix_flags(value: Any) -> tuple[tuple[FlagFix, ...], list[Issue]]:
    """The fixes an entry's ``fix_flags`` lists, and every problem in it."""
    if value is None:
        return (), []
    if not isinstance(value, list) or not value:
        return (), [((KEY,), "`fix_flags` must be a list of fixes, each with `flags` or `env`")]
    issues: list[Issue] = []
    fixes = [_fix(item, (KEY, index), issues) for index, item in enumerate(value)]
    if issues:
        return (), issues
    return tuple(fix for fix in fixes if fix is not None), []


def _fix(item: Any, path: Path, issues: list[Issue]) -> FlagFix | None:
    if not isinstance(item, Mapping) or not item:
        issues.append((path, "a fix must be a mapping with `flags` and/or `env`"))
        return None
    for key in item:
        if key not in _PARTS:
            hint = suggest(str(key), _PARTS)
            issues.append(((*path, str(key)), f"unknown key `{key}` in a fix.{hint}"))
    flags = _changes(item.get("flags"), (*path, "flags"), _FLAG_NAME, issues)
    env = _changes(item.get("env"), (*path, "env"), _ENV_NAME, issues)
    return FlagFix(flags, env)


def _changes(
    value: Any, path: Path, grammar: re.Pattern[str], issues: list[Issue]
) -> tuple[FlagChange, ...]:
    if value is None:
        return ()
    part = str(path[-1])
    if not isinstance(value, Mapping) or not value:
        issues.append((path, f"`{part}` must map names to a value, `lower` or `raise`"))
        return ()
    changes = []
    for name, setting in value.items():
        where = (*path, str(name))
        if not isinstance(name, str) or grammar.fullmatch(name) is None:
            what = "an engine argument" if part == "flags" else "an environment variable"
            case = "snake_case" if part == "flags" else "UPPER_CASE"
            issues.append((where, f"`{name}` is not the name of {what} ({case})"))
            continue
        change = _change(name, setting, env=part == "env")
        if change is None:
            issues.append((where, f"`{name}`: {_expected(part)}, not {setting!r}"))
            continue
        changes.append(change)
    return tuple(changes)


def _change(name: str, setting: Any, *, env: bool) -> FlagChange | None:
    if isinstance(setting, str) and setting in tuple(Direction):
        return FlagChange(name, direction=Direction(setting))
    if env:
        if isinstance(setting, bool) or not isinstance(setting, str | int | float):
            return None
        return FlagChange(name, value=str(setting))
    if isinstance(setting, bool | int | float | str):
        return FlagChange(name, value=setting)
    return None


def _expected(part: str) -> str:
    if part == "env":
        return "expected a string, a number, `lower` or `raise`"
    return "expected true, false, a number, a string, `lower` or `raise`"


def _shown(value: Value | None) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


BOUNDS_KEY = "flag_bounds"
_BOUND_KEYS = ("min", "max", "above", "below", "integer", "choices")


@dataclass(frozen=True)
class Bounds:
    """The values vLLM accepts for one engine flag: ``min``/``max`` inclusive,
    ``above``/``below`` exclusive, ``integer`` for a whole number, or a set of ``choices``."""

    min: float | None = None
    max: float | None = None
    above: float | None = None
    below: float | None = None
    integer: bool = False
    choices: tuple[float, ...] = ()

    def allows(self, value: float) -> bool:
        """Whether vLLM accepts ``value`` for this flag."""
        if self.choices:
            return value in self.choices
        if self.integer and value != int(value):
            return False
        return not (
            (self.min is not None and value < self.min)
            or (self.max is not None and value > self.max)
            or (self.above is not None and value <= self.above)
            or (self.below is not None and value >= self.below)
        )

    def describe(self) -> str:
        """``0 < value <= 1``, ``value >= 1``, ``one of 1, 8, 16``."""
        if self.choices:
            return "one of " + ", ".join(_number(c) for c in self.choices)
        low = f"{_number(self.above)} < " if self.above is not None else ""
        low = f"{_number(self.min)} <= " if self.min is not None else low
        high = f" <= {_number(self.max)}" if self.max is not None else ""
        high = f" < {_number(self.below)}" if self.below is not None else high
        whole = "a whole number " if self.integer else ""
        return f"{whole}{low}value{high}"


def step(now: float, direction: Direction, bounds: Bounds | None) -> float | None:
    """A first try at ``now`` changed in ``direction``, inside ``bounds``: halved or doubled,
    the nearest choice, or the limit itself; None where the range leaves no value on that
    side of ``now`` (nothing to offer)."""
    lower = direction is Direction.LOWER
    if bounds is not None and bounds.choices:
        side = [c for c in bounds.choices if (c < now if lower else c > now)]
        return (max(side) if lower else min(side)) if side else None
    changed = now / 2 if lower else now * 2
    if isinstance(now, int) or (bounds is not None and bounds.integer):
        changed = float(int(changed)) if lower else float(-(-changed // 1))
    if bounds is None or bounds.allows(changed):
        return changed
    limit = bounds.min if lower else bounds.max
    if limit is not None and (limit < now if lower else limit > now) and bounds.allows(limit):
        return limit
    return None


def parse_bounds(value: Any) -> tuple[dict[str, Bounds], list[Issue]]:
    """The catalogue's ``flag_bounds``: each engine flag's valid values, and every problem."""
    if value is None:
        return {}, []
    if not isinstance(value, Mapping):
        return {}, [((BOUNDS_KEY,), "`flag_bounds` must map engine flags to their bounds")]
    bounds: dict[str, Bounds] = {}
    issues: list[Issue] = []
    for name, spec in value.items():
        where: Path = (BOUNDS_KEY, str(name))
        if not isinstance(name, str) or _FLAG_NAME.fullmatch(name) is None:
            issues.append((where, f"`{name}` is not the name of an engine argument (snake_case)"))
        elif not isinstance(spec, Mapping) or not spec:
            issues.append((where, f"`{name}`: expected a mapping of {', '.join(_BOUND_KEYS)}"))
        else:
            found = _bounds(spec, where, issues)
            if found is not None:
                bounds[name] = found
    return bounds, issues


def _bounds(spec: Mapping[Any, Any], where: Path, issues: list[Issue]) -> Bounds | None:
    count = len(issues)
    for key in spec:
        if key not in _BOUND_KEYS:
            hint = suggest(str(key), _BOUND_KEYS)
            issues.append(((*where, str(key)), f"unknown key `{key}` in bounds.{hint}"))
    limits = {k: spec.get(k) for k in ("min", "max", "above", "below")}
    for key, limit in limits.items():
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int | float)):
            issues.append(((*where, key), f"`{key}` must be a number, not {limit!r}"))
    choices = spec.get("choices", [])
    if not isinstance(choices, list) or not all(
        isinstance(c, int | float) and not isinstance(c, bool) for c in choices
    ):
        issues.append(((*where, "choices"), "`choices` must be a list of numbers"))
    if not isinstance(spec.get("integer", False), bool):
        issues.append(((*where, "integer"), "`integer` must be true or false"))
    if len(issues) > count:
        return None
    return Bounds(
        min=limits["min"],
        max=limits["max"],
        above=limits["above"],
        below=limits["below"],
        integer=spec.get("integer", False),
        choices=tuple(sorted(choices)),
    )


def _number(value: float | None) -> str:
    return f"{value:g}" if value is not None else ""
