"""The harness spec: argv, kwargs, env, request and probe fields built from a cell."""

from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from repromatrix.backends.harness_spec import (
    STORE_TRUE_FLAGS,
    build_spec,
    offline_kwargs,
    server_argv,
    server_command,
    server_launcher,
)
from repromatrix.errors import ConfigError
from repromatrix.matrix.expand import expand
from repromatrix.values import Adapter, Lane, Launch, Level, Probe
from support.harness import make_cell, offline_launch
from support.matrix import setup


def test_flags_become_kebab_case_options_one_element_each() -> None:
    argv = server_argv({"max_model_len": 2048, "kv_cache_memory_bytes": 262144, "dtype": "bf16"})
    assert argv == [
        "--dtype",
        "bf16",
        "--kv-cache-memory-bytes",
        "262144",
        "--max-model-len",
        "2048",
    ]


def vllm_like_parser(flags: dict[str, object]) -> argparse.ArgumentParser:
    """A parser declaring ``flags`` the way vLLM's does: booleans as BooleanOptionalAction."""
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    for name, value in flags.items():
        option = "--" + name.replace("_", "-")
        if isinstance(value, bool) and name in STORE_TRUE_FLAGS:
            parser.add_argument(option, action="store_true", default=False)
        elif isinstance(value, bool):
            parser.add_argument(option, action=argparse.BooleanOptionalAction, default=None)
        else:
            parser.add_argument(option, default=None)
    return parser


def test_true_and_false_are_sent_as_vllm_parses_them_and_none_is_left_out() -> None:
    flags = {"enforce_eager": True, "enable_prefix_caching": False, "max_lora_rank": None}
    argv = server_argv(flags)
    assert argv == ["--no-enable-prefix-caching", "--enforce-eager"]
    parsed = vllm_like_parser(flags).parse_args(argv)
    assert parsed.enable_prefix_caching is False
    assert parsed.enforce_eager is True
    assert parsed.max_lora_rank is None


def test_a_false_store_true_flag_is_its_default_and_has_no_no_form() -> None:
    flags = {"disable_log_stats": False, "enable_lora": False}
    argv = server_argv(flags)
    assert argv == ["--no-enable-lora"]
    parsed = vllm_like_parser(flags).parse_args(argv)
    assert (parsed.disable_log_stats, parsed.enable_lora) == (False, False)


def test_floats_keep_their_value() -> None:
    assert server_argv({"gpu_memory_utilization": 0.5}) == ["--gpu-memory-utilization", "0.5"]


@pytest.mark.parametrize(
    "value",
    ["$(rm -rf /)", "`id`", "a; echo pwned", "x && y", "'quoted' \"double\"", "two words", "\n"],
)
def test_values_that_look_like_shell_code_stay_one_inert_element(value: str) -> None:
    argv = server_argv({"served_model_name": value})
    assert argv == ["--served-model-name", value]


def test_a_value_starting_with_a_dash_cannot_become_an_option() -> None:
    argv = server_argv({"served_model_name": "--trust-remote-code"})
    assert argv == ["--served-model-name=--trust-remote-code"]


@pytest.mark.parametrize(
    "name", ["max-model-len", "MaxModelLen", "x; rm -rf /", "a b", "", "--model", "ünicode"]
)
def test_flag_names_that_are_not_snake_case_are_a_config_error(name: str) -> None:
    cell = make_cell({name: 1})
    with pytest.raises(ConfigError) as err:
        build_spec(cell, "/models/tiny")
    message = str(err.value)
    assert "scenarios/cpu-kv-cache-too-small.yaml" in message
    assert "snake_case" in message


flag_names = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True)
flag_values = st.one_of(
    st.text(max_size=30), st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False)
)


@given(st.dictionaries(flag_names, flag_values, max_size=8))
def test_argv_parses_back_to_the_flags(flags: dict[str, object]) -> None:
    assume(not any(f"no_{name}" in flags for name in flags))  # --no-x would be declared twice
    argv = server_argv(flags)  # type: ignore[arg-type]
    assert all(isinstance(arg, str) for arg in argv)
    parsed = vars(vllm_like_parser(flags).parse_args(argv))
    expected = {
        k: v if isinstance(v, bool) else (None if v is None else str(v)) for k, v in flags.items()
    }
    assert parsed == expected


