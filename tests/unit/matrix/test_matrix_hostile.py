"""Hostile matrix and scenario files, and values that become pipeline variables.

The classes (each a parametrized test): runner labels that would become
Buildkite or GitHub syntax; command-line values that Buildkite would
interpolate at upload; control characters anywhere in a YAML file; YAML tags
on mappings and lists, and tagged scalars PyYAML cannot construct; control
characters in the Hugging Face cache path; launch.env names that are shell
text or secrets. Each is refused with the file, the line and one sentence
(exit 2), or, for the pipeline, reaches the step exactly as it was given.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from repromatrix.cli import main
from repromatrix.errors import EXIT_OK, EXIT_USAGE, ConfigError
from repromatrix.grammars import check_mirror
from repromatrix.matrix.config import load_matrix
from repromatrix.matrix.scenarios import load_scenario
from repromatrix.matrix.yamlsrc import parse_yaml
from support import paths

FLEET = paths.DATA / "fleet" / "matrix.yaml"
SCENARIOS = paths.SCENARIOS
GPU_MATRIX = """\
lanes:
  gpu:
    runtime: {{hf_cache: {hf_cache}}}
    images: [v0.32.0]
    gpus:
      h100: {{runner: {runner}, count: 1}}
    models: {{m: {{source: org/m}}}}
