"""What a GPU fleet sets in its matrix: environment variables per lane and per GPU entry (never
a secret, never shell, YAML or template code), a start deadline per model, and how long a cell
waits for a busy GPU; each bad value an error at its file, line and column."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repromatrix.backends.docker.calls import ContainerSettings, container_call
from repromatrix.backends.harness_spec import build_spec
from repromatrix.cli import main
from repromatrix.errors import EXIT_USAGE, ConfigError
from repromatrix.matrix.config import load_matrix
from repromatrix.matrix.expand import plan
from repromatrix.matrix.lanes import DEFAULT_GPU_IDLE_WAIT_S
from repromatrix.values import Cell, Lane
from support.matrix import BASELINE, at, setup, write

FLEET = """
lanes:
  gpu:
    runtime:
      deadline_s: 1800
      gpu_idle_wait_s: 120
      env:
        NCCL_DEBUG: WARN
        NCCL_SOCKET_IFNAME: ^docker0,lo
        NCCL_IB_TIMEOUT: 22
    images: [v0.32.0]
    gpus:
      a100x2:
        runner: team-a100x2
        count: 2
        env:
          NCCL_P2P_LEVEL: NVL
          NCCL_DEBUG: INFO
          PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True
      l40s: {runner: team-l40s, count: 1}
    models:
      llama-8b: {source: meta-llama/Llama-3.1-8B-Instruct}
      gpt-oss-120b: {source: openai/gpt-oss-120b, deadline_s: 5400}
