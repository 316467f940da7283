"""A plan no runner can hold is refused at load: more GPUs than the entry has, a tensor
parallel size vLLM refuses for the model, a size below 1; each at the line and column that
set it (a flag set, an include, the scenario's launch or a variant). And eight L4s cannot
hold seed 000 at TP 8, however much memory they have together."""

from __future__ import annotations

from pathlib import Path

import pytest

from repromatrix.cli import main
from repromatrix.errors import EXIT_USAGE, ConfigError
from repromatrix.matrix.expand import plan
from repromatrix.matrix.memory import Fit, estimate, infeasible_reason
from repromatrix.matrix.scenarios import load_scenarios
from repromatrix.values import Lane, Level
from support.matrix import BASELINE, MOE_SCENARIO, at, setup, write

# The facts of Qwen/Qwen3-30B-A3B's config.json, and GPUs as nvidia-smi reports them
# (L4: ../shared/nvidia-smi/plain-l4-idle.txt, 23034 MiB; H200: 143771 MiB).
QWEN = (
    "{source: Qwen/Qwen3-30B-A3B, architecture: Qwen3MoeForCausalLM, moe: true, "
    "hidden_size: 2048, intermediate_size: 6144, num_hidden_layers: 48, "
    "num_attention_heads: 32, num_key_value_heads: 4, head_dim: 128, num_experts: 128, "
    "moe_intermediate_size: 768, max_position_embeddings: 40960, "
    "num_parameters: 30532122624}"
)
MATRIX = f"""
lanes:
  gpu:
    images: [v0.31.0]
    gpus:
      h100: {{runner: gpu-h100, count: 1, memory_gib: 80, usable_memory_mib: 81559}}
      h200x4: {{runner: gpu-h200x4, count: 4, memory_gib: 141, usable_memory_mib: 143771}}
      l4x8: {{runner: gpu-l4x8, count: 8, memory_gib: 24, usable_memory_mib: 23034}}
    models:
      qwen3-30b-a3b: {QWEN}
    flagsets:
      default: {{}}
"""
ONLY_H200 = "exclude:\n  - {gpu: [h100, l4x8]}\n"


def value_at(text: str, key: str, occurrence: int = 1) -> str:
    """``line:column`` of the value written after ``key: `` (the n-th such key)."""
    line, column = at(text, f"{key}: ", occurrence).split(":")
    return f"{line}:{int(column) + len(key) + 2}"


def planned(tmp_path: Path, matrix: str, scenarios: dict[str, str] | None = None) -> list[str]:
    """The problems of planning ``matrix`` (with the MoE scenario), as text."""
    loaded, catalogue = setup(tmp_path, matrix, scenarios or {"moe-rank": MOE_SCENARIO})
    with pytest.raises(ConfigError) as caught:
        plan(loaded, catalogue, Lane.GPU)
    return [str(problem) for problem in caught.value.problems]


def test_a_flag_set_asking_for_more_gpus_than_the_entry_has(tmp_path: Path) -> None:
    matrix = MATRIX.replace("default: {}", "default: {}\n      tp4: {tensor_parallel_size: 4}")
    [problem] = planned(tmp_path, matrix)
    assert problem == (
        f"{tmp_path}/matrix.yaml:{value_at(matrix, 'tensor_parallel_size')}: "
        "tensor_parallel_size 4 x "
        "pipeline_parallel_size 1 asks for 4 GPUs, but GPU `h100` has `count: 1`: lower the "
        "size, or exclude this GPU for these cells: cell "
        "gpu/v0.31.0/h100/qwen3-30b-a3b/tp4/moe-rank/trigger (and 2 more)"
    )


def test_an_include_that_sets_tp_is_blamed_at_its_own_line(tmp_path: Path) -> None:
    include = "include:\n  - model: qwen3-30b-a3b\n    flags: {pipeline_parallel_size: 2}\n"
    include += "  - gpu: [h100, l4x8]\n    flags:\n      tensor_parallel_size: 8\n"
    matrix = MATRIX + include
    problems = planned(tmp_path, matrix)
    where = f"{tmp_path}/matrix.yaml:{value_at(matrix, 'tensor_parallel_size')}"
    assert problems == [
        # h100: 8 x 2 GPUs of 1; the include setting TP is the one to change.
        f"{where}: tensor_parallel_size 8 x pipeline_parallel_size "
        "2 asks for 16 GPUs, but GPU `h100` has `count: 1`: lower the size, or exclude this GPU "
        "for these cells: cell gpu/v0.31.0/h100/qwen3-30b-a3b/default/moe-rank/trigger "
        "(and 2 more)",
        # h200x4: TP 1 x PP 2 fits; l4x8: 8 x 2 does not.
        f"{where}: tensor_parallel_size 8 x pipeline_parallel_size "
        "2 asks for 16 GPUs, but GPU `l4x8` has `count: 8`: lower the size, or exclude this GPU "
        "for these cells: cell gpu/v0.31.0/l4x8/qwen3-30b-a3b/default/moe-rank/trigger "
        "(and 2 more)",
    ]
    # PP alone over the count of a 1-GPU entry is blamed on the PP flag.
    alone = MATRIX + "include:\n  - gpu: h100\n    flags: {pipeline_parallel_size: 2}\n"
    [problem] = planned(tmp_path / "pp", alone)
    pp = value_at(alone, "pipeline_parallel_size")
    assert problem.startswith(f"{tmp_path}/pp/matrix.yaml:{pp}: tensor_parallel_size 1 x ")


