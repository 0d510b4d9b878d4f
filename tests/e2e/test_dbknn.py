"""Headless Chromium: train dbk-nn (DBK + nearest-neighbour residual) from the Train page, then use it like any
run — its maps take clicks, the PI-width map shows, and Decide answers from its joint posterior (the joint
Vecchia prediction plus the DBK part): county intervals, plausible maps and suggested sites.

Trained on spatial blocks, whose validation blocks make its feature check a test of the gaps; the Train page
and the Maps header say what the check decided, the latent scale the block folds cross-validated, the skewed
noise fitted on them and the noise scale per tests count.

Screenshots: ``test-artifacts/train-dbk-nn.png``, ``test-artifacts/maps-dbk-nn.png``,
``test-artifacts/decide-dbk-nn.png``.
"""

from __future__ import annotations

import re

import pytest

from tests.e2e.helpers import (
    choose,
    click_grid,
    expect_legend,
    nav,
    no_exception,
    screenshot,
    segment,
    settle,
    train_from_page,
    wait_grid_drawn,
)

pytestmark = pytest.mark.e2e


def test_dbk_nn_trains_from_the_page_and_its_run_is_usable(server, page):
    page.goto(server + "/train")
    page.get_by_role("heading", name="Train", exact=True).wait_for(timeout=120_000)
    settle(page)
    choose(page, "Model", re.compile(r"^dbk-nn — "))
    choose(page, "Split (8:1:1)", "block")  # validation on spatial blocks: the feature check tests the gaps
    no_exception(page)
    train_from_page(page, (("dbk epochs", 2), ("epochs", 3), ("dbk rank", 16), ("neighbors", 10)), cell_km=4)
    no_exception(page)
    # the page says when the feature check dropped the features (which fit wins on this tiny run may change)
    settle(page)
    dropped = page.get_by_text("the DBK features were dropped", exact=False).count() > 0
    # ... and the latent scale its block folds cross-validated (docs/calibration.md)
    assert page.get_by_text("from 10-fold cross-validation over 10 km blocks", exact=False).count() == 1
    # ... with the skewed noise fitted on the same folds (docs/calibration.md), which its metrics score
    assert page.get_by_text("a new measurement's noise is skewed", exact=False).count() == 1
    # ... and, the Data page weighting by `tests`, the noise scaled per tests count (docs/calibration.md)
    assert page.get_by_text("the noise variance is scaled per tests count (1 / 2-4 / 5-16 / >16:",
                            exact=False).count() == 1
    # the coverage with its band by held-out block (a block split)
    coverage = page.get_by_test_id("stMetric").filter(has_text="95% coverage").first.inner_text()
    assert re.search(r"\d+\.\d% ± \d+\.\d", coverage), coverage
    screenshot(page, "train-dbk-nn.png")

    nav(page, "Maps")
    wait_grid_drawn(page)
    body = page.get_by_test_id("stMain").inner_text()
    assert "dbk-nn" in body and "nearest-neighbour residual" in body, "the run and its uncertainty note"
    assert ("Training: the DBK features were dropped" in body) == dropped, "the header says what the check decided"
    assert "atent variance is scaled by" in body, "the header says the cross-validated scale"
    assert "a new measurement's noise is skewed" in body, "and the skewed noise of a new measurement"
    assert "scaled per tests count" in body, "and the noise scale per tests count"
    seen = {click_grid(page, fx, fy) for fx, fy in ((0.5, 0.5), (0.4, 0.45))}
    assert len(seen) == 2, seen
    segment(page, "Map", "95% PI width")
    expect_legend(page, "95% prediction-interval width (log10(Mbps))")
    screenshot(page, "maps-dbk-nn.png")

    nav(page, "Decide")
    frames = page.locator('iframe[title*="ua_gridmap"]')
    frames.nth(5).wait_for(timeout=90_000)
    assert frames.count() == 6, "P(below) map, area choropleth and four plausible maps"
    no_exception(page)
    assert page.get_by_text("need the joint posterior", exact=False).count() == 0
    # county intervals: the ranked table of areas with their interval bounds
    page.get_by_role("heading", name="Areas", exact=True).wait_for()
    page.get_by_role("heading", name="Plausible maps", exact=True).wait_for()
    page.get_by_role("button", name="Suggest sites", exact=True).click()
    settle(page)
    page.get_by_text("Latent variance after the 10 measurements", exact=False).wait_for(timeout=90_000)
    no_exception(page)
    assert frames.count() == 7
    screenshot(page, "decide-dbk-nn.png")
