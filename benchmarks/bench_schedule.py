"""How well the packing scheduler fills a GPU runner, on a simulated clock.

Simulated runners (8 GPUs, 4 GPUs) get a mix of cells needing 1, 2 or 4 GPUs
whose durations are drawn from what real cells take: crash cells that stop
early at their root cause (30-120 s), healthy starts that run to readiness and
answer (120-600 s), probes (2-20 s). The SAME ``Planner`` the thread pool uses
decides every start; ``simulate`` only replaces the threads by a clock.

For each runner it prints the makespan against the lower bound
``max(sum(gpus x duration) / GPUs, longest cell)`` (goal: within 1.1x) and the
one-at-a-time order's time against the makespan (today's run), with three
kinds of estimates: exact (every cell measured in an earlier run), measured
with +-30% noise (re-runs vary), and none measured (the class estimates of
``cell_needs``: every crash cell looks alike, so does every healthy one).

It also simulates the images: each cell waits for one of several images whose
pulls take minutes, made as jobs of the same pool (``--image-jobs``) or all
before the first cell, and prints the ratio of the two makespans.

``--real`` also runs a few real CPU-lane cells (vLLM in Docker, images built by a
matrix run) through the real command, ``repromatrix run --jobs 1`` and then
``--jobs 2``, and prints the wall-clock ratio and whether every cell's outcome is
the same. It starts engines: run it alone (``flock /tmp/repromatrix-engine.lock``).

``--real-images`` removes one built CPU image and builds it again twice, each
time from the same layer cache: before a run (``--prepare-only``, then the run)
and during one (an image job of its pool while the cells of an image already
built run), and prints the ratio.

Usage: ``python benchmarks/bench_schedule.py [--seeds N] [--cells N] [--real [GLOB]]
[--real-images] [--quick]``. ``--quick`` simulates 2 random matrices per runner and
skips ``--real`` and ``--real-images``, which need Docker and vLLM.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import quick_mode

from repromatrix.run.images import image_job, job_key
from repromatrix.run.schedule import (
    CRASH_ESTIMATE_S,
    ENGINE_ESTIMATE_S,
    PROBE_ESTIMATE_S,
    Capacity,
    Job,
    Need,
    Planner,
    makespan_lower_bound,
    one_at_a_time,
    simulate,
)
from repromatrix.values import Lane

# (kind, share of cells, duration range in seconds, class estimate when nothing was measured)
KINDS = (
    ("crash", 0.45, (30.0, 120.0), CRASH_ESTIMATE_S[Lane.GPU]),
    ("healthy", 0.40, (120.0, 600.0), ENGINE_ESTIMATE_S[Lane.GPU]),
    ("probe", 0.15, (2.0, 20.0), PROBE_ESTIMATE_S),
)
WIDTHS = (1, 2, 4)
WIDTH_SHARES = (0.6, 0.25, 0.15)


@dataclass(frozen=True)
class SimCell:
    """A simulated cell: its width, what it really takes and the class estimate."""

    key: str
    gpus: int
    duration: float
    class_estimate: float


def draw_cells(rng: random.Random, count: int) -> list[SimCell]:
    """``count`` cells of the real mix of kinds and widths (probes use one GPU)."""
    cells = []
    for i in range(count):
        kind, _, (low, high), estimate = rng.choices(KINDS, [k[1] for k in KINDS])[0]
        width = 1 if kind == "probe" else rng.choices(WIDTHS, WIDTH_SHARES)[0]
        cells.append(SimCell(f"{kind}-{i}", width, rng.uniform(low, high), estimate))
    return cells


ESTIMATES: dict[str, Callable[[SimCell, random.Random], float]] = {
    "exact": lambda cell, _rng: cell.duration,
    "noisy +-30%": lambda cell, rng: cell.duration * rng.uniform(0.7, 1.3),
    "none measured": lambda cell, _rng: cell.class_estimate,
}


@dataclass(frozen=True)
class Figures:
    """One simulated run's figures against its bounds."""

    to_bound: float
    speedup: float
    wide_start: float  # mean start of the 4-GPU cells, as a share of the makespan


