"""Model facts from the model's own files: the real config.json of every default-matrix GPU
model (tests/data/models/, with its provenance), read from an HF cache laid out as
``repromatrix prepare`` fills it, the matrix's facts over the files', and every way the files
can be missing or wrong (the estimate is unknown with the reason, never a guess)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml

from repromatrix.cli import main
from repromatrix.matrix import config_facts
from repromatrix.matrix.conditions import head_dim, kv_cache_bytes_needed
from repromatrix.matrix.config import load_matrix
from repromatrix.matrix.expand import plan
from repromatrix.matrix.inputs import load_inputs
from repromatrix.matrix.memory import estimate, estimate_json, memory_problems
from repromatrix.values import Lane, Model
from support import factories, paths

MODELS = paths.DATA / "models"
# The default matrix's GPU models and the repo whose config.json each is.
DEFAULT_GPU_MODELS = {
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen3.5-122b-a10b": "Qwen/Qwen3.5-122B-A10B",
    "gemma-4-e2b-it": "google/gemma-4-E2B-it",
    "qwen3-vl-8b-instruct": "Qwen/Qwen3-VL-8B-Instruct",
}
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def data_folder(repo: str) -> Path:
    return MODELS / repo.replace("/", "--")


def snapshot(hub: Path, repo: str, commit: str = COMMIT, ref: str | None = "main") -> Path:
    """A snapshot folder of ``repo`` in ``hub`` as huggingface_hub lays it out."""
    folder = hub / ("models--" + repo.replace("/", "--"))
    (folder / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    if ref is not None:
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / ref).write_text(commit)
    return folder / "snapshots" / commit


def fake_cache(root: Path, repos: list[str]) -> Path:
    """An HF_HOME whose hub holds each repo's real config.json (tests/data/models/)."""
    for repo in repos:
        folder = snapshot(root / "hub", repo)
        (folder / "config.json").write_bytes((data_folder(repo) / "config.json").read_bytes())
    return root


def read(repo: str) -> config_facts.FileFacts:
    return config_facts.read_files(data_folder(repo))


def gpu_model(name: str = "m", source: str = "org/m", **facts: Any) -> Model:
    return Model(name, Lane.GPU, source, **facts)


def safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    """A real safetensors file: the header (dtype, shape, bytes per tensor) and zero data."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape, size) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(offset))


# --- the real configs ------------------------------------------------------------------


def test_every_real_config_has_its_provenance() -> None:
    readme = (MODELS / "README.md").read_text(encoding="utf-8")
    folders = sorted(p.name for p in MODELS.iterdir() if p.is_dir())
    assert len(folders) == 6
    for name in folders:
        assert f"`{name}/config.json`" in readme
        assert json.loads((MODELS / name / "config.json").read_text(encoding="utf-8"))


def test_qwen3_30b_a3b() -> None:
    found = read("Qwen/Qwen3-30B-A3B")
    assert found.found
    assert {k: found.values[k] for k in ("head_dim", "num_key_value_heads", "num_experts")} == {
        "head_dim": 128,  # not 2048 / 32
        "num_key_value_heads": 4,
        "num_experts": 128,
    }
    assert found.values["moe_intermediate_size"] == 768
    assert found.values["architecture"] == "Qwen3MoeForCausalLM"
    assert found.values["tie_word_embeddings"] is False
    assert "moe_layers" not in found.values  # every layer: decoder_sparse_step 1
    assert "full_attention_layers" not in found.values  # sliding_window null: every layer


def test_gemma_4_e2b_reads_its_text_config() -> None:
    values = read("google/gemma-4-E2B-it").values
    assert values["num_key_value_heads"] == 1
    assert values["head_dim"] == 256
    assert values["global_head_dim"] == 512
    assert values["kv_shared_layers"] == 20
    # Layers 0-14 have a KV cache of their own; of them 4, 9 and 14 are full attention.
    assert values["full_attention_layers"] == 3
    assert values["hidden_size"] == 1536 and values["num_hidden_layers"] == 35
    assert values["use_double_wide_mlp"] is True
    assert values["moe"] is False  # enable_moe_block false, its expert keys null
    assert values["multimodal"] is True
    assert values["tie_word_embeddings"] is True
    assert values["dtype"] == "bfloat16"


def test_qwen3_5_122b_a10b_and_its_fp8_copy() -> None:
    bf16, fp8 = read("Qwen/Qwen3.5-122B-A10B").values, read("Qwen/Qwen3.5-122B-A10B-FP8").values
    assert bf16["full_attention_layers"] == 12  # every 4th of 48; the rest linear attention
    assert (bf16["num_key_value_heads"], bf16["head_dim"]) == (2, 256)
    assert (bf16["num_experts"], bf16["moe_intermediate_size"]) == (256, 1024)
    assert "intermediate_size" not in bf16  # it has none: never a guessed one
    assert bf16["dtype"] == "bfloat16"
    assert fp8["dtype"] == "fp8"  # quantization_config.quant_method, not text_config.dtype
    assert {k: v for k, v in fp8.items() if k != "dtype"} == {
        k: v for k, v in bf16.items() if k != "dtype"
    }


def test_qwen3_vl_8b_and_llama_3_1_8b() -> None:
    vl, llama = read("Qwen/Qwen3-VL-8B-Instruct").values, read(LLAMA).values
    assert (vl["num_hidden_layers"], vl["num_key_value_heads"], vl["head_dim"]) == (36, 8, 128)
    assert vl["multimodal"] is True
    # Llama's config.json has no head_dim; LlamaConfig makes it 4096 / 32.
    assert (llama["head_dim"], llama["num_key_value_heads"], llama["num_hidden_layers"]) == (
        128,
        8,
        32,
    )
    assert llama["intermediate_size"] == 14336
    assert llama["moe"] is False and llama["multimodal"] is False


@pytest.mark.parametrize("name", sorted(DEFAULT_GPU_MODELS))
def test_the_default_matrix_types_what_the_real_config_says(name: str) -> None:
    typed = next(
        m for m in load_matrix(paths.ROOT / "matrix.yaml").lanes[Lane.GPU].models if m.name == name
    )
    body = yaml.safe_load((paths.ROOT / "matrix.yaml").read_text())["lanes"]["gpu"]["models"]
    files = read(DEFAULT_GPU_MODELS[name]).values
    compared = [key for key in body[name] if key in files]
    assert len(compared) >= 8
    assert {k: getattr(typed, k) for k in compared} == {k: files[k] for k in compared}


# --- the default matrix planned against an HF cache of the real configs -------------------


def default_matrix(tmp_path: Path, strip: bool) -> Path:
    """The default matrix with its GPU lane's hf_cache in ``tmp_path``; ``strip`` leaves its
    GPU models only what their config.json cannot give (source, adapters, parameters)."""
    data = yaml.safe_load((paths.ROOT / "matrix.yaml").read_text())
    gpu = data["lanes"]["gpu"]
    gpu["runtime"]["hf_cache"] = str(fake_cache(tmp_path / "hf", list(DEFAULT_GPU_MODELS.values())))
    if strip:
        for name, body in gpu["models"].items():
            files = read(DEFAULT_GPU_MODELS[name]).values
            gpu["models"][name] = {k: v for k, v in body.items() if k not in files}
    path = tmp_path / ("stripped.yaml" if strip else "typed.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def planned(matrix: Path) -> list[Any]:
    loaded, scenarios = load_inputs(matrix, paths.SCENARIOS)
    return plan(loaded, scenarios, Lane.GPU)


def test_the_default_matrix_estimates_every_gpu_model_from_its_real_config(
    tmp_path: Path,
) -> None:
    typed, stripped = (
        planned(default_matrix(tmp_path, False)),
        planned(default_matrix(tmp_path, True)),
    )
    assert [c.id for c in typed] == [c.id for c in stripped]  # the same cells, same outcomes
    assert [c.expected for c in typed] == [c.expected for c in stripped]
    engine = [(a, b) for a, b in zip(typed, stripped, strict=True) if estimate(a) is not None]
    assert len(engine) > 100
    for by_hand, from_files in engine:
        assert estimate_json(estimate(by_hand)) == estimate_json(estimate(from_files)), by_hand.id
        source = from_files.model.facts_source
        assert source is not None and source.found, by_hand.id
        assert source.config.endswith(f"snapshots/{COMMIT}/config.json")
        assert {"num_key_value_heads", "head_dim", "num_hidden_layers"} <= set(source.from_files)
        assert not source.disagreements and not by_hand.model.facts_source.disagreements
    # No fact is missing: the two models whose config.json has no parameter count are given
    # a lower bound counted from it in matrix.yaml.
    lacking = {c.model.name: estimate(c).missing for _, c in engine}
    assert lacking == dict.fromkeys(
        ("qwen3-30b-a3b", "qwen3-vl-8b-instruct", "qwen3.5-122b-a10b", "gemma-4-e2b-it"), ()
    )


def test_gemma_and_qwen3_5_kv_cache_come_from_their_layer_types(tmp_path: Path) -> None:
    cells = planned(default_matrix(tmp_path, True))
    gemma = next(
        c
        for c in cells
        if c.id.endswith("h100/gemma-4-e2b-it/default/lora-int32-offset-overflow/trigger")
    )
    # 87383 tokens x K,V x 3 full-attention layers with a cache of their own x 1 KV head x
    # global_head_dim 512 x 2 bytes.
    assert estimate(gemma).kv_cache == 87383 * 2 * 3 * 1 * 512 * 2
    qwen = next(c for c in cells if c.id.endswith("qwen3.5-122b-a10b/default/healthy-gpu/baseline"))
    # Per GPU at TP4: its 2 KV heads are fewer than the 4 ranks, so each rank holds one.
    assert estimate(qwen).kv_cache == 4096 * 2 * 12 * 1 * 256 * 2


def test_llama_3_1_8b_from_its_config_alone(tmp_path: Path) -> None:
    cache = fake_cache(tmp_path / "hf", [LLAMA])
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(
        f"""
