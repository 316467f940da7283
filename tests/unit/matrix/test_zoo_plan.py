"""The zoo's plan and preparation, without an engine: its folder runs alone against the
default matrix, its scenarios carry their own adapter rank and model folder, and those are
made locally (an adapter per rank in the image, a broken copy of the folder on the host)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from repromatrix import cli
from repromatrix.backends.base import Prepared
from repromatrix.errors import ConfigError
from repromatrix.fleet.listing import flags_text
from repromatrix.judgement import Expected
from repromatrix.matrix.expand import plan
from repromatrix.matrix.inputs import load_inputs
from repromatrix.matrix.scenarios import load_scenarios
from repromatrix.models.tinymodel import TinyModel, ensure_model_files, tiny_model_for
from repromatrix.run.cell import cell_context
from repromatrix.run.images import ImageJobs
from repromatrix.values import Cell, Image, Lane, Model
from support import paths
from support.matrix import write

ROOT = paths.ROOT
ZOO = ROOT / "scenarios" / "zoo"


@pytest.fixture
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands read ./matrix.yaml and ./scenarios, as a user in the checkout does."""
    monkeypatch.chdir(ROOT)


def zoo_cells() -> tuple[Cell, ...]:
    matrix, scenarios = load_inputs(Path("matrix.yaml"), [Path("scenarios/zoo")])
    return plan(matrix, scenarios, Lane.CPU)


def cell(cells: Sequence[Cell], version: str, scenario: str, variant: str) -> Cell:
    wanted = f"cpu/{version}/cpu/tiny-llama/default/{scenario}/{variant}"
    return next(c for c in cells if c.id == wanted)


@pytest.mark.usefixtures("in_repo")
def test_the_zoo_folder_plans_alone_with_a_hit_and_an_avoided_per_scenario_and_version() -> None:
    cells = zoo_cells()
    ids = {path.stem for path in ZOO.glob("*.yaml")}
    assert {c.scenario.id for c in cells} == ids
    for version in ("0.27.1", "0.30.0", "0.31.0", "0.32.0"):
        for scenario in ids:
            mine = [c for c in cells if c.image.tag == version and c.scenario.id == scenario]
            # One of each at least: cpu-compiler-missing adds a control expected to hit that
            # does not test the crash (eager mode compiles nothing).
            assert {c.expected for c in mine} == {Expected.AVOIDED, Expected.HIT}


@pytest.mark.usefixtures("in_repo")
def test_no_matrix_rule_names_a_zoo_scenario_and_a_misspelt_rule_is_still_an_error(
    tmp_path: Path,
) -> None:
    text = Path("matrix.yaml").read_text()
    assert not any(scenario in text for scenario in (p.stem for p in ZOO.glob("*.yaml")))
    broken = write(tmp_path, "matrix.yaml", text.replace("cpu-kv-cache-too-small", "cpu-kv-cache"))
    with pytest.raises(ConfigError, match="unknown scenario `cpu-kv-cache`"):
        load_inputs(broken, [Path("scenarios/zoo")])


