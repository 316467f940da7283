"""Benchmark (not a test): how fast the plan expands, and what filtering during expansion saves.

A synthetic matrix (default 50 tags x 8 GPUs x 20 models x 10 flag sets x 10
scenarios, written as real YAML and read with the real loaders) is expanded
by ``repromatrix.matrix.expand.expand``, once whole and once with a selection. For
comparison, the same cells are then planned the naive way: build every cell
of the full product first, then keep those whose trigger holds and that the
selection matches. Each is timed without tracing, then run again under
tracemalloc for its peak memory.

    python benchmarks/bench_plan.py [--tags 50] [--compare-tags 10] [--quick]

``--quick`` plans a matrix of 4 tags x 2 GPUs x 4 models x 2 flag sets (2 tags
compared) in well under a second.

The naive run keeps the whole product in memory (about 1 KiB a cell), so it
runs on a slice of ``--compare-tags`` tags; the streaming figures are shown
for that slice too, so the two can be compared like for like.
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import quick_mode

from repromatrix.judgement import Expected
from repromatrix.matrix.conditions import Facts, holds
from repromatrix.matrix.config import Matrix, load_matrix
from repromatrix.matrix.effective import EffectiveFlags, effective_flags
from repromatrix.matrix.expand import cell_id, expand, expected_outcome, image_variant, levels
from repromatrix.matrix.scenarios import load_scenarios
from repromatrix.matrix.selector import Selector
from repromatrix.values import Cell, FlagSet, Gpu, Lane, Model, Scenario, Variant

TRIGGERS = (
    "{}",  # a baseline-like scenario: applies everywhere
    "{model.moe: true, flags.enable_lora: true, flags.max_lora_rank: {gt: 128}}",
    "{gpu.count: {ge: 4}, model.moe: true}",
    "{flags.enable_lora: true, derived.lora_row_offset_elements: {ge: 2147483648}}",
    "{model.multimodal: true}",
    "{gpu.compute_capability: {ge: 9.0}, flags.enforce_eager: true}",
    "{derived.kv_cache_bytes_short: {gt: 0}}",
    "{model.moe: false, gpu.memory_gib: {ge: 80}}",
    "{flags.max_num_seqs: {in: [4, 8]}}",
    "{gpu.count: 1, model.multimodal: false}",
)


QUICK = {"tags": 4, "gpus": 2, "models": 4, "flagsets": 2, "compare_tags": 2}


def matrix_yaml(tags: int, gpus: int, models: int, flagsets: int) -> str:
    """Return a synthetic GPU-lane matrix with the given axis sizes."""
    images = ", ".join(f"v0.{i}.0" for i in range(tags))
    gpu_lines = "".join(
        f"      gpu{i}: {{runner: r{i}, count: {1 + 3 * (i % 2)}, "
        f'compute_capability: "{8 + i % 4}.0", memory_gib: {40 * (1 + i % 3)}}}\n'
        for i in range(gpus)
    )
    model_lines = "".join(
        f"      model{i}: {{source: org/m{i}, moe: {str(i % 2 == 0).lower()}, "
        f"multimodal: {str(i % 5 == 0).lower()}, intermediate_size: {4096 * (1 + i % 3)}, "
        f"hidden_size: 2048, num_hidden_layers: 24, num_attention_heads: 16, "
        f"num_key_value_heads: 4, max_position_embeddings: 131072}}\n"
        for i in range(models)
    )
    flag_lines = "".join(
        f"      f{i}: {{enforce_eager: {str(i % 2 == 0).lower()}, max_num_seqs: {2 ** (i % 5)}}}\n"
        for i in range(flagsets)
    )
    return (
        f"lanes:\n  gpu:\n    images: [{images}]\n    gpus:\n{gpu_lines}"
        f"    models:\n{model_lines}    flagsets:\n{flag_lines}"
    )


def scenario_yaml(index: int) -> str:
    """Return one synthetic scenario: a trigger of the list above and two variants."""
    return (
        f"id: s{index}\ntitle: synthetic {index}\nlanes: [gpu]\n"
        f"trigger: {TRIGGERS[index % len(TRIGGERS)]}\n"
        "launch:\n  flags: {enable_lora: true, max_lora_rank: 320, max_model_len: 100000,\n"
        "          enable_chunked_prefill: false, kv_cache_memory_bytes: 1048576}\n"
        "signatures: [{pattern: 'boom'}]\naffected: '>=0.20.0,<0.30.0'\nfixed: '>=0.30.0'\n"
        "variants:\n  - {name: rank-128, kind: control, flags: {max_lora_rank: 128}}\n"
        "  - {name: short, kind: workaround, flags: {max_model_len: 4096}}\n"
        "avoided: ok\n"
    )


def load(folder: Path, args: argparse.Namespace, tags: int) -> tuple[Matrix, tuple[Scenario, ...]]:
    """Write the synthetic files and read them back with the real loaders."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "matrix.yaml").write_text(matrix_yaml(tags, args.gpus, args.models, args.flagsets))
    scenarios = folder / "scenarios"
    scenarios.mkdir(exist_ok=True)
    for index in range(args.scenarios):
        (scenarios / f"s{index}.yaml").write_text(scenario_yaml(index))
    return load_matrix(folder / "matrix.yaml"), load_scenarios(scenarios)