def run_once(
    cells: list[SimCell], gpus: int, estimate: str, reserve: bool, rng: random.Random
) -> Figures:
    """Simulate ``cells`` on ``gpus`` GPUs with one kind of estimate and one policy."""
    jobs = [Job(c.key, Need(gpus=c.gpus), ESTIMATES[estimate](c, rng)) for c in cells]
    actual = {c.key: c.duration for c in cells}
    capacity = Capacity(gpu_ids=tuple(str(i) for i in range(gpus)))
    sim = simulate(Planner(jobs, capacity, reserve=reserve), lambda job: actual[job.key])
    bound = makespan_lower_bound(((c.gpus, c.duration) for c in cells), gpus)
    wide = {c.key for c in cells if c.gpus == 4}
    starts = [span.start / sim.end for span in sim.spans if span.key in wide]
    return Figures(
        sim.end / bound,
        one_at_a_time(actual) / sim.end,
        statistics.mean(starts) if starts else 0.0,
    )


POLICIES = (("reserve+backfill", True), ("greedy", False))


def bench(gpus: int, count: int, seeds: int) -> None:
    """Print the ratios for one runner size over ``seeds`` random matrices."""
    print(f"\n{gpus} GPUs, {count} cells (1/2/4-GPU mix), {seeds} random matrices")
    print(
        f"  {'policy':<17}{'estimates':<15}{'makespan/bound':>24}"
        f"{'one-at-a-time/makespan':>25}{'4-GPU cells start at':>23}"
    )
    for policy, reserve in POLICIES:
        for estimate in ESTIMATES:
            figures = []
            for seed in range(seeds):
                rng = random.Random(seed)
                figures.append(run_once(draw_cells(rng, count), gpus, estimate, reserve, rng))
            to_bound = [f.to_bound for f in figures]
            print(
                f"  {policy:<17}{estimate:<15}"
                f"mean {statistics.mean(to_bound):5.3f}x worst {max(to_bound):5.3f}x"
                f"{statistics.mean(f.speedup for f in figures):>17.2f}x faster"
                f"{statistics.mean(f.wide_start for f in figures):>12.0%} of the run"
            )


PULL_S = (120.0, 600.0)  # a vllm/vllm-openai image of 10-20 GB from a registry mirror
IMAGE_SLOTS = 2  # ``--image-jobs``' default


