"""Expansion: which cells exist, their ids, flags and expectations; include/exclude; selection."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from repromatrix.errors import UsageError
from repromatrix.judgement import Expected
from repromatrix.matrix.config import load_matrix
from repromatrix.matrix.expand import expand, expected_outcome, path_notices, plan
from repromatrix.matrix.scenarios import load_scenarios
from repromatrix.matrix.selector import Selector
from repromatrix.values import Cell, Lane
from support import factories, paths
from support.matrix import BASELINE, GPU_LANE, MOE_SCENARIO, setup

ROOT = paths.ROOT
ID_PART = re.compile(r"[a-z0-9._-]+")


def ids(cells: Iterable[Cell]) -> list[str]:
    return [cell.id for cell in cells]


def by_id(cells: Iterable[Cell]) -> dict[str, Cell]:
    return {cell.id: cell for cell in cells}


def test_cells_exist_only_where_the_trigger_holds(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path)
    cells = list(expand(matrix, scenarios))
    moe = [c for c in cells if c.scenario.id == "moe-rank"]
    assert {c.model.name for c in moe} == {"moe"}  # the dense model never meets the trigger
    # eager's max_lora_rank 64 is the configuration under test: the launch's 320 only fills
    # flags a flag set leaves open, so the trigger (rank > 128) fails under eager
    assert len(moe) == 4 * 2 * 1 * 3  # tags x GPUs x flag sets x variants
    healthy = [c for c in cells if c.scenario.id == "healthy"]
    assert len(healthy) == 4 * 2 * 2 * 2  # the baseline applies everywhere
    assert len(set(ids(cells))) == len(cells) == 24 + 32
    assert ids(cells) == sorted(ids(cells), key=lambda i: ids(cells).index(i))  # stable order


def test_ids_are_canonical(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path)
    cell = by_id(expand(matrix, scenarios))["gpu/v0.31.0/h100/moe/default/moe-rank/rank-128"]
    parts = cell.id.split("/")
    assert parts == ["gpu", "v0.31.0", "h100", "moe", "default", "moe-rank", "rank-128"]


def test_expectations_by_version_and_variant(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path)
    cells = by_id(expand(matrix, scenarios))
    expected = {
        tag: cells[f"gpu/{tag}/h100/moe/default/moe-rank/trigger"].expected
        for tag in ("v0.31.0", "v0.31.1rc0", "v0.32.0", "nightly")
    }
    assert expected == {
        "v0.31.0": Expected.HIT,
        "v0.31.1rc0": Expected.AVOIDED,  # a pre-release of the fix, not of the affected 0.31.x
        "v0.32.0": Expected.AVOIDED,
        "nightly": Expected.UNKNOWN,
    }
    for variant in ("rank-128", "sharded"):
        for tag in ("v0.31.0", "nightly"):
            cell = cells[f"gpu/{tag}/h100/moe/default/moe-rank/{variant}"]
            assert cell.expected is Expected.AVOIDED
    assert cells["gpu/v0.31.0/h100/dense/default/healthy/baseline"].expected is Expected.AVOIDED


def test_expected_outcome_rules() -> None:
    scenario = replace(
        factories.scenario("s", lanes=(Lane.GPU,)), affected=SpecifierSet("==0.17.*")
    )
    assert scenario.fixed is None
    assert expected_outcome(scenario, Version("0.17.0"), True) is Expected.HIT
    assert expected_outcome(scenario, Version("0.17.1rc1"), True) is Expected.HIT
    # No known fix: above the affected range nothing is known, below it the crash was not yet.
    assert expected_outcome(scenario, Version("0.22.1"), True) is Expected.UNKNOWN
    assert expected_outcome(scenario, Version("0.16.0"), True) is Expected.AVOIDED
    fixed = replace(scenario, fixed=SpecifierSet(">=0.18.0"))
    assert expected_outcome(fixed, Version("0.22.1"), True) is Expected.AVOIDED
    assert expected_outcome(scenario, Version("0.17.0"), False) is Expected.AVOIDED
    assert expected_outcome(scenario, None, True) is Expected.UNKNOWN
    # The scenario's code path not taken: the cell can decide nothing, whatever the range.
    assert expected_outcome(scenario, Version("0.17.0"), True, reaches=False) is (
        Expected.NOT_REACHED
    )
    assert expected_outcome(fixed, Version("0.22.1"), True, reaches=False) is (Expected.NOT_REACHED)


def test_flags_merge_in_order(tmp_path: Path) -> None:
    text = GPU_LANE + "include:\n  - {flagset: eager, flags: {max_lora_rank: 192, max_loras: 2}}\n"
    matrix, scenarios = setup(tmp_path, text)
    cells = by_id(expand(matrix, scenarios))
    trigger = cells["gpu/v0.31.0/h100/moe/eager/moe-rank/trigger"]
    control = cells["gpu/v0.31.0/h100/moe/eager/moe-rank/rank-128"]
    healthy = cells["gpu/v0.31.0/h100/moe/eager/healthy/baseline"]
    # scenario launch, then flag set, then include, then variant: later wins
    assert dict(trigger.flags) == {
        "enable_lora": True, "enforce_eager": True, "max_lora_rank": 192, "max_loras": 2,
    }  # fmt: skip
    assert control.flags["max_lora_rank"] == 128
    assert dict(healthy.flags) == {"enforce_eager": True, "max_lora_rank": 192, "max_loras": 2}


def test_deadline_and_interrupt(tmp_path: Path) -> None:
    interrupted = """
    id: interrupted
    title: t
    lanes: [gpu]
    trigger: {launch.interrupt_on: {ne: null}}
    launch: {interrupt_on: "Warming up multi-modal processing", startup_timeout_s: 2500}
    signatures: [{pattern: "KeyboardInterrupt: terminated", process: APIServer}]
    affected: all
    variants: [{name: no-interrupt, kind: workaround, interrupt: false}]
    avoided: ok
    """
    text = GPU_LANE + "include:\n  - {gpu: a6000, deadline_s: 4000}\n"
    matrix, scenarios = setup(tmp_path, text, {"interrupted": interrupted})
    cells = by_id(expand(matrix, scenarios))
    trigger = cells["gpu/v0.32.0/h100/dense/default/interrupted/trigger"]
    workaround = cells["gpu/v0.32.0/h100/dense/default/interrupted/no-interrupt"]
    assert trigger.interrupt_on == "Warming up multi-modal processing"
    assert trigger.expected is Expected.HIT
    assert (workaround.interrupt_on, workaround.expected) == (None, Expected.AVOIDED)
    assert trigger.deadline_s == 2500.0  # the launch raises the lane's 1800
    assert cells["gpu/v0.32.0/a6000/dense/default/interrupted/trigger"].deadline_s == 4000.0


def test_exclude_matches_partially_and_by_list(tmp_path: Path) -> None:
    text = (
        GPU_LANE
        + """
