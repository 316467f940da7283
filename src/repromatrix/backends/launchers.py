"""A cell's container as the launchers of HPC sites start it: pyxis on ``srun``, or Apptainer.

Many clusters have no Docker daemon on their nodes: a job step starts the container
itself, with pyxis (``srun --container-image``, enroot underneath) or Apptainer
(``apptainer exec --nv``). Both are rendered here from the same ``ContainerCall``
the Docker backend creates (image, argv, mounts, environment, GPUs, memory), and read
back (``parse_pyxis``, ``parse_apptainer``) into the same ``ContainerLaunch`` that call gives,
so the three cannot drift apart. Neither launcher can be installed where this is
built, so nothing here runs one: ``run --dry-run`` shows both for each cell.

No secret reaches either: a cell runs offline and is given none (``HF_TOKEN`` is
``prepare``'s alone), so pyxis is given the plain variables by name
(``--container-env``, their values from srun's environment) and Apptainer on its
command line. Neither gives the container a network namespace of its own, which a
Docker cell has (``--network none``). A path reaches a mount list only when it holds
neither of the list's separators (``,`` and ``:``).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from repromatrix.backends.docker.calls import ContainerCall, Mount, split_ref
from repromatrix.errors import UsageError

MOUNT_SEPARATORS = frozenset(",:")  # between a mount list's entries, and in one entry


@dataclass(frozen=True)
class ContainerLaunch:
    """What any launcher must give a cell's container."""

    image: str  # the image as the launcher names it
    argv: tuple[str, ...]  # entrypoint and command, exec form
    mounts: tuple[Mount, ...]
    environment: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[str, ...] = ()  # exactly these GPUs (UUIDs where known)
    memory: str | None = None  # the memory limit, e.g. 3073m


def launch_of(call: ContainerCall, image: str) -> ContainerLaunch:
    """What ``call`` asks of any launcher, its image named ``image``."""
    return ContainerLaunch(
        image=image,
        argv=(*call.entrypoint, *call.command),
        mounts=call.mounts,
        environment=dict(call.environment),
        gpus=call.device_ids,
        memory=call.mem_limit,
    )


def enroot_image(ref: str) -> str:
    """A Docker image reference as pyxis takes it: ``registry#path:tag``; an image that only
    a local Docker daemon has (no registry) is ``dockerd://name:tag``."""
    first, slash, rest = ref.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return f"dockerd://{ref}" if ref.startswith("repromatrix/") else ref


def apptainer_image(ref: str) -> str:
    """A Docker image reference as Apptainer takes it: from a registry (``docker://``), or
    from a local Docker daemon (``docker-daemon:``) for the images repromatrix builds."""
    if ref.startswith("repromatrix/"):
        repository, tag = split_ref(ref)
        return f"docker-daemon:{repository}:{tag}"
    return f"docker://{ref}"


@dataclass(frozen=True)
class Command:
    """A launcher's command line and what its own environment must add."""

    argv: tuple[str, ...]
    environment: Mapping[str, str] = field(default_factory=dict)


def pyxis_command(call: ContainerCall) -> Command:
    """``srun --container-image ...`` for ``call``: the variables are named on the command line
    (``--container-env``) and their values are srun's environment's."""
    launch = launch_of(call, enroot_image(call.image))
    argv = ["srun", "--ntasks=1", "--nodes=1", f"--container-image={launch.image}"]
    if launch.mounts:
        argv.append("--container-mounts=" + ",".join(_mount(m) for m in launch.mounts))
    argv += ["--no-container-mount-home", "--container-writable"]
    names = sorted(launch.environment)
    if names:
        argv.append(f"--container-env={','.join(names)}")
    if launch.memory:
        argv.append(f"--mem={launch.memory.upper()}")
    return Command((*argv, *launch.argv), dict(launch.environment))


