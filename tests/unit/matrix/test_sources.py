"""Models and adapters as users have them: repo ids or local folders, adapters per model,
the mounts a GPU cell gets, and ``repromatrix prepare`` (with a fake downloader)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from repromatrix.backends.docker.calls import ContainerSettings, container_call
from repromatrix.backends.harness_spec import container_adapter_path, container_model_path
from repromatrix.commands import prepare
from repromatrix.errors import ConfigError, InfraError
from repromatrix.matrix.config import load_matrix
from repromatrix.matrix.expand import plan
from repromatrix.matrix.sources import Download, check_local, downloads
from repromatrix.values import Cell
from support.matrix import at, setup, write

MODELS = """
lanes:
  gpu:
    runtime: {hf_cache: HF_HOME_HERE}
    images: [v0.17.0]
    gpus:
      h200x4: {runner: gpu-h200x4, count: 4, compute_capability: "9.0"}
    models:
      hub-moe:
        source: org/moe
        moe: true
        adapters:
          seed-adapter: {source: org/moe-lora}
      local-moe:
        path: weights/moe
        moe: true
        adapters:
          seed-adapter: {path: /srv/adapters/moe}
    flagsets:
      default: {tensor_parallel_size: 4}
"""

ADAPTER_SCENARIO = """
id: lora-moe
title: LoRA MoE injection
lanes: [gpu]
trigger:
  model.moe: true
  flags.enable_lora: true
launch:
  flags: {enable_lora: true}
  lora_adapter: seed-adapter
signatures: [{pattern: "TritonExperts", process: Worker}]
affected: "==0.17.*"
variants:
  - {name: no-lora, kind: control, flags: {enable_lora: false}}
