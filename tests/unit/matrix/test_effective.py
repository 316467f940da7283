"""Flag precedence, provenance, baselines that know the crashes their configuration triggers,
and identical effective cells planned once."""

from __future__ import annotations

from pathlib import Path

import pytest

from repromatrix.judgement import Expected
from repromatrix.matrix.effective import effective_flags
from repromatrix.matrix.expand import plan
from repromatrix.matrix.selector import Selector
from repromatrix.values import Cell
from support.matrix import BASELINE, MOE_SCENARIO, setup

USER_FLAGS = """
lanes:
  gpu:
    images: [v0.31.0, v0.32.0, nightly]
    gpus:
      h100: {runner: gpu-h100, count: 1, compute_capability: "9.0"}
    models:
      moe: {source: org/moe, moe: true}
    flagsets:
      default: {}
      rank256: {max_lora_rank: 256}
      rank320: {max_lora_rank: 320}
      lora320: {enable_lora: true, max_lora_rank: 320}
      prefix-off: {enable_prefix_caching: false}
include:
  - flagset: prefix-off
    scenario: moe-rank
    flags: {max_loras: 2}
"""


def by_id(cells: tuple[Cell, ...]) -> dict[str, Cell]:
    return {cell.id: cell for cell in cells}


def test_layers_merge_lowest_first_and_name_where_each_flag_came_from() -> None:
    effective = effective_flags(
        {
            "variant": {"max_lora_rank": 128},
            "scenario": {"enable_lora": True, "max_lora_rank": 320, "max_loras": 1},
            "flagset": {"max_lora_rank": 256, "enforce_eager": False},
            "include": {"max_loras": 4},
        }
    )
    assert dict(effective.flags) == {
        "enable_lora": True,
        "enforce_eager": False,
        "max_lora_rank": 128,
        "max_loras": 4,
    }
    assert dict(effective.sources) == {
        "enable_lora": "scenario",
        "enforce_eager": "flagset",
        "max_lora_rank": "variant",
        "max_loras": "include",
    }


def test_an_unknown_layer_is_refused() -> None:
    with pytest.raises(ValueError, match="launch"):
        effective_flags({"launch": {"x": 1}})


def test_the_flag_set_is_the_configuration_under_test(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path, USER_FLAGS, {"moe-rank": MOE_SCENARIO})
    cells = by_id(plan(matrix, scenarios))
    cell = cells["gpu/v0.31.0/h100/moe/rank256/moe-rank/trigger"]
    assert cell.flags["max_lora_rank"] == 256  # not the scenario's 320
    assert cell.flag_sources["max_lora_rank"] == "flagset"
    assert cell.flag_sources["enable_lora"] == "scenario"  # the flag set leaves it open
    assert cell.expected is Expected.HIT  # 256 > 128: the trigger holds on the effective flags


def test_a_variant_wins_over_the_flag_set(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path, USER_FLAGS, {"moe-rank": MOE_SCENARIO})
    cell = by_id(plan(matrix, scenarios))["gpu/v0.31.0/h100/moe/default/moe-rank/rank-128"]
    assert (cell.flags["max_lora_rank"], cell.flag_sources["max_lora_rank"]) == (128, "variant")
    assert cell.expected is Expected.AVOIDED
    # under rank256 the control runs exactly what default's control runs: planned once
    assert "gpu/v0.31.0/h100/moe/rank256/moe-rank/rank-128" in cell.same_as


def test_a_false_in_the_flag_set_is_kept_and_an_include_adds_to_it(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path, USER_FLAGS, {"moe-rank": MOE_SCENARIO})
    cell = by_id(plan(matrix, scenarios))["gpu/v0.31.0/h100/moe/prefix-off/moe-rank/trigger"]
    assert cell.flags["enable_prefix_caching"] is False
    assert (cell.flags["max_loras"], cell.flag_sources["max_loras"]) == (2, "include")


