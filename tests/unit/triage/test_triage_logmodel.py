"""The log model: process prefixes, headers and wrappers of many vLLM versions; line splitting."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repromatrix.triage.logmodel import LineSplitter, decode, is_quiet, parse_line, visible_text

ESC = "\x1b"

# (raw line, process, stream, level, origin, text)
PREFIXES = [
    (
        "(EngineCore_DP0 pid=226144) ERROR 10-25 13:12:42 [core.py:708] EngineCore failed.",
        "EngineCore_DP0",
        "pid=226144",
        "ERROR",
        "core.py:708",
        "EngineCore failed.",
    ),
    (
        '(EngineCore pid=316)   File "/opt/vllm/core.py", line 144, in __init__',
        "EngineCore",
        "pid=316",
        None,
        None,
        '  File "/opt/vllm/core.py", line 144, in __init__',
    ),
    (
        "(Worker pid=613) (Worker_TP3 pid=613) ERROR 11-05 03:12:46 [multiproc_executor.py:800] x",
        "Worker_TP3",
        "pid=613",
        "ERROR",
        "multiproc_executor.py:800",
        "x",
    ),
    (
        "(Worker_PP0_TP1_EP1 pid=435) WARNING 09-15 14:22:31 [utils.py:1] w",
        "Worker_PP0_TP1_EP1",
        "pid=435",
        "WARNING",
        "utils.py:1",
        "w",
    ),
    (
        "(RayWorkerWrapper pid=5120, ip=10.0.0.2) ERROR 07-10 08:00:12 worker_base.py:340] boom",
        "RayWorkerWrapper",
        "pid=5120",
        "ERROR",
        "worker_base.py:340",
        "boom",
    ),
    (
        "(VllmWorker rank=0 pid=211) ERROR 03-02 11:20:11 [multiproc_executor.py:375] e",
        "VllmWorker rank=0",
        "pid=211",
        "ERROR",
        "multiproc_executor.py:375",
        "e",
    ),
    (
        "(VllmWorkerProcess pid=312) INFO 08-01 12:00:03 multiproc_worker_utils.py:215] ready",
        "VllmWorkerProcess",
        "pid=312",
        "INFO",
        "multiproc_worker_utils.py:215",
        "ready",
    ),
    (
        "(ApiServer_2 pid=9) WARNING 01-01 00:00:00 [api_server.py:1] w",
        "ApiServer_2",
        "pid=9",
        "WARNING",
        "api_server.py:1",
        "w",
    ),
    ("(pid=77, ip=10.0.0.3) ValueError: x", "pid=77", "pid=77", None, None, "ValueError: x"),
    (
        "[rank0]: torch.OutOfMemoryError: CUDA",
        "rank0",
        "rank0",
        None,
        None,
        "torch.OutOfMemoryError: CUDA",
    ),
    (
        "[rank1]:[E0601 10:10:00.123456789 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog",
        "rank1",
        "rank1",
        "ERROR",
        "ProcessGroupNCCL.cpp:632",
        "[Rank 1] Watchdog",
    ),
    (
        "ERROR 10-16 05:20:48 registry.py:264] ImportError: x",
        None,
        None,
        "ERROR",
        "registry.py:264",
        "ImportError: x",
    ),
    ("WARN 2025-01-02 03:04:05 [x.py:9] old", None, None, "WARNING", "x.py:9", "old"),
    (
        "INFO:     Application startup complete.",
        None,
        None,
        "INFO",
        None,
        "Application startup complete.",
    ),
    ("ERROR:root:boom", None, None, "ERROR", "root", "boom"),
    (
        "[W1129 18:28:50.883912002 utils.cpp:68] Warning: NUMA",
        None,
        None,
        "WARNING",
        "utils.cpp:68",
        "Warning: NUMA",
    ),
    (
        "[E ProcessGroupNCCL.cpp:632] old torch",
        None,
        None,
        "ERROR",
        "ProcessGroupNCCL.cpp:632",
        "old torch",
    ),
    (
        "gpu-3:1203:1290 [1] NCCL WARN Cuda failure",
        None,
        None,
        "WARNING",
        "nccl",
        "NCCL WARN Cuda failure",
    ),
    (
        "/opt/x.py:24: DeprecationWarning: old",
        None,
        None,
        "WARNING",
        None,
        "/opt/x.py:24: DeprecationWarning: old",
    ),
    ("(4.26 GiB) is not a prefix", None, None, None, None, "(4.26 GiB) is not a prefix"),
]


@pytest.mark.parametrize(("raw", "process", "stream", "level", "origin", "text"), PREFIXES)
def test_reads_process_level_origin_and_message(
    raw: str,
    process: str | None,
    stream: str | None,
    level: str | None,
    origin: str | None,
    text: str,
) -> None:
    line = parse_line(3, raw)
    assert (line.process, line.stream, line.level, line.origin, line.text) == (
        process,
        stream,
        level,
        origin,
        text,
    )
    assert line.raw == raw
    assert line.number == 3


WRAPPED = [
    "vllm-1  | (APIServer pid=1) ERROR 01-01 00:00:00 [x.py:1] boom",
    "vllm_1   | (APIServer pid=1) ERROR 01-01 00:00:00 [x.py:1] boom",
    "2025-03-02T11:20:11.000000000Z (APIServer pid=1) ERROR 01-01 00:00:00 [x.py:1] boom",
    "2025-03-02T11:20:11.1234567Z vllm-1  | (APIServer pid=1) ERROR 01-01 00:00:00 [x.py:1] boom",
    "[2025-03-02 11:20:11,123] (APIServer pid=1) ERROR 01-01 00:00:00 [x.py:1] boom",
    "[pod/vllm-5f8/vllm] (APIServer pid=1) ERROR 01-01 00:00:00 [x.py:1] boom",
    "Mar  2 11:20:11 gpu-3 vllm[4242]: (APIServer pid=1) ERROR 01-01 00:00:00 [x.py:1] boom",
    f"{ESC}[36mvllm-1  |{ESC}[0m {ESC}[1;36m(APIServer pid=1){ESC}[0;0m {ESC}[31mERROR{ESC}[0m "
    f"01-01 00:00:00 {ESC}[2m[x.py:1]{ESC}[0m boom",
    "^[[1;36m(APIServer pid=1)^[[0;0m ^[[31mERROR^[[0m 01-01 00:00:00 [x.py:1] boom",
    "[1;36m(APIServer pid=1)[0;0m [31mERROR[0m 01-01 00:00:00 [x.py:1] boom",
    f"{ESC}]8;;http://x{ESC}\\(APIServer pid=1) ERROR 01-01 00:00:00 [x.py:1] boom",
]


@pytest.mark.parametrize("raw", WRAPPED)
def test_peels_wrappers_and_colours_off(raw: str) -> None:
    line = parse_line(1, raw)
    assert (line.process, line.level, line.origin, line.text) == (
        "APIServer",
        "ERROR",
        "x.py:1",
        "boom",
    )
    assert line.raw == raw


def test_a_carriage_return_progress_bar_shows_its_last_state() -> None:
    raw = "Loading:  0% | 0/4\rLoading: 50% | 2/4\rValueError: broken shard\r"
    assert visible_text(raw) == "ValueError: broken shard"
    assert parse_line(1, raw).raw == raw


@pytest.mark.parametrize(
    "raw",
    [
        "(EngineCore_DP0 pid=1) INFO 11-29 18:28:43 [core.py:133] Initializing",
        "INFO 06-12 10:01:02 llm_engine.py:161] Initializing",
        "DEBUG 2025-06-12 10:01:02 [x.py:1] d",
        "vllm-1  | (APIServer pid=1) INFO 01-01 00:00:00 [x.py:1] i",
        "2025-03-02T11:20:01.123Z INFO 03-02 11:20:01 [__init__.py:239] Automatically",
        'INFO:     127.0.0.1:50 - "POST /v1/completions HTTP/1.1" 200 OK',
        "gpu-3:1203:1290 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM",
        "[rank0]:(Worker pid=2) INFO 01-01 00:00:00 [x.py:1] i",
    ],
)
def test_info_and_debug_lines_are_quiet(raw: str) -> None:
    assert is_quiet(raw.encode())
    assert parse_line(1, raw).level in ("INFO", "DEBUG")


@pytest.mark.parametrize(
    "raw",
    [
        "(EngineCore_DP0 pid=1) ERROR 11-29 18:28:58 [core.py:1510] INFO lost",
        "ERROR 01-01 00:00:00 [x.py:1] NCCL INFO inside an error",
        "gpu-3:1203:1290 [1] NCCL WARN Cuda failure 'out of memory'",
        "INFORMATION: not a level",
        "ValueError: INFO 01-01 00:00:00",
        "",
    ],
)
def test_other_lines_are_not_quiet(raw: str) -> None:
    assert not is_quiet(raw.encode())


def _split_all(chunks: list[bytes], max_line: int | None = None) -> list[str]:
    splitter = LineSplitter() if max_line is None else LineSplitter(max_line=max_line)
    lines: list[bytes] = []
    for chunk in chunks:
        head, block = splitter.split(chunk)
        if head is not None:
            lines.append(head)
        if block is not None:
            lines.extend(block.split(b"\n"))
    tail = splitter.flush()
    return [decode(line) for line in [*lines, *([tail] if tail is not None else [])]]


@given(
    st.lists(st.text(alphabet="ab\n\ré€ \x00", max_size=30), max_size=8),
    st.lists(st.integers(min_value=0, max_value=200), max_size=6),
)
def test_any_chunking_gives_the_lines_of_the_whole(parts: list[str], cuts: list[int]) -> None:
    data = "".join(parts).encode("utf-8")
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    expected = [line.rstrip("\r") for line in data.decode("utf-8").split("\n")]
    if data.endswith(b"\n") or not data:
        expected.pop()
    assert _split_all(chunks) == expected


@given(
    st.lists(st.text(alphabet="ab\n", max_size=40), max_size=8),
    st.lists(st.integers(min_value=0, max_value=300), max_size=6),
)
def test_every_line_is_cut_alike_whatever_the_chunks(parts: list[str], cuts: list[int]) -> None:
    # A long line is cut at the same length whether it came in pieces or whole inside a
    # chunk (issue 32: what reads a block after the splitter reads a long line's first
    # bytes only, as it reads one that came in pieces).
    data = "".join(parts).encode("utf-8")
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    expected = [line[:5] for line in data.decode("utf-8").split("\n")]
    if data.endswith(b"\n") or not data:
        expected.pop()
    assert _split_all(chunks, max_line=5) == expected


def test_a_gigantic_line_is_cut_and_never_held_whole() -> None:
    splitter = LineSplitter(max_line=1000)
    for _ in range(100):
        assert splitter.split(b"x" * 700) == (None, None)
        assert splitter.pending_bytes <= 1000
    head, block = splitter.split(b"yy\nnext\n")
    assert head == b"x" * 1000
    assert block == b"next"
    assert splitter.flush() is None


def test_bytes_that_are_not_utf8_are_replaced() -> None:
    assert _split_all([b"caf\xe9\n", b"\xc3", b"\xa9t\xc3\n"]) == ["caf\ufffd", "\u00e9t\ufffd"]