def test_a_variant_or_the_launch_that_sets_tp_is_blamed_in_the_scenario_file(
    tmp_path: Path,
) -> None:
    scenario = MOE_SCENARIO.replace(
        "{name: sharded, kind: workaround, flags: {fully_sharded_loras: true}}",
        "{name: sharded, kind: workaround, flags: {fully_sharded_loras: true, "
        "tensor_parallel_size: 3}}",
    ).replace("max_lora_rank: 320}", "max_lora_rank: 320, tensor_parallel_size: 2}")
    matrix = MATRIX + ONLY_H200
    problems = planned(tmp_path, matrix, {"moe-rank": scenario})
    file = f"{tmp_path}/scenarios/moe-rank.yaml"
    three = value_at(scenario, "tensor_parallel_size", 2)
    assert problems == [
        f"{file}:{three}: tensor_parallel_size 3 does not divide the 32 attention heads "
        "of model `qwen3-30b-a3b` (vLLM refuses it at start-up): cell "
        "gpu/v0.31.0/h200x4/qwen3-30b-a3b/default/moe-rank/sharded",
        f"{file}:{three}: tensor_parallel_size 3 neither divides nor is a multiple of "
        "the 4 KV heads of model `qwen3-30b-a3b` (vLLM's QKVParallelLinear asserts): cell "
        "gpu/v0.31.0/h200x4/qwen3-30b-a3b/default/moe-rank/sharded",
    ]
    # The launch's TP 2 fits four H200s and divides everything: the other cells plan.
    over = scenario.replace("tensor_parallel_size: 2}", "tensor_parallel_size: 8}")
    launch = value_at(over, "tensor_parallel_size")
    problems = planned(tmp_path / "launch", matrix, {"moe-rank": over})
    assert problems[0].startswith(f"{tmp_path}/launch/scenarios/moe-rank.yaml:{launch}: ")
    assert "asks for 8 GPUs, but GPU `h200x4` has `count: 4`" in problems[0]


def test_tp_must_divide_the_expert_intermediate_size_unless_experts_are_divided(
    tmp_path: Path,
) -> None:
    odd = MATRIX.replace("moe_intermediate_size: 768", "moe_intermediate_size: 770") + ONLY_H200
    odd = odd.replace("default: {}", "default: {tensor_parallel_size: 4}")
    problems = planned(tmp_path, odd)
    assert len(problems) == 1 and "does not divide the expert intermediate size 770" in problems[0]
    expert = odd.replace(
        "default: {tensor_parallel_size: 4}",
        "default: {tensor_parallel_size: 4, enable_expert_parallel: true}",
    )
    loaded, catalogue = setup(tmp_path / "ep", expert, {"moe-rank": MOE_SCENARIO})
    assert plan(loaded, catalogue, Lane.GPU)  # expert parallelism: no intermediate split


@pytest.mark.parametrize("value", ["0", "-2", "1.5", '"4"', "true"])
def test_a_size_below_one_or_not_a_number_is_refused_where_it_is_written(
    tmp_path: Path, value: str
) -> None:
    matrix = MATRIX.replace("default: {}", f"default: {{tensor_parallel_size: {value}}}")
    with pytest.raises(ConfigError) as caught:
        setup(tmp_path, matrix)
    [problem] = caught.value.problems
    assert f"{problem.line}:{problem.column}" == at(matrix, value + "}")
    words = "must be at least 1" if value in ("0", "-2") else "must be a whole number"
    assert problem.message.startswith(f"flag `tensor_parallel_size` {words}")
    scenario = MOE_SCENARIO.replace("max_lora_rank: 128}", f"pipeline_parallel_size: {value}}}")
    write(tmp_path / "s", "moe-rank.yaml", scenario)
    with pytest.raises(ConfigError) as caught:
        load_scenarios(tmp_path / "s")
    assert "flag `pipeline_parallel_size`" in str(caught.value)


def test_plan_exits_2_naming_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    matrix = MATRIX.replace("default: {}", "default: {tensor_parallel_size: 4}")
    setup(tmp_path, matrix, {"moe-rank": MOE_SCENARIO, "healthy": BASELINE})
    args = ["plan", "--matrix", str(tmp_path / "matrix.yaml")]
    assert main([*args, "--scenarios", str(tmp_path / "scenarios")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"matrix.yaml:{value_at(matrix, 'tensor_parallel_size')}: tensor_parallel_size 4" in err
    assert "GPU `h100` has `count: 1`" in err and "Traceback" not in err


def test_eight_l4s_cannot_hold_seed_000_at_tp8(tmp_path: Path) -> None:
    seed = "default: {tensor_parallel_size: 8, max_model_len: 4096}"  # seed 000's launch
    matrix = MATRIX.replace("default: {}", seed)
    matrix += "exclude:\n  - {gpu: [h100, h200x4]}\n"
    loaded, catalogue = setup(tmp_path, matrix, {"moe-rank": MOE_SCENARIO})
    cells = [c for c in plan(loaded, catalogue, Lane.GPU) if c.level is Level.ENGINE]
    trigger = next(c for c in cells if c.variant.name == "trigger")
    found = estimate(trigger)
    assert found is not None and found.ranks == 8 and found.fit is Fit.INFEASIBLE
    # Each L4 needs about 31 GiB of its 20.7 GiB budget, 166 GiB for all eight.
    assert found.budget is not None and 30 * 2**30 < found.need < 32 * 2**30
    assert (infeasible_reason(trigger) or "").startswith(
        "infeasible: each of its 8 GPUs (TP x PP) needs at least 31.1 GiB"
    )
