"""Headless Chromium on a run with time as an input (issue 23 part 3): open it on Maps, move the quarter slider, pick
the Change map, click a cell for its change and P(improved).

The run is a tiny space-time ``vecchia`` fit (``--time-input``) on a synthetic 8-quarter CSV over Puerto Rico whose
speeds rise in time, served from its own store. Screenshots: ``test-artifacts/time-maps-latest.png`` (opened at the
latest quarter), ``time-maps-slider.png`` (after the slider moved), ``time-change.png`` (the Change map with a
clicked cell), ``time-change-uncertain.png`` (one quarter apart: the cells with an uncertain sign in grey).
"""

from __future__ import annotations

import re
import time

import pytest

from tests.e2e.conftest import start_server, stop_server
from tests.e2e.helpers import (
    choose,
    click_grid,
    expect_legend,
    legend_titles,
    nav,
    no_exception,
    screenshot,
    segment,
    settle,
    wait_grid_drawn,
)

pytestmark = pytest.mark.e2e

RUN = "20240102-000000-000-vecchia-st"


@pytest.fixture(scope="module")
def time_server(tmp_path_factory):
    """A server whose store holds one space-time run (2019Q1-2020Q4 grids, 5 km cells)."""
    from gpcore.cli import main
    from tests.gpcore.test_cli_time import write_spacetime_csv

    root = tmp_path_factory.mktemp("e2e-time")
    # a slow rise (0.05 log10 a year): clear over the eight quarters, not from one quarter to the next (the grey cells)
    csv = write_spacetime_csv(root / "st.csv", n=2000, trend=0.05)
    store = root / "runs"
    assert main(["fit", "--data", str(csv), "--y", "download_mbps", "--transform", "log10", "--weight", "tests",
                 "--model", "vecchia", "--time-input", "--set", "epochs=2", "--set", "neighbors=8", "--cell-km", "5",
                 "--out", str(store / RUN)]) == 0
    proc, url = start_server(store, root / "streamlit.log")
    try:
        yield url
    finally:
        stop_server(proc)


def slider_value(page) -> str:
    return page.get_by_test_id("stSlider").get_by_role("slider").first.get_attribute("aria-valuetext") or ""


def test_slider_and_change_map_in_the_browser(time_server, page):
    page.goto(f"{time_server}/?run={RUN}")
    page.get_by_test_id("stSidebar").get_by_text("Uncertainty Atlas", exact=False).first.wait_for(timeout=120_000)
    settle(page)
    nav(page, "Maps")
    wait_grid_drawn(page, 0)
    expect_legend(page, "Posterior mean of download_mbps at 2020Q4")
    assert slider_value(page) == "2020Q4"
    screenshot(page, "time-maps-latest.png")

    # move the slider five quarters back with the keyboard, as a user would
    thumb = page.get_by_test_id("stSlider").get_by_role("slider").first
    thumb.focus()
    for _ in range(5):
        page.keyboard.press("ArrowLeft")
    t0 = time.perf_counter()
    expect_legend(page, "Posterior mean of download_mbps at 2019Q3")
    redraw_s = time.perf_counter() - t0
    settle(page)
    no_exception(page)
    assert slider_value(page) == "2019Q3"
    assert "at=2019Q3" in page.url, page.url
    print(f"slider -> new legend in {redraw_s:.2f} s (a quarter not shown before)")
    wait_grid_drawn(page, 0)
    screenshot(page, "time-maps-slider.png")
    thumb.focus()  # back to a quarter already drawn (warm caches), and again forward
    page.keyboard.press("End")
    t0 = time.perf_counter()
    expect_legend(page, "Posterior mean of download_mbps at 2020Q4")
    print(f"slider -> legend of a quarter drawn before in {time.perf_counter() - t0:.2f} s")
    settle(page)
    thumb.focus()
    for _ in range(5):
        page.keyboard.press("ArrowLeft")
    expect_legend(page, "Posterior mean of download_mbps at 2019Q3")
    settle(page)

    # the Change map between the first and the last quarter
    segment(page, "Map", "Change")
    expect_legend(page, "Change of download_mbps from 2019Q1 to 2020Q4", timeout=90)
    no_exception(page)
    assert page.get_by_text(re.compile(r"sign uncertain: 0\.1 < P\(improved\) < 0\.9")).count() == 1
    assert "map=change" in page.url
    assert page.get_by_text(re.compile(r"averaged over 16 draws of the hyperparameters")).count() == 1
    line = click_grid(page, 0.45, 0.5)
    assert line.startswith("Kernel slice at x_ref")
    page.get_by_text("P(improved)", exact=True).first.wait_for(timeout=30_000)
    page.get_by_text(re.compile(r"^Change 2019Q1 → 2020Q4 at cell")).first.wait_for()
    no_exception(page)
    titles = legend_titles(page)
    assert any(t.startswith("Change of download_mbps") for t in titles), titles
    screenshot(page, "time-change.png")

    # one quarter apart the change is small: cells whose sign is uncertain turn grey
    choose(page, "From quarter", "2020Q3")
    expect_legend(page, "Change of download_mbps from 2020Q3 to 2020Q4", timeout=90)
    no_exception(page)
    assert "from=2020Q3" in page.url
    caption = page.get_by_text(re.compile(r"with an uncertain sign \(grey\)")).first.inner_text()
    uncertain = int(re.search(r"([\d,]+) with an uncertain sign", caption).group(1).replace(",", ""))
    assert uncertain > 0, caption
    wait_grid_drawn(page, 0)
    screenshot(page, "time-change-uncertain.png")


def test_decide_at_the_grid_quarter_and_another_in_the_browser(time_server, page):
    """Decide on the space-time run: at the grid's quarter its county table comes from the factor the fit stored;
    another quarter builds its own. Screenshots ``time-decide-latest.png`` and ``time-decide-2019Q3.png``."""
    page.goto(f"{time_server}/?run={RUN}")
    page.get_by_test_id("stSidebar").get_by_text("Uncertainty Atlas", exact=False).first.wait_for(timeout=120_000)
    settle(page)
    nav(page, "Decide")
    page.get_by_text("Areas at 2020Q4", exact=True).wait_for(timeout=90_000)
    settle(page)
    no_exception(page)
    assert slider_value(page) == "2020Q4"
    tables = page.get_by_test_id("stDataFrame")
    tables.first.wait_for(timeout=60_000)
    screenshot(page, "time-decide-latest.png")

    thumb = page.get_by_test_id("stSlider").get_by_role("slider").first
    thumb.focus()
    for _ in range(5):
        page.keyboard.press("ArrowLeft")
    page.get_by_text("Areas at 2019Q3", exact=True).wait_for(timeout=90_000)
    settle(page)
    no_exception(page)
    assert "at=2019Q3" in page.url, page.url
    page.get_by_text("Plausible maps at 2019Q3", exact=True).wait_for(timeout=60_000)
    screenshot(page, "time-decide-2019Q3.png")

    # one quarter on every page: Maps and Export follow Decide's slider (Maps showed 2019Q1 here before), and Export
    # writes that quarter's grid
    nav(page, "Maps")
    expect_legend(page, "Posterior mean of download_mbps at 2019Q3")
    assert slider_value(page) == "2019Q3"
    nav(page, "Export")
    page.get_by_text("The grid at 2019Q3.", exact=False).first.wait_for(timeout=60_000)
    assert slider_value(page) == "2019Q3"
    with page.expect_download() as download:
        page.get_by_role("button", name="CSV").first.click()
    assert download.value.suggested_filename == f"{RUN}-2019Q3.csv"
    no_exception(page)
    screenshot(page, "time-export-2019Q3.png")