avoided: ready
"""


def cells_of(tmp_path: Path, matrix: str = MODELS) -> dict[str, Cell]:
    text = matrix.replace("HF_HOME_HERE", str(tmp_path / "hf"))
    loaded, scenarios = setup(tmp_path, text, {"lora-moe": ADAPTER_SCENARIO})
    return {cell.model.name + "/" + cell.variant.name: cell for cell in plan(loaded, scenarios)}


def test_a_local_model_and_its_adapter_are_mounted_read_only(tmp_path: Path) -> None:
    cell = cells_of(tmp_path)["local-moe/trigger"]
    assert cell.model.path == str(tmp_path / "weights" / "moe")  # relative to the matrix
    call = container_call(cell, {}, "img", ContainerSettings(gpu_ids=("0", "1", "2", "3")), "r")
    volumes = call.create_kwargs()["volumes"]
    assert volumes[str(tmp_path / "weights" / "moe")] == {
        "bind": "/opt/repromatrix/models/local-moe",
        "mode": "ro",
    }
    assert volumes["/srv/adapters/moe"] == {
        "bind": "/opt/repromatrix/adapters/local-moe/seed-adapter",
        "mode": "ro",
    }
    assert container_model_path(cell) == "/opt/repromatrix/models/local-moe"
    assert container_adapter_path(cell) == "/opt/repromatrix/adapters/local-moe/seed-adapter"


def test_a_hub_model_reads_the_hf_cache_and_lora_off_loads_no_adapter(tmp_path: Path) -> None:
    cells = cells_of(tmp_path)
    hub = cells["hub-moe/trigger"]
    assert (container_model_path(hub), container_adapter_path(hub)) == ("org/moe", "org/moe-lora")
    assert container_adapter_path(cells["hub-moe/no-lora"]) is None
    assert container_adapter_path(cells["local-moe/no-lora"]) is None


def test_downloads_list_each_repo_the_cells_read_once(tmp_path: Path) -> None:
    wanted = downloads(list(cells_of(tmp_path).values()))
    assert [(d.kind, d.repo_id, d.used_by) for d in wanted] == [
        ("model", "org/moe", ("hub-moe",)),
        ("adapter", "org/moe-lora", ("hub-moe",)),
    ]


def line(needle: str) -> str:
    """The line of ``needle`` in MODELS as written (at() gives line:column)."""
    return at(MODELS, needle).split(":")[0]


def test_a_missing_folder_is_named_before_anything_starts(tmp_path: Path) -> None:
    cells = list(cells_of(tmp_path).values())
    problems = [str(p) for p in check_local(cells, "matrix.yaml", is_dir=lambda _: False)]
    assert problems == [
        f"matrix.yaml:{line('path: weights/moe')}: model `local-moe`: the folder "
        f"{tmp_path / 'weights' / 'moe'} does not "
        "exist on this runner",
        f"matrix.yaml:{line('seed-adapter: {path')}: adapter `seed-adapter` of model "
        "`local-moe`: the folder /srv/adapters/moe "
        "does not exist on this runner",
    ]
    assert check_local(cells, "matrix.yaml", is_dir=lambda _: True) == []


def test_a_scenario_adapter_of_another_model_is_excluded_never_added(tmp_path: Path) -> None:
    """An adapter serves the model it was trained for: the advice keeps it there and excludes
    the model that lacks it from the scenario (it never says to add it to that model)."""
    text = MODELS.replace("seed-adapter: {source: org/moe-lora}", "seed-adaptor: {source: o/a}")
    with pytest.raises(ConfigError) as info:
        cells_of(tmp_path, text)
    (problem,) = info.value.problems
    assert problem.file.endswith("lora-moe.yaml")
    assert problem.line == int(at(ADAPTER_SCENARIO, "lora_adapter").split(":")[0])
    message = str(problem)
    assert "adapter `seed-adapter` is declared under model `local-moe`, not under `hub-moe` " in (
        message
    )
    assert "cell gpu/v0.17.0/h200x4/hub-moe/" in message
    assert "exclude `hub-moe` from scenario `lora-moe`" in message
    assert "`exclude: [{model: hub-moe, scenario: lora-moe}]`" in message
    assert "add it under" not in message


def test_a_scenario_adapter_declared_under_no_model_is_declared_where_it_was_trained(
    tmp_path: Path,
) -> None:
    text = MODELS.replace("seed-adapter: {source: org/moe-lora}", "seed-adaptor: {source: o/a}")
    text = text.replace("seed-adapter: {path: /srv/adapters/moe}", "other: {path: /srv/a}")
    with pytest.raises(ConfigError) as info:
        cells_of(tmp_path, text)
    messages = sorted(str(problem) for problem in info.value.problems)
    assert len(messages) == 2  # one per model that lacks it, each at the scenario's line
    hub = messages[0]
    assert "adapter `seed-adapter` is declared under no model" in hub
    assert "(cell gpu/v0.17.0/h200x4/hub-moe/" in hub
    assert "declare it under the model it was trained for" in hub
    assert "base_model_name_or_path" in hub
    assert "exclude the other models from scenario `lora-moe`" in hub
    assert "Perhaps you meant `seed-adaptor`?" in hub


def test_bad_model_entries_each_with_a_position(tmp_path: Path) -> None:
    text = """
        lanes:
          gpu:
            images: [v0.31.0]
            gpus: {h100: {runner: r, count: 1}}
            models:
              both: {source: org/a, path: /m}
              neither: {moe: true}
              folder-as-repo: {source: /models/x}
              adapters-bad:
                source: org/b
                adapters: {a: {source: org/a, path: /x}, b: {pth: /y}}
          cpu:
            images: ["0.32.0"]
            gpus: {cpu: {runner: u}}
            models: {t: {source: t, path: /m}}
        """
    path = write(tmp_path, "matrix.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    problems = [str(p).removeprefix(f"{path}:") for p in info.value.problems]
    assert problems == [
        f"{at(text, '{source: org/a, path')}: model `both` has `source` and `path`: "
        "give one of them",
        f"{at(text, '{moe: true}')}: model `neither` needs `source` (an HF repo id) or `path` "
        "(a local folder)",
        f"{at(text, '/models/x')}: `source` `/models/x` is not an HF repo id like org/name "
        "(a folder: use `path`)",
        f"{at(text, '{source: org/a, path: /x}')}: adapter `a` needs one of `source` (an HF repo "
        "id) or `path`",
        f"{at(text, '{pth')}: adapter `b` needs one of `source` (an HF repo id) or `path`",
        f"{at(text, 'pth')}: unknown key `pth` in adapter `b`. Perhaps you meant `path`?",
        f"{at(text, '/m}}')}: `path` is for GPU models: a CPU model is a local recipe",
    ]


def prepare_args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    prepare.add_parser(sub)
    folder = tmp_path / "scenarios"
    return parser.parse_args(
        ["prepare", "--matrix", str(tmp_path / "matrix.yaml"), "--scenarios", str(folder), *extra]
    )


def test_prepare_downloads_into_the_hf_cache_with_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cells_of(tmp_path, MODELS.replace("path: weights/moe", "path: /"))  # writes the inputs
    (tmp_path / "matrix.yaml").write_text(
        (tmp_path / "matrix.yaml").read_text().replace("path: /srv/adapters/moe", "path: /")
    )
    fetched: list[tuple[str, Path]] = []

    def fake(item: Download, cache: Path) -> Path:
        fetched.append((item.repo_id, cache))
        return cache / item.repo_id

    assert prepare.run(prepare_args(tmp_path), download=fake) == 0
    assert fetched == [
        ("org/moe", tmp_path / "hf" / "hub"),
        ("org/moe-lora", tmp_path / "hf" / "hub"),
    ]
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "prepare: [1/2] model org/moe (for hub-moe)"
    assert err[2] == "prepare: [2/2] adapter org/moe-lora (for hub-moe)"
    assert err[-1] == f"prepare: 2 repos in {tmp_path / 'hf' / 'hub'}"


def test_prepare_keeps_going_and_names_every_failure(tmp_path: Path) -> None:
    cells_of(tmp_path, MODELS.replace("path: weights/moe", "path: /"))
    (tmp_path / "matrix.yaml").write_text(
        (tmp_path / "matrix.yaml").read_text().replace("path: /srv/adapters/moe", "path: /")
    )
    tried = []

    def offline(item: Download, cache: Path) -> Path:
        tried.append(item.repo_id)
        raise OSError(f"cannot reach the hub for {item.repo_id}")

    with pytest.raises(InfraError) as info:
        prepare.run(prepare_args(tmp_path, "--hf-cache", str(tmp_path / "other")), download=offline)
    assert tried == ["org/moe", "org/moe-lora"]
    assert str(info.value) == (
        "prepare: 2 of 2 repos not fetched:\n"
        "  org/moe: OSError: cannot reach the hub for org/moe\n"
        "  org/moe-lora: OSError: cannot reach the hub for org/moe-lora"
    )


def test_prepare_stops_at_a_missing_folder_before_downloading(tmp_path: Path) -> None:
    cells_of(tmp_path)  # weights/moe does not exist under tmp_path

    def never(item: Download, cache: Path) -> Path:
        raise AssertionError("nothing may be downloaded")

    with pytest.raises(ConfigError, match=r"model `local-moe`: the folder .* does not exist"):
        prepare.run(prepare_args(tmp_path), download=never)


def test_a_tilde_path_of_an_unknown_user_is_a_config_error(tmp_path: Path) -> None:
    # `~.cache/x` (a slash forgotten) asks for the home of a user named `.cache`.
    text = MODELS.replace("/srv/adapters/moe", "~nosuchuser.cache/adapter")
    with pytest.raises(ConfigError, match="no home folder"):
        load_matrix(write(tmp_path, "matrix.yaml", text))
