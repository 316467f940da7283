"""Where a cell ran, in its result: the image's environment report (made once per image and
runner, kept with the run), the runner's GPUs the cell was given, the model revision read.

The recording backend of ``support.pool`` stands behind the ``Backend`` interface; vLLM's own
collector in real images is run by ``tests/integration/run/test_cpu_matrix.py``.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict, replace
from pathlib import Path

from repromatrix.backends.base import Prepared
from repromatrix.models.tinymodel import content_hash, tiny_model_for
from repromatrix.results import store
from repromatrix.run.cell import cell_context
from repromatrix.run.environment import EnvironmentReports, report_key
from repromatrix.run.images import ImageReady
from repromatrix.values import Lane, Launch
from support import factories
from support.pool import UUIDS, Recorder, resources, run, saved
from support.runner import cell

OLD, NEW = cell(version="0.31.0", variant="old"), cell(version="0.32.0", variant="new")
TWICE = [OLD, NEW, cell(version="0.32.0", variant="again")]


def reports(tmp_path: Path, runner_gpus: int = 0) -> EnvironmentReports:
    return EnvironmentReports(tmp_path, tmp_path / "cache", resources(gpus=runner_gpus))


def test_each_images_report_is_made_once_saved_with_the_run_and_named_by_its_cells(
    tmp_path: Path,
) -> None:
    backend = Recorder()
    run(tmp_path, backend, TWICE, resources(), reports=reports(tmp_path))
    assert sorted(backend.reported) == sorted({OLD.image.key, NEW.image.key})
    results = saved(tmp_path)
    keys = {one.id: one.image.key for one in TWICE}
    for result in results.values():
        assert result.environment is not None
        text = store.read_environment(tmp_path, result.environment)
        assert text == f"vLLM Version : in {keys[result.id]}\n"
    assert len({r.environment for r in results.values()}) == 2  # one per image


def test_a_second_run_on_the_same_runner_reads_the_report_back(tmp_path: Path) -> None:
    first, second = Recorder(), Recorder()
    run(tmp_path / "a", first, [NEW], resources(), reports=reports(tmp_path / "a"))
    again = EnvironmentReports(tmp_path / "b", tmp_path / "a" / "cache", resources())
    run(tmp_path / "b", second, [NEW], resources(), reports=again)
    assert first.reported == [NEW.image.key] and second.reported == []
    [one], [two] = saved(tmp_path / "a").values(), saved(tmp_path / "b").values()
    assert one.environment == two.environment and two.environment is not None
    assert (tmp_path / "b" / two.environment).is_file()  # each run folder holds its own copy


def test_another_runner_or_another_image_is_another_report() -> None:
    prepared = Prepared("gpu-v0.32.0", "tag", digest="sha256:a")
    key = report_key("docker", prepared, resources(gpus=2))
    assert key == report_key("docker", prepared, resources(gpus=2))
    assert key != report_key("docker", prepared, resources(gpus=4))
    assert key != report_key("docker", replace(prepared, digest="sha256:b"), resources(gpus=2))


def test_a_collector_that_fails_leaves_the_cells_running_and_says_why(tmp_path: Path) -> None:
    out = io.StringIO()
    backend = Recorder(report=lambda _prepared: None)
    counts = run(tmp_path, backend, [NEW], resources(), out, reports=reports(tmp_path))
    assert sum(counts.values()) == 1
    [result] = saved(tmp_path).values()
    assert result.environment is None
    assert f"no environment report for {NEW.image.key}: collect_env exited" in out.getvalue()


def test_a_gpu_result_names_the_runners_gpus_it_was_given(tmp_path: Path) -> None:
    cells = [cell(Lane.GPU, gpus=2, variant="two"), cell(Lane.GPU, gpus=1, variant="one")]
    runner = resources(gpus=4)
    backend = Recorder()
    run(tmp_path, backend, cells, runner)
    listed = {asdict(gpu)["uuid"]: asdict(gpu) for gpu in runner.gpus}
    for one in cells:
        result = saved(tmp_path)[one.id]
        placement = backend.placements[one.id]
        assert placement is not None and placement.gpu_ids is not None
        # the GPUs it ran on, each with every fact the runner read of it
        assert list(result.runner_gpus) == [listed[uuid] for uuid in placement.gpu_ids]
        assert set(placement.gpu_ids) <= set(UUIDS.values())
    document = json.loads((store.cell_dir(tmp_path, cells[0].id) / store.RESULT_FILE).read_text())
    assert document["schema_version"] == 3 and len(document["runner_gpus"]) == 2


def test_a_cpu_result_names_the_tiny_models_content_and_no_gpu(tmp_path: Path) -> None:
    lora = factories.cell(
        Lane.CPU,
        of=factories.scenario("cpu-lora", launch=Launch(lora_adapter="tiny-lora")),
        flags={"enable_lora": True},
    )
    tiny = tiny_model_for(lora.model, tmp_path)
    adapter = tiny.adapter_path()
    adapter.mkdir(parents=True)
    (tiny.path / "config.json").write_text("{}")
    (adapter / "adapter_config.json").write_text("{}")
    ready = ImageReady(Prepared("k", "img"), "0.32.0", {lora.model.name: tiny}, "environment/k.txt")
    context = cell_context(lora, ready, tmp_path)
    assert context.model_revision == content_hash(tiny.path) != content_hash(adapter)
    assert context.adapter_revision == content_hash(adapter)
    assert context.environment == "environment/k.txt"
    (adapter / "adapter_config.json").write_text('{"changed": 1}')
    assert content_hash(tiny.path) == context.model_revision  # its adapters are not part of it
    (tiny.path / "config.json").write_text('{"changed": 1}')
    assert content_hash(tiny.path) != context.model_revision  # its content is its revision