def product_then_filter(
    matrix: Matrix, scenarios: Sequence[Scenario], selector: Selector
) -> list[Cell]:
    """The naive plan: every cell of the full product first, filtered afterwards.

    Each cell is made as ``expand`` makes it (effective flags, trigger, expectation), without
    its caches. The synthetic matrix has no include or exclude rules and no baseline.
    """
    config = matrix.lanes[Lane.GPU]
    everything: list[tuple[Cell, bool]] = []
    axes = (config.images, config.gpus, config.models, config.flagsets, scenarios)
    for image, gpu, model, flagset, scenario in itertools.product(*axes):
        trigger_facts, _ = cell_facts(gpu, model, flagset, scenario, scenario.variants[0])
        applies = holds(scenario.trigger, trigger_facts)
        for variant, level in itertools.product(scenario.variants, levels(scenario, Lane.GPU)):
            facts, effective = cell_facts(gpu, model, flagset, scenario, variant)
            triggered = holds(scenario.trigger, facts)
            expected = expected_outcome(scenario, image.version, triggered)
            parts = (image.tag, gpu.name, model.name, flagset.name, scenario.id, variant.name)
            cell = Cell(
                id=cell_id(Lane.GPU, parts, level),
                lane=Lane.GPU,
                level=level,
                image=image_variant(image, facts.container.image),
                gpu=gpu,
                model=model,
                flagset=flagset,
                scenario=scenario,
                variant=variant,
                expected=expected,
                flags=effective.flags,
                env=scenario.launch.env,
                deadline_s=max(config.runtime.deadline_s, scenario.launch.startup_timeout_s),
                interrupt_on=facts.interrupt_on,
                flag_sources=effective.sources,
                expected_scenario=scenario.id if expected is not Expected.AVOIDED else None,
                container=facts.container,
            )
            everything.append((cell, applies))
    return [cell for cell, applies in everything if applies and selector.matches(cell.id)]


def cell_facts(
    gpu: Gpu, model: Model, flagset: FlagSet, scenario: Scenario, variant: Variant
) -> tuple[Facts, EffectiveFlags]:
    """What a trigger sees of one variant of a combination, and its effective flags."""
    effective = effective_flags(
        {"scenario": scenario.launch.flags, "flagset": flagset.flags, "variant": variant.flags}
    )
    interrupt = scenario.launch.interrupt_on if variant.interrupt else None
    launch = replace(
        scenario.launch, model_files=variant.model_files or scenario.launch.model_files
    )
    container = scenario.launch.container.merged(variant.container)
    return Facts(model, gpu, effective.flags, launch, interrupt, container), effective


@dataclass(frozen=True)
class Measure:
    """One way of planning, timed and traced."""

    cells: int
    seconds: float
    peak_mib: float

    @property
    def rate(self) -> float:
        """Cells planned per second."""
        return self.cells / self.seconds if self.seconds else float("inf")


def measure(plan: Callable[[], Iterable[Cell]]) -> Measure:
    """Time ``plan`` (consuming what it yields), then run it again for tracemalloc's peak."""
    gc.collect()
    start = time.perf_counter()
    count = sum(1 for _ in plan())
    seconds = time.perf_counter() - start
    gc.collect()
    tracemalloc.start()
    for _ in plan():
        pass
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return Measure(count, seconds, peak / 2**20)


def report(label: str, result: Measure) -> None:
    """Print one line of figures."""
    print(
        f"  {label:<34} {result.cells:>9,} cells  {result.seconds:8.2f} s  "
        f"{result.rate:>11,.0f} cells/s  peak {result.peak_mib:9.1f} MiB"
    )


def compare(args: argparse.Namespace, folder: Path, selector: Selector) -> None:
    """Streaming and naive planning on the same (smaller) matrix, with the ratios."""
    matrix, scenarios = load(folder / "compare", args, args.compare_tags)
    for label, chosen in (("whole plan", Selector()), ("selection", selector)):
        streaming = functools.partial(expand, matrix, scenarios, selector=chosen)
        naive_plan = functools.partial(product_then_filter, matrix, scenarios, chosen)
        stream, naive = measure(streaming), measure(naive_plan)
        # The same cells, field by field: a ratio between two different plans means nothing.
        assert all(a == b for a, b in itertools.zip_longest(streaming(), naive_plan()))
        print(f"{args.compare_tags} tags, {label}:")
        report("filtered during expansion", stream)
        report("full product, then filtered", naive)
        print(
            f"  ratio: {naive.seconds / stream.seconds:.1f}x faster, "
            f"{naive.peak_mib / max(stream.peak_mib, 0.01):.0f}x less peak memory"
        )


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tags", type=int, default=50)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--flagsets", type=int, default=10)
    parser.add_argument("--scenarios", type=int, default=10)
    parser.add_argument("--compare-tags", type=int, default=10)
    parser.add_argument("--only", default="gpu/v0.1*/*/model1*/*")
    args = quick_mode.parse_args(parser, QUICK)
    selector = Selector(only=[args.only])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        matrix, scenarios = load(folder / "full", args, args.tags)
        size = args.tags * args.gpus * args.models * args.flagsets * args.scenarios
        axes = f"{args.tags} tags x {args.gpus} GPUs x {args.models} models"
        print(f"{axes} x {args.flagsets} flag sets x {args.scenarios} scenarios")
        print(f"= {size:,} combinations, each with 3 variants:")
        report("whole plan", measure(lambda: expand(matrix, scenarios)))
        report(f"--only {args.only}", measure(lambda: expand(matrix, scenarios, selector=selector)))
        compare(args, folder, selector)


if __name__ == "__main__":
    main()