lanes:
  gpu:
    runtime: {{hf_cache: {cache}}}
    images: [v0.31.0]
    gpus: {{h100: {{runner: gpu-h100, count: 1, memory_gib: 80, usable_memory_mib: 81559}}}}
    models: {{llama: {{source: {LLAMA}}}}}
    flagsets: {{long: {{max_model_len: 100000, enable_lora: true}}}}
"""
    )
    model = load_matrix(matrix).lanes[Lane.GPU].models[0]
    assert (
        kv_cache_bytes_needed(model, {"max_model_len": 100_000}) == 100_000 * 2 * 32 * 8 * 128 * 2
    )
    assert model.widest_intermediate_size == 14336  # seed 003's row: 2 x 14336
    assert model.facts_source is not None and model.facts_source.found


# --- the matrix over the files --------------------------------------------------------------


def test_a_matrix_without_head_dim_is_not_given_hidden_over_heads(tmp_path: Path) -> None:
    """Qwen3-30B-A3B's head_dim is 128, not 2048 / 32: without its config, it is unknown."""
    model = gpu_model(
        "qwen3-30b-a3b",
        "Qwen/Qwen3-30B-A3B",
        hidden_size=2048,
        num_attention_heads=32,
        num_key_value_heads=4,
        num_hidden_layers=48,
        max_position_embeddings=40960,
    )
    assert head_dim(model) is None
    assert kv_cache_bytes_needed(model, {}) is None
    looked = config_facts.with_file_facts(model, ["hidden_size"], str(tmp_path / "empty"))
    assert head_dim(looked) is None
    assert looked.facts_source is not None and not looked.facts_source.found
    cell = factories.cell(Lane.GPU, model=looked, flags={})
    [problem] = [p for p in memory_problems([cell], "m.yaml") if "model `" in str(p)]
    assert "`head_dim`" in str(problem)
    assert "models--Qwen--Qwen3-30B-A3B" in str(problem)  # where it would come from
    assert "not in the HF cache" in str(problem)
    # With its config.json in the cache, the same matrix entry knows it.
    cache = fake_cache(tmp_path / "hf", ["Qwen/Qwen3-30B-A3B"])
    read_model = config_facts.with_file_facts(model, ["hidden_size"], str(cache))
    assert head_dim(read_model) == 128
    assert kv_cache_bytes_needed(read_model, {}) == 40960 * 2 * 48 * 4 * 128 * 2


def test_the_matrix_wins_and_the_plan_warns_where_it_and_the_file_disagree(
    tmp_path: Path,
) -> None:
    cache = fake_cache(tmp_path / "hf", ["Qwen/Qwen3-30B-A3B"])
    model = gpu_model("q", "Qwen/Qwen3-30B-A3B", head_dim=64, hidden_size=2048)
    merged = config_facts.with_file_facts(model, ["head_dim", "hidden_size"], str(cache))
    assert merged.head_dim == 64  # the matrix's
    assert merged.num_key_value_heads == 4  # the file's, where the matrix gives none
    source = merged.facts_source
    assert source is not None
    assert "hidden_size" not in source.from_files and "head_dim" not in source.from_files
    [problem] = config_facts.facts_problems([merged], "matrix.yaml")
    assert "`head_dim`: the matrix gives 64" in str(problem)
    assert "128; the matrix's is used" in str(problem)