"""


def matrix_text(runner: str = "gpu-h100", hf_cache: str = "~/.cache/huggingface") -> str:
    return GPU_MATRIX.format(runner=runner, hf_cache=hf_cache)


def refused_at(tmp_path: Path, text: str, line: int) -> str:
    """Load ``text`` as a matrix: it must be refused with one problem at ``line``."""
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_matrix(path)
    (problem,) = raised.value.problems
    assert (problem.file, problem.line) == (str(path), line), problem
    assert "\n" not in problem.message
    return problem.message


# --- runner labels --------------------------------------------------------------------------

HOSTILE_LABELS = [
    '"gpu-$BUILDKITE_AGENT_ACCESS_TOKEN"',  # the example: interpolated at upload
    '"gpu-${BUILDKITE_AGENT_ACCESS_TOKEN}"',
    '"${{ secrets.HF_TOKEN }}"',  # a GitHub expression
    '"gpu\\nh100"',
    '"gpu\\rh100"',
    '"gpu h100"',
    '"-gpu"',
    '"gpu;id"',
    '"gpu`id`"',
    '"$(id)"',
    '"gpu\'h100"',
    '"gpu\\"h100"',
    '"gpu,h100"',  # two labels to a runs-on list
    '"gpu/../h100"',
    '"gpu\\u202eh100"',
    '"' + "g" * 300 + '"',
]


@pytest.mark.parametrize("label", HOSTILE_LABELS, ids=range(len(HOSTILE_LABELS)))
def test_a_runner_label_outside_its_grammar_is_refused_at_load(tmp_path: Path, label: str) -> None:
    message = refused_at(tmp_path, matrix_text(runner=label), line=6)
    assert "`runner`" in message and "is refused" in message


@pytest.mark.parametrize("label", ["gpu-h100", "ubuntu-latest", "team_a100x2", "linux.arm64"])
def test_real_runner_labels_load(tmp_path: Path, label: str) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(matrix_text(runner=label))
    assert load_matrix(path).lanes


# --- values Buildkite would interpolate -----------------------------------------------------

INTERPOLATED = [
    "$BUILDKITE_AGENT_ACCESS_TOKEN",
    "${BUILDKITE_AGENT_ACCESS_TOKEN}",
    "${BUILDKITE_AGENT_ACCESS_TOKEN:-x}",
    "a$$b",
    "x$",
    "$(id)",
    "${{ secrets.HF_TOKEN }}",
]
_VARIABLE = re.compile(r"\\\$|\$\$|\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*")


def upload(text: str) -> str:
    """What Buildkite makes of pipeline text at upload: ``$$`` and ``\\$`` are a ``$``, and
    every other ``$NAME`` or ``${...}`` is replaced (here by a marker a test can see)."""

    def one(match: re.Match[str]) -> str:
        found = match.group()
        if found in ("$$", "\\$"):
            return "$"
        return "7" if found == "${BUILDKITE_BUILD_NUMBER}" else "<INTERPOLATED>"

    return _VARIABLE.sub(one, text)


def pipeline(*args: str) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["plan", "--format", "buildkite", *args]) == EXIT_OK
    return printed.getvalue()


def argv_of(script: str, program: str) -> list[str]:
    """The arguments of the first line of ``script`` that runs ``program``."""
    line = next(line for line in script.splitlines() if program in line)
    return shlex.split(line)


def after(argv: list[str], option: str) -> str:
    return argv[argv.index(option) + 1]


@pytest.mark.parametrize("text", INTERPOLATED, ids=range(len(INTERPOLATED)))
def test_every_value_reaches_the_buildkite_step_as_it_was_given(tmp_path: Path, text: str) -> None:
    matrix = tmp_path / f"m{text}.yaml"
    shutil.copy(FLEET, matrix)
    scenarios = tmp_path / f"s{text}"
    shutil.copytree(SCENARIOS, scenarios)
    package = f"repromatrix @ file:///src/{text}"
    gate = ["--baseline", f"v0.31.0{text}", "--candidate", f"v0.32.0{text}"]
    raw = pipeline(
        "--matrix", str(matrix), "--scenarios", str(scenarios), "--package", package, *gate
    )
    steps = yaml.safe_load(upload(raw))["steps"]
    assert "<INTERPOLATED>" not in upload(raw)
    for step in steps[:-2]:
        commands = "\n".join(step["commands"])
        run = argv_of(commands, "bin/repromatrix run")
        assert after(run, "--matrix") == str(matrix)
        assert after(run, "--scenarios") == str(scenarios)
        installed = argv_of(commands, "pip install")
        assert installed[installed.index("install") + 2] == package  # after -q; extras follow
    report = steps[-1]["command"]
    diff = argv_of(report, "bin/repromatrix diff")
    assert (after(diff, "--baseline"), after(diff, "--candidate")) == (gate[1], gate[3])
    assert argv_of(report, "pip install")[-1] == package


@pytest.mark.parametrize("option", ["--package", "--baseline"])
@pytest.mark.parametrize("text", ["a\\$b", "a\nb", "a\x1bb"])
def test_a_value_buildkite_cannot_carry_exactly_is_refused(
    option: str, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = ["--baseline", "v0.31.0", "--candidate", "v0.32.0"]
    args = ["--package", ".", *gate]
    args[args.index(option) + 1] = text
    assert main(["plan", "--format", "buildkite", "--matrix", str(FLEET), *args]) == EXIT_USAGE
    assert f"{option} " in capsys.readouterr().err


# --- control characters anywhere in a YAML file ---------------------------------------------

CONTROLS = ["\x00", "\x01", "\x07", "\x08", "\x0b", "\x0c", "\x1b", "\x7f", "\x80", "\x9f"]
PLACES = {
    "a comment": "lanes: {{}}  # a comment {c} here\n",
    "a value": "lanes:\n  gpu:\n    registry: vllm{c}/x\n",
    "a key": "lanes:\n  gp{c}u: {{}}\n",
}


@pytest.mark.parametrize("place", list(PLACES))
@pytest.mark.parametrize("control", CONTROLS, ids=[f"{ord(c):#04x}" for c in CONTROLS])
def test_a_control_character_anywhere_is_a_problem_with_its_line_not_a_traceback(
    tmp_path: Path, control: str, place: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = PLACES[place].format(c=control)
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    line = next(n for n, row in enumerate(text.split("\n"), 1) if control in row)
    assert main(["plan", "--matrix", str(path), "--scenarios", str(SCENARIOS)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"repromatrix: error: {path}:{line}:")
    assert "control character" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_control_character_in_a_scenario_file_is_a_problem_too(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("id: bad\n# \x1b[2J\ntitle: x\n")
    with pytest.raises(ConfigError) as raised:
        load_scenario(path)
    (problem,) = raised.value.problems
    assert problem.line == 2 and "control character" in problem.message


# --- YAML tags on mappings and lists, and tagged values PyYAML cannot build ------------------

TAGGED = [
    "a: !foo {b: 1}",
    "a: !foo [1]",
    "a: !!omap [{b: 1}]",
    "a: !!set {b}",
    "a: !!pairs [{b: 1}]",
    "a: !!python/object:os.system {}",
    "a: !!python/tuple [1]",
    "a: !!str {b: 1}",
    "a: !!map [1]",
    "a: !!seq {b: 1}",
    "a: !!bool maybe",  # PyYAML raised a KeyError
    "a: !!int",  # and an IndexError
    "a: !!int ''",
    "a: !!float ''",
]


@pytest.mark.parametrize("text", TAGGED, ids=range(len(TAGGED)))
def test_a_tag_that_is_not_plain_data_is_a_problem(text: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_yaml(text + "\n", "f.yaml")
    (problem,) = raised.value.problems
    assert (problem.line, problem.column) == (1, 4)
    assert "\n" not in problem.message


@pytest.mark.parametrize("text", ["a: !!map {b: 1}", "a: !!seq [1]", "a: !!str x", "a: !!int 3"])
def test_the_standard_tags_of_plain_data_are_accepted(text: str) -> None:
    parse_yaml(text + "\n", "f.yaml")


# --- the Hugging Face cache path ------------------------------------------------------------

HOSTILE_CACHES = ['"/cache\\nRUN id"', '"/cache\\r"', '"/ca\\x1b[2Jche"', '"/cache\\0"', '"/c\\tx"']


@pytest.mark.parametrize("cache", HOSTILE_CACHES, ids=range(len(HOSTILE_CACHES)))
def test_an_hf_cache_with_a_control_character_is_refused_at_load(
    tmp_path: Path, cache: str
) -> None:
    message = refused_at(tmp_path, matrix_text(hf_cache=cache), line=3)
    assert "`hf_cache`" in message and "is refused" in message


# --- launch.env names -----------------------------------------------------------------------

SCENARIO = """\
id: env-test
title: env
lanes: [cpu]
trigger: {{flags.enforce_eager: true}}
launch:
  env:
    {name}: "1"
