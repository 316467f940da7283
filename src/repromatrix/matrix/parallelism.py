"""Whether a cell's parallelism can start at all: more GPUs than its entry has, or a tensor
parallel size that does not divide what vLLM divides, is bad input, found at load.

A cell asking for ``tensor_parallel_size x pipeline_parallel_size`` GPUs on an entry with
fewer would be given the entry's GPUs and fail at start-up (or be planned against GPUs it
never gets); a size vLLM refuses would end in a ``ValueError`` or an assertion read as
something else. vLLM 0.17.0-0.32.0 refuse:

- attention heads not divisible by TP: ``ModelConfig.verify_with_parallel_config``
  (vllm/config/model.py, line 1504 of 0.31.0);
- KV heads neither divisible by TP nor dividing it: ``QKVParallelLinear`` (``divide``,
  model_executor/layers/linear.py, lines 1052-1058 of 0.31.0);
- a MoE expert intermediate size not divisible by TP (without expert parallelism, which
  divides the experts instead): ``FusedMoEConfig`` (model_executor/layers/fused_moe/
  config.py, ``assert self.intermediate_size % tp_size == 0``, line 1322 of 0.31.0).

Sizes below 1 are refused where the flag is read (``yamlsrc.Reader.flags``). Each problem
points at the line and column that set the size: a flag set or include rule of the matrix,
or the scenario's launch or variant.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from repromatrix.errors import ConfigError, Problem
from repromatrix.matrix.config import Matrix, Rule
from repromatrix.matrix.yamlsrc import Location, YMap, YNode, YScalar, YSeq, load_yaml
from repromatrix.model import Cell, Lane, Level

TENSOR = "tensor_parallel_size"
PIPELINE = "pipeline_parallel_size"


def parallel_problems(cells: Iterable[Cell], matrix: Matrix) -> list[Problem]:
    """One problem per wrong size and the place that set it, naming a cell it breaks and
    how many more."""
    found: dict[tuple[str, int, int, str], list[str]] = {}
    for cell in cells:
        if cell.level is Level.PROBE:
            continue  # a probe loads no model on the cell's GPUs
        for flag, message in cell_problems(cell):
            where = flag_location(cell, flag, matrix)
            key = (where.file, where.line, where.column, message)
            found.setdefault(key, []).append(cell.id)
    problems = []
    for (file, line, column, message), ids in found.items():
        more = f" (and {len(ids) - 1} more)" if len(ids) > 1 else ""
        problems.append(Problem(file, line, column, f"{message}: cell {ids[0]}{more}"))
    return problems


def cell_problems(cell: Cell) -> list[tuple[str, str]]:
    """What is wrong with one engine cell's sizes: ``(the flag to blame, why)``."""
    tensor = _size(cell, TENSOR)
    pipeline = _size(cell, PIPELINE)
    gpu = cell.gpu
    problems: list[tuple[str, str]] = []
    if cell.lane is Lane.GPU and gpu.count and tensor * pipeline > gpu.count:
        blame = TENSOR if tensor > 1 or PIPELINE not in cell.flags else PIPELINE
        problems.append(
            (
                blame,
                f"tensor_parallel_size {tensor} x pipeline_parallel_size {pipeline} asks "
                f"for {tensor * pipeline} GPUs, but GPU `{gpu.name}` has `count: {gpu.count}`: "
                "lower the size, or exclude this GPU for these cells",
            )
        )
    if tensor > 1:
        problems += [(TENSOR, why) for why in _divisibility(cell, tensor)]
    return problems


def _divisibility(cell: Cell, tensor: int) -> list[str]:
    """Why vLLM refuses ``tensor`` for the cell's model (nothing where the facts are unknown)."""
    model = cell.model
    name = f"model `{model.name}`"
    why = []
    heads, kv_heads = model.num_attention_heads, model.num_key_value_heads
    if heads and heads % tensor:
        why.append(
            f"tensor_parallel_size {tensor} does not divide the {heads} attention heads of "
            f"{name} (vLLM refuses it at start-up)"
        )
    if kv_heads and kv_heads % tensor and tensor % kv_heads:
        why.append(
            f"tensor_parallel_size {tensor} neither divides nor is a multiple of the "
            f"{kv_heads} KV heads of {name} (vLLM's QKVParallelLinear asserts)"
        )
    inner = model.moe_intermediate_size
    expert = cell.flags.get("enable_expert_parallel") is True
    if model.moe and inner and not expert and inner % tensor:
        why.append(
            f"tensor_parallel_size {tensor} does not divide the expert intermediate size "
            f"{inner} of {name} (vLLM's FusedMoEConfig asserts; enable_expert_parallel "
            "divides the experts instead)"
        )
    return why


