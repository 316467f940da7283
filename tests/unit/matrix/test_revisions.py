"""Models and adapters pinned to a revision: read from the matrix, fetched at it by ``prepare``,
and given to vLLM (``--revision`` for a model, the snapshot for an adapter, via the harness)."""

from __future__ import annotations

from pathlib import Path

import pytest

from repromatrix.backends.harness_spec import build_spec, container_model_path
from repromatrix.errors import ConfigError
from repromatrix.matrix.config import load_matrix
from repromatrix.matrix.expand import plan
from repromatrix.matrix.sources import Download, downloads, fetch
from repromatrix.values import Cell
from support.matrix import at, setup, write

COMMIT = "0123456789abcdef0123456789abcdef01234567"
PINNED = f"""
lanes:
  gpu:
    runtime: {{hf_cache: /hf}}
    images: [v0.32.0]
    gpus:
      h100: {{runner: gpu-h100, count: 1}}
    models:
      pinned:
        source: org/moe
        revision: {COMMIT}
        moe: true
        adapters:
          seed-adapter: {{source: org/moe-lora, revision: v1}}
      floating:
        source: org/moe
        moe: true
        adapters:
          seed-adapter: {{source: org/moe-lora}}
"""
SCENARIO = """
id: lora-moe
title: LoRA MoE
lanes: [gpu]
trigger: {model.moe: true}
launch:
  flags: {enable_lora: true}
  lora_adapter: seed-adapter
signatures: [{pattern: "TritonExperts", process: Worker}]
affected: all
avoided: ready
"""


def cells_of(tmp_path: Path, matrix: str = PINNED) -> dict[str, Cell]:
    loaded, scenarios = setup(tmp_path, matrix, {"lora-moe": SCENARIO})
    return {cell.model.name: cell for cell in plan(loaded, scenarios)}


def test_a_revision_pins_the_model_and_the_adapter(tmp_path: Path) -> None:
    cells = cells_of(tmp_path)
    assert cells["pinned"].model.revision == COMMIT
    assert cells["pinned"].adapter is not None and cells["pinned"].adapter.revision == "v1"
    assert cells["floating"].model.revision is None


def test_the_pinned_model_reaches_vllm_as_its_revision_and_the_tokenizers(tmp_path: Path) -> None:
    cell = cells_of(tmp_path)["pinned"]
    spec = build_spec(cell, container_model_path(cell))
    argv = spec["argv"]
    assert argv[argv.index("--revision") + 1] == COMMIT
    assert argv[argv.index("--tokenizer-revision") + 1] == COMMIT
    assert spec["kwargs"]["revision"] == spec["kwargs"]["tokenizer_revision"] == COMMIT
    # The harness resolves each repo in the container's cache: the adapter to its snapshot.
    assert spec["hub"] == {
        "model": {"repo": "org/moe", "revision": COMMIT},
        "adapter": {"repo": "org/moe-lora", "revision": "v1", "name": "seed-adapter"},
    }
    assert "revision" not in cell.flags  # the result's flags stay the configuration under test


def test_an_unpinned_model_is_resolved_at_main_and_given_no_revision(tmp_path: Path) -> None:
    cell = cells_of(tmp_path)["floating"]
    spec = build_spec(cell, container_model_path(cell))
    assert "--revision" not in spec["argv"]
    assert spec["hub"]["model"] == {"repo": "org/moe", "revision": None}


def test_a_flag_set_that_gives_a_revision_itself_wins(tmp_path: Path) -> None:
    text = PINNED + "    flagsets:\n      default: {revision: main}\n"
    spec = build_spec(cell := cells_of(tmp_path, text)["pinned"], container_model_path(cell))
    argv = spec["argv"]
    assert argv[argv.index("--revision") + 1] == "main"


def test_prepare_fetches_each_repo_at_each_revision(tmp_path: Path) -> None:
    wanted = downloads(list(cells_of(tmp_path).values()))
    assert [(d.kind, d.repo_id, d.revision) for d in wanted] == [
        ("model", "org/moe", None),
        ("model", "org/moe", COMMIT),
        ("adapter", "org/moe-lora", None),
        ("adapter", "org/moe-lora", "v1"),
    ]
    said: list[str] = []
    fetched: list[Download] = []
    assert (
        fetch(wanted, tmp_path, lambda item, cache: fetched.append(item) or cache, said.append)
        == ()
    )
    assert fetched == list(wanted)
    assert f"prepare: [2/4] model org/moe@{COMMIT} (for pinned)" in said


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{path: /m, revision: v1}", "`revision` pins an HF repo"),
        ("{source: org/a, revision: ../../etc}", "is not a branch, tag or commit"),
        ("{source: org/a, revision: --help}", "starts with `-`"),
        ("{source: org/a, revision: 'a b'}", "holds a space"),
    ],
)
def test_a_revision_that_cannot_be_pinned_is_named_where_it_is(
    tmp_path: Path, entry: str, message: str
) -> None:
    text = f"""
        lanes:
          gpu:
            images: [v0.32.0]
            gpus: {{h100: {{runner: r, count: 1}}}}
            models:
              m: {entry}
        """
    path = write(tmp_path, "matrix.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    (problem,) = info.value.problems
    assert message in str(problem)
    assert str(problem).startswith(f"{path}:{at(text, 'revision').split(':')[0]}:")


def test_a_cpu_recipe_has_no_revision(tmp_path: Path) -> None:
    text = """
        lanes:
          cpu:
            images: ["0.32.0"]
            gpus: {cpu: {runner: u}}
            models: {t: {source: tiny-llama, revision: v1}}
        """
    with pytest.raises(ConfigError, match="a folder or recipe has none"):
        load_matrix(write(tmp_path, "matrix.yaml", text))