def test_identical_effective_cells_are_planned_once(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path, USER_FLAGS, {"moe-rank": MOE_SCENARIO})
    cells = by_id(plan(matrix, scenarios))
    # default (the scenario's 320), rank320 and lora320 (the user's 320) run the same thing
    kept = cells["gpu/v0.31.0/h100/moe/default/moe-rank/trigger"]
    assert set(kept.same_as) == {
        "gpu/v0.31.0/h100/moe/lora320/moe-rank/trigger",
        "gpu/v0.31.0/h100/moe/rank320/moe-rank/trigger",
    }
    assert "gpu/v0.31.0/h100/moe/rank320/moe-rank/trigger" not in cells
    # every variant too: each distinct run appears exactly once
    runs = [(c.image.tag, c.scenario.id, tuple(c.flags.items())) for c in cells.values()]
    assert len(runs) == len(set(runs))


def test_a_selection_of_a_twin_alone_still_plans_it(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path, USER_FLAGS, {"moe-rank": MOE_SCENARIO})
    only = "gpu/v0.31.0/h100/moe/rank320/moe-rank/trigger"
    cells = plan(matrix, scenarios, selector=Selector([only]))
    assert [cell.id for cell in cells] == [only]


LORA_BASELINE = """
lanes:
  gpu:
    images: [v0.31.0, v0.32.0, nightly]
    gpus:
      h100: {runner: gpu-h100, count: 1}
    models:
      moe: {source: org/moe, moe: true}
      dense: {source: org/dense}
    flagsets:
      default: {}
      lora320: {enable_lora: true, max_lora_rank: 320}
"""


def test_a_baseline_expects_the_crash_its_configuration_triggers(tmp_path: Path) -> None:
    matrix, scenarios = setup(
        tmp_path, LORA_BASELINE, {"moe-rank": MOE_SCENARIO, "healthy": BASELINE}
    )
    cells = by_id(plan(matrix, scenarios))
    hit = cells["gpu/v0.31.0/h100/moe/lora320/healthy/baseline"]
    assert (hit.expected, hit.expected_scenario) == (Expected.HIT, "moe-rank")
    assert [s.id for s in hit.predicted] == ["moe-rank"]
    assert hit.hit_scenarios == ("moe-rank",)
    assert [s.id for s in hit.watched] == ["healthy", "moe-rank"]
    fixed = cells["gpu/v0.32.0/h100/moe/lora320/healthy/baseline"]
    assert (fixed.expected, fixed.expected_scenario) == (Expected.AVOIDED, None)
    nightly = cells["gpu/nightly/h100/moe/lora320/healthy/baseline"]
    assert (nightly.expected, nightly.expected_scenario) == (Expected.UNKNOWN, "moe-rank")
    for healthy in (
        "gpu/v0.31.0/h100/moe/default/healthy/baseline",
        "gpu/v0.31.0/h100/dense/lora320/healthy/baseline",
    ):
        assert (cells[healthy].expected, cells[healthy].predicted) == (Expected.AVOIDED, ())


def test_above_the_affected_range_with_no_known_fix_is_unknown() -> None:
    from packaging.specifiers import SpecifierSet  # noqa: PLC0415
    from packaging.version import Version  # noqa: PLC0415

    from repromatrix.matrix.effective import after_range  # noqa: PLC0415

    def above(spec: str, version: str) -> bool:
        return after_range(SpecifierSet(spec), Version(version))

    assert above("==0.17.*", "0.22.1") and not above("==0.17.*", "0.16.0")
    assert not above("==0.17.*", "0.17.1")  # inside
    assert above(">=0.22.1,<=0.27.1", "0.31.0") and not above(">=0.22.1,<=0.27.1", "0.17.0")
    assert above(">=0.22.0,<0.31.1rc0", "0.31.1rc0")  # a pre-release is a version too
    assert above("<0.29.0", "0.32.0") and not above(">=0.31.0", "0.30.0")