"""


def cells(tmp_path: Path, matrix: str = FLEET) -> dict[str, Cell]:
    loaded, scenarios = setup(tmp_path, matrix, {"healthy": BASELINE})
    return {"/".join(c.id.split("/")[2:4]): c for c in plan(loaded, scenarios, Lane.GPU)}


def problems(tmp_path: Path, text: str) -> list[str]:
    path = write(tmp_path, "matrix.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    return [str(p).removeprefix(f"{path}:") for p in info.value.problems]


def test_lane_and_gpu_env_reach_the_cell_the_gpu_entry_over_the_lane(tmp_path: Path) -> None:
    planned = cells(tmp_path)
    wide, narrow = planned["a100x2/llama-8b"], planned["l40s/llama-8b"]
    assert dict(narrow.env) == {
        "NCCL_DEBUG": "WARN",
        "NCCL_IB_TIMEOUT": "22",
        "NCCL_SOCKET_IFNAME": "^docker0,lo",
    }
    assert dict(wide.env) == {
        "NCCL_DEBUG": "INFO",  # the GPU entry's over the lane's
        "NCCL_IB_TIMEOUT": "22",
        "NCCL_P2P_LEVEL": "NVL",
        "NCCL_SOCKET_IFNAME": "^docker0,lo",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }
    # As a scenario's env does: in the harness spec, which the container (and a local
    # harness, and a Slurm task's run) hands to the launched vLLM process.
    spec = build_spec(wide, "/models/llama")
    assert spec["env"]["NCCL_P2P_LEVEL"] == "NVL"
    call = container_call(wide, spec, "img", ContainerSettings(gpu_ids=("0", "1")), "r1")
    assert json.loads(call.create_kwargs()["command"][1])["env"] == spec["env"]


def test_a_scenario_env_wins_over_the_fleet_env(tmp_path: Path) -> None:
    own = BASELINE.replace("launch: {}", "launch: {env: {NCCL_DEBUG: TRACE}}")
    loaded, scenarios = setup(tmp_path, FLEET, {"healthy": own})
    cell = next(c for c in plan(loaded, scenarios, Lane.GPU) if "/a100x2/" in c.id)
    assert cell.env["NCCL_DEBUG"] == "TRACE" and cell.env["NCCL_P2P_LEVEL"] == "NVL"


def test_a_model_deadline_replaces_the_lanes_and_is_its_start_up_wait(tmp_path: Path) -> None:
    planned = cells(tmp_path)
    small, big = planned["l40s/llama-8b"], planned["l40s/gpt-oss-120b"]
    assert small.deadline_s == 1800 and big.deadline_s == 5400
    assert build_spec(small, "m")["startup_timeout_s"] == 600  # the scenario's start-up
    assert build_spec(big, "m")["startup_timeout_s"] == 5400  # a 120B model loads longer
    shorter = FLEET.replace("deadline_s: 5400", "deadline_s: 900")
    assert cells(tmp_path / "short", shorter)["l40s/gpt-oss-120b"].deadline_s == 900


def test_the_gpu_idle_wait_is_read_with_its_default(tmp_path: Path) -> None:
    gpu = load_matrix(write(tmp_path, "m.yaml", FLEET)).lanes[Lane.GPU]
    assert gpu.runtime.gpu_idle_wait_s == 120
    plain = FLEET.replace("      gpu_idle_wait_s: 120\n", "")
    runtime = load_matrix(write(tmp_path, "p.yaml", plain)).lanes[Lane.GPU].runtime
    assert runtime.gpu_idle_wait_s == DEFAULT_GPU_IDLE_WAIT_S
    none = FLEET.replace("gpu_idle_wait_s: 120", "gpu_idle_wait_s: 0")
    assert load_matrix(write(tmp_path, "n.yaml", none)).lanes[Lane.GPU].runtime.gpu_idle_wait_s == 0


@pytest.mark.parametrize(
    ("old", "new", "needle", "message"),
    [
        ("gpu_idle_wait_s: 120", "gpu_idle_wait_s: -5", "-5", "0 or more seconds, not -5"),
        ("gpu_idle_wait_s: 120", "gpu_idle_wait: 5", "gpu_idle_wait", "Perhaps you meant `gpu_"),
        ("deadline_s: 5400", "deadline_s: 0", "0}", "must be a positive finite number"),
        ("deadline_s: 5400", "deadlin_s: 60", "deadlin_s", "Perhaps you meant `deadline_s`?"),
        ("NCCL_P2P_LEVEL: NVL", "HF_TOKEN: x", "HF_TOKEN", "a secret"),
        ("NCCL_P2P_LEVEL: NVL", "WANDB_API_KEY: abc", "WANDB_API_KEY", "holds a secret"),
        ("NCCL_P2P_LEVEL: NVL", "DB_PASSWORD: abc", "DB_PASSWORD", "holds a secret"),
        ("NCCL_DEBUG: WARN", "CUDA_VISIBLE_DEVICES: '0'", "CUDA_VISIBLE", "the run sets it"),
        ("NCCL_DEBUG: WARN", "1NCCL: x", "1NCCL", "not a variable name"),
        ("NCCL_DEBUG: WARN", "NCCL_DEBUG: $(id)", "$(id)", "no space, quote, `$`"),
        ("NCCL_DEBUG: WARN", "NCCL_DEBUG: '`id`'", "'`id`'", "backquote"),
        ("NCCL_DEBUG: WARN", "NCCL_DEBUG: '{{ secrets.X }}'", "'{{", "brace"),
        ("NCCL_DEBUG: WARN", "NCCL_DEBUG: '!!python/object'", "'!!", "`!`"),
        ("NCCL_DEBUG: WARN", "NCCL_DEBUG: 'a; rm -rf /'", "'a;", "which a shell, YAML"),
        ("NCCL_DEBUG: WARN", "NCCL_DEBUG: [a, b]", "[a, b]", "must be text"),
    ],
)
def test_bad_fleet_settings_are_errors_at_their_place(
    tmp_path: Path, old: str, new: str, needle: str, message: str
) -> None:
    text = FLEET.replace(old, new, 1)
    (found,) = problems(tmp_path, text)
    assert found.startswith(f"{at(text, needle)}: "), found
    assert message in found


TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"  # the shape of a Hugging Face token
KEY = "q9Xz" * 10  # forty mixed letters and digits: the shape of a secret key


@pytest.mark.parametrize("value", [TOKEN, "ghp_" + "a1B2" * 9, "AKIAIOSFODNN7EXAMPLE", KEY])
def test_a_secret_shaped_value_is_refused_and_never_repeated(tmp_path: Path, value: str) -> None:
    text = FLEET.replace("NCCL_DEBUG: WARN", f"NCCL_DEBUG: {value}")
    (found,) = problems(tmp_path, text)
    assert found.startswith(f"{at(text, value)}: `runtime.env` `NCCL_DEBUG`: its value is refused")
    assert "it looks like" in found
    assert value not in found


def test_values_operators_use_pass(tmp_path: Path) -> None:
    values = [
        "mlx5_0:1,mlx5_1:1",  # NCCL_IB_HCA
        "=eth0",  # NCCL_SOCKET_IFNAME, an exact name
        "GPU-5b3c1f6e-1f3a-4d5e-9a1b-2c3d4e5f6a7b",  # a lower-case UUID is no key
        "/opt/nccl/lib/libnccl-net.so",
        "INIT,ENV",
        "",
    ]
    for number, value in enumerate(values):
        text = FLEET.replace("NCCL_DEBUG: WARN", f"NCCL_X{number}: '{value}'")
        runtime = load_matrix(write(tmp_path, f"m{number}.yaml", text)).lanes[Lane.GPU].runtime
        assert dict(runtime.env)[f"NCCL_X{number}"] == value


def test_the_command_refuses_a_secret_in_the_env_with_exit_2_and_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = FLEET.replace("NCCL_P2P_LEVEL: NVL", f"NCCL_P2P_LEVEL: {TOKEN}")
    matrix = write(tmp_path, "matrix.yaml", text)
    scenarios = write(tmp_path / "scenarios", "healthy.yaml", BASELINE).parent
    code = main(["plan", "--matrix", str(matrix), "--scenarios", str(scenarios)])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert f"{matrix}:{at(text, TOKEN)}: GPU `a100x2` `env` `NCCL_P2P_LEVEL`" in err
    assert TOKEN not in err and "Traceback" not in err
