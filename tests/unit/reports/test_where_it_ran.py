"""Where it ran, in the reports and on the site: each runner's GPUs, the images it ran (digest,
vLLM, environment report) and the model revisions read, from results of two runners merged."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest

from repromatrix.cli import main
from repromatrix.judgement import Outcome
from repromatrix.publish.site import cell_page
from repromatrix.reports.runners import gpu_words, runner_summaries
from repromatrix.reports.write import write_reports
from repromatrix.results.store import write_environment
from repromatrix.results.verdicts import judge_all
from support import paths
from support.upgrade import gpu_run, schema, write_gpu_run

RUN = "20260102-000000"
H100 = {
    "index": "0", "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-5fd1", "memory_mib": 81559,
    "compute_capability": "9.0", "driver_version": "550.54.15", "cuda_version": "12.4",
}  # fmt: skip
H200 = {"index": "1", "name": "NVIDIA H200", "uuid": "GPU-77a0"}  # what `nvidia-smi -L` says
REVISION = "c" * 40


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    folder = tmp_path / RUN
    cells = []
    for number, cell in enumerate(gpu_run(RUN)):
        host, gpu = ("gpu-a", H100) if number % 2 else ("gpu-b", H200)
        report = write_environment(
            folder, f"gpu-{cell.image_tag}", f"vLLM {cell.image_tag} on {host}\n"
        )
        cells.append(
            replace(
                cell,
                host=host,
                runner_gpus=(gpu,),
                model_revision=REVISION,
                environment=report,
            )
        )
    write_gpu_run(folder, cells)
    return folder


def test_each_runner_is_summarised_with_its_gpus_images_and_revisions(run_dir: Path) -> None:
    write_reports(run_dir)
    document = json.loads((run_dir / "compat.json").read_text())
    jsonschema.validate(document, schema("compat.schema.json"))
    runners = {r["host"]: r for r in document["runners"]}
    assert set(runners) == {"gpu-a", "gpu-b"}
    assert runners["gpu-a"]["gpus"] == [H100] and runners["gpu-b"]["gpus"] == [H200]
    assert runners["gpu-a"]["models"] == [{"model": "qwen3-30b-a3b", "revision": REVISION}]
    for runner in runners.values():
        for image in runner["images"]:
            [report] = image["environment"]
            assert (
                run_dir / report
            ).read_text() == f"vLLM {image['image_tag']} on {runner['host']}\n"
    markdown = (run_dir / "compat.md").read_text()
    section = markdown.split("## Where it ran", 1)[1]
    assert "**gpu-a**" in section and "**gpu-b**" in section
    assert (
        "NVIDIA H100 80GB HBM3 (GPU-5fd1, 81559 MiB, compute 9.0, driver 550.54.15, CUDA 12.4)"
        in section
    )
    assert f"revision `{REVISION}`" in section
    html = (run_dir / "compat.html").read_text()
    assert 'id="runners"' in html and f'href="{report}"' in html


def test_skipped_cells_ran_nowhere() -> None:
    cells = [replace(c, host="gpu-a") for c in gpu_run(RUN)]
    cells[0] = replace(cells[0], outcome=Outcome.SKIPPED, host="elsewhere")
    assert [s.host for s in runner_summaries(judge_all(cells))] == ["gpu-a"]


def test_a_gpu_is_named_with_whatever_the_runner_read_of_it() -> None:
    assert gpu_words(H200) == "NVIDIA H200 (GPU-77a0)"
    assert gpu_words({"index": "MIG-1"}) == "GPU MIG-1"
    mig = {**H100, "mig_profile": "1g.10gb"}
    assert gpu_words(mig).startswith("NVIDIA H100 80GB HBM3 (GPU-5fd1, MIG 1g.10gb, 81559 MiB")


def test_the_cells_page_says_where_it_ran_and_links_its_environment_report(
    run_dir: Path, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    assert (
        main(
            [
                "publish",
                str(run_dir),
                "--out",
                str(site),
                "--scenarios",
                str(paths.ROOT / "scenarios"),
            ]
        )
        == 0
    )
    cell = next(c for c in gpu_run(RUN) if c.image_tag == "v0.31.0")
    page = (site / cell_page(RUN, cell.id)).read_text()
    assert "gpu-a" in page or "gpu-b" in page
    assert REVISION in page
    [href] = re.findall(r'href="([^"]+)">vLLM\'s environment report', page)
    report = (site / "cells" / RUN / href).resolve()
    assert report.is_file() and report.read_text().startswith("vLLM v0.31.0 on ")
    index = (site / "index.html").read_text()
    assert 'id="runners"' in index