def _size(cell: Cell, flag: str) -> int:
    """A parallel size of the cell (1 when unset; sizes below 1 are refused when read)."""
    value = cell.flags.get(flag)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def flag_location(cell: Cell, flag: str, matrix: Matrix) -> Location:
    """Where the cell's value of ``flag`` is written: the layer ``flag_sources`` names, found
    again in its file (the owner's line when it cannot be)."""
    source = cell.flag_sources.get(flag)
    scenario = cell.scenario
    scenario_file = scenario.file or f"scenario {scenario.id}"
    if source == "flagset":
        keys: Sequence[str | int] = ("lanes", cell.lane.value, "flagsets", cell.flagset.name, flag)
        return _locate(matrix.file, keys) or Location(matrix.file, 0, 0)
    if source == "include":
        rule = _include_rule(cell, flag, matrix.include)
        if rule is not None:
            return _locate_in_rule(matrix.file, rule, flag) or rule.where
        return Location(matrix.file, 0, 0)
    if source == "variant":
        found = _locate_in_variant(scenario_file, cell.variant.name, flag)
        return found or Location(scenario_file, 0, 0)
    return _locate(scenario_file, ("launch", "flags", flag)) or Location(scenario_file, 0, 0)


def _include_rule(cell: Cell, flag: str, rules: Sequence[Rule]) -> Rule | None:
    """The last include rule that extends the cell with ``flag`` (a later rule wins)."""
    values = {
        "lane": cell.lane.value,
        "image": cell.image.tag,
        "gpu": cell.gpu.name,
        "model": cell.model.name,
        "flagset": cell.flagset.name,
        "scenario": cell.scenario.id,
        "variant": cell.variant.name,
        "level": cell.level.value,
    }
    matching = [
        rule
        for rule in rules
        if flag in rule.flags and all(rule.accepts(axis, value) for axis, value in values.items())
    ]
    return matching[-1] if matching else None


def _locate_in_rule(file: str, rule: Rule, flag: str) -> Location | None:
    """The flag's position inside the include rule written at ``rule.where``."""
    root = _read(file)
    rules = root.get("include") if isinstance(root, YMap) else None
    if not isinstance(rules, YSeq):
        return None
    for item in rules.items:
        if isinstance(item, YMap) and item.where.line == rule.where.line:
            return _walk(item, ("flags", flag))
    return None


def _locate_in_variant(file: str, name: str, flag: str) -> Location | None:
    """The flag's position in the scenario file's variant called ``name``."""
    root = _read(file)
    variants = root.get("variants") if isinstance(root, YMap) else None
    if not isinstance(variants, YSeq):
        return None
    for item in variants.items:
        named = item.get("name") if isinstance(item, YMap) else None
        if isinstance(item, YMap) and isinstance(named, YScalar) and named.value == name:
            return _walk(item, ("flags", flag))
    return None


def _locate(file: str, keys: Sequence[str | int]) -> Location | None:
    """The position of the value at ``keys`` in a YAML file (``None``: not found there)."""
    root = _read(file)
    return None if root is None else _walk(root, keys)


def _walk(node: YNode, keys: Sequence[str | int]) -> Location | None:
    found: YNode | None = node
    for key in keys:
        if isinstance(key, int):
            found = found.items[key] if isinstance(found, YSeq) and key < len(found.items) else None
        else:
            found = found.get(key) if isinstance(found, YMap) else None
        if found is None:
            return None
    return None if found is None else found.where


def _read(file: str) -> YNode | None:
    try:
        return load_yaml(Path(file))
    except ConfigError:
        return None