exclude:
  - {gpu: a6000, model: moe}
  - {image: [nightly, v0.31.1rc0], scenario: healthy}
  - {variant: sharded, flagset: eager}
"""
    )
    matrix, scenarios = setup(tmp_path, text)
    cells = ids(expand(matrix, scenarios))
    assert not [i for i in cells if "/a6000/moe/" in i]
    assert [i for i in cells if "/a6000/dense/" in i]
    assert not [i for i in cells if re.match(r"gpu/(nightly|v0.31.1rc0)/.*/healthy/", i)]
    assert [i for i in cells if re.match(r"gpu/nightly/.*/moe-rank/", i)]
    assert not [i for i in cells if i.endswith("/eager/moe-rank/sharded")]
    assert [i for i in cells if i.endswith("/default/moe-rank/sharded")]


def test_include_extends_matching_combinations_only(tmp_path: Path) -> None:
    text = GPU_LANE + "include:\n  - {gpu: h100, model: moe, flags: {tensor_parallel_size: 1}}\n"
    matrix, scenarios = setup(tmp_path, text)
    plain, _ = setup(tmp_path / "plain")
    cells = list(expand(matrix, scenarios))
    assert ids(cells) == ids(expand(plain, scenarios))  # extending adds no combination
    for cell in cells:
        extended = "tensor_parallel_size" in cell.flags
        assert extended == ("/h100/moe/" in cell.id)


def test_include_adds_back_what_exclude_removed(tmp_path: Path) -> None:
    text = (
        GPU_LANE
        + """
exclude:
  - {image: v0.31.0}
include:
  - {image: v0.31.0, gpu: a6000, model: moe, flagset: default, scenario: moe-rank, variant: trigger}
