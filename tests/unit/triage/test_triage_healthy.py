"""Precision: real logs of healthy starts give no root cause.

tests/data/logs/healthy holds real logs of the CPU lane's cells whose engine
started and answered a completion (outcome ``avoided``, or ``not_reached`` where the
engine never took its scenario's path), across vLLM versions.
Their WARNING lines, config dumps and the noise of the harness stopping the
server (vLLM's shutdown force-kills the EngineCore: an EngineDeadError in the
output handler) must not be taken for a cause, with or without the documented
scenarios' signatures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from repromatrix.matrix.scenarios import load_scenarios
from repromatrix.triage import triage_path
from support.triage import REPO, case_id, labelled

HEALTHY = [(path, label) for path, label in labelled() if path.parent.name == "healthy"]


def test_healthy_logs_of_several_versions_are_here() -> None:
    assert len({label["vllm_version"] for _, label in HEALTHY}) >= 2
    assert all(label["root_cause_line"] is None for _, label in HEALTHY)


@pytest.mark.parametrize("case", HEALTHY, ids=case_id)
def test_a_healthy_start_gets_no_root_cause(case: tuple[Path, dict[str, Any]]) -> None:
    path, _ = case
    for scenarios in ((), load_scenarios(REPO / "scenarios")):
        diagnosis = triage_path(path, scenarios)
        assert diagnosis.root_cause is None
        assert diagnosis.scenarios_seen == ()