def test_a_pinned_revision_reads_that_snapshot(tmp_path: Path) -> None:
    cache = fake_cache(tmp_path / "hf", ["Qwen/Qwen3-30B-A3B"])  # main: the real config
    other = "fedcba9876543210fedcba9876543210fedcba98"
    pinned = snapshot(cache / "hub", "Qwen/Qwen3-30B-A3B", other, ref=None)
    config = json.loads((data_folder("Qwen/Qwen3-30B-A3B") / "config.json").read_text())
    (pinned / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 8}))
    model = gpu_model("q", "Qwen/Qwen3-30B-A3B")
    at_main = config_facts.with_file_facts(model, [], str(cache))
    at_pin = config_facts.with_file_facts(
        gpu_model("q", "Qwen/Qwen3-30B-A3B", revision=other), [], str(cache)
    )
    assert (at_main.num_key_value_heads, at_pin.num_key_value_heads) == (4, 8)
    assert at_pin.facts_source is not None and other in at_pin.facts_source.config


def test_a_local_folder_is_read_and_the_cpu_lane_is_not(tmp_path: Path) -> None:
    folder = tmp_path / "gemma"
    folder.mkdir()
    (folder / "config.json").write_bytes(
        (data_folder("google/gemma-4-E2B-it") / "config.json").read_bytes()
    )
    model = config_facts.with_file_facts(gpu_model("g", str(folder), path=str(folder)), [], None)
    assert (model.num_key_value_heads, model.global_head_dim) == (1, 512)
    cpu = Model("tiny", Lane.CPU, "tiny-llama", hidden_size=256, num_attention_heads=4)
    assert config_facts.with_file_facts(cpu, [], str(tmp_path)) is cpu
    assert head_dim(cpu) == 64  # the tiny recipe's LlamaConfig: 256 / 4


# --- the weights' size ----------------------------------------------------------------------


def test_weights_from_the_index_total_size(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_bytes((data_folder(LLAMA) / "config.json").read_bytes())
    # A made-up total (no index of these models was found verbatim: tests/data/models/README).
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 1000}, "weight_map": {}})
    )
    found = config_facts.read_files(tmp_path)
    assert (found.values["weights_bytes"], found.values["num_parameters"]) == (1000, 500)
    assert found.weights == str(tmp_path / "model.safetensors.index.json")


def test_weights_from_the_safetensors_headers_alone(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_bytes((data_folder(LLAMA) / "config.json").read_bytes())
    safetensors(
        tmp_path / "model.safetensors",
        {"embed": ("BF16", [8, 4], 64), "scale": ("F32", [3], 12)},
    )
    found = config_facts.read_files(tmp_path)
    assert (found.values["weights_bytes"], found.values["num_parameters"]) == (76, 35)
    assert found.weights == str(tmp_path / "model.safetensors")


def test_an_fp8_index_gives_bytes_but_no_parameter_count(tmp_path: Path) -> None:
    fp8 = data_folder("Qwen/Qwen3.5-122B-A10B-FP8") / "config.json"
    (tmp_path / "config.json").write_bytes(fp8.read_bytes())
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 4096}})
    )
    values = config_facts.read_files(tmp_path).values
    assert values["weights_bytes"] == 4096 and "num_parameters" not in values


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"\x10\x00", "shorter than a safetensors header"),
        (struct.pack("<Q", 10**12), "more than safetensors allows"),
        (struct.pack("<Q", 5) + b"{nope", "not a readable safetensors header"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (struct.pack("<Q", 14) + b'{"w": {"a":1}}', "has no shape and data_offsets"),
    ],
)
def test_a_broken_safetensors_header_is_a_note(tmp_path: Path, content: bytes, why: str) -> None:
    (tmp_path / "config.json").write_bytes((data_folder(LLAMA) / "config.json").read_bytes())
    (tmp_path / "model.safetensors").write_bytes(content)
    found = config_facts.read_files(tmp_path)
    assert found.found and "weights_bytes" not in found.values
    assert any(why in note for note in found.notes)