"""
    )
    matrix, scenarios = setup(tmp_path, text)
    v031 = [i for i in ids(expand(matrix, scenarios)) if i.startswith("gpu/v0.31.0/")]
    assert v031 == ["gpu/v0.31.0/a6000/moe/default/moe-rank/trigger"]


def test_include_adds_a_tag_the_lane_does_not_list(tmp_path: Path) -> None:
    text = GPU_LANE + "include:\n  - {image: v0.30.0, gpu: h100, model: dense, flagset: default}\n"
    matrix, scenarios = setup(tmp_path, text)
    added = [c for c in expand(matrix, scenarios) if c.image.tag == "v0.30.0"]
    assert ids(added) == ["gpu/v0.30.0/h100/dense/default/healthy/baseline"]  # moe-rank: no MoE
    assert added[0].image.ref == "vllm/vllm-openai:v0.30.0"
    assert added[0].image.version == Version("0.30.0")


def test_an_include_adds_only_when_it_matches_no_surviving_combination(tmp_path: Path) -> None:
    # GitHub semantics on the matrix axes (before triggers): a match extends, no match adds
    core = "{image: v0.31.0, gpu: h100, model: dense, flagset: default, flags: {seed: 1}}"
    include = f"include:\n  - {core}\n"
    text = GPU_LANE + "exclude:\n  - {image: v0.31.0, model: dense}\n" + include
    matrix, scenarios = setup(tmp_path, text)
    added = [
        c for c in expand(matrix, scenarios) if "/v0.31.0/" in c.id and c.model.name == "dense"
    ]
    assert ids(added) == ["gpu/v0.31.0/h100/dense/default/healthy/baseline"]
    assert added[0].flags["seed"] == 1
    text = GPU_LANE + "exclude:\n  - {image: v0.31.0, model: dense, scenario: moe-rank}\n" + include
    matrix, scenarios = setup(tmp_path / "b", text)
    cells = by_id(expand(matrix, scenarios))
    # (dense, healthy) survived the exclude, so the include extends it and adds nothing
    assert cells["gpu/v0.31.0/h100/dense/default/healthy/baseline"].flags["seed"] == 1
    assert "gpu/v0.31.0/a6000/dense/default/healthy/baseline" in cells
    assert "seed" not in cells["gpu/v0.31.0/a6000/dense/default/healthy/baseline"].flags


def test_level_rules_and_probe_cells(tmp_path: Path) -> None:
    probe = (
        MOE_SCENARIO
        + "probe: {program: moe_lora_rank.py, lanes: [gpu], params: {num_experts: 8}}\n"
    )
    text = GPU_LANE + "exclude:\n  - {level: probe, gpu: a6000}\n"
    matrix, scenarios = setup(tmp_path, text, {"moe-rank": probe})
    cells = list(expand(matrix, scenarios))
    probes = [c for c in cells if c.id.endswith("@probe")]
    assert probes and all(c.level.value == "probe" and c.gpu.name == "h100" for c in probes)
    assert Counter(c.level.value for c in cells) == {"engine": 24, "probe": 12}
    assert (
        by_id(cells)["gpu/v0.31.0/h100/moe/default/moe-rank/trigger@probe"].expected is Expected.HIT
    )


def test_lane_and_selector_filter_during_expansion(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path)
    selector = Selector(only=["gpu/{v0.31.0,nightly}/h100/*"], skip=["*/eager/*"])
    cells = list(expand(matrix, scenarios, Lane.GPU, selector))
    assert cells and all(selector.matches(c.id) for c in cells)
    assert {c.image.tag for c in cells} == {"v0.31.0", "nightly"}
    every = [c for c in expand(matrix, scenarios) if selector.matches(c.id)]
    assert ids(cells) == ids(every)  # the same cells as filtering afterwards
    assert list(expand(matrix, scenarios, Lane.CPU)) == []


def test_plan_raises_for_an_empty_selection_or_a_missing_lane(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path)
    with pytest.raises(
        UsageError, match=r"No cell id has a part `a600`\. Perhaps you meant `a6000`\?"
    ):
        plan(matrix, scenarios, selector=Selector(only=["gpu/*/a600/*"]))
    with pytest.raises(UsageError, match="defines no `cpu` lane"):
        plan(matrix, scenarios, Lane.CPU)
    assert len(plan(matrix, scenarios, Lane.GPU)) == 56


def test_the_default_plan() -> None:
    cells = plan(load_matrix(ROOT / "matrix.yaml"), load_scenarios(ROOT / "scenarios"))
    table = by_id(cells)
    assert len(table) == len(cells)
    for cell in cells:
        parts = cell.id.removesuffix("@probe").split("/")
        assert len(parts) == 7 and all(ID_PART.fullmatch(p) for p in parts)
    seed_000 = "gpu/{}/h200x4/qwen3-30b-a3b/default/moe-lora-rank-over-128/trigger"
    assert table[seed_000.format("v0.31.0")].expected is Expected.HIT
    assert table[seed_000.format("v0.31.0")].flags["tensor_parallel_size"] == 4
    assert table[seed_000.format("v0.31.1rc0")].expected is Expected.AVOIDED
    assert table[seed_000.format("v0.32.0")].expected is Expected.AVOIDED
    assert table[seed_000.format("nightly")].expected is Expected.UNKNOWN
    # Seed 000's range follows the source: 0.22.1 and 0.27.1 dispatch rank 320 to the
    # one-shot kernel too.
    for tag in ("v0.22.1", "v0.27.1"):
        assert table[seed_000.format(tag)].expected is Expected.HIT
    seed_003 = "gpu/v0.27.1/h100/gemma-4-e2b-it/default/lora-int32-offset-overflow/{}"
    # The V1 runner 0.27.1 starts for Gemma 4 never runs the kernel at full length with an
    # adapter: the plain launch can at best be not_reached; the V2 runner's profile run can.
    assert table[seed_003.format("trigger")].expected is Expected.NOT_REACHED
    assert table[seed_003.format("v2-model-runner")].expected is Expected.HIT
    assert table[seed_003.format("max-model-len-87382")].expected is Expected.AVOIDED
    fixed_003 = "gpu/v0.31.0/h100/gemma-4-e2b-it/default/lora-int32-offset-overflow/trigger"
    assert table[fixed_003].expected is Expected.AVOIDED  # int64 offsets from 0.29.0
    seed_001 = "gpu/v0.17.0/h200x4/qwen3.5-122b-a10b/default/moe-lora-flashinfer-experts/{}"
    # The plain launch picks Triton's experts on 0.17.0: never an expected hit.
    assert table[seed_001.format("trigger")].expected is Expected.NOT_REACHED
    assert table[seed_001.format("trigger")].flags["tensor_parallel_size"] == 4
    # FlashInfer CUTLASS with VLLM_USE_FLASHINFER_MOE_FP16=1 and expert parallelism on H200;
    # FlashInfer TRTLLM without expert parallelism only on the SM100 family.
    ep = table[seed_001.format("flashinfer-fp16-ep")]
    assert ep.expected is Expected.HIT and ep.env["VLLM_USE_FLASHINFER_MOE_FP16"] == "1"
    assert ep.flags["enable_expert_parallel"] is True
    assert table[seed_001.format("flashinfer-fp16")].expected is Expected.NOT_REACHED
    for version in ("0.27.1", "0.30.0", "0.31.0", "0.32.0"):
        kv = f"cpu/{version}/cpu/tiny-llama/default/cpu-kv-cache-too-small/"
        assert table[kv + "trigger"].expected is Expected.HIT
        assert table[kv + "max-model-len-64"].expected is Expected.AVOIDED
    cpu_probes = [c for c in cells if c.lane is Lane.CPU and c.id.endswith("@probe")]
    assert cpu_probes and all(c.model.name != "tiny-llama" for c in cpu_probes)
    assert not [c for c in cells if c.model.name == "tiny-moe" and c.level.value == "engine"]
    assert {c.scenario.id for c in cells if c.gpu.name == "h200x4"} >= {
        "moe-lora-flashinfer-experts"
    }
    assert not [
        c for c in cells if c.scenario.id == "moe-lora-flashinfer-experts" and c.gpu.count < 4
    ]
    # Rank 320 needs ~88.7 GiB on one GPU (matrix.yaml): seed 000's engine cells run at TP4
    # on h200x4 only; its probe (CPU code) still runs on one GPU runner.
    seed_000_engine = [
        c for c in cells if c.scenario.id == "moe-lora-rank-over-128" and c.level.value == "engine"
    ]
    placed = {(c.gpu.name, c.flags["tensor_parallel_size"]) for c in seed_000_engine}
    assert seed_000_engine and placed == {("h200x4", 4)}
    assert {c.model.name for c in cells if c.gpu.name == "h200x4"} == {
        "qwen3-30b-a3b", "qwen3.5-122b-a10b"
    }  # fmt: skip


SEED_003_USERS = """
lanes:
  gpu:
    images: [v0.27.1]
    gpus:
      h100: {runner: gpu-h100, count: 1, compute_capability: "9.0", memory_gib: 80}
    models:
      gemma: {source: google/gemma-4-E2B-it, intermediate_size: 6144, use_double_wide_mlp: true,
              max_position_embeddings: 131072}
      llama: {source: meta-llama/Llama-3.1-8B-Instruct, intermediate_size: 14336,
              max_position_embeddings: 131072}
