"""Shared test data for triage: the labelled logs and small scenario values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from repromatrix.values import Lane, Scenario, Signature, Variant
from support import factories, paths

LOGS = paths.DATA / "logs"
REPO = paths.ROOT


def catalogue_examples() -> dict[str, str]:
    """One real message per catalogue category (tests/data/catalogue-examples.yaml)."""
    path = paths.DATA / "catalogue-examples.yaml"
    examples: dict[str, str] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return examples


def labelled() -> list[tuple[Path, dict[str, Any]]]:
    """Every labelled log: (path, label) from each ``labels.yaml`` under tests/data/logs."""
    cases = []
    for labels in sorted(LOGS.glob("*/labels.yaml")):
        for label in yaml.safe_load(labels.read_text(encoding="utf-8")):
            cases.append((labels.parent / label["file"], label))
    return cases


def case_id(case: tuple[Path, dict[str, Any]]) -> str:
    """A short pytest id: folder/file."""
    path, _ = case
    return f"{path.parent.name}/{path.stem}"


def scenario(
    scenario_id: str,
    *signatures: Signature,
    variants: tuple[Variant, ...] = (),
    fixed: str | None = None,
) -> Scenario:
    """A scenario value with just what triage reads: signatures, variants, fix range."""
    return factories.scenario(
        scenario_id, *signatures, lanes=(Lane.CPU,), variants=variants, fixed=fixed
    )
