"""The four classes of triage misses (issue 14), each a general rule, on small logs.

1. Configuration, argument and scheduler dumps are never evidence of a cause.
2. Errors under wrappers' prefixes and headers, and under prefixes triage does not know.
3. The V0 order: the message first, then its traceback.
4. A catalogued warning gives way to a later fatal error that it does not explain.

The labelled logs of each class (tests/data/logs/classes) run through every test
of test_triage_labelled.py too; here each rule is pinned on its own.
"""

from __future__ import annotations

from collections import Counter

import pytest

from repromatrix.triage import Diagnosis, Triager
from repromatrix.triage.logmodel import Line, PrefixLearner, is_dump, parse_line
from support.triage import labelled

API_FAILED = (
    "(APIServer pid=1) RuntimeError: Engine core initialization failed. "
    "See root cause above. Failed core proc(s): {}\n"
)


def diagnose(log: str) -> Diagnosis:
    triager = Triager()
    triager.feed(log.encode())
    return triager.diagnose()


def root_line(log: str) -> str | None:
    cause = diagnose(log).root_cause
    return cause.line if cause else None


def test_each_class_has_labelled_logs_in_several_formats() -> None:
    classes = Counter(label["class"] for path, label in labelled() if "class" in label)
    assert set(classes) == {1, 2, 3, 4}
    assert all(count >= 3 for count in classes.values()), classes


# -- 1. dumps ---------------------------------------------------------------------------

DUMPS = [
    "Dumping input data for V1 LLM engine (v0.9.1) with config: model='m', trust_remote_code=True",
    "Initializing a V1 LLM engine (v0.10.0) with config: model='m', disable_custom_all_reduce=True",
    "non-default args: {'model': 'm', 'disable_custom_all_reduce': True}",
    "Dumping scheduler output for model execution: SchedulerOutput(scheduled_new_reqs=[])",
    "Dumping scheduler stats: SchedulerStats(num_running_reqs=1)",
    "args: Namespace(model='m', trust_remote_code=True)",
]


@pytest.mark.parametrize("text", DUMPS)
def test_a_dump_is_recognised(text: str) -> None:
    assert is_dump(text)


@pytest.mark.parametrize("text", DUMPS)
@pytest.mark.parametrize(
    "header", ["(EngineCore_DP0 pid=3) ERROR 01-01 00:00:00 [dump_input.py:69] ", "[launcher] "]
)
def test_a_dump_naming_a_catalogued_feature_is_never_the_cause(header: str, text: str) -> None:
    log = f"{header}{text}\n(EngineCore_DP0 pid=3) ERROR 01-01 00:00:01 [core.py:1] ValueError: x\n"
    assert root_line(log) == log.splitlines()[1]


def test_the_continuation_lines_of_a_dump_are_the_dump_too() -> None:
    head = "(EngineCore_DP0 pid=3) ERROR 01-01 00:00:00 [dump_input.py:69] "
    log = (
        f"{head}Dumping input data for V1 LLM engine (v0.9.1) with config: model='m',\n"
        f"{head}  trust_remote_code=True, disable_custom_all_reduce=False\n" + API_FAILED
    )
    assert root_line(log) is None


def test_an_exception_that_mentions_a_config_is_not_a_dump() -> None:
    log = "ValueError: cannot build the engine: EngineArgs(model='m') has no tokenizer\n"
    assert root_line(log) == log.strip()


# -- 2. wrappers and unknown prefixes -----------------------------------------------------

HEADERS = [
    # (raw line, level, origin, text)
    (
        "2025-07-02 11:04:17.382 | ERROR    | srv.main:launch:88 - boom",
        "ERROR",
        "srv.main:launch:88",
    ),
    ("ERROR    2025-08-11 09:12:44.517 serve.py:131] boom", "ERROR", "serve.py:131"),
    ("ERROR 2025-08-11T09:12:44.517Z [serve.py:131] boom", "ERROR", "serve.py:131"),
    ("2025-03-18 22:40:31,877 - llm_service.engine - ERROR - boom", "ERROR", None),
    ("[2025-03-18 22:40:31,877] [ERROR] [engine.py:45] boom", "ERROR", "engine.py:45"),
    (
        "2025-10-02T07:21:06.000047514Z stderr F ERROR 10-02 07:21:14 [core.py:708] boom",
        "ERROR",
        "core.py:708",
    ),
    ("\x1b_bk;t=1754903500622\x07ERROR 08-11 09:12:41 [core.py:700] boom", "ERROR", "core.py:700"),
    ("_bk;t=1754903500622\x07ERROR 08-11 09:12:41 [core.py:700] boom", "ERROR", "core.py:700"),
    ("2025-09-30T18:00:18.1234568Z ##[error]boom", "ERROR", None),
    ("14:05:07.185 | WARN | x.py:3 - boom", "WARNING", "x.py:3"),
    ("2025-04-02 09:10:11,204\tERROR worker.py:1832 -- boom", "ERROR", "worker.py:1832"),
]


