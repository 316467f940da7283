"""The runner: run ids, resume, backend choice, skips, and faults surviving in real containers."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from repromatrix.backends import kinds
from repromatrix.backends import local as local_kind
from repromatrix.backends.base import Prepared
from repromatrix.backends.docker import kind as docker_kind
from repromatrix.errors import UsageError
from repromatrix.host.runner import Runner
from repromatrix.judgement import Outcome
from repromatrix.matrix.config import load_matrix
from repromatrix.results import store as results
from repromatrix.run.claim import claim
from repromatrix.run.folder import pending, resolve_folder
from repromatrix.values import Image, Lane
from support import paths
from support.pool import Recorder, resources, run
from support.runner import cell

ROOT = paths.ROOT


def test_run_id_defaults_to_the_time_and_resume_takes_the_latest(tmp_path: Path):
    folder = resolve_folder(tmp_path, None, resume=False)
    assert len(folder.run_id) == 15 and folder.path == tmp_path / folder.run_id
    for name in ("20250101-000000", "20250301-000000", "not a run"):
        (tmp_path / name).mkdir()
    assert resolve_folder(tmp_path, None, resume=True).run_id == "20250301-000000"
    assert resolve_folder(tmp_path, "x1", resume=True).run_id == "x1"


def test_bad_run_ids_and_resume_without_runs_are_usage_errors(tmp_path: Path):
    with pytest.raises(UsageError, match="run id"):
        resolve_folder(tmp_path, "../escape", resume=False)
    with pytest.raises(UsageError, match="no earlier run"):
        resolve_folder(tmp_path / "none", None, resume=True)


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
    assert kinds.choose("auto") is docker_kind.KIND
    monkeypatch.setattr(docker_kind.DockerKind, "available", lambda self: False)
    assert kinds.choose("auto") is local_kind.KIND
    assert kinds.choose("local") is local_kind.KIND
    assert kinds.choose("docker") is docker_kind.KIND  # named: no probe, the run says why
    with pytest.raises(UsageError, match="--backend"):
        kinds.choose("podman")


def gpus(count: int) -> Runner:
    return Runner(gpu_ids=tuple(str(index) for index in range(count)))


def test_gpu_cells_are_skipped_with_a_reason_where_they_cannot_run():
    gpu = cell(Lane.GPU, gpus=4)
    local, docker_ = local_kind.KIND, docker_kind.KIND
    assert local.skip_reason(cell(), Runner()) is None
    assert "local backend" in (local.skip_reason(gpu, gpus(8)) or "")
    assert docker_.skip_reason(gpu, Runner()) == (
        "GPU cell needs 4 GPU(s) (h200x4); this host has no GPU"
    )
    assert "has 2 GPU(s)" in (docker_.skip_reason(gpu, gpus(2)) or "")
    assert docker_.skip_reason(gpu, gpus(4)) is None


def test_container_settings_follow_the_matrix_runtimes(tmp_path: Path):
    matrix = load_matrix(ROOT / "matrix.yaml")
    runtimes = {lane: config.runtime for lane, config in matrix.lanes.items()}
    settings = docker_kind.container_settings(runtimes, tmp_path, Runner())
    assert settings[Lane.CPU].shm_size == matrix.lanes[Lane.CPU].runtime.shm_size
    assert [m.target for m in settings[Lane.CPU].mounts] == [str(tmp_path)]
    assert all(m.read_only for m in settings[Lane.CPU].mounts)
    hf = settings[Lane.GPU].hf_cache
    assert hf is not None and not hf.startswith("~")  # expanded before docker sees it


# -- faults, in real containers -------------------------------------------------------------


def test_a_second_run_of_the_same_run_folder_is_refused_until_the_first_ends(tmp_path: Path):
    first = claim(tmp_path / "run")
    with pytest.raises(UsageError, match=f"another run \\(pid {os.getpid()} on "):
        claim(tmp_path / "run")
    first.release()
    claim(tmp_path / "run").release()  # free again once the first has ended


def test_cells_of_an_image_that_failed_to_build_are_infra_errors_with_the_reason(tmp_path):
    def make(image: Image) -> Prepared:
        return Prepared(image.key, "repromatrix/cell-cpu-0.32.0:x", error="build of x failed: boom")

    one, other = cell(variant="trigger"), cell(variant="max-model-len-64")
    gpu = cell(Lane.GPU)
    skips = {gpu.id: "GPU cell needs 4 GPU(s) (h200x4); no GPU"}
    out = io.StringIO()
    backend = Recorder(make=make)
    counts = run(tmp_path / "r", backend, [one, other, gpu], resources(), out, skips=skips)
    found = {r.id: r for r in results.read_results(tmp_path / "r")[0]}
    assert found[one.id].outcome is Outcome.INFRA_ERROR
    assert found[one.id].reason == "image not available: build of x failed: boom"
    assert found[other.id].outcome is Outcome.INFRA_ERROR
    assert found[gpu.id].outcome is Outcome.SKIPPED and "no GPU" in found[gpu.id].reason
    assert counts == {"infra_error": 2, "skipped": 1}
    assert backend.placements == {}  # no cell of a failed image ever starts