signatures: [{{pattern: "x"}}]
affected: ">=0"
avoided: serves
"""
HOSTILE_ENV_NAMES = [
    '"A B"',
    '"$(id)"',
    '"X;rm -rf /"',
    '"1X"',
    '"X-Y"',
    '"X=Y"',
    '"X\\nY"',
    '""',
    "HF_TOKEN",  # secrets come from the host at run time, never from a file
    "hf_token",
    "HUGGING_FACE_HUB_TOKEN",
    "HUGGINGFACE_TOKEN",
]


@pytest.mark.parametrize("name", HOSTILE_ENV_NAMES, ids=range(len(HOSTILE_ENV_NAMES)))
def test_a_launch_env_name_is_checked_when_the_scenario_loads(tmp_path: Path, name: str) -> None:
    path = tmp_path / "env-test.yaml"
    path.write_text(SCENARIO.format(name=name))
    with pytest.raises(ConfigError) as raised:
        load_scenario(path)
    (problem,) = raised.value.problems
    assert problem.line == 7 and "`env`" in problem.message and "is refused" in problem.message


def test_a_good_launch_env_name_loads(tmp_path: Path) -> None:
    path = tmp_path / "env-test.yaml"
    path.write_text(SCENARIO.format(name="VLLM_CPU_KVCACHE_SPACE"))
    assert dict(load_scenario(path).launch.env) == {"VLLM_CPU_KVCACHE_SPACE": "1"}


def test_plan_refuses_a_scenario_folder_with_a_secret_in_env(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "scenarios"
    shutil.copytree(SCENARIOS, folder)
    (folder / "env-test.yaml").write_text(SCENARIO.format(name="HF_TOKEN"))
    code = main(["plan", "--scenarios", str(folder), "--matrix", str(paths.ROOT / "matrix.yaml")])
    assert code == EXIT_USAGE
    assert "HF_TOKEN" in capsys.readouterr().err


# --- launch.lora_adapter: a name, as the matrix's adapter names are -------------------------

ADAPTER_SCENARIO = """\
id: env-test
title: env
lanes: [cpu]
trigger: {{flags.enforce_eager: true}}
launch:
  lora_adapter: {name}