def test_server_command_keeps_every_argument_separate() -> None:
    spec = build_spec(make_cell({"served_model_name": "a b; c"}), "/models/tiny llama")
    command = server_command(spec, port=8123)
    assert command[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert command[3:9] == [
        "--model",
        "/models/tiny llama",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
    ]
    assert command[9:] == ["--served-model-name", "a b; c"]
    assert shlex.join(command).count("'a b; c'") == 1


def test_the_server_starts_as_the_images_entrypoint_starts_it() -> None:
    cell = make_cell({"served_model_name": "a b; c"}, lane=Lane.GPU)
    spec = build_spec(cell, "Qwen/Qwen3-0.6B", launcher=("vllm", "serve"))
    assert server_command(spec, port=8123) == [
        "vllm", "serve", "Qwen/Qwen3-0.6B", "--host", "127.0.0.1", "--port", "8123",
        "--served-model-name", "a b; c",
    ]  # fmt: skip
    older = build_spec(cell, "m", launcher=("python3", "-m", "vllm.entrypoints.openai.api_server"))
    assert server_command(older, port=1)[:5] == [
        "python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("entrypoint", "launcher"),
    [
        # vllm/vllm-openai's current tags, and the tags before `vllm serve` existed
        (["vllm", "serve"], ("vllm", "serve")),
        (["python3", "-m", "vllm.entrypoints.openai.api_server"],
         ("python3", "-m", "vllm.entrypoints.openai.api_server")),
        # a wrapper in front (NVIDIA's images) is kept: it is how the image starts vLLM
        (["/opt/nvidia/nvidia_entrypoint.sh", "/usr/local/bin/vllm", "serve"],
         ("/opt/nvidia/nvidia_entrypoint.sh", "/usr/local/bin/vllm", "serve")),
        # anything else starts no server the harness knows: the module form
        (["/bin/bash"], ()),
        (["vllm"], ()),
        (["python3", "-m", "vllm.entrypoints.cli.main"], ()),
        (None, ()),
        ([], ()),
    ],
)  # fmt: skip
def test_the_launcher_is_read_from_the_images_entrypoint(
    entrypoint: list[str] | None, launcher: tuple[str, ...]
) -> None:
    assert server_launcher(entrypoint) == launcher


def test_server_spec_fields() -> None:
    cell = make_cell({"max_model_len": 2048, "kv_cache_memory_bytes": 262144}, deadline_s=300)
    spec = build_spec(cell, "/models/tiny")
    assert spec["mode"] == "server"
    assert spec["model"] == "/models/tiny"
    assert spec["argv"] == ["--kv-cache-memory-bytes", "262144", "--max-model-len", "2048"]
    assert spec["request"]["model"] == "/models/tiny"
    assert spec["request"]["lora"] is None
    assert spec["request"]["max_tokens"] > 0 and spec["request"]["prompt"]
    assert spec["startup_timeout_s"] == 300  # never longer than the cell's deadline
    assert json.loads(json.dumps(spec)) == spec


def test_served_model_name_is_what_the_request_asks_for() -> None:
    spec = build_spec(make_cell({"served_model_name": "tiny"}), "/models/tiny")
    assert spec["request"]["model"] == "tiny"


def test_the_interrupt_text_reaches_the_harness() -> None:
    # The harness looks for it in each line it relays (text, no pattern: none runs in images).
    spec = build_spec(make_cell(interrupt_on="Warming up multi-modal processing..."), "/m")
    assert spec["interrupt_on"] == "Warming up multi-modal processing..."


def test_lora_adapter_is_loaded_and_the_request_goes_through_it() -> None:
    cell = make_cell({"enable_lora": True}, launch=Launch(lora_adapter="tiny-lora"))
    spec = build_spec(cell, "/m", adapter_path="/m/adapters/lora-r8")
    assert spec["argv"] == ["--enable-lora", "--lora-modules", "tiny-lora=/m/adapters/lora-r8"]
    assert spec["request"]["model"] == "tiny-lora"
    assert spec["request"]["lora"] == {"name": "tiny-lora", "path": "/m/adapters/lora-r8"}


def test_adapter_without_a_local_path_is_named_by_itself() -> None:
    cell = make_cell({"enable_lora": True}, launch=Launch(lora_adapter="org/adapter"))
    spec = build_spec(cell, "org/model")
    assert spec["argv"][-1] == "org/adapter=org/adapter"


def test_a_gpu_cells_adapter_is_the_models_mounted_folder_or_repo() -> None:
    launch = Launch(lora_adapter="seed-adapter")
    cell = make_cell({"enable_lora": True}, lane=Lane.GPU, launch=launch)
    local = replace(cell.model, adapters=(Adapter("seed-adapter", path="/srv/lora"),))
    spec = build_spec(replace(cell, model=local), "/opt/repromatrix/models/qwen3")
    target = "/opt/repromatrix/adapters/qwen3/seed-adapter"
    assert spec["argv"][-2:] == ["--lora-modules", f"seed-adapter={target}"]
    assert spec["request"]["model"] == "seed-adapter"
    hub = replace(cell.model, adapters=(Adapter("seed-adapter", source="org/lora"),))
    spec = build_spec(replace(cell, model=hub), "Qwen/Qwen3-0.6B")
    assert spec["argv"][-1] == "seed-adapter=org/lora"


def test_a_variant_with_lora_off_asks_the_base_model() -> None:
    cell = make_cell({"enable_lora": False}, launch=Launch(lora_adapter="tiny-lora"))
    spec = build_spec(cell, "/m", adapter_path="/a")
    assert spec["argv"] == ["--no-enable-lora"]
    assert spec["request"]["model"] == "/m"
    assert spec["request"]["lora"] is None


def test_offline_mode_passes_flags_as_llm_kwargs() -> None:
    flags = {"max_model_len": 2048, "enforce_eager": True, "enable_lora": False, "seed": None}
    spec = build_spec(make_cell(flags, launch=offline_launch()), "/m")
    assert spec["mode"] == "offline"
    assert spec["kwargs"] == {"enable_lora": False, "enforce_eager": True, "max_model_len": 2048}
    assert offline_kwargs({"seed": None}) == {}


def test_env_merges_scenario_and_cell_and_refuses_secrets() -> None:
    launch = Launch(env={"VLLM_CPU_KVCACHE_SPACE": "1", "A": "x"})
    spec = build_spec(make_cell(launch=launch, env={"A": "y"}), "/m")
    assert spec["env"] == {"A": "y", "VLLM_CPU_KVCACHE_SPACE": "1"}
    for secret in ("HF_TOKEN", "hf_token", "HUGGING_FACE_HUB_TOKEN"):
        with pytest.raises(ConfigError, match="secret"):
            build_spec(make_cell(env={secret: "hf_abc"}), "/m")


def test_a_secret_in_the_host_environment_never_reaches_the_spec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    spec = build_spec(make_cell({"enable_lora": True}, launch=Launch(lora_adapter="x")), "/m")
    assert "hf_secret_value" not in json.dumps(spec)


def test_a_variants_env_reaches_the_harness(tmp_path: Path) -> None:
    scenario = """
    id: forced
    title: t
    lanes: [cpu]
    trigger: {model.moe: false}
    launch: {env: {A: launch}}
    signatures: [{pattern: "x"}]
    affected: all
    variants: [{name: forced, kind: workaround, env: {A: variant, B: "0"}}]
    avoided: ok
    """
    matrix = "lanes:\n  cpu:\n    images: ['0.32.0']\n    gpus: {cpu: {runner: r, count: 0}}\n"
    matrix += "    models: {tiny-llama: {source: tiny-llama}}\n"
    loaded, scenarios = setup(tmp_path, matrix, {"forced": scenario})
    cells = {cell.variant.name: cell for cell in expand(loaded, scenarios)}
    assert build_spec(cells["trigger"], "/m")["env"] == {"A": "launch"}
    assert build_spec(cells["forced"], "/m")["env"] == {"A": "variant", "B": "0"}


def test_bad_env_names_are_refused() -> None:
    with pytest.raises(ConfigError, match="not a valid variable name"):
        build_spec(make_cell(env={"A=B": "1"}), "/m")


def test_probe_cells_name_their_program_and_params() -> None:
    probe = Probe("moe_lora_rank.py", {"max_lora_rank": 320, "moe": True})
    cell = make_cell(level=Level.PROBE, probe=probe)
    spec = build_spec(cell, "/m")
    assert spec["mode"] == "probe"
    assert spec["probe"] == {
        "program": "moe_lora_rank.py",
        "params": {"max_lora_rank": 320, "moe": True},
    }
    assert "argv" not in spec


@pytest.mark.parametrize("program", ["../evil.py", "/abs.py", "x.sh", "a b.py"])
def test_probe_programs_must_be_plain_file_names(program: str) -> None:
    cell = make_cell(level=Level.PROBE, probe=Probe(program))
    with pytest.raises(ConfigError, match="probe program"):
        build_spec(cell, "/m")


def test_probe_cell_without_a_probe_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no probe"):
        build_spec(make_cell(level=Level.PROBE), "/m")


def test_zero_and_one_are_values_not_booleans() -> None:
    assert server_argv({"seed": 0, "tensor_parallel_size": 1}) == [
        "--seed",
        "0",
        "--tensor-parallel-size",
        "1",
    ]
