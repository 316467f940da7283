"""The local backend against real vLLM: crashes, a healthy server, early stop and deadlines."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from repromatrix.backends.harness_spec import build_spec
from repromatrix.backends.local import LocalBackend
from repromatrix.models.tinymodel import LORA_RANK, TinyModel, ensure_tiny_model
from repromatrix.values import Cell, Launch
from support import paths
from support.harness import TINY, make_cell, status_of
from support.machine import venv

VENVS = paths.VENVS

KV_FLAGS = {"max_model_len": 2048, "kv_cache_memory_bytes": 262144}

KV_ROOT_CAUSE = "To serve at least one request with the model's max seq len"


@pytest.fixture(scope="module")
def tiny() -> TinyModel:
    return ensure_tiny_model(TINY, str(venv("0.32.0") / "bin" / "python3"), lora_ranks=(LORA_RANK,))


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


@pytest.mark.vllm("0.32.0")
def test_real_kv_cache_too_small_crash(backend: LocalBackend, tiny: TinyModel) -> None:
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


@pytest.mark.vllm("0.31.0", "0.32.0")  # 0.32.0 makes the tiny model
def test_real_healthy_server_answers_through_the_lora_adapter(
    backend: LocalBackend, tiny: TinyModel
) -> None:
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


@pytest.mark.vllm("0.32.0")
def test_real_early_stop_ends_the_cell_and_leaves_no_process(
    backend: LocalBackend, tiny: TinyModel
) -> None:
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


@pytest.mark.vllm("0.32.0")
def test_real_deadline_stops_the_cell(backend: LocalBackend, tiny: TinyModel) -> None:
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
