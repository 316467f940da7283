"""A signature with ``beside``: the crash's line counts only with the second pattern in the
same log (seed 003: an illegal memory access raised from a punica LoRA kernel)."""

from __future__ import annotations

from repromatrix.matrix.scenarios import load_scenario
from repromatrix.triage import Triager, triage_path
from support import paths

LOGS = paths.DATA / "logs"
SEED_003 = load_scenario(paths.ROOT / "scenarios" / "lora-int32-offset-overflow.yaml")
ILLEGAL = b"RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered\n"


def shows(data: bytes) -> bool:
    triager = Triager([SEED_003])
    triager.feed(data)
    return triager.diagnose().shows(SEED_003.id)


def test_the_seeds_quoted_traceback_is_its_crash() -> None:
    # The seed document's quoted lines, the same six lines as the public issue's log
    # (vllm-project/vllm#53028): the error, then with CUDA_LAUNCH_BLOCKING=1 the frame of
    # _lora_expand in lora_expand_op.py.
    diagnosis = triage_path(
        LOGS / "real" / "01-gemma4-lora-expand-illegal-memory-access.log", [SEED_003]
    )
    assert diagnosis.shows(SEED_003.id) and diagnosis.scenario == SEED_003.id


def test_an_illegal_memory_access_without_a_lora_kernel_frame_is_not_it() -> None:
    assert not shows(ILLEGAL + b"RuntimeError: Engine core initialization failed.\n")
    frame = b'  File "/x/vllm/model_executor/layers/fused_moe/fused_moe.py", line 9, in f\n'
    assert not shows(b"Traceback (most recent call last):\n" + frame + ILLEGAL)


def test_the_frame_may_come_before_or_after_the_error() -> None:
    frame = b'  File "/x/vllm/lora/ops/triton_ops/lora_shrink_op.py", line 149, in _lora_shrink\n'
    assert shows(b"Traceback (most recent call last):\n" + frame + ILLEGAL)
    assert shows(ILLEGAL + frame.lstrip())


def test_a_lora_kernel_frame_without_the_illegal_access_is_not_it() -> None:
    # A LoRA shrink kernel's own assertion (vllm-project/vllm#27962) is another crash.
    assert not triage_path(LOGS / "real" / "13-lora-shrink-assert-qwen3vl.log", [SEED_003]).shows(
        SEED_003.id
    )