"""


def test_seed_003s_control_is_planned_only_for_the_model_it_was_computed_for(
    tmp_path: Path,
) -> None:
    scenario = (ROOT / "scenarios" / "lora-int32-offset-overflow.yaml").read_text()
    matrix, scenarios = setup(tmp_path, SEED_003_USERS, {"lora-int32-offset-overflow": scenario})
    cells = {(c.model.name, c.variant.name): c for c in expand(matrix, scenarios)}
    # Both models overflow at 87383 tokens (Gemma from 87383, a Llama 3 8B from 74900), where
    # a start-up step runs the kernel at full length: the V2 model runner's profile run ...
    assert cells[("gemma", "v2-model-runner")].expected is Expected.HIT
    assert cells[("llama", "v2-model-runner")].expected is Expected.HIT
    # ... not the V1 runner's, which 0.27.1 starts for these models: at best not reached.
    assert cells[("gemma", "trigger")].expected is Expected.NOT_REACHED
    assert cells[("llama", "trigger")].expected is Expected.NOT_REACHED
    # ... but 87382 is one token below Gemma 4 E2B's boundary only: the Llama gets no control
    # that would still overflow and say nothing.
    assert cells[("gemma", "max-model-len-87382")].expected is Expected.AVOIDED
    assert ("llama", "max-model-len-87382") not in cells


def test_a_variants_env_is_over_the_launchs(tmp_path: Path) -> None:
    forced = """
    id: forced
    title: t
    lanes: [gpu]
    trigger: {model.moe: true}
    launch: {env: {VLLM_LOGGING_LEVEL: DEBUG, A: launch}}
    signatures: [{pattern: "x"}]
    affected: all
    variants: [{name: b, kind: workaround, env: {A: variant, B: "1"}}]
    avoided: ok
    """
    matrix, scenarios = setup(tmp_path, GPU_LANE, {"forced": forced})
    cells = by_id(expand(matrix, scenarios))
    trigger = cells["gpu/v0.32.0/h100/moe/default/forced/trigger"]
    variant = cells["gpu/v0.32.0/h100/moe/default/forced/b"]
    assert dict(trigger.env) == {"VLLM_LOGGING_LEVEL": "DEBUG", "A": "launch"}
    assert dict(variant.env) == {"VLLM_LOGGING_LEVEL": "DEBUG", "A": "variant", "B": "1"}


LONG_LORA_TEAM = """
lanes:
  gpu:
    images: [v0.27.1, v0.31.0, v0.32.0]
    gpus:
      h100: {runner: gpu-h100, count: 1, compute_capability: "9.0", memory_gib: 80}
      a100x2: {runner: gpu-a100x2, count: 2, compute_capability: "8.0", memory_gib: 80}
    models:
      llama: {source: meta-llama/Llama-3.1-8B-Instruct, intermediate_size: 14336,
              max_position_embeddings: 131072}
    flagsets:
      long-lora: {enable_lora: true, max_model_len: 100000, enable_chunked_prefill: false,
                  max_num_batched_tokens: 100000}
