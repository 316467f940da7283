"""The runner: run ids, resume, backend choice, skips, and faults surviving in real containers."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from repromatrix.backends import local as local_kind
from repromatrix.backends import registry
from repromatrix.backends.base import Host, Prepared
from repromatrix.backends.docker import kind as docker_kind
from repromatrix.errors import UsageError
from repromatrix.matrix.config import load_matrix
from repromatrix.model import Lane, Outcome
from repromatrix.results import store as results
from repromatrix.run.cell import CellContext
from repromatrix.run.folder import claim
from repromatrix.run.progress import Progress
from repromatrix.run.stages import RunOptions, RunState, pending, resolve_run_dir, stage_cells
from support import paths
from support.runner import cell

ROOT = paths.ROOT


def test_run_id_defaults_to_the_time_and_resume_takes_the_latest(tmp_path: Path):
    run_id, run_dir = resolve_run_dir(RunOptions(results=tmp_path))
    assert len(run_id) == 15 and run_dir == tmp_path / run_id
    for name in ("20250101-000000", "20250301-000000", "not a run"):
        (tmp_path / name).mkdir()
    assert resolve_run_dir(RunOptions(results=tmp_path, resume=True))[0] == "20250301-000000"
    assert resolve_run_dir(RunOptions(results=tmp_path, run_id="x1", resume=True))[0] == "x1"


def test_bad_run_ids_and_resume_without_runs_are_usage_errors(tmp_path: Path):
    with pytest.raises(UsageError, match="run id"):
        resolve_run_dir(RunOptions(results=tmp_path, run_id="../escape"))
    with pytest.raises(UsageError, match="no earlier run"):
        resolve_run_dir(RunOptions(results=tmp_path / "none", resume=True))


def test_resume_leaves_out_cells_with_a_result(tmp_path: Path):
    done, todo = cell(variant="trigger"), cell(variant="max-model-len-64")
    result = results.CellResult(
        id=done.id, outcome=Outcome.HIT, expected=done.expected, lane="cpu", level="engine",
        image="x", image_tag="0.32.0", gpu="cpu", model="tiny-llama", flagset="default",
        scenario=done.scenario.id, variant="trigger",
    )  # fmt: skip
    results.write_result(tmp_path, result, b"log")
    assert pending((done, todo), tmp_path, resume=True) == (todo,)
    assert pending((done, todo), tmp_path, resume=False) == (done, todo)


def test_backend_choice(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(docker_kind.DockerKind, "available", lambda self: True)
    assert registry.choose("auto") is docker_kind.KIND
    monkeypatch.setattr(docker_kind.DockerKind, "available", lambda self: False)
    assert registry.choose("auto") is local_kind.KIND
    assert registry.choose("local") is local_kind.KIND
    assert registry.choose("docker") is docker_kind.KIND  # named: no probe, the run says why
    with pytest.raises(UsageError, match="--backend"):
        registry.choose("podman")


def gpus(count: int) -> Host:
    return Host(gpu_ids=tuple(str(index) for index in range(count)))


def test_gpu_cells_are_skipped_with_a_reason_where_they_cannot_run():
    gpu = cell(Lane.GPU, gpus=4)
    local, docker_ = local_kind.KIND, docker_kind.KIND
    assert local.skip_reason(cell(), Host()) is None
    assert "local backend" in (local.skip_reason(gpu, gpus(8)) or "")
    assert docker_.skip_reason(gpu, Host()) == (
        "GPU cell needs 4 GPU(s) (h200x4); this host has no GPU"
    )
    assert "has 2 GPU(s)" in (docker_.skip_reason(gpu, gpus(2)) or "")
    assert docker_.skip_reason(gpu, gpus(4)) is None


def test_container_settings_follow_the_matrix_runtimes(tmp_path: Path):
    matrix = load_matrix(ROOT / "matrix.yaml")
    runtimes = {lane: config.runtime for lane, config in matrix.lanes.items()}
    settings = docker_kind.container_settings(runtimes, tmp_path)
    assert settings[Lane.CPU].shm_size == matrix.lanes[Lane.CPU].runtime.shm_size
    assert [m.target for m in settings[Lane.CPU].mounts] == [str(tmp_path)]
    assert all(m.read_only for m in settings[Lane.CPU].mounts)
    hf = settings[Lane.GPU].hf_cache
    assert hf is not None and not hf.startswith("~")  # expanded before docker sees it
    assert "HF_TOKEN" in settings[Lane.GPU].secret_env


# -- faults, in real containers -------------------------------------------------------------


def test_a_second_run_of_the_same_run_folder_is_refused_until_the_first_ends(tmp_path: Path):
    first = claim(tmp_path / "run")
    with pytest.raises(UsageError, match=f"another run \\(pid {os.getpid()}\\)"):
        claim(tmp_path / "run")
    first.release()
    claim(tmp_path / "run").release()  # free again once the first has ended


def test_cells_of_an_image_that_failed_to_build_are_infra_errors_with_the_reason(tmp_path):
    failed = Prepared(
        "cpu-0.32.0", "repromatrix/cell-cpu-0.32.0:x", error="build of x failed: boom"
    )
    one, other = cell(variant="trigger"), cell(variant="max-model-len-64")
    gpu = cell(Lane.GPU)
    contexts = {
        one.id: CellContext(failed, model_path="/m"),
        other.id: CellContext(failed, model_path="/m"),
        gpu.id: CellContext(None, "", skip_reason="GPU cell needs 4 GPU(s) (h200x4); no GPU"),
    }
    out = io.StringIO()
    state = RunState(
        options=RunOptions(results=tmp_path),
        run_id="r",
        run_dir=tmp_path / "r",
        todo=(one, other, gpu),
        backend=object(),  # type: ignore[arg-type]  # never called: no cell here can start
        contexts=contexts,
    )
    state = stage_cells(state, Progress(3, out=out))
    found = {r.id: r for r in results.read_results(tmp_path / "r")[0]}
    assert found[one.id].outcome is Outcome.INFRA_ERROR
    assert found[one.id].reason == "image not available: build of x failed: boom"
    assert found[other.id].outcome is Outcome.INFRA_ERROR
    assert found[gpu.id].outcome is Outcome.SKIPPED and "no GPU" in found[gpu.id].reason
    assert state.outcomes == {"infra_error": 2, "skipped": 1}
    assert " start " not in out.getvalue().split("\n")[-2]  # a skipped cell never "starts"
