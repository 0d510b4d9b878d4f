"""Headless Chromium: the Compare page's "Test split" control over the bundled random and spatial-block runs.

A fresh store (the bundled runs only: DBK-RBF, SVGP and PPGP on a random split and on 10 km spatial blocks).
The test clicks the control as a user does and reads what the page shows — the selected option, the ranking
table's split and model cells, the caption naming the split, the random-vs-blocks table — never session state.
"""

from __future__ import annotations

import pytest

from tests.e2e.helpers import eventually, no_exception, screenshot, segment, segment_selected, settle

pytestmark = pytest.mark.e2e

BUNDLED = ("dbk-rbf", "svgp", "ppgp")
BLOCKS = "Spatial blocks (10 km)"


def ranking_cells(page) -> list[str]:
    """The accessible grid cells of the Compare page's first table (the ranking)."""
    frame = page.get_by_test_id("stDataFrame").first
    frame.locator("[role=gridcell]").first.wait_for(state="attached")
    return frame.locator("[role=gridcell]").all_inner_texts()


def ranking_splits(page) -> set[str]:
    return {c for c in ranking_cells(page) if c == "Random" or c.startswith("Spatial blocks")}


def ranking_models(page) -> set[str]:
    return {c.split(" (")[0] for c in ranking_cells(page) if c.split(" (")[0] in BUNDLED}


def test_the_test_split_control_switches_the_comparison(server, page):
    page.goto(server + "/compare")
    page.get_by_role("heading", name="Compare", exact=True).wait_for(timeout=120_000)
    settle(page)
    no_exception(page)
    page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
    assert segment_selected(page, "Test split") == "Random"
    assert ranking_splits(page) == {"Random"}
    assert ranking_models(page) == set(BUNDLED)
    assert page.get_by_text("Test split: random 8:1:1", exact=False).count() == 1
    assert page.get_by_role("heading", name="Random vs spatial blocks").count() == 1, "both kinds: side by side"
    assert page.get_by_text("two binomial standard errors", exact=False).count() == 1
    assert any(c.startswith("± ") for c in ranking_cells(page)), "each coverage with its band"

    segment(page, "Test split", BLOCKS)
    eventually(lambda: ranking_splits(page) == {BLOCKS}, what="the ranking of the block runs")
    no_exception(page)
    assert segment_selected(page, "Test split") == BLOCKS
    assert ranking_models(page) == set(BUNDLED)
    assert page.get_by_text("Test split: spatial blocks of 10 km", exact=False).count() == 1
    assert page.get_by_text("Test split: random 8:1:1", exact=False).count() == 0
    assert page.get_by_text("by held-out block", exact=False).count() == 1, "a block split's band is by block"
    assert any(c.startswith("± ") for c in ranking_cells(page))
    page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
    screenshot(page, "compare-spatial-blocks.png")

    segment(page, "Test split", "Random")
    eventually(lambda: ranking_splits(page) == {"Random"}, what="the ranking of the random runs again")
    assert segment_selected(page, "Test split") == "Random"
