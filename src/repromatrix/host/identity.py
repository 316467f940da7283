"""Whether a GPU of this runner is the GPU a cell's matrix entry names, and can run its image.

A matrix GPU entry (``model.Gpu``) may name the GPU (``name``: a glob such as
``H100*``, or a ``/regular expression/``), its compute capability and its
memory. A runner GPU (``runner.RunnerGpu``, as nvidia-smi reports it) matches
when each fact both sides know agrees:

- the name matches the whole name nvidia-smi reports, with or without its
  ``NVIDIA `` prefix, letter case aside (``H100*`` matches ``NVIDIA H100 80GB HBM3``);
- the compute capability is the same (``9.0``; compared as numbers);
- the memory is within ``MEMORY_TOLERANCE`` of the entry's ``memory_gib``: what a
  driver reports sits below the size a GPU is sold by (an 80 GB H100 reports
  81559 MiB, 79.6 GiB; an H200 143771 MiB, 140.4 GiB; ECC on a GDDR card keeps
  1/16 back: a 48 GB card reports 46068 MiB, 45.0 GiB). A MIG slice is judged by
  its own profile (``1g.10gb``: 10), never by its GPU's memory;
- a whole GPU in MIG mode matches no entry: its cells must name one of its
  slices (``--gpus MIG-<uuid>``).

A fact the runner could not read (no nvidia-smi answer for it) is not compared.
Pure functions; the Docker kind's skip reasons call ``runner_mismatch``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

from repromatrix.host.runner import Runner, RunnerGpu
from repromatrix.patterns import compile_pattern, regex_problem
from repromatrix.values import Gpu

MEMORY_TOLERANCE = 0.10
PROFILE_SIZE = re.compile(r"(?P<size>[0-9]+)gb\Z")
VERSION = re.compile(r"[0-9]+(?:\.[0-9]+)*")


def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot name a GPU (an empty one, a regular expression RE2 cannot
    take), or None when it can."""
    if not pattern.strip():
        return "it is empty"
    body = _regex_body(pattern)
    why = None if body is None else regex_problem(body)
    return None if why is None else f"it is {why}"


def name_matches(pattern: str, name: str) -> bool:
    """Whether ``name`` (as nvidia-smi reports it) is a GPU ``pattern`` names."""
    names = {name.strip(), name.strip().removeprefix("NVIDIA ")}
    body = _regex_body(pattern)
    if body is not None:
        compiled = compile_pattern(body, ignore_case=True)
        return any(compiled.fullmatch(candidate) for candidate in names)
    return any(fnmatch.fnmatchcase(candidate.lower(), pattern.lower()) for candidate in names)


def _regex_body(pattern: str) -> str | None:
    """The regular expression of a ``/.../`` pattern; None for a glob."""
    text = pattern.strip()
    return text[1:-1] if len(text) > 2 and text.startswith("/") and text.endswith("/") else None


def judged_memory_gib(gpu: RunnerGpu) -> float | None:
    """The memory ``gpu`` is judged by, in GiB: a MIG slice's profile size, else the total
    the driver reports (None when neither is known)."""
    if gpu.mig_profile is not None and (size := PROFILE_SIZE.search(gpu.mig_profile)):
        return float(size["size"])
    return gpu.memory_mib / 1024 if gpu.memory_mib is not None else None


def mismatch(entry: Gpu, gpu: RunnerGpu) -> str | None:
    """Why ``gpu`` is not the GPU ``entry`` names, or None when every known fact agrees."""
    why = []
    if entry.name_pattern is not None and not name_matches(entry.name_pattern, gpu.name):
        why.append(f"its name is not {entry.name_pattern}")
    if gpu.mig_mode and gpu.mig_profile is None:
        why.append("it is in MIG mode (name one of its MIG slices: --gpus MIG-<uuid>)")
    wanted, found = entry.compute_capability, gpu.compute_capability
    if wanted is not None and found is not None and _numbers(wanted) != _numbers(found):
        why.append(f"its compute capability is {found}, not {wanted}")
    memory = judged_memory_gib(gpu)
    if entry.memory_gib and memory is not None and not _close(memory, entry.memory_gib):
        what = f"profile {gpu.mig_profile}" if gpu.mig_profile else f"{memory:.1f} GiB"
        why.append(f"its memory ({what}) is not {entry.memory_gib} GiB")
    return "; ".join(why) or None