# --- bad input: never a guess, never a traceback --------------------------------------------


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda d: None, "not found"),
        (lambda d: (d / "config.json").mkdir(), "not a plain file"),
        (lambda d: (d / "config.json").write_text("{hidden_size: 4"), "not JSON"),
        (lambda d: (d / "config.json").write_bytes(b"\xff\xfe{}"), "not JSON"),
        (lambda d: (d / "config.json").write_text("[1, 2]"), "not a JSON object"),
    ],
)
def test_a_config_that_cannot_be_read_gives_no_facts_and_says_why(
    tmp_path: Path, make: Any, why: str
) -> None:
    cache = tmp_path / "hf"
    folder = snapshot(cache / "hub", "org/m")
    make(folder)
    model = config_facts.with_file_facts(gpu_model(hidden_size=2048), ["hidden_size"], str(cache))
    source = model.facts_source
    assert source is not None and not source.found
    assert why in source.notes[0] and str(folder / "config.json") in source.notes[0]
    assert model.head_dim == 0 and model.hidden_size == 2048  # the matrix's, nothing guessed
    [problem] = config_facts.facts_problems([model], "matrix.yaml")
    assert why in str(problem) and "the matrix's alone" in str(problem)


def test_a_field_of_the_wrong_kind_is_left_unknown_with_its_reason() -> None:
    config = json.loads((data_folder("Qwen/Qwen3-30B-A3B") / "config.json").read_text())
    values, notes = config_facts.config_facts(
        {**config, "num_key_value_heads": "four", "head_dim": -1, "hidden_size": True}
    )
    assert "num_key_value_heads" not in values and "hidden_size" not in values
    assert "head_dim" not in values  # -1 is not one, and qwen3_moe has no default to fall to
    assert any("`num_key_value_heads` is 'four'" in note for note in notes)
    assert any("`head_dim` is -1" in note for note in notes)


def test_a_config_without_head_dim_follows_its_own_class() -> None:
    llama = json.loads((data_folder(LLAMA) / "config.json").read_text())
    assert config_facts.config_facts(llama)[0]["head_dim"] == 128  # LlamaConfig: 4096 / 32
    qwen3 = {"model_type": "qwen3", "hidden_size": 2048, "num_attention_heads": 32}
    assert config_facts.config_facts(qwen3)[0]["head_dim"] == 128  # Qwen3Config's default
    other = {"model_type": "somenew", "hidden_size": 2048, "num_attention_heads": 32}
    values, notes = config_facts.config_facts(other)
    assert "head_dim" not in values
    assert any("no `head_dim`" in note and "somenew" in note for note in notes)


def test_plan_names_the_source_of_each_models_facts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix = default_matrix(tmp_path, True)
    code = main(
        [
            "plan",
            "--matrix",
            str(matrix),
            "--scenarios",
            str(paths.SCENARIOS),
            "--lane",
            "gpu",
            "--json",
        ]
    )
    assert code == 0
    out, err = capsys.readouterr()
    cells = json.loads(out)
    facts = {c["model"]: c["model_facts"] for c in cells}
    assert set(facts) == set(DEFAULT_GPU_MODELS)
    for name, repo in DEFAULT_GPU_MODELS.items():
        assert facts[name]["found"] is True
        assert facts[name]["config"].startswith(
            str(tmp_path / "hf" / "hub" / ("models--" + repo.replace("/", "--")))
        )
        assert "head_dim" in facts[name]["from_files"]
        assert f"model `{name}`: facts from {facts[name]['config']}" in err


def test_a_config_lacking_a_fact_leaves_the_estimate_unknown_and_says_where(
    tmp_path: Path,
) -> None:
    config = json.loads((data_folder("Qwen/Qwen3-30B-A3B") / "config.json").read_text())
    del config["num_hidden_layers"]
    cache = tmp_path / "hf"
    folder = snapshot(cache / "hub", "Qwen/Qwen3-30B-A3B")
    (folder / "config.json").write_text(json.dumps(config))
    model = config_facts.with_file_facts(
        gpu_model("q", "Qwen/Qwen3-30B-A3B", num_parameters=30_532_122_624), [], str(cache)
    )
    assert model.num_hidden_layers == 0 and model.head_dim == 128
    cell = factories.cell(Lane.GPU, model=model, flags={"max_model_len": 4096})
    found = estimate(cell)
    assert found is not None and found.kv_cache is None
    assert "model.num_hidden_layers" in found.missing
    [problem] = [p for p in memory_problems([cell], "m.yaml") if "model `" in str(p)]
    assert f"`num_hidden_layers`, which its files in {folder} lack" in str(problem)


