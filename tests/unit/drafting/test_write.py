"""The draft's YAML: it loads with the scenario loader, every string stays a string (no tag,
anchor or line break can come from the log), deployment arguments and secrets stay out,
and where the log is silent a comment says so."""

from __future__ import annotations

from types import MappingProxyType

import yaml

from repromatrix.drafting.check import load_draft
from repromatrix.drafting.write import draft_id, engine_flags, render_draft
from repromatrix.triage import Diagnosis, Direction, FlagChange, FlagFix
from repromatrix.triage.diagnosis import RootCause
from repromatrix.triage.facts import LaunchRecord, read_launch
from support import paths

HOSTILE = "!!python/object:os.system &a *a $(rm -rf /) `id` #x\n: {y} 'q' \"d\""
SILENT = LaunchRecord(MappingProxyType({}), None, None, None, None)


def diagnosis(line: str = "ValueError: bad max_model_len 4096", **facts: str) -> Diagnosis:
    cause = RootCause(
        line, "EngineCore", "ValueError", line.partition(": ")[2], "kv_cache_too_small"
    )
    fixes = (FlagFix(flags=(FlagChange("max_model_len", direction=Direction.LOWER),)),)
    return Diagnosis(cause, "", "", fix_flags=fixes, facts=MappingProxyType(facts))


def record(**args: object) -> LaunchRecord:
    return LaunchRecord(MappingProxyType(args), "non-default args", "/m", None, "cpu")  # type: ignore[arg-type]


def test_a_draft_loads_and_carries_the_log_s_values():
    text = render_draft(
        diagnosis(vllm_version="0.32.0"), record(max_model_len=4096, port=8000), "draft-x", "x.log"
    )
    scenario = load_draft("draft-x", text)
    assert scenario.launch.flags == {"max_model_len": 4096}
    assert str(scenario.affected) == "==0.32.0"
    assert [v.name for v in scenario.variants] == ["trigger", "max-model-len-2048"]
    assert "the affected range is not known yet" in text


def test_hostile_text_stays_a_plain_string():
    text = render_draft(
        diagnosis("ValueError: " + HOSTILE), record(tokenizer=HOSTILE), "draft-x", HOSTILE
    )
    document = yaml.safe_load(text)  # safe_load refuses any tag a value could turn into
    assert document["launch"]["flags"]["tokenizer"] == HOSTILE
    assert "!!python" in document["signatures"][0]["pattern"]
    load_draft("draft-x", text)


def test_deployment_arguments_and_secrets_stay_out():
    kept, notes = engine_flags(
        record(
            host="0.0.0.0",
            port=1,
            api_key="sk-1",
            served_model_name="m",
            hf_token_x="t",
            enforce_eager=True,
            lora_modules=["a"],
        )
    )
    assert kept == {"enforce_eager": True}
    assert any("secret" in note for note in notes) and any("lora_modules" in note for note in notes)


def test_where_the_log_is_silent_the_draft_says_so():
    text = render_draft(diagnosis(), SILENT, "draft-x", "x.log")
    assert "the log records no engine arguments" in text
    assert "the log states no vLLM version" in text
    assert "the log names no model" in text and "the log names no GPU" in text
    assert "not drafted: lower max_model_len" in text
    load_draft("draft-x", text)


def test_the_id_comes_from_the_category():
    assert draft_id(diagnosis()) == "draft-kv-cache-too-small"


def test_a_value_yaml_has_no_number_for_is_written_as_text():
    text = render_draft(diagnosis(), record(gpu_memory_utilization=float("nan")), "draft-x", "x")
    assert yaml.safe_load(text)["launch"]["flags"]["gpu_memory_utilization"] == "nan"


def test_from_an_argument_dump_only_flags_set_off_vllm_s_defaults_are_drafted():
    log = paths.DATA / "logs" / "classes" / "k7-v0-args-namespace-hard-wrapped-at-80-columns.log"
    dump = read_launch(log.read_text().splitlines())
    kept, notes = engine_flags(dump)
    assert kept == {"trust_remote_code": True, "max_model_len": 8192, "tensor_parallel_size": 2}
    assert notes[0].startswith(f"from the log's argument dump: {len(dump.args) - 3} other")
    assert notes[1] == "not read (no literal value in the dump): config_format"
    text = render_draft(diagnosis(), dump, "draft-x", log.name)
    assert load_draft("draft-x", text).launch.flags == kept
    assert "  flags.tensor_parallel_size: {eq: 2}" in text


def test_a_dump_that_sets_no_known_flag_says_so():
    dump = LaunchRecord(
        MappingProxyType({"port": 8000, "seed": 0}), "argument dump", None, None, None
    )
    kept, _ = engine_flags(dump)
    assert kept == {}
    text = render_draft(diagnosis(), dump, "draft-x", "x.log")
    assert "argument dump sets no engine flag the draft knows the default of" in text
