"""Headless Chromium: a person who uses only the browser trains a run with time as an input (issue 23) — upload an
8-quarter file, turn "Time as an input" on, pick the forecast split, train, and find the quarter slider on Maps.

The file is the synthetic 2019Q1-2020Q4 CSV over Puerto Rico (speeds rising in time); the server has its own empty
store. Screenshots: ``test-artifacts/train-time-forecast.png`` (the Train page with time on and the forecast split),
``train-time-error.png`` (a test period with nothing before it: the message and the disabled Train button),
``train-time-finished.png`` (the finished run) and ``train-time-maps.png`` (its Maps page with the quarter slider).
"""

from __future__ import annotations

import re

import pytest

from tests.e2e.conftest import start_server, stop_server
from tests.e2e.helpers import (
    choose,
    chosen,
    expect_legend,
    nav,
    no_exception,
    radio,
    screenshot,
    settle,
    train_from_page,
    wait_grid_drawn,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def train_time_server(tmp_path_factory):
    """A server with an empty run store (the bundled runs still show) and the 8-quarter CSV to upload."""
    from tests.gpcore.test_cli_time import write_spacetime_csv

    root = tmp_path_factory.mktemp("e2e-train-time")
    csv = write_spacetime_csv(root / "st.csv", n=800)
    proc, url = start_server(root / "runs", root / "streamlit.log")
    try:
        yield url, csv.read_bytes()
    finally:
        stop_server(proc)


def test_train_a_forecast_run_with_time_and_see_its_slider(train_time_server, page):
    url, data = train_time_server
    page.goto(url)
    page.get_by_role("heading", name="Data", exact=True).wait_for(timeout=120_000)
    settle(page)
    radio(page, "Source", "Upload a file")
    page.get_by_test_id("stFileUploaderDropzoneInput").first.set_input_files(
        {"name": "st.csv", "mimeType": "text/csv", "buffer": data})
    settle(page)
    page.get_by_role("button", name="Use this data set").click()
    page.get_by_text("Loaded st.csv", exact=False).wait_for(timeout=60_000)
    settle(page)

    nav(page, "Train")
    choose(page, "Model", re.compile(r"^vecchia — "))
    assert page.get_by_text("First quarter", exact=True).count() == 0, "time is off until the toggle is on"
    page.get_by_text("Time as an input", exact=True).click()
    settle(page)
    assert (chosen(page, "First quarter"), chosen(page, "Last quarter")) == ("2019Q1", "2020Q4")
    assert chosen(page, "Space-time covariance").startswith("separable")
    choose(page, "Split (8:1:1)", "forecast (later quarters)")
    assert (chosen(page, "Test from"), chosen(page, "Test to")) == ("2020Q1", "2020Q4"), "the last 4 quarters"
    page.get_by_text("Forecast: tested on 2020Q1–2020Q4", exact=False).wait_for()
    no_exception(page)
    screenshot(page, "train-time-forecast.png")

    # a test period with no quarter before it: the message names the controls, Train waits for the fix
    choose(page, "Test from", "2019Q1")
    error = page.get_by_test_id("stAlertContentError").first.inner_text()
    assert "Nothing is left to train on" in error and "Test from" in error and "First quarter" in error, error
    assert page.get_by_role("button", name="Train", exact=True).is_disabled()
    screenshot(page, "train-time-error.png")
    choose(page, "Test from", "2020Q1")
    assert page.get_by_test_id("stAlertContentError").count() == 0

    train_from_page(page, [("epochs", 2), ("neighbors", 8)], cell_km=5.0, timeout_ms=240_000)
    no_exception(page)
    screenshot(page, "train-time-finished.png")

    nav(page, "Maps")  # the new run is the active run: the quarter slider at its latest quarter
    wait_grid_drawn(page, 0)
    expect_legend(page, "Posterior mean of download_mbps at 2020Q4")
    slider = page.get_by_test_id("stSlider").filter(has_text="Quarter").get_by_role("slider").first
    assert slider.get_attribute("aria-valuetext") == "2020Q4"
    no_exception(page)
    screenshot(page, "train-time-maps.png")
