"""Headless Chromium against ``streamlit run``: train, click a map cell, see its kernel slice.

Screenshots of the Maps and Compare pages are saved under ``test-artifacts/``.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.conftest import ARTIFACTS

pytestmark = pytest.mark.e2e


def settle(page, timeout: float = 90.0) -> None:
    """Wait until the script run finished (no 'Running...' status widget) and the page is drawn."""
    time.sleep(0.8)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if page.get_by_test_id("stStatusWidget").count() == 0 and page.get_by_test_id("stSkeleton").count() == 0:
            break
        time.sleep(0.25)
    time.sleep(0.5)


def nav(page, name: str) -> None:
    page.get_by_test_id("stSidebarNav").get_by_text(name, exact=True).click()
    page.get_by_role("heading", name=name, exact=True).wait_for()
    settle(page)


def set_number(page, label: str, value) -> None:
    box = page.locator(f'input[aria-label="{label}"]')
    box.fill(str(value))
    box.press("Enter")
    settle(page)


def screenshot(page, name: str) -> None:
    """The whole page (Streamlit scrolls inside its main block, so grow the viewport to fit it)."""
    height = page.evaluate(
        "() => Math.max(...Array.from(document.querySelectorAll("
        "'[data-testid=stMain], [data-testid=stMainBlockContainer]')).map(e => e.scrollHeight), 900)"
    )
    size = page.viewport_size
    page.set_viewport_size({"width": size["width"], "height": min(int(height) + 80, 4000)})
    time.sleep(1.5)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)
    page.set_viewport_size(size)


def click_map_cell(page, chart, fx: float = 0.5, fy: float = 0.5, attempts: int = 4) -> None:
    """Hover, then click the map until the app reports a kernel slice (software WebGL picks slowly)."""
    chart.scroll_into_view_if_needed()
    for attempt in range(attempts):
        box = chart.bounding_box()
        x, y = box["x"] + box["width"] * (fx + 0.01 * attempt), box["y"] + box["height"] * fy
        for i in range(3):
            page.mouse.move(x + i, y, steps=3)
            time.sleep(0.4)
        page.mouse.click(x, y)
        try:
            page.get_by_text("Kernel slice at x_ref", exact=True).first.wait_for(timeout=20_000)
            return
        except Exception:  # noqa: BLE001 - retry the click
            continue
    raise AssertionError("clicking a grid cell did not select x_ref")


def test_train_then_click_a_cell_shows_its_kernel_slice(server, page):
    page.goto(server)
    page.get_by_test_id("stSidebar").get_by_text("Puerto Rico", exact=False).first.wait_for(timeout=120_000)
    settle(page)
    assert page.get_by_text("CPU", exact=False).count() + page.get_by_text("GPU:", exact=False).count() > 0

    # --- train a fast model on the sample
    nav(page, "Train")
    for label, value in (("epochs", 3), ("rank", 16), ("hidden", 16), ("batch size", 2048)):
        set_number(page, label, value)
    set_number(page, "Grid cell (km, 0 = auto)", 3)
    page.get_by_role("button", name="Train", exact=True).click()
    page.get_by_text("is in the run store", exact=False).wait_for(timeout=150_000)
    settle(page)

    # --- maps: click a cell on the canvas, the kernel slice and the point's interval appear
    nav(page, "Maps")
    page.locator("[data-testid=stDeckGlJsonChart] canvas").first.wait_for(timeout=60_000)
    time.sleep(2.0)
    assert page.get_by_text("Click a grid cell", exact=False).count() == 1
    chart = page.get_by_test_id("stDeckGlJsonChart").first
    click_map_cell(page, chart)
    settle(page)
    page.get_by_text("Posterior mean at x_ref", exact=True).wait_for()
    page.get_by_text("95% interval", exact=True).wait_for()
    assert page.get_by_test_id("stDeckGlJsonChart").count() == 2, "the main map and the kernel-slice map"
    assert "xref=" in page.url, "x_ref is in the URL"
    screenshot(page, "maps.png")

    # --- compare: the violins for the bundled run and the new one
    nav(page, "Compare")
    page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
    time.sleep(1.5)
    assert page.locator(".js-plotly-plot").count() >= 4
    assert page.locator(".violin").count() >= 1 or page.locator("g.trace.violins").count() >= 1
    screenshot(page, "compare.png")