include:
  - gpu: a100x2
    flags: {tensor_parallel_size: 2}
"""


def test_no_known_fix_above_the_affected_range_is_unknown_never_avoided(tmp_path: Path) -> None:
    # A team's 100,000-token LoRA flag set on Llama-8B is past seed 003's overflow point
    # (74900 tokens at TP1). With the document's own `fixed: null`, v0.31 and v0.32 lie above
    # the affected range with no fix known: unknown, not avoided.
    shipped = (ROOT / "scenarios" / "lora-int32-offset-overflow.yaml").read_text()
    undated = re.sub(r"(?m)^fixed: .*$", "fixed: null", shipped)
    undated = re.sub(r"(?m)^affected: .*$", 'affected: ">=0.22.1,<=0.27.1"', undated)
    matrix, scenarios = setup(tmp_path, LONG_LORA_TEAM, {"lora-int32-offset-overflow": undated})
    cells = by_id(expand(matrix, scenarios))
    cell = "gpu/{}/h100/llama/long-lora/lora-int32-offset-overflow/trigger"
    for tag in ("v0.31.0", "v0.32.0"):
        assert cells[cell.format(tag)].expected is Expected.UNKNOWN
    # The fix dated from the source (int64 offsets from 0.29.0): avoided there is known.
    matrix, scenarios = setup(
        tmp_path / "dated", LONG_LORA_TEAM, {"lora-int32-offset-overflow": shipped}
    )
    cells = by_id(expand(matrix, scenarios))
    for tag in ("v0.31.0", "v0.32.0"):
        assert cells[cell.format(tag)].expected is Expected.AVOIDED
    assert cells[cell.format("v0.27.1").replace("/trigger", "/v2-model-runner")].expected is (
        Expected.HIT
    )
    # Per rank at TP2 (the a100x2 entry): 99999 x 14336 < 2**31, no overflow, no such cell.
    assert not [c for c in cells if "/a100x2/" in c and "lora-int32" in c]


def test_plan_says_when_no_cell_takes_a_scenarios_path(tmp_path: Path) -> None:
    shipped = (ROOT / "scenarios" / "moe-lora-flashinfer-experts.yaml").read_text()
    four_a100 = """
