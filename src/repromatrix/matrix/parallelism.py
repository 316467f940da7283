"""Whether a cell's parallelism can start at all: more GPUs than its entry has, or a tensor
parallel size that does not divide what vLLM divides, is bad input, found at load.

A cell asking for ``tensor_parallel_size x pipeline_parallel_size`` GPUs on an entry with
fewer would be given the entry's GPUs and fail at start-up (or be planned against GPUs it
never gets); a size vLLM refuses would end in a ``ValueError`` or an assertion read as
something else. vLLM 0.17.0-0.32.0 refuse:

- attention heads not divisible by TP: ``ModelConfig.verify_with_parallel_config``
  (vllm/config/model.py, line 1051 of 0.17.0, 1504 of 0.31.0);
- KV heads neither divisible by TP nor dividing it: ``QKVParallelLinear`` (``divide``,
  model_executor/layers/linear.py, line 1001 of 0.17.0, lines 1052-1058 of 0.31.0);
- a MoE expert intermediate size not divisible by TP (without expert parallelism, which
  divides the experts instead): ``assert intermediate_size % self.tp_size == 0`` in
  ``FusedMoE`` (model_executor/layers/fused_moe/layer.py line 485 of 0.17.0), in
  ``FusedMoEConfig`` from 0.27.1 (fused_moe/config.py, line 1322 of 0.31.0).

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
from repromatrix.values import Cell, Lane, Level

TENSOR = "tensor_parallel_size"
PIPELINE = "pipeline_parallel_size"


def parallel_problems(cells: Iterable[Cell], matrix: Matrix) -> list[Problem]:
    """One problem per wrong size and the place that set it, naming a cell it breaks and
    how many more."""
    found: dict[tuple[str, int, int, str], list[str]] = {}
    locator = FlagLocator(matrix)
    for cell in cells:
        if cell.level is Level.PROBE:
            continue  # a probe loads no model on the cell's GPUs
        for flag, message in cell_problems(cell):
            where = locator.where(cell, flag)
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


class FlagLocator:
    """Finds where a cell's flag value is written; each file is read once, and only when
    a problem needs its position."""

    def __init__(self, matrix: Matrix) -> None:
        self.matrix = matrix
        self.files: dict[str, YNode | None] = {}

    def where(self, cell: Cell, flag: str) -> Location:
        """Where the cell's value of ``flag`` is written: the layer ``flag_sources`` names,
        found again in its file (the file alone, line 0, when it cannot be)."""
        source = cell.flag_sources.get(flag)
        matrix_file = self.matrix.file
        scenario_file = cell.scenario.file or f"scenario {cell.scenario.id}"
        found: Location | None = None
        if source == "flagset":
            path = ("lanes", cell.lane.value, "flagsets", cell.flagset.name, flag)
            found = self._walk(matrix_file, path)
        elif source == "include":
            rule = _include_rule(cell, flag, self.matrix.include)
            if rule is None:
                return Location(matrix_file, 0, 0)
            return self._in_list(matrix_file, "include", rule.where.line, flag) or rule.where
        elif source == "variant":
            line = self._variant_line(scenario_file, cell.variant.name)
            found = self._in_list(scenario_file, "variants", line, flag) if line else None
        else:
            found = self._walk(scenario_file, ("launch", "flags", flag))
        file = matrix_file if source in ("flagset", "include") else scenario_file
        return found or Location(file, 0, 0)

    def _read(self, file: str) -> YNode | None:
        if file not in self.files:
            try:
                self.files[file] = load_yaml(Path(file))
            except ConfigError:
                self.files[file] = None
        return self.files[file]

    def _walk(self, file: str, keys: Sequence[str]) -> Location | None:
        """The position of the value at ``keys`` in a YAML file (``None``: not there)."""
        node = self._read(file)
        for key in keys:
            node = node.get(key) if isinstance(node, YMap) else None
        return None if node is None else node.where

    def _in_list(self, file: str, key: str, line: int, flag: str) -> Location | None:
        """The flag's position in the entry of the top-level list ``key`` at ``line``."""
        root = self._read(file)
        items = root.get(key) if isinstance(root, YMap) else None
        for item in items.items if isinstance(items, YSeq) else ():
            if isinstance(item, YMap) and item.where.line == line:
                flags = item.get("flags")
                value = flags.get(flag) if isinstance(flags, YMap) else None
                return None if value is None else value.where
        return None

    def _variant_line(self, file: str, name: str) -> int:
        """The line of the scenario file's variant called ``name`` (0: not found)."""
        root = self._read(file)
        variants = root.get("variants") if isinstance(root, YMap) else None
        for item in variants.items if isinstance(variants, YSeq) else ():
            named = item.get("name") if isinstance(item, YMap) else None
            if isinstance(named, YScalar) and named.value == name:
                return item.where.line
        return 0


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