@pytest.mark.parametrize(("raw", "level", "origin"), HEADERS)
def test_reads_the_level_under_wrappers_headers(raw: str, level: str, origin: str | None) -> None:
    line = parse_line(1, raw)
    assert (line.level, line.origin, line.text) == (level, origin, "boom")


def test_a_level_name_is_not_taken_for_a_compose_service() -> None:
    assert parse_line(1, "ERROR    | x.py:3 - boom").level == "ERROR"
    assert parse_line(1, "vllm-1  | ERROR 01-01 00:00:00 [x.py:1] boom").text == "boom"


def unprefixed(text: str) -> Line:
    return parse_line(1, text)


def test_a_traceback_header_teaches_its_unknown_prefix_with_free_digits() -> None:
    learner = PrefixLearner()
    learner.learn(unprefixed("03:00:10.000 w2> Traceback (most recent call last):"))
    assert learner.remove("w7> ValueError: x") == "ValueError: x"
    assert learner.remove("other ValueError: x") is None


@pytest.mark.parametrize(
    "raw",
    [
        "(EngineCore_DP0 pid=3) ERROR 01-01 00:00:00 [core.py:1] Traceback (most recent call"
        " last):",
        "EngineCore hit an exception: Traceback (most recent call last):",
        "Traceback (most recent call last):",
    ],
)
def test_known_prefixes_and_messages_teach_no_prefix(raw: str) -> None:
    learner = PrefixLearner()
    learner.learn(parse_line(1, raw))
    assert not learner


def test_a_traceback_under_an_unknown_prefix_names_its_exception() -> None:
    log = "".join(
        f"[shard-{n}] {text}\n"
        for n, text in enumerate(
            [
                "Traceback (most recent call last):",
                '  File "/srv/app.py", line 4, in main',
                "    run()",
                "RuntimeError: the widget broke",
                "exited with code 1",
            ]
        )
    )
    assert root_line(log) == "[shard-3] RuntimeError: the widget broke"


def test_an_info_line_under_a_wrappers_header_states_nothing() -> None:
    log = "2025-07-02 11:04:09.114 | INFO     | srv:launch:61 - CUDA out of memory is unlikely\n"
    assert root_line(log) is None


# -- 3. V0 order: message first, then the traceback ---------------------------------------

V0 = "ERROR 04-22 10:31:07 engine.py:389] "
FRAMES = [
    "Traceback (most recent call last):",
    '  File "/v/engine/multiprocessing/engine.py", line 380, in run_mp_engine',
    "    engine = MQLLMEngine.from_engine_args(engine_args=engine_args)",
]


def test_a_message_whose_traceback_never_ends_is_the_cause() -> None:
    log = "".join(f"{V0}{t}\n" for t in ["'NoneType' object is not subscriptable", *FRAMES])
    log += "RuntimeError: Engine process failed to start. See stack trace for the root cause.\n"
    assert root_line(log) == f"{V0}'NoneType' object is not subscriptable"


def test_a_message_whose_traceback_ends_gives_way_to_its_exception() -> None:
    texts = ["'rope_type'", *FRAMES, "KeyError: 'rope_type'"]
    log = "".join(f"{V0}{t}\n" for t in texts)
    assert root_line(log) == f"{V0}KeyError: 'rope_type'"


def test_a_message_then_a_raw_traceback_gives_way_to_its_exception() -> None:
    log = f"{V0}'rope_type'\n" + "\n".join([*FRAMES, "KeyError: 'rope_type'"]) + "\n"
    assert root_line(log) == "KeyError: 'rope_type'"


# -- 4. a warning against a later fatal error ----------------------------------------------

WARNED = (
    "(Worker pid=4) WARNING 01-01 00:00:00 [cpu.py:1] Failed to import from vllm._C: "
    "ImportError('libnuma.so.1: cannot open shared object file: No such file or directory')\n"
)


def fatal(exception: str) -> str:
    head = "(Worker pid=4) ERROR 01-01 00:00:05 [multiproc_executor.py:1] "
    return "".join(
        f"{head}{text}\n"
        for text in [
            "WorkerProc failed to start.",
            "Traceback (most recent call last):",
            '  File "/v/worker.py", line 9, in init_device',
            "    self.load()",
            exception,
        ]
    )


def test_a_warning_gives_way_to_a_later_unrelated_fatal_error() -> None:
    error = "ValueError: head size 40 is not supported"
    assert root_line(WARNED + fatal(error) + API_FAILED) == fatal(error).splitlines()[-1]


def test_a_warning_stays_the_cause_when_the_fatal_error_is_the_same_failure() -> None:
    error = "AttributeError: '_OpNamespace' '_C' object has no attribute 'init_cpu_memory_env'"
    assert root_line(WARNED + fatal(error) + API_FAILED) == WARNED.strip()


def test_a_warning_stays_the_cause_when_nothing_fatal_follows() -> None:
    assert root_line(WARNED + API_FAILED) == WARNED.strip()


def test_a_one_line_error_without_traceback_does_not_outrank_the_warning() -> None:
    later = "(Worker pid=4) ERROR 01-01 00:00:05 [x.py:1] ValueError: something else\n"
    assert root_line(WARNED + later + API_FAILED) == WARNED.strip()