lanes:
  gpu:
    images: [v0.17.0]
    gpus:
      a100x4: {runner: gpu-a100x4, count: 4, compute_capability: "8.0", memory_gib: 80}
      h200x4: {runner: gpu-h200x4, count: 4, compute_capability: "9.0", memory_gib: 141}
    models:
      moe: {source: Qwen/Qwen3.5-122B-A10B, moe: true,
            adapters: {seed-001-adapter: {path: /adapters/a}}}
    flagsets:
      tp4: {tensor_parallel_size: 4}
"""
    matrix, scenarios = setup(tmp_path, four_a100, {"moe-lora-flashinfer-experts": shipped})
    cells = plan(matrix, scenarios)
    # FlashInfer's experts need compute capability 9.0 (CUTLASS) or 10.x (TRTLLM): on A100s
    # every cell is planned not_reached, and plan says no cell decides the scenario.
    a100 = plan(matrix, scenarios, selector=Selector(only=("gpu/*/a100x4/*",)))
    triggers = [c for c in a100 if c.variant.kind == "trigger"]
    assert len(triggers) == 3 and {c.expected for c in triggers} == {Expected.NOT_REACHED}
    [notice] = path_notices(a100)
    assert notice.startswith("scenario `moe-lora-flashinfer-experts`: no cell of this plan")
    # With the H200s the FlashInfer CUTLASS variant takes it: nothing to say.
    assert path_notices(cells) == ()
    hit = [c for c in cells if c.expected is Expected.HIT]
    assert [(c.gpu.name, c.variant.name) for c in hit] == [("h200x4", "flashinfer-fp16-ep")]


def test_a_baseline_expects_a_predicted_crash_only_where_its_path_is_taken(
    tmp_path: Path,
) -> None:
    shipped = (ROOT / "scenarios" / "lora-int32-offset-overflow.yaml").read_text()
    team = LONG_LORA_TEAM.replace("v0.27.1, v0.31.0, v0.32.0", "v0.27.1")
    matrix, scenarios = setup(
        tmp_path, team, {"lora-int32-offset-overflow": shipped, "healthy": BASELINE}
    )
    cells = by_id(expand(matrix, scenarios))
    baseline = cells["gpu/v0.27.1/h100/llama/long-lora/healthy/baseline"]
    # 100000 tokens overflow on 0.27.1, but its V1 runner never runs the kernel at full
    # length at start-up: the healthy launch cannot crash there.
    assert [s.id for s in baseline.predicted] == ["lora-int32-offset-overflow"]
    assert baseline.expected is Expected.AVOIDED
