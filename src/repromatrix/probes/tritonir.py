"""Compile a captured Triton launch to TTIR for a GPU target, and read its address arithmetic.

Standard library only at import; Triton is imported when ``compile_ttir`` runs.
A probe captures a launch of vLLM's own kernel (``probekit.KernelLaunch``, with
the exact arguments vLLM's Python prepared), then has the installed Triton
lower that kernel to TTIR for an NVIDIA target, exactly as it would before a
launch on a GPU, without a GPU: the front end and the TTIR passes need none.

``row_offsets`` then answers a question about the IR: where a value loaded
from an index array (e.g. ``token_indices_sorted_by_lora_ids``) is multiplied
on its way into a store address, in how many bits is that multiply done? An
``i32`` multiply of a token row index by a row stride is the int32 offset
overflow of the punica LoRA kernels; ``i64`` is the fix.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

try:
    from repromatrix.probes import probekit
except ImportError:  # run as a program inside an image: only this folder is on sys.path
    import probekit  # type: ignore[import-not-found,no-redef]

_SSA = re.compile(r"%[A-Za-z0-9_.$-]+")
_ASSIGN = re.compile(r"^\s*(%[A-Za-z0-9_.$-]+)(?::\d+)?\s*=\s*([A-Za-z_][\w.]*)(.*)$")
_STORE = re.compile(r"^\s*tt\.store\s+(.*)$")
_ITER_ARGS = re.compile(r"iter_args\(([^)]*)\)")
_ALIAS = re.compile(r"(%[A-Za-z0-9_.$-]+)\s*=\s*(%[A-Za-z0-9_.$-]+)")
_LOC_REF = re.compile(r"loc\((#loc\d*)\)\s*$")
_LOC_DEF = re.compile(r"^(#loc\d*)\s*=\s*loc\((.*)\)\s*$")
_FILE_LINE = re.compile(r'"([^"]+)":(\d+):\d+')
_ELEMENT = re.compile(r"x?(i\d+)>?\s*$")


@dataclass(frozen=True)
class TtirOp:
    """One TTIR operation: its result, name, operands, type text and source location."""

    result: str | None
    name: str
    operands: tuple[str, ...]
    type: str
    loc: str | None


@dataclass(frozen=True)
class Multiply:
    """A multiply of a loaded index by something, feeding a store address."""

    width: str  # "i32" or "i64"
    factors: tuple[str, ...]  # kernel arguments the other factor derives from
    source: str | None  # "file:line" of the multiply in the kernel's source


def parse(ttir: str) -> tuple[tuple[TtirOp, ...], dict[str, str]]:
    """The operations of a TTIR module, and its location table resolved to ``file:line``."""
    ops: list[TtirOp] = []
    locs: dict[str, str] = {}
    for raw in ttir.splitlines():
        line = raw.strip()
        if defined := _LOC_DEF.match(line):
            locs[defined.group(1)] = defined.group(2)
            continue
        ops.extend(_ops_of(line))
    return tuple(ops), {ref: _file_line(ref, locs) for ref in locs}


def _ops_of(line: str) -> Iterator[TtirOp]:
    loc = _LOC_REF.search(line)
    ref = loc.group(1) if loc else None
    body = line[: loc.start()] if loc else line
    if assign := _ASSIGN.match(body):
        result, name, rest = assign.groups()
        operands, _, type_text = rest.rpartition(" : ") if " : " in rest else (rest, "", "")
        yield TtirOp(result, name, _names(operands), type_text.strip(), ref)
        # Loop-carried values (``iter_args(%a = %b)``) are new names for their initial values.
        carried = _ITER_ARGS.search(rest)
        for alias, value in _ALIAS.findall(carried.group(1) if carried else ""):
            yield TtirOp(alias, "alias", (_base(value),), "", ref)
    elif store := _STORE.match(body):
        operands, _, type_text = store.group(1).rpartition(" : ")
        yield TtirOp(None, "tt.store", _names(operands), type_text.strip(), ref)


def _names(text: str) -> tuple[str, ...]:
    return tuple(_base(name) for name in _SSA.findall(text))


def _base(name: str) -> str:
    return name.split("#", 1)[0]


def _file_line(ref: str, locs: Mapping[str, str]) -> str:
    seen: set[str] = set()
    while ref in locs and ref not in seen:
        seen.add(ref)
        text = locs[ref]
        if found := _FILE_LINE.search(text):
            path = found.group(1)
            cut = path.rfind("/vllm/")
            return f"{path[cut + 1 :] if cut >= 0 else path}:{found.group(2)}"
        nested = re.search(r"#loc\d*", text)
        if nested is None:
            break
        ref = nested.group(0)
    return "unknown"


def _forward(ops: tuple[TtirOp, ...], roots: set[str], stop_at: Iterable[str] = ()) -> set[str]:
    """Every value computed from ``roots``; ops named in ``stop_at`` do not pass it on."""
    stop = set(stop_at)
    reached = set(roots)
    changed = True
    while changed:
        changed = False
        for op in ops:
            if op.result is None or op.result in reached or op.name in stop:
                continue
            if any(operand in reached for operand in op.operands):
                reached.add(op.result)
                changed = True
    return reached


def _backward(ops: tuple[TtirOp, ...], roots: set[str]) -> set[str]:
    """Every value ``roots`` are computed from."""
    producers: dict[str, list[TtirOp]] = {}
    for op in ops:
        if op.result:
            producers.setdefault(op.result, []).append(op)
    reached, todo = set(roots), list(roots)
    while todo:
        for op in producers.get(todo.pop(), ()):
            for operand in op.operands:
                if operand not in reached:
                    reached.add(operand)
                    todo.append(operand)
    return reached


def row_offsets(ttir: str, index_argument: str, arguments: Iterable[str]) -> tuple[Multiply, ...]:
    """The multiplies of values loaded from ``index_argument`` that feed a ``tt.store`` address.

    ``arguments`` are the kernel's parameter names, used to say what the other
    factor of each multiply is made of (``output_d0_stride``...).
    """
    ops, locs = parse(ttir)
    index_pointers = _forward(ops, {f"%{index_argument}"}, stop_at=("tt.load",))
    loaded = {
        op.result
        for op in ops
        if op.name == "tt.load" and op.result and op.operands and op.operands[0] in index_pointers
    }
    rows = _forward(ops, loaded)
    addresses = _backward(ops, {op.operands[0] for op in ops if op.name == "tt.store"})
    known = {f"%{name}" for name in arguments}
    found = []
    for op in ops:
        if op.name != "arith.muli" or op.result not in addresses:
            continue
        if not any(operand in rows for operand in op.operands):
            continue
        others = {operand for operand in op.operands if operand not in rows}
        factors = sorted(name[1:] for name in _backward(ops, others) & known)
        element = _ELEMENT.search(op.type)
        width = element.group(1) if element else op.type
        found.append(Multiply(width, tuple(factors), locs.get(op.loc or "")))
    return tuple(found)


class _GpuTarget:
    """Answers Triton's runtime in place of a GPU driver, so a launch can be specialised."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target


