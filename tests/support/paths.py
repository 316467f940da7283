"""Where things are, from any test module, wherever it sits in the tree."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
DATA = TESTS / "data"
SCENARIOS = ROOT / "scenarios"
PACKAGE = ROOT / "src" / "repromatrix"
VENVS = ROOT / ".cache" / "venvs"