def apptainer_command(call: ContainerCall) -> Command:
    """``apptainer exec --nv ...`` for ``call``: its variables on the command line."""
    launch = launch_of(call, apptainer_image(call.image))
    argv = ["apptainer", "exec"]
    if launch.gpus or call.gpus_needed:
        argv.append("--nv")
    argv += ["--containall", "--cleanenv", "--writable-tmpfs"]
    for mount in launch.mounts:
        argv += ["--bind", _mount(mount)]
    env = dict(launch.environment)
    if launch.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(launch.gpus)  # --nv shows every GPU of the job
    for name, value in sorted(env.items()):
        argv += ["--env", f"{name}={value}"]
    if launch.memory:
        argv += ["--memory", launch.memory]
    return Command((*argv, launch.image, *launch.argv))


def parse_pyxis(command: Command) -> ContainerLaunch:
    """Read an ``srun --container-image`` command back into what it gives the container."""
    parser = _parser("srun")
    for flag in ("--ntasks", "--nodes", "--container-image", "--container-mounts", "--mem"):
        parser.add_argument(flag)
    parser.add_argument("--container-env", default="")
    for flag in ("--no-container-mount-home", "--container-writable"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("program", nargs=argparse.REMAINDER)
    options = parser.parse_args(_after(command.argv, "srun"))
    names = [n for n in options.container_env.split(",") if n]
    mounts = options.container_mounts.split(",") if options.container_mounts else []
    environment = {name: command.environment[name] for name in names}
    nvidia = environment.get("NVIDIA_VISIBLE_DEVICES", "")
    return ContainerLaunch(
        image=options.container_image,
        argv=tuple(options.program),
        mounts=tuple(_read_mount(m) for m in mounts),
        environment=environment,
        gpus=tuple(nvidia.split(",")) if nvidia else (),
        memory=options.mem.lower() if options.mem else None,
    )


def parse_apptainer(command: Command) -> ContainerLaunch:
    """Read an ``apptainer exec`` command back into what it gives the container."""
    parser = _parser("apptainer exec")
    for flag in ("--nv", "--containall", "--cleanenv", "--writable-tmpfs"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("--bind", action="append", default=[])
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("--memory")
    parser.add_argument("image")
    parser.add_argument("program", nargs=argparse.REMAINDER)
    options = parser.parse_args(_after(command.argv, "apptainer", "exec"))
    environment = dict(item.split("=", 1) for item in options.env)
    visible = environment.pop("CUDA_VISIBLE_DEVICES", "")
    return ContainerLaunch(
        image=options.image,
        argv=tuple(options.program),
        mounts=tuple(_read_mount(m) for m in options.bind),
        environment=environment,
        gpus=tuple(visible.split(",")) if visible else (),
        memory=options.memory,
    )


def _mount(mount: Mount) -> str:
    """One entry of a mount list (pyxis's ``--container-mounts``, Apptainer's ``--bind``):
    ``source:target:ro|rw``, entries joined by ``,``. A path holding either separator would
    write entries of its own (``/x,/:/host:rw`` mounts the host's root read-write), so it is
    refused, never written."""
    for path in (mount.source, mount.target):
        if bad := MOUNT_SEPARATORS.intersection(path):
            raise UsageError(
                f"cannot mount {path!r} in a container started by pyxis or Apptainer: it holds"
                f" {', '.join(repr(c) for c in sorted(bad))}, which their mount lists take as a"
                " separator; use a path without ',' or ':' (a link to it will do)"
            )
    return f"{mount.source}:{mount.target}:{'ro' if mount.read_only else 'rw'}"


def _read_mount(text: str) -> Mount:
    source, target, *flags = text.split(":")
    return Mount(source, target, read_only="ro" in flags)


def _parser(prog: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=prog, add_help=False, allow_abbrev=False, exit_on_error=False
    )


def _after(argv: Sequence[str], *command: str) -> list[str]:
    """The words after the launcher's own command (``ValueError`` when it is another)."""
    if list(argv[: len(command)]) != list(command):
        raise ValueError(f"not a `{' '.join(command)}` command: {list(argv[:2])}")
    return list(argv[len(command) :])