@pytest.mark.usefixtures("in_repo")
def test_the_adapter_rank_and_the_model_folder_are_part_of_the_plan(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cells = zoo_cells()
    lora = cell(cells, "0.32.0", "cpu-lora-rank-above-max", "trigger")
    assert "lora_rank=64[s]" in flags_text(lora)
    broken = cell(cells, "0.32.0", "cpu-model-config-missing", "trigger")
    control = cell(cells, "0.32.0", "cpu-model-config-missing", "whole-folder")
    assert (broken.model_files, control.model_files) == ("no-config", "intact")
    assert "model_files=no-config[s]" in flags_text(broken)
    assert "model_files=intact[v]" in flags_text(control)
    # Same flags, another folder: two runs, not one run standing for both.
    assert broken.flags == control.flags and not broken.same_as
    assert control.expected is Expected.AVOIDED
    args = ["plan", "--lane", "cpu", "--scenarios", "scenarios/zoo", "--json"]
    assert cli.main([*args, "--only", "*/0.32.0/*/cpu-tokenizer-corrupt/*"]) == 0
    rows = {row["variant"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["trigger"]["model_files"] == "corrupt-tokenizer"
    assert rows["whole-folder"]["model_files"] == "intact"


def test_a_misspelt_model_files_value_is_reported_with_a_suggestion(tmp_path: Path) -> None:
    text = (ZOO / "cpu-model-config-missing.yaml").read_text()
    write(tmp_path, "cpu-model-config-missing.yaml", text.replace("intact", "intakt"))
    with pytest.raises(ConfigError) as raised:
        load_scenarios(tmp_path)
    message = str(raised.value)
    assert "`model_files` must be one of" in message and "Perhaps you meant `intact`" in message


def tiny_folder(root: Path) -> TinyModel:
    tiny = tiny_model_for(Model("tiny-llama", Lane.CPU, "tiny-llama"), root)
    (tiny.path / "adapters" / "lora-r8").mkdir(parents=True)
    (tiny.path / "config.json").write_text('{"model_type": "llama"}')
    (tiny.path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": list(range(50))}}))
    (tiny.path.with_name(tiny.path.name + ".complete")).touch()
    return tiny


def test_broken_model_folders_are_copies_made_once_beside_the_whole_one(tmp_path: Path) -> None:
    tiny = tiny_folder(tmp_path)
    assert ensure_model_files(tiny, "intact") == tiny.path
    no_config = ensure_model_files(tiny, "no-config")
    assert no_config == tmp_path / f"{tiny.path.name}-no-config"
    assert not (no_config / "config.json").exists()
    assert (no_config / "tokenizer.json").exists() and not (no_config / "adapters").exists()
    cut = ensure_model_files(tiny, "corrupt-tokenizer")
    with pytest.raises(json.JSONDecodeError):
        json.loads((cut / "tokenizer.json").read_text())
    assert json.loads((cut / "config.json").read_text()) == {"model_type": "llama"}
    assert (tiny.path / "config.json").exists()  # the whole folder is left alone
    (no_config / "marker").write_text("kept")
    assert ensure_model_files(tiny, "no-config") == no_config
    assert (no_config / "marker").exists()


class RecordingBackend:
    """Records what it is asked to generate; writes the adapters' markers as the image would."""

    def __init__(self) -> None:
        self.ranks: list[Sequence[int]] = []

    def make_model(
        self, model: Model, prepared: Prepared, models_root: Path, lora_ranks: Sequence[int]
    ) -> TinyModel:
        self.ranks.append(lora_ranks)
        tiny = tiny_model_for(model, models_root)
        for rank in lora_ranks:
            adapter = tiny.adapter_path(rank)
            adapter.mkdir(parents=True, exist_ok=True)
            adapter.with_name(adapter.name + ".complete").touch()
        return tiny

    def prepare(self, images: Sequence[Image]) -> dict[str, Prepared]:
        return {image.key: Prepared(image.key, "image") for image in images}

    def vllm_version(self, prepared: Prepared) -> str | None:
        return None


@pytest.mark.usefixtures("in_repo")
def test_preparing_the_zoo_asks_for_each_adapter_rank_and_makes_each_folder(
    tmp_path: Path,
) -> None:
    cells = [c for c in zoo_cells() if c.image.tag == "0.32.0"]
    tiny_folder(tmp_path)
    backend = RecordingBackend()
    # Every image the cells need (the no-libnuma and no-compiler variants are images of their
    # own), made as a run makes them; the model is made by the first image job, with every rank.
    jobs = ImageJobs(
        backend,  # type: ignore[arg-type]
        cells,
        models_root=tmp_path,
        note=lambda _: None,
    )
    made = {key: jobs.make(key) for key in jobs.images}
    contexts = {c.id: cell_context(c, made[c.image.key], tmp_path) for c in cells}
    assert len(jobs.images) == 3
    assert [list(ranks) for ranks in backend.ranks] == [[8, 64]]
    tiny = tiny_model_for(cells[0].model, tmp_path)
    lora = contexts[cell(cells, "0.32.0", "cpu-lora-rank-above-max", "trigger").id]
    assert lora.adapter_path == str(tiny.adapter_path(64))
    broken = contexts[cell(cells, "0.32.0", "cpu-tokenizer-corrupt", "trigger").id]
    assert broken.model_path == str(tiny.files_path("corrupt-tokenizer"))
    assert Path(broken.model_path).is_dir()
    whole = contexts[cell(cells, "0.32.0", "cpu-tokenizer-corrupt", "whole-folder").id]
    assert whole.model_path == str(tiny.path)