def _close(found: float, wanted: int) -> bool:
    return abs(found - wanted) <= MEMORY_TOLERANCE * wanted


def _numbers(version: str) -> tuple[int, ...]:
    found = VERSION.match(version.strip())
    return tuple(int(part) for part in found.group().split(".")) if found else ()


def describe_entry(entry: Gpu) -> str:
    """The matrix entry as a reason names it: ``h100 (H100*, compute capability 9.0, 80 GiB)``."""
    facts = [entry.name_pattern] if entry.name_pattern else []
    if entry.compute_capability:
        facts.append(f"compute capability {entry.compute_capability}")
    if entry.memory_gib:
        facts.append(f"{entry.memory_gib} GiB")
    return f"{entry.name} ({', '.join(facts)})" if facts else entry.name


def runner_mismatch(entry: Gpu, runner: Runner) -> str | None:
    """Why the GPUs ``runner`` may lend are not all the GPU ``entry`` names, or None.

    Every usable GPU must match, since the scheduler may give the cell any of them
    (on a runner of mixed GPUs, ``--gpus`` narrows the run to the matching ones). An id
    nvidia-smi did not list (no nvidia-smi here) is unchecked.
    """
    found = [(gpu, why) for gpu in runner.usable if gpu and (why := mismatch(entry, gpu))]
    if not found:
        return None
    named = "; ".join(f"{gpu.summary}: {why}" for gpu, why in found)
    matching = len(runner.gpu_ids) - len(found)
    hint = f" ({matching} other(s) match: narrow the run with --gpus)" if matching else ""
    return f"GPU cell for {describe_entry(entry)}, but this runner's {named}{hint}"


def driver_shortfall(
    gpus: Sequence[RunnerGpu], image_cuda: str | None, requirement: str | None = None
) -> str | None:
    """Why the driver of ``gpus`` cannot run an image built for CUDA ``image_cuda`` (its
    ``CUDA_VERSION``), or None when it can or when either side is unknown.

    A driver older than the image's CUDA can still run it through CUDA's forward
    compatibility on the driver branches the image's ``NVIDIA_REQUIRE_CUDA`` lists
    (``brand=tesla,driver>=535,driver<536``); the NVIDIA runtime decides those, so a
    driver inside such a range is not refused here.
    """
    # One driver serves every GPU of a host: the first GPU that knows its versions speaks.
    known = [(gpu.driver_version, gpu.cuda_version) for gpu in gpus if gpu.cuda_version]
    if image_cuda is None or not known:
        return None
    driver, cuda = known[0]
    if cuda is None or _numbers(cuda)[:2] >= _numbers(image_cuda)[:2]:
        return None
    if driver and forward_compatible(requirement or "", driver):
        return None
    return (
        f"the driver {driver or '(version unknown)'} supports CUDA up to {cuda}, and the "
        f"image is built for CUDA {image_cuda} (its CUDA_VERSION): update the runner's driver"
    )


def forward_compatible(requirement: str, driver: str) -> bool:
    """Whether an ``NVIDIA_REQUIRE_CUDA`` value lets ``driver`` run the image by a driver range
    (one of its space-separated alternatives, each ``key<op>value`` joined by commas)."""
    version = _numbers(driver)
    for alternative in requirement.split():
        ranges = [c for c in alternative.split(",") if c.startswith("driver")]
        if ranges and all(_holds(version, condition) for condition in ranges):
            return True
    return False


def _holds(version: tuple[int, ...], condition: str) -> bool:
    found = re.fullmatch(r"driver(?P<op>>=|<=|==|<|>)(?P<value>[0-9.]+)", condition)
    if found is None:
        return False
    bound = _numbers(found["value"])
    ops = {
        ">=": version >= bound,
        "<=": version <= bound,
        "==": version == bound,
        "<": version < bound,
        ">": version > bound,
    }
    return ops[found["op"]]