@contextlib.contextmanager
def _specialising_for(target: Any, captured: dict[str, Any]) -> Iterator[None]:
    """Within the block, Triton specialises launches for ``target`` and compiles nothing."""
    driver = importlib.import_module("triton.runtime.driver").driver
    knobs = importlib.import_module("triton.knobs").runtime

    def hook(*_: Any, **kwargs: Any) -> bool:
        captured.update(kwargs["compile"])
        return True  # True tells Triton to skip compiling and launching

    previous_driver, previous_hook = vars(driver).get("_active"), knobs.jit_cache_hook
    driver.set_active(_GpuTarget(target))
    knobs.jit_cache_hook = hook
    try:
        yield
    finally:
        # Not ``reset_active``: with no GPU, creating the default driver raises.
        driver._active = previous_driver
        knobs.jit_cache_hook = previous_hook


def compile_ttir(launch: probekit.KernelLaunch, arch: int) -> str:
    """The TTIR Triton makes of ``launch`` (kernel and arguments) for CUDA ``sm_<arch>``."""
    compiler = importlib.import_module("triton.compiler.compiler")
    target = importlib.import_module("triton.backends.compiler").GPUTarget("cuda", arch, 32)
    captured: dict[str, Any] = {}
    with _specialising_for(target, captured):
        launch.kernel.warmup(*launch.positional, grid=launch.grid, **launch.keywords)
    if not captured:
        raise RuntimeError("Triton did not specialise the kernel (its cache hook was not called)")
    kernel = probekit.jit_function(launch.kernel)
    source = compiler.ASTSource(
        kernel, captured["signature"], captured["constants"], captured["configs"][0]
    )
    backend = compiler.make_backend(target)
    options = backend.parse_options(
        {key: captured[key] for key in ("num_warps", "num_ctas", "num_stages") if key in captured}
    )
    ir = importlib.import_module("triton._C.libtriton").ir
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    codegen = backend.get_codegen_implementation(options)
    module = source.make_ir(target, options, codegen, backend.get_module_map(), context)
    stages: dict[str, Any] = {}
    backend.add_stages(stages, options, source.language)
    return str(stages["ttir"](module, {}))