def test_plan_warns_at_the_model_line_where_the_matrix_and_its_file_disagree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = fake_cache(tmp_path / "hf", ["Qwen/Qwen3-30B-A3B"])
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(
        f"""lanes:
  gpu:
    runtime: {{hf_cache: {cache}}}
    images: [v0.31.0]
    gpus: {{h100: {{runner: gpu-h100, count: 1, memory_gib: 80}}}}
    models:
      qwen3:
        source: Qwen/Qwen3-30B-A3B
        head_dim: 64
"""
    )
    assert main(["plan", "--matrix", str(matrix), "--scenarios", str(paths.SCENARIOS)]) == 0
    err = capsys.readouterr().err
    config = cache / "hub" / "models--Qwen--Qwen3-30B-A3B" / "snapshots" / COMMIT / "config.json"
    assert (
        f"repromatrix: warning: {matrix}:7: model `qwen3`: `head_dim`: the matrix gives 64, "
        f"{config} 128; the matrix's is used"
    ) in err
    assert f"repromatrix: model `qwen3`: facts from {config} (" in err


def test_a_parameter_count_that_differs_names_the_weights_file(tmp_path: Path) -> None:
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_bytes((data_folder(LLAMA) / "config.json").read_bytes())
    safetensors(folder / "model.safetensors", {"w": ("BF16", [10], 20)})
    model = gpu_model("l", str(folder), path=str(folder), num_parameters=11)
    merged = config_facts.with_file_facts(model, ["num_parameters"], None)
    assert merged.num_parameters == 11 and merged.weights_bytes == 20
    [problem] = config_facts.facts_problems([merged], "m.yaml")
    assert f"`num_parameters`: the matrix gives 11, {folder / 'model.safetensors'} 10" in str(
        problem
    )


def test_layers_with_experts_and_windows() -> None:
    dense_first = {"num_hidden_layers": 4, "num_experts": 8, "moe_intermediate_size": 16}
    assert "moe_layers" not in config_facts.config_facts(dense_first)[0]  # every layer
    values = config_facts.config_facts({**dense_first, "first_k_dense_replace": 1})[0]
    assert values["moe_layers"] == 3  # DeepSeek's first dense layer
    values = config_facts.config_facts({**dense_first, "decoder_sparse_step": 2})[0]
    assert values["moe_layers"] == 2  # layers 1 and 3
    values = config_facts.config_facts({**dense_first, "mlp_only_layers": [0, 1]})[0]
    assert values["moe_layers"] == 2
    mixtral = {"num_hidden_layers": 2, "num_local_experts": 8, "intermediate_size": 14336}
    assert config_facts.config_facts(mixtral)[0]["moe_intermediate_size"] == 14336
    window = {"num_hidden_layers": 2, "sliding_window": 4096}
    assert config_facts.config_facts(window)[0]["full_attention_layers"] == 0
    unused = {**window, "use_sliding_window": False}  # Qwen2's: every layer full
    assert "full_attention_layers" not in config_facts.config_facts(unused)[0]
    short = {"num_hidden_layers": 3, "layer_types": ["full_attention"]}
    values, notes = config_facts.config_facts(short)
    assert "full_attention_layers" not in values
    assert any("`layer_types` has 1 entries for 3 layers" in note for note in notes)


def test_packed_quantized_weights_give_bytes_but_no_parameter_count(tmp_path: Path) -> None:
    config = json.loads((data_folder(LLAMA) / "config.json").read_text())
    awq = {**config, "quantization_config": {"quant_method": "awq", "bits": 4}}
    (tmp_path / "config.json").write_text(json.dumps(awq))
    safetensors(tmp_path / "model.safetensors", {"qweight": ("I32", [4, 2], 32)})
    found = config_facts.read_files(tmp_path)
    assert found.values["weights_bytes"] == 32
    assert "num_parameters" not in found.values and "dtype" not in found.values
    assert any("'awq'" in note for note in found.notes)
    assert any("elements are not its parameters" in note for note in found.notes)


def test_an_hf_cache_under_a_home_this_host_lacks_leaves_the_facts_unknown() -> None:
    # `~.cache/huggingface` reads as the home of a user named `.cache` (found by Hypothesis).
    model = Model("m", Lane.GPU, source="org/m")
    folder, _config, why = config_facts.snapshot_folder(model, "~.cache/huggingface")
    assert folder is None and why.endswith("no home folder for its `~` on this host")