signatures: [{{pattern: "x"}}]
affected: ">=0"
avoided: serves
"""
HOSTILE_ADAPTERS = [
    '"tiny=/etc --trust-remote-code"',  # becomes `--lora-modules NAME=PATH` in the argv
    '"--trust-remote-code"',
    '"a=b"',
    '"tiny lora"',
    '"../../x"',
    '"Tiny-Lora"',
    '"tiny\\nlora"',
    '"-x"',
]


@pytest.mark.parametrize("name", HOSTILE_ADAPTERS, ids=range(len(HOSTILE_ADAPTERS)))
def test_a_lora_adapter_that_is_not_a_name_is_refused_at_load(tmp_path: Path, name: str) -> None:
    path = tmp_path / "env-test.yaml"
    path.write_text(ADAPTER_SCENARIO.format(name=name))
    with pytest.raises(ConfigError) as raised:
        load_scenario(path)
    (problem,) = raised.value.problems
    assert problem.line == 6 and "`lora_adapter`" in problem.message


def test_a_lora_adapter_name_loads(tmp_path: Path) -> None:
    path = tmp_path / "env-test.yaml"
    path.write_text(ADAPTER_SCENARIO.format(name="tiny-lora"))
    assert load_scenario(path).launch.lora_adapter == "tiny-lora"


# --- an image an include adds to the CPU lane must be a version pip can install -------------

CPU_INCLUDE = """
  - lane: cpu
    image: {tag}
    gpu: cpu
    model: tiny-llama
    flagset: default
    scenario: healthy-cpu
"""


@pytest.mark.parametrize("tag", ["nightly", "latest", "main", "my-build"])
def test_an_include_that_adds_a_cpu_image_without_a_version_is_refused_at_load(
    tmp_path: Path, tag: str
) -> None:
    text = (paths.ROOT / "matrix.yaml").read_text() + CPU_INCLUDE.format(tag=tag)
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_matrix(path)
    (problem,) = raised.value.problems
    assert problem.line == text.splitlines().index(f"    image: {tag}") + 1
    assert f"CPU image `{tag}` must be a vllm-cpu version" in problem.message


def test_an_include_may_add_a_cpu_version_or_a_gpu_nightly(tmp_path: Path) -> None:
    gpu = "\n  - {image: nightly, gpu: h100, model: qwen3-30b-a3b, scenario: healthy-gpu}\n"
    text = (paths.ROOT / "matrix.yaml").read_text() + CPU_INCLUDE.format(tag="0.29.0") + gpu
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    assert load_matrix(path).include


# --- values outside their grammar (issue 34) ------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "org/m\u0430",  # Cyrillic a (U+0430): another repository to the hub, the same to a reader
        "\u043ergan/m",  # Cyrillic o (U+043E)
        "org/m\u200b",  # a zero-width space
        "org/\uff4d",  # a full-width m
    ],
)
def test_a_model_source_outside_ascii_is_refused(tmp_path: Path, source: str) -> None:
    text = GPU_MATRIX.format(runner="gpu-h100", hf_cache="~/.cache/huggingface")
    message = refused_at(tmp_path, text.replace("source: org/m", f'source: "{source}"'), 7)
    assert "not ASCII" in message or "control character" in message


@pytest.mark.parametrize("mirror", ["http://[::1/debian", "http://deb.example:99999/debian"])
def test_a_mirror_url_that_does_not_parse_is_refused_not_a_traceback(mirror: str) -> None:
    assert check_mirror(mirror) is not None
