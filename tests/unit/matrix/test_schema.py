"""The published JSON Schemas: generated from the validator's tables, accepting what it accepts.

Each broken file below is rejected by the validator (``ConfigError``) and by the schema an
editor reads; every shipped file passes both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from repromatrix.cli import main
from repromatrix.errors import ConfigError
from repromatrix.matrix.config import load_matrix
from repromatrix.matrix.keys import SECTIONS
from repromatrix.matrix.scenarios import load_scenario
from repromatrix.matrix.schema import SCHEMA_FILES, document_schema, schema_text
from support import paths

jsonschema = pytest.importorskip("jsonschema")

ROOT = paths.ROOT
SCHEMAS = ROOT / "schemas"
SHIPPED_MATRICES = [ROOT / "matrix.yaml", ROOT / "tests" / "data" / "fleet" / "matrix.yaml"]
SHIPPED_SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


def errors(kind: str, text: str) -> list[str]:
    validator = jsonschema.Draft7Validator(
        document_schema(kind), format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER
    )
    return [error.message for error in validator.iter_errors(yaml.safe_load(text))]


def test_the_published_schemas_are_the_generated_ones(tmp_path: Path) -> None:
    for kind, name in SCHEMA_FILES.items():
        assert (SCHEMAS / name).read_text() == schema_text(kind), (
            f"schemas/{name} is stale: run `repromatrix schema --out schemas`"
        )
        jsonschema.Draft7Validator.check_schema(document_schema(kind))
    assert main(["schema", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(SCHEMA_FILES.values())


def test_every_key_the_validator_knows_is_in_a_schema() -> None:
    definitions = {
        **document_schema("matrix")["definitions"],
        **document_schema("scenario")["definitions"],
    }
    roots = {"matrix": document_schema("matrix"), "scenario": document_schema("scenario")}
    for name, section in SECTIONS.items():
        schema: dict[str, Any] = roots.get(name) or definitions[name]
        assert list(schema["properties"]) == list(section.names)
        assert schema.get("required", []) == list(section.required)


@pytest.mark.parametrize("path", SHIPPED_MATRICES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_shipped_matrices_pass_and_name_their_schema(path: Path) -> None:
    text = path.read_text()
    assert errors("matrix", text) == []
    schema = (path.parent / text.splitlines()[0].split("$schema=")[1]).resolve()
    assert schema == SCHEMAS / "matrix.schema.json"


@pytest.mark.parametrize("path", SHIPPED_SCENARIOS, ids=lambda p: p.name)
def test_shipped_scenarios_pass_and_name_their_schema(path: Path) -> None:
    text = path.read_text()
    assert errors("scenario", text) == []
    schema = (path.parent / text.splitlines()[0].split("$schema=")[1]).resolve()
    assert schema == SCHEMAS / "scenario.schema.json"


MATRIX_BREAKS = {
    "typo in a runtime key": ("deadline_s: 1800", "deadine_s: 1800"),
    "typo in a GPU key": ("runner: gpu-h100", "runer: gpu-h100"),
    "unknown lane": ("  cpu:\n    package", "  tpu:\n    package"),
    "count as words": ("count: 4", "count: four"),
    "moe as text": ("moe: true\n        hidden_size: 2048", "moe: maybe\n        hidden_size: 1"),
    "unknown dtype": ("dtype: bfloat16", "dtype: bf16"),
    "bad shm size": ("shm_size: 16g", "shm_size: lots"),
    "typo in an exclude axis": ("  - model: qwen3-30b-a3b\n    gpu: rtx-a6000", "  - modle: x"),
    "an include naming no axis": ("  - gpu: h200x4\n    model: qwen3.5-122b-a10b\n    flags:",
                                  "  - flags:"),
    "a missing required key": ("        runner: gpu-h100\n", ""),
    "a flag in --kebab-case": ("enforce_eager: true", "--enforce-eager: true"),
    "a follow rule with a typo": ('images: ["0.27.1", "0.30.0", "0.31.0", "0.32.0"]',
                                  'images: {follow: ">=0.31", newset: 2}'),
    "nightlies on the cpu lane": ('images: ["0.27.1", "0.30.0", "0.31.0", "0.32.0"]',
                                  'images: {follow: ">=0.31", nightlies: true}'),
    "a follow rule without follow": ('images: ["0.27.1", "0.30.0", "0.31.0", "0.32.0"]',
                                     "images: {release_candidates: true}"),
}  # fmt: skip


def test_the_schema_accepts_a_follow_rule_on_each_lane(tmp_path: Path) -> None:
    text = (ROOT / "matrix.yaml").read_text()
    text = text.replace(
        'images: ["0.27.1", "0.30.0", "0.31.0", "0.32.0"]', 'images: {follow: ">=0.31", newest: 2}'
    )
    gpu = 'images:\n      follow: ">=0.31"\n      release_candidates: true\n      nightlies: true\n'
    gpu += '      exclude: ["*.post*"]\n    old_images:\n'
    text = text.replace("images:\n      - v0.17.0", gpu + "      - v0.17.0", 1)
    data = yaml.safe_load(text)
    del data["lanes"]["gpu"]["old_images"]
    followed = tmp_path / "matrix.yaml"
    followed.write_text(yaml.safe_dump(data))
    load_matrix(followed)
    assert errors("matrix", followed.read_text()) == []


@pytest.mark.parametrize("case", sorted(MATRIX_BREAKS))
def test_the_schema_rejects_a_matrix_the_validator_rejects(case: str, tmp_path: Path) -> None:
    old, new = MATRIX_BREAKS[case]
    text = (ROOT / "matrix.yaml").read_text()
    assert old in text
    broken = tmp_path / "matrix.yaml"
    broken.write_text(text.replace(old, new, 1))
    with pytest.raises(ConfigError):
        load_matrix(broken)
    assert errors("matrix", broken.read_text()), case


SCENARIO_BREAKS = {
    "typo in a top-level key": ("moe-lora-rank-over-128", "avoided:", "avodied:"),
    "typo in a launch key": ("moe-lora-rank-over-128", "startup_timeout_s:", "startup_timout_s:"),
    "typo in a variant key": ("moe-lora-rank-over-128", "  - name: rank-128", "  - nme: rank-128"),
    "unknown variant kind": ("moe-lora-rank-over-128", "kind: control", "kind: check"),
    "unknown lane": ("moe-lora-rank-over-128", "lanes: [gpu]", "lanes: [tpu]"),
    "unknown trigger fact": ("moe-lora-rank-over-128", "model.moe: true", "model.mixture: true"),
    "unknown comparison": ("moe-lora-rank-over-128", "{gt: 128}", "{above: 128}"),
    "a timeout in words": ("moe-lora-rank-over-128", "startup_timeout_s: 1200",
                           "startup_timeout_s: twenty minutes"),
    "a baseline with a trigger": ("healthy-gpu", "baseline: true",
                                  "baseline: true\ntrigger: {model.moe: true}"),
    "a crash without signatures": ("moe-lora-rank-over-128", "signatures:", "signatures_:"),
    "a bad probe program": ("moe-lora-rank-over-128", "program: moe_lora_rank.py",
                            "program: probes/moe.sh"),
    "a mode that does not exist": ("moe-lora-rank-over-128", "mode: server", "mode: daemon"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(SCENARIO_BREAKS))
def test_the_schema_rejects_a_scenario_the_validator_rejects(case: str, tmp_path: Path) -> None:
    name, old, new = SCENARIO_BREAKS[case]
    text = (ROOT / "scenarios" / f"{name}.yaml").read_text()
    assert old in text
    broken = tmp_path / f"{name}.yaml"
    broken.write_text(text.replace(old, new, 1))
    with pytest.raises(ConfigError):
        load_scenario(broken)
    assert errors("scenario", broken.read_text()), case
