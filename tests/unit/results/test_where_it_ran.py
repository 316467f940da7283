"""Schema 2: where a cell ran (runner GPUs, revisions read, the environment report), read back
through the validated schema; version-1 results still read; reports kept and merged with runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from repromatrix.results.merge import merge
from repromatrix.results.schema import SCHEMA_VERSION, ResultProblem, parse_result
from repromatrix.results.store import (
    RESULT_FILE,
    cell_dir,
    read_environment,
    read_results,
    write_environment,
)
from support.reports import result, write_run

GPU = {
    "index": "0", "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-5fd1", "memory_mib": 81559,
    "driver_version": "550.54.15", "cuda_version": "12.4", "mig_mode": None,
}  # fmt: skip
REPORT = "Collecting environment information...\nvLLM Version                 : 0.32.0\n"


def where(**changes: object) -> bytes:
    cell = replace(
        result(lane="gpu", tag="v0.32.0", gpu="h100"),
        runner_gpus=(GPU,),
        model_revision="a" * 40,
        adapter_revision=None,
        environment="environment/gpu-v0.32.0-0123456789ab.txt",
    )
    data = {**cell.to_json(), **changes}
    return json.dumps(data).encode()


def test_where_it_ran_is_read_back_as_written() -> None:
    read = parse_result(where())
    assert read.schema_version == SCHEMA_VERSION == 3
    assert read.runner_gpus == (GPU,)
    assert read.model_revision == "a" * 40 and read.adapter_revision is None
    assert read.environment == "environment/gpu-v0.32.0-0123456789ab.txt"


def test_a_version_1_result_reads_with_where_it_ran_unknown() -> None:
    data = json.loads(where())
    for name in ("runner_gpus", "model_revision", "adapter_revision", "environment"):
        del data[name]
    data["schema_version"] = 1
    read = parse_result(json.dumps(data).encode())
    assert (read.runner_gpus, read.model_revision, read.environment) == ((), None, None)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("environment", "../../etc/passwd", "is not environment/<name>.txt"),
        ("environment", "environment/../x.txt", "is not environment/<name>.txt"),
        ("environment", "cells/x/log.txt", "is not environment/<name>.txt"),
        ("runner_gpus", {"name": "H100"}, "must be a list of GPUs"),
        ("runner_gpus", ["H100"], "must hold objects of GPU facts"),
        ("runner_gpus", [{"name": ["H100"]}], "GPU fact `name` must be text"),
        ("model_revision", 7, "must be text"),
    ],
)
def test_where_it_ran_from_another_machine_is_checked(field: str, value: object, message: str):
    with pytest.raises(ResultProblem) as info:
        parse_result(where(**{field: value}))
    assert f"`{field}` " in str(info.value) and message in str(info.value)


def test_a_report_is_saved_once_by_content_redacted_and_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_notARealToken123")
    path = write_environment(tmp_path, "gpu-v0.32.0", REPORT + "HF_TOKEN=hf_notARealToken123\n")
    assert path.startswith("environment/gpu-v0.32.0-") and path.endswith(".txt")
    text = read_environment(tmp_path, path)
    assert text == REPORT + "HF_TOKEN=<redacted>\n"
    assert write_environment(tmp_path, "gpu-v0.32.0", REPORT) != path  # another content
    assert read_environment(tmp_path, "../outside.txt") is None
    (tmp_path / "environment" / "linked.txt").symlink_to(tmp_path / path)
    assert read_environment(tmp_path, "environment/linked.txt") is None  # links are not read


def test_merge_brings_each_kept_cells_report(tmp_path: Path) -> None:
    shards = []
    for name, tag in (("a", "0.31.0"), ("b", "0.32.0")):
        shard = tmp_path / name
        report = write_environment(shard, f"cpu-{tag}", f"vLLM Version : {tag}\n")
        write_run(shard, [replace(result(tag=tag), environment=report, host=f"runner-{name}")])
        shards.append(shard)
    merged = merge(shards, tmp_path / "merged")
    assert merged.problems == ()
    found, _ = read_results(tmp_path / "merged")
    for kept in found:
        assert kept.environment is not None
        assert read_environment(tmp_path / "merged", kept.environment) == (
            f"vLLM Version : {kept.image_tag}\n"
        )
    saved = json.loads((cell_dir(tmp_path / "merged", found[0].id) / RESULT_FILE).read_text())
    assert saved["environment"] == found[0].environment