def image_run(cells: list[SimCell], gpus: int, rng: random.Random) -> tuple[float, float, float]:
    """Makespans with images as pool jobs and with every image made first, and a lower bound.

    Each cell needs one of ``gpus // 2`` images (one per vLLM version of the matrix), whose
    pull takes 2-10 minutes; ``IMAGE_SLOTS`` pulls run at once either way. The bound: no cell
    starts before the first pull ends, and none before its own image's pull could end.
    """
    pulls = {job_key(str(i)): rng.uniform(*PULL_S) for i in range(max(gpus // 2, 2))}
    image_of = {c.key: rng.choice(sorted(pulls)) for c in cells}
    actual = {**{c.key: c.duration for c in cells}, **pulls}
    capacity = Capacity(gpu_ids=tuple(str(i) for i in range(gpus)))
    images = [image_job(str(i)) for i in range(len(pulls))]
    cell_jobs = [Job(c.key, Need(gpus=c.gpus), c.duration, after=image_of[c.key]) for c in cells]
    overlapped = simulate(Planner([*images, *cell_jobs], capacity, IMAGE_SLOTS), _took(actual))
    alone = [Job(c.key, Need(gpus=c.gpus), c.duration) for c in cells]
    first = simulate(Planner(images, capacity, IMAGE_SLOTS), _took(actual)).end
    first += simulate(Planner(alone, capacity), _took(actual)).end
    area = sum(c.gpus * c.duration for c in cells) / gpus
    bound = max(min(pulls.values()) + area, *(pulls[image_of[c.key]] + c.duration for c in cells))
    return overlapped.end, first, bound


def _took(actual: dict[str, float]) -> Callable[[Job], float]:
    return lambda job: actual[job.key]


def bench_images(gpus: int, count: int, seeds: int) -> None:
    """Print how much overlapping pulls with cells saves over pulling every image first."""
    runs = [
        image_run(draw_cells(random.Random(s), count), gpus, random.Random(s)) for s in range(seeds)
    ]
    to_bound = [over / bound for over, _, bound in runs]
    saved = [first / over for over, first, _ in runs]
    print(
        f"\n{gpus} GPUs, {count} cells over {max(gpus // 2, 2)} images pulled "
        f"{IMAGE_SLOTS} at a time (2-10 min each), {seeds} random matrices, exact estimates"
    )
    print(
        f"  images as pool jobs: makespan/bound mean {statistics.mean(to_bound):5.3f}x "
        f"worst {max(to_bound):5.3f}x; every image first takes "
        f"{statistics.mean(saved):.2f}x as long (worst case {min(saved):.2f}x)"
    )


REAL_CELLS = "cpu/0.32.0/cpu/tiny-llama/*"
QUICK = {"seeds": 2}


def real_cpu_lane(selection: str) -> None:
    """The same real cells with ``--jobs 1`` then ``--jobs 2``: wall clock and outcomes."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from real_cells import run_real  # noqa: PLC0415 (docker and vLLM only for --real)

    print(f"\nreal CPU lane: {selection}")
    outcomes, wall = {}, {}
    for jobs in (1, 2):
        wall[jobs], outcomes[jobs] = run_real(selection, jobs)
        print(f"  repromatrix run --jobs {jobs}: {wall[jobs]:6.1f} s")
    for cell_id in sorted(outcomes[1]):
        print(f"    {outcomes[1][cell_id]:<14} {outcomes[2].get(cell_id, '-'):<14} {cell_id}")
    same = "yes" if outcomes[1] == outcomes[2] else "NO"
    print(f"  jobs 1 / jobs 2 wall clock: {wall[1] / wall[2]:.2f}x; same outcomes: {same}")


def real_image_overlap(build: str = "0.30.0", ready: str = "0.32.0") -> None:
    """One image built during the run, real: made first (``--prepare-only``, then the run),
    or as a job of the run's pool while the cells of the image already built run."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from real_cells import remove_image, run_real  # noqa: PLC0415 (docker only for --real)

    selection = [
        f"cpu/{ready}/cpu/tiny-llama/default/*",
        f"cpu/{build}/cpu/tiny-llama/default/cpu-kv-cache-too-small/trigger",
    ]
    print(f"\nreal CPU lane, the {build} image built during the run: {', '.join(selection)}")
    # Built once first, untimed: both timed builds below then find the same layer cache (the
    # build stages' pip installs) and redo the same steps (the final image's layers).
    run_real(selection, 2, "--prepare-only")
    remove_image(build)
    prepared, _ = run_real(selection, 2, "--prepare-only")
    cells, first = run_real(selection, 2)
    print(f"  image first (--prepare-only, then run): {prepared:6.1f} s + {cells:6.1f} s")
    remove_image(build)
    overlapped, pooled = run_real(selection, 2)
    print(f"  image as a job of the run's pool:       {overlapped:6.1f} s")
    same = "yes" if first == pooled else f"NO: {first} vs {pooled}"
    ratio = (prepared + cells) / overlapped
    print(f"  image first / overlapped wall clock: {ratio:.2f}x; same outcomes: {same}")


def main() -> None:
    """Run the simulated runners (and, with ``--real``, the real CPU lane)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--cells", type=int, default=0, help="cells per run (default: 6 x GPUs)")
    parser.add_argument("--real", nargs="?", const=REAL_CELLS, default=None, metavar="GLOB")
    parser.add_argument(
        "--real-images",
        action="store_true",
        help="also build one CPU image twice for real: before the run, and during it",
    )
    args = quick_mode.parse_args(parser, QUICK)
    for gpus in (8, 4):
        bench(gpus, args.cells or 6 * gpus, args.seeds)
    for gpus in (8, 4):
        bench_images(gpus, args.cells or 6 * gpus, args.seeds)
    if args.quick and (args.real or args.real_images):
        quick_mode.skipped("--real and --real-images", "they need Docker and vLLM")
        return
    if args.real:
        real_cpu_lane(args.real)
    if args.real_images:
        real_image_overlap()


if __name__ == "__main__":
    main()
