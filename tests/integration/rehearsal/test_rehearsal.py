"""The GPU-lane rehearsal for real: a local registry, pulls, real vLLM and a moved tag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repromatrix.images.wheelhouse import CACHE_ROOT
from repromatrix.rehearsal.hfcache import repo_folder
from repromatrix.rehearsal.registry import answers, local_registry
from repromatrix.rehearsal.rehearse import MODEL_REPO
from repromatrix.results.store import LOG_FILE, cell_dir, read_results
from support import paths

ROOT = paths.ROOT


@pytest.mark.program("docker-registry")
def test_the_local_registry_starts_on_the_loopback_answers_and_stops(tmp_path: Path):
    with local_registry(tmp_path / "registry", port=5998) as registry:
        assert registry.host == "127.0.0.1:5998"
        config = (tmp_path / "registry" / "config.yml").read_text()
        assert "addr: 127.0.0.1:5998" in config
        assert registry.tags("nothing/here") == []  # the registry answers 404: no tags
    assert not answers("127.0.0.1:5998")


@pytest.mark.docker
@pytest.mark.vllm
@pytest.mark.program("docker-registry")
def test_the_rehearsal_pulls_runs_and_records_a_moved_tag(tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    argv = [sys.executable, "-m", "repromatrix", "rehearse", "--versions", "0.32.0",
            "--results", str(tmp_path), "--run-id", "rehearsal", "--port", "5997"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout)
    ((ref, first),) = summary["pushed"].items()
    assert summary["moved"][ref] != first
    results, problems = read_results(tmp_path / "rehearsal")
    assert problems == []
    by_scenario = {(r.scenario, r.variant): r for r in results}
    assert all(r.lane == "gpu" for r in results)
    healthy = by_scenario[("healthy-gpu", "baseline")]
    assert healthy.outcome.value == "avoided" and healthy.answered
    assert healthy.image_digest is not None and healthy.image_digest.endswith(first)
    hit = by_scenario[("kv-cache-memory-too-small", "trigger")]
    assert hit.outcome.value == "hit" and hit.root_cause is not None
    assert "KV cache" in hit.root_cause.line or "max seq len" in hit.root_cause.line
    moved, _ = read_results(tmp_path / "rehearsal-moved")
    assert moved and all(r.image_digest and r.image_digest.endswith(summary["moved"][ref])
                         for r in moved)  # fmt: skip
    # vLLM's own console script started the server, as the look-alike's entrypoint says.
    log = (cell_dir(tmp_path / "rehearsal", healthy.id) / LOG_FILE).read_text()
    [launched] = [json.loads(line.split(" ", 1)[1]) for line in log.splitlines()
                  if line.startswith("@@repromatrix-launch ")]  # fmt: skip
    assert launched[:3] == ["vllm", "serve", MODEL_REPO]
    assert "version 0.32.0" in log  # vLLM's own banner
    # The revision read is the snapshot the cache's refs/main names.
    cache = CACHE_ROOT if CACHE_ROOT.is_absolute() else ROOT / CACHE_ROOT
    repo = repo_folder(cache / "rehearsal" / "huggingface", MODEL_REPO)
    assert healthy.model_revision == (repo / "refs" / "main").read_text().strip()
    assert healthy.environment is not None
    assert "vLLM Version" in (tmp_path / "rehearsal" / healthy.environment).read_text()
