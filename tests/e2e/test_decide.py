"""Headless Chromium: train a tiny run, then the Decide page — click an area, redraw the samples, suggest sites.

A screenshot of the Decide page is saved as ``test-artifacts/decide.png``.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.e2e.helpers import choose, train_from_page
from tests.e2e.test_dashboard import nav, screenshot, settle

pytestmark = pytest.mark.e2e


def grid_frames(page):
    return page.locator('iframe[title*="ua_gridmap"]')


def click_frame_centre(page, frame_el, expect_text: str, attempts: int = 4) -> None:
    """Click the middle of a grid-map iframe until ``expect_text`` appears (the map must be drawn first)."""
    frame_el.scroll_into_view_if_needed()
    for attempt in range(attempts):
        box = frame_el.bounding_box()
        x, y = box["x"] + box["width"] * (0.5 + 0.02 * attempt), box["y"] + box["height"] * 0.5
        page.mouse.move(x, y, steps=3)
        time.sleep(0.5)
        page.mouse.click(x, y)
        try:
            page.get_by_text(expect_text, exact=True).first.wait_for(timeout=20_000)
            return
        except Exception:  # noqa: BLE001 - the canvas may still be loading: click again
            continue
    raise AssertionError(f"clicking the map did not show {expect_text!r}")


def test_decide_page_in_the_browser(server, page):
    page.goto(server)
    page.get_by_test_id("stSidebar").get_by_text("Puerto Rico", exact=False).first.wait_for(timeout=120_000)
    settle(page)
    nav(page, "Train")
    choose(page, "Model", re.compile(r"^dbk-rbf — "))  # a feature-form model here; dbk-nn: test_dbknn.py
    train_from_page(page, (("epochs", 2), ("rank", 16), ("hidden", 16), ("batch size", 2048)), cell_km=4,
                    timeout_ms=150_000)

    nav(page, "Decide")
    frames = grid_frames(page)
    frames.nth(5).wait_for(timeout=60_000)
    assert frames.count() == 6, "P(below) map, area choropleth and four plausible maps"
    assert page.get_by_text("Click an area on the map", exact=False).count() == 1
    time.sleep(2.0)

    # click an area: its posterior appears
    click_frame_centre(page, frames.nth(1), "P(area mean below)")
    settle(page)
    page.get_by_text("Area mean", exact=True).wait_for()

    # draw another four plausible maps
    page.get_by_role("button", name="Draw another four", exact=True).click()
    settle(page)
    assert page.locator('input[aria-label="Seed"]').input_value() == "1"

    # where to measure next
    page.get_by_role("button", name="Suggest sites", exact=True).click()
    settle(page)
    page.get_by_text("Latent variance after the 10 measurements", exact=False).wait_for(timeout=60_000)
    assert grid_frames(page).count() == 7
    screenshot(page, "decide.png")
