"""compat.html and the published site, filtered and screenshot in real headless Chromium."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import paths
from support.machine import chromium
from support.reports import PAYLOAD, hostile_page
from support.upgrade import merged_real_run


@pytest.fixture(scope="module")
def page_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hostile_page(tmp_path_factory.mktemp("html") / "20260101-000000")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright  # noqa: PLC0415  (only where chromium is)

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium())
        yield launched
        launched.close()


@pytest.mark.browser
def test_table_filters_and_screenshot(browser: Any, page_file: Path, tmp_path: Path) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(page_file.as_uri())

    assert requested == [page_file.as_uri()]  # no other file, no network: works offline
    assert page.title() == "vLLM compatibility: run 20260101-000000"
    sections = page.locator("section.configuration")
    assert sections.count() == 2
    gpu = sections.nth(1)
    assert gpu.locator("h2").inner_text() == "gpu lane · h100 · qwen3-30b-a3b · default"
    rows = gpu.locator("tbody tr")
    assert [rows.nth(i).locator("th").inner_text() for i in range(rows.count())] == [
        "v0.17.0",
        "v0.22.1",
        "v0.31.0",
        "v0.31.1rc0",
        "v0.32.0",
        "nightly (0.33.0.dev7+g1234abc)",
    ]
    regression = rows.nth(4).locator("td")
    assert "v-regression" in (regression.get_attribute("class") or "")
    assert "expected avoided · observed hit" in regression.inner_text()
    assert "levels disagree" in regression.inner_text()

    # The log excerpt is there on demand, as text.
    cell = "gpu/v0.32.0/h100/qwen3-30b-a3b/default/moe-lora-rank-over-128/trigger"
    details = page.locator(f'details[data-cell="{cell}"]')
    excerpt = details.locator("pre")
    assert not excerpt.is_visible()
    details.locator("summary").click()
    assert excerpt.is_visible()
    assert "AssertionError: fused_moe_lora_one_shot supports max_lora_rank<=128" in (
        excerpt.inner_text()
    )
    hostile = page.locator('details[data-cell^="cpu/0.30.0/"]')
    hostile.locator("summary").click()
    assert PAYLOAD in hostile.locator("pre").inner_text()
    assert page.evaluate("window.pwned") is None

    # Filters: by GPU, then by scenario.
    page.select_option('select[data-filter="gpu"]', "h100")
    assert not sections.nth(0).is_visible()
    assert gpu.is_visible()
    page.select_option('select[data-filter="gpu"]', "")
    page.select_option('select[data-filter="scenario"]', "healthy-cpu")
    assert sections.nth(0).is_visible()
    assert not gpu.is_visible()
    visible = sections.nth(0).locator("thead th:visible")
    assert [visible.nth(i).inner_text() for i in range(visible.count())] == [
        "image",
        "healthy-cpu\nbaseline",
    ]
    page.select_option('select[data-filter="scenario"]', "")

    shot = page.screenshot(path=str(tmp_path / "compat.png"), full_page=True)
    assert shot.startswith(b"\x89PNG\r\n\x1a\n")
    assert (tmp_path / "compat.png").stat().st_size > 10_000
    page.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from repromatrix.publish.site import publish  # noqa: PLC0415
    from repromatrix.reports.findings import ReportOptions  # noqa: PLC0415
    from repromatrix.reports.ranges import load_documents  # noqa: PLC0415
    from support.upgrade import write_gpu_run  # noqa: PLC0415

    root = tmp_path_factory.mktemp("site")
    write_gpu_run(root / "results" / "20260102-000000")
    documents = load_documents(paths.ROOT / "scenarios")
    options = ReportOptions(documents=documents, baseline="v0.31.1rc0", candidate="v0.32.0")
    publish([root / "results" / "20260102-000000"], root / "site", options)
    return root / "site"


def _shot(page: Any, path: Path) -> bytes:
    data: bytes = page.screenshot(path=str(path), full_page=True)
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert path.stat().st_size > 10_000
    return data


@pytest.mark.browser
def test_site_index_filters_and_screenshots(browser: Any, site: Path, tmp_path: Path) -> None:
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    index = site / "index.html"
    page.goto(index.as_uri())
    assert requested == [index.as_uri()]
    assert page.title() == "vLLM compatibility: run 20260102-000000"
    rows = page.locator('#upgrade table[data-lane="gpu"] tbody tr')
    assert rows.count() == 4
    everything = _shot(page, tmp_path / "index-all.png")

    page.select_option('select[data-filter="safety"]', "not_safe")
    visible = page.locator('#upgrade table[data-lane="gpu"] tbody tr:visible th')
    assert [visible.nth(i).inner_text() for i in range(visible.count())] == ["v0.32.0"]
    unsafe = _shot(page, tmp_path / "index-unsafe.png")
    assert unsafe != everything

    page.select_option('select[data-filter="safety"]', "")
    page.select_option("select[data-heat]", "gpu/h100/qwen3-30b-a3b/eager")
    assert page.locator('[data-heat-map="gpu/h100/qwen3-30b-a3b/eager"]').is_visible()
    assert not page.locator('[data-heat-map="gpu/h100/qwen3-30b-a3b/default"]').is_visible()
    heat = _shot(page, tmp_path / "index-eager.png")
    assert heat not in (everything, unsafe)

    # One click from a crash to its cell page: root cause, process, excerpt.
    page.locator('#upgrade a:text("moe-lora-rank-over-128")').first.click()
    assert "AssertionError: fused_moe_lora_one_shot" in page.locator("pre").inner_text()
    page.close()


@pytest.mark.browser
def test_site_scenario_page_filters(browser: Any, site: Path, tmp_path: Path) -> None:
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.goto((site / "scenarios" / "moe-lora-rank-over-128.html").as_uri())
    strips = page.locator("table.strips tbody tr")
    total = strips.count()
    assert total == 8  # 4 GPU images, 4 CPU probes
    before = _shot(page, tmp_path / "scenario-all.png")
    page.select_option('select[data-filter="configuration"]', index=1)
    shown = page.locator("table.strips tbody tr:visible")
    assert 0 < shown.count() < total
    after = _shot(page, tmp_path / "scenario-filtered.png")
    assert after != before
    assert page.locator("svg.strip rect").count() == total  # one run: one square each
    page.close()


@pytest.fixture(scope="module")
def real_site(tmp_path_factory: pytest.TempPathFactory) -> Path:

    from repromatrix.cli import main  # noqa: PLC0415

    root = tmp_path_factory.mktemp("real-site")
    run = merged_real_run(root)
    scenarios = str(paths.ROOT / "scenarios")
    assert main(["publish", str(run), "--out", str(root / "site"), "--scenarios", scenarios]) == 0
    return root / "site"


@pytest.mark.browser
def test_real_cpu_lane_site_in_chromium(browser: Any, real_site: Path, tmp_path: Path) -> None:
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.goto((real_site / "index.html").as_uri())
    assert page.title() == "vLLM compatibility: runs ci-cpu-matrix, moe"
    rows = page.locator('#upgrade table[data-lane="cpu"] tbody tr')
    assert rows.count() == 3
    everything = _shot(page, tmp_path / "real-index.png")
    # The staged KV-cache crash no longer counts against an image (issue 31): the images left
    # by "not safe" are those whose MoE probe hit seed 000's assertion.
    page.select_option('select[data-filter="safety"]', "not_safe")
    visible = page.locator('#upgrade table[data-lane="cpu"] tbody tr:visible th')
    assert [visible.nth(i).inner_text() for i in range(visible.count())] == ["0.27.0", "0.31.0"]
    assert _shot(page, tmp_path / "real-index-unsafe.png") != everything

    page.goto((real_site / "scenarios" / "moe-lora-rank-over-128.html").as_uri())
    # The documented range now follows the source (0.22.0 dispatches rank > 128 to the one-shot
    # kernel): the real observations agree with it.
    observed = page.locator("#observed").inner_text()
    assert "observations agree with the documented range >=0.22.0,<0.31.1rc0" in observed
    strips = page.locator("table.strips tbody tr")
    assert strips.count() == 3
    before = _shot(page, tmp_path / "real-scenario.png")
    page.select_option('select[data-filter="configuration"]', index=1)
    assert page.locator("table.strips tbody tr:visible").count() == 3  # one configuration
    assert _shot(page, tmp_path / "real-scenario-cpu.png").startswith(before[:8])
    page.close()
