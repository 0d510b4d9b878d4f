"""Headless Chromium against ``streamlit run``: every control that changes what is shown, clicked like a user.

One server for the module (a temporary run store; the bundled ready runs show). The tests run in file
order and build on each other only where a user would (the svgp run trained on the Train page is then
compared and clicked). Each asserts what the page shows — selected state, legend titles and colours, run
headers, table rows, the x_ref line — never session state. Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.e2e.helpers import (
    GRIDMAP,
    choose,
    chosen,
    click_grid,
    eventually,
    expect_legend,
    legend_gradients,
    nav,
    no_exception,
    options,
    radio,
    run_headers,
    screenshot,
    segment,
    segment_selected,
    set_number,
    settle,
    wait_grid_drawn,
    widget,
    xref_text,
)
from tests.sample_files import NO_COORD_NAMES, housing_with_text

pytestmark = pytest.mark.e2e

BUNDLED = ("dbk-nn", "vecchia", "dbk-rbf", "svgp", "ppgp")


def ranking_models(page) -> list[str]:
    """The model column of the Compare page's ranking table (the first dataframe's accessible grid cells)."""
    frame = page.get_by_test_id("stDataFrame").first
    frame.locator("[role=gridcell]").first.wait_for(state="attached")
    cells = frame.locator("[role=gridcell]").all_inner_texts()
    models = ("dbk-nn", "vecchia", "dbk-rbf", "dbk-silu", "svgp", "ppgp", "softki", "cagp", "solvegp", "exact")
    return [c.split(" (")[0] for c in cells if c.split(" (")[0] in models]  # "svgp (bundled)" -> "svgp"


def test_first_open_shows_a_ready_comparison(server, page):
    page.goto(server + "/compare")
    page.get_by_role("heading", name="Compare", exact=True).wait_for(timeout=120_000)
    settle(page)
    no_exception(page)
    sidebar = page.get_by_test_id("stSidebar").inner_text()
    assert "Puerto Rico" in sidebar
    assert re.search(r"\d+ in the store, 10 on this data set", sidebar), sidebar  # 5 random + 5 spatial-block runs
    assert chosen(page, "Active run", page.get_by_test_id("stSidebar")).startswith("dbk-nn"), "the default model first"
    page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
    models = ranking_models(page)
    assert set(BUNDLED) <= set(models), models
    assert models[0] in ("dbk-nn", "vecchia"), ("the default model (or its residual alone, tied) ranks first", models)
    assert page.locator("g.trace.violins, .violinlayer path").count() >= 1, "the urban / rural violins"
    assert page.get_by_text("95% target").count() >= 1, "the coverage chart's target line"
    screenshot(page, "compare-first-open.png")


def test_maps_controls_change_what_is_shown(server, page):
    page.goto(server + "/maps")
    page.get_by_role("heading", name="Maps", exact=True).wait_for(timeout=120_000)
    settle(page)
    wait_grid_drawn(page)
    expect_legend(page, "Posterior mean of download_mbps")

    # the Map control: each option shows its map and stays selected
    segment(page, "Map", "95% PI width")
    assert segment_selected(page, "Map") == "95% PI width"
    expect_legend(page, "95% prediction-interval width (log10(Mbps))")
    radio(page, "PI width units", "original")
    expect_legend(page, "95% prediction-interval width (Mbps)")
    time.sleep(1.5)
    assert segment_selected(page, "Map") == "95% PI width", "the control does not spring back"
    assert "map=width" in page.url
    screenshot(page, "maps-width.png")
    segment(page, "Map", "Measurements")
    assert segment_selected(page, "Map") == "Measurements"
    expect_legend(page, "Measured download_mbps")
    segment(page, "Map", "Posterior mean")
    assert segment_selected(page, "Map") == "Posterior mean"

    # the colour scale recolours the legend (and the map drawn from the same palette)
    before = legend_gradients(page)[0]
    choose(page, "Colour scale", "magma")
    eventually(lambda: legend_gradients(page)[0] != before, what="the legend recoloured")

    # the one run picker, the sidebar's Active run: the map follows it and the pick stays
    sidebar = page.get_by_test_id("stSidebar")
    assert widget(page, "stSelectbox", "Run").count() == 0, "Maps has no run selector of its own"
    first = run_headers(page)[0]
    choose(page, "Active run", re.compile(r"^svgp "), sidebar)
    eventually(lambda: run_headers(page)[0].startswith("svgp"), what="the svgp run's map")
    assert run_headers(page)[0] != first
    assert chosen(page, "Active run", sidebar).startswith("svgp")
    choose(page, "Active run", re.compile(r"^ppgp"), sidebar)
    eventually(lambda: run_headers(page)[0].startswith("ppgp"), what="the ppgp run's map")
    time.sleep(1.0)
    assert chosen(page, "Active run", sidebar).startswith("ppgp"), "the sidebar's pick stays"
    assert run_headers(page)[0].startswith("ppgp"), "the map follows the sidebar and stays"

    # side by side: a second run's map beside the first, then back to one
    page.get_by_text("Second run side by side", exact=True).click()
    settle(page)
    choose(page, "Second run", re.compile(r"^dbk-rbf"))
    heads = eventually(lambda: len(run_headers(page)) == 2 and run_headers(page), what="two run maps")
    assert heads[0].startswith("ppgp") and heads[1].startswith("dbk-rbf"), heads
    page.get_by_text("Second run side by side", exact=True).click()
    settle(page)
    eventually(lambda: len(run_headers(page)) == 1, what="one run map")

    # a click sets x_ref; the kernel-slice mode changes the slice map's legend
    line = click_grid(page, 0.45, 0.5)
    assert "xref=" in page.url and line
    expect_legend(page, "Kernel slice k(·, x_ref)")
    choose(page, "Kernel slice", re.compile(r"^correlation"))
    expect_legend(page, "Kernel slice: correlation")
    assert xref_text(page) == line, "x_ref survives the mode change"
    screenshot(page, "maps-xref.png")

    # Export: the reproduce command is that of the run chosen in the sidebar
    nav(page, "Export")
    choose(page, "Active run", re.compile(r"^dbk-rbf"), sidebar)
    eventually(lambda: page.get_by_text("--model dbk-rbf").count() >= 1, what="dbk-rbf's command")
    choose(page, "Active run", re.compile(r"^svgp"), sidebar)
    eventually(lambda: page.get_by_text("--model svgp").count() >= 1, what="svgp's command")
    assert chosen(page, "Active run", sidebar).startswith("svgp")
    no_exception(page)


def test_the_first_map_view_holds_the_whole_region_at_the_maps_real_width(server, browser):
    """The grid map fits its first view to the run's region at the width it is drawn at (a narrow window's column
    is narrower than the width the page assumes): the zoom is view_for_bounds' at that width, and the region's
    padded span fits inside the map."""
    from app import layers as L

    ctx = browser.new_context(viewport={"width": 1100, "height": 1000})
    try:
        page = ctx.new_page()
        page.goto(server + "/maps")
        page.get_by_role("heading", name="Maps", exact=True).wait_for(timeout=120_000)
        settle(page)
        wait_grid_drawn(page)
        frame = page.frame_locator(GRIDMAP).first
        v = json.loads(frame.locator("body").get_attribute("data-view"))
        box = page.locator(GRIDMAP).first.bounding_box()
        assert v["fitted"] and abs(v["width"] - box["width"]) <= 2, (v, box)
        assert v["width"] < 560, ("a column narrower than the page's assumed width", v)
        ref = L.view_for_bounds(v["bounds"], width_px=v["width"], height_px=v["height"], pad=v["pad"])
        assert abs(v["zoom"] - ref["zoom"]) <= 0.011, (v, ref)
        W, S, E, N = v["bounds"]
        span_px = 512 * 2 ** v["zoom"] * (E - W) / 360
        assert span_px <= v["width"], ("the region's west-east span fits", span_px, v)
        assert span_px >= 0.8 * v["width"], ("and fills the map", span_px, v)
        screenshot(page, "maps-narrow-window.png")
    finally:
        ctx.close()


def test_every_model_form_renders_and_svgp_trains_from_the_page(server, page):
    from gpcore.models import available_models

    page.goto(server + "/train")
    page.get_by_role("heading", name="Train", exact=True).wait_for(timeout=120_000)
    settle(page)
    offered = [o.split(" — ")[0] for o in options(page, "Model")]
    assert offered == available_models()
    for name in available_models():
        choose(page, "Model", re.compile(rf"^{re.escape(name)} — "))
        no_exception(page)
        train = page.get_by_role("button", name="Train", exact=True)
        assert train.is_visible() and train.is_enabled(), f"no Train button for {name}"
        assert page.get_by_text("paper defaults").count() == 0
    choose(page, "Model", re.compile(r"^svgp — "))
    set_number(page, "epochs", 2)
    set_number(page, "Grid cell (km, 0 = auto)", 0.6)  # about 25,700 cells over Puerto Rico
    page.get_by_role("button", name="Train", exact=True).click()
    # the page reruns after the click; on a slow machine that takes more than a second
    eventually(lambda: page.get_by_role("button", name="Train", exact=True).is_disabled(), timeout=20,
               what="the Train button disabled while a job runs")
    page.get_by_text("is in the run store", exact=False).wait_for(timeout=300_000)
    settle(page)
    no_exception(page)

    nav(page, "Compare")
    page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
    models = ranking_models(page)
    assert models.count("svgp") == 2 and {"dbk-rbf", "ppgp"} <= set(models), models
    screenshot(page, "compare-after-training.png")

    # the new run is active: its >= 20,000-cell grid takes clicks anywhere
    nav(page, "Maps")
    header = page.get_by_text(re.compile(r"[\d,]+ grid cells")).first.inner_text()
    cells = int(re.search(r"([\d,]+) grid cells", header).group(1).replace(",", ""))
    assert cells >= 20_000, header
    seen = {click_grid(page, fx, fy) for fx, fy in ((0.5, 0.5), (0.35, 0.45), (0.65, 0.55))}
    assert len(seen) == 3, seen
    screenshot(page, "maps-large-grid.png")


def upload(page, name: str, data: bytes) -> None:
    page.get_by_test_id("stFileUploaderDropzoneInput").first.set_input_files(
        {"name": name, "mimeType": "text/csv", "buffer": data}
    )
    settle(page)


def test_uploads_show_their_problems_and_the_fix_is_on_the_page(server, page):
    page.goto(server)  # Data is the default page: its URL is the root
    page.get_by_role("heading", name="Data", exact=True).wait_for(timeout=120_000)
    settle(page)
    # the measurement map is at least as wide as the width its first view fits the region into
    from app.app_pages.data import MAP_WIDTH_PX

    deck = page.get_by_test_id("stDeckGlJsonChart").first
    deck.wait_for(timeout=60_000)
    assert deck.bounding_box()["width"] >= MAP_WIDTH_PX, (deck.bounding_box(), MAP_WIDTH_PX)
    radio(page, "Source", "Upload a file")

    # unrecognised coordinate names: the message names the selectors, which stay on the page
    upload(page, "no_names.csv", NO_COORD_NAMES)
    error = page.get_by_test_id("stAlertContentError").first.inner_text()
    assert "no_names.csv" in error and "Longitude column" in error and "pass lon=" not in error, error
    assert page.get_by_role("button", name="Use this data set").is_disabled()
    choose(page, "Longitude column", "px")
    choose(page, "Latitude column", "py")
    assert page.get_by_test_id("stAlertContentError").count() == 0
    eventually(lambda: chosen(page, "Target column") == "speed", what="speed as the target")
    screenshot(page, "data-coordinates-fixed.png")

    # text in the target: the column stays a target, the rows to drop are named, coordinates are never the default
    upload(page, "housing.csv", housing_with_text())
    eventually(lambda: chosen(page, "Target column") == "housing_median_age",
               what="the first number column that is not a coordinate as the default target")
    assert "median_house_value" in options(page, "Target column")
    choose(page, "Target column", "median_house_value")
    warning = page.get_by_test_id("stAlertContentWarning").first.inner_text()
    assert "3 rows of 'median_house_value' will be dropped" in warning, warning
    assert "'expensive'" in warning and "'500k+'" in warning and "101" in warning and "1501" in warning
    assert chosen(page, "Target transform") == "log10", "log10 for a positive value column"
    page.get_by_role("button", name="Use this data set").click()
    settle(page)
    page.get_by_text("Loaded housing.csv", exact=False).wait_for()
    assert "housing.csv" in page.get_by_test_id("stSidebar").inner_text()
    dropped = page.get_by_test_id("stMetric").filter(has_text="Rows dropped").first.inner_text()
    assert dropped.strip().endswith("3"), dropped
    screenshot(page, "data-text-in-target.png")
    no_exception(page)
