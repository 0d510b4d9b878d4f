"""Playwright helpers that use the dashboard as a person does: click, choose, type, upload, look.

Every helper waits for Streamlit's rerun to finish (:func:`settle`) before returning, so a test's next
assertion sees the page the user would see. Nothing here reads or writes session state.
"""

from __future__ import annotations

import re
import time

from tests.e2e.conftest import ARTIFACTS

GRIDMAP = "iframe[title='app.gridmap.ua_gridmap']"


IDLE_JS = (
    "() => { const app = document.querySelector('[data-testid=stApp]');"
    " return !!app && app.getAttribute('data-test-script-state') === 'notRunning' &&"
    " !document.querySelector('[data-testid=stStatusWidget]') &&"
    " !document.querySelector('[data-stale=true]') && !document.querySelector('[data-testid=stSkeleton]'); }"
)


def settle(page, timeout: float = 120.0) -> None:
    """Wait until the script run is over (``stApp``'s ``data-test-script-state`` is "notRunning"; the status
    widget shows "Running..." only after a delay) and nothing on the page is stale or a skeleton."""
    time.sleep(0.4)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if page.evaluate(IDLE_JS):
            break
        time.sleep(0.15)
    time.sleep(0.3)


def nav(page, name: str) -> None:
    page.get_by_test_id("stSidebarNav").get_by_text(name, exact=True).click()
    page.get_by_role("heading", name=name, exact=True).wait_for()
    settle(page)


def widget(page, testid: str, label: str, scope=None):
    """The widget container ``testid`` whose label is ``label`` (in ``scope``: the page or the sidebar)."""
    root = scope if scope is not None else page
    return root.get_by_test_id(testid).filter(
        has=page.get_by_test_id("stWidgetLabel").get_by_text(label, exact=True)
    ).first


def choose(page, label: str, option: str | re.Pattern, scope=None) -> None:
    """Open the selectbox labelled ``label`` and click the option whose text matches ``option``."""
    box = widget(page, "stSelectbox", label, scope)
    box.get_by_role("combobox").click()
    page.get_by_role("option", name=option).first.click()
    settle(page)


def chosen(page, label: str, scope=None) -> str:
    """The text the selectbox labelled ``label`` shows."""
    box = widget(page, "stSelectbox", label, scope)
    combo = box.get_by_role("combobox")
    value = combo.input_value() if combo.evaluate("e => e.tagName") == "INPUT" else ""
    return value or box.inner_text()


def options(page, label: str, scope=None, attempts: int = 4) -> list[str]:
    """The option texts of the selectbox labelled ``label`` (opens and closes it; retried when a rerun that
    was still under way closed the list before it was read)."""
    for _ in range(attempts):
        settle(page)
        box = widget(page, "stSelectbox", label, scope)
        box.get_by_role("combobox").click()
        try:
            page.get_by_role("option").first.wait_for(timeout=10_000)
            texts = page.get_by_role("option").all_inner_texts()
        except Exception:  # noqa: BLE001 - the list closed under us: try again
            texts = []
        page.keyboard.press("Escape")
        time.sleep(0.3)
        if texts:
            return texts
    return []


def segment(page, group: str, option: str) -> None:
    page.get_by_role("radiogroup", name=group).get_by_role("radio", name=option, exact=True).click()
    settle(page)


def segment_selected(page, group: str) -> str:
    radios = page.get_by_role("radiogroup", name=group).get_by_role("radio", checked=True)
    return radios.first.inner_text()


def radio(page, group: str, option: str) -> None:
    page.get_by_role("radiogroup", name=group).get_by_test_id("stRadioOption").filter(
        has_text=re.compile(rf"^{re.escape(option)}$")).first.click()
    settle(page)


def set_number(page, label: str, value) -> None:
    box = page.locator(f'input[aria-label="{label}"]')
    box.fill(str(value))
    box.press("Enter")
    settle(page)


def train_from_page(page, settings, cell_km: float, timeout_ms: int = 300_000) -> None:
    """On the Train page: set the model's number settings (``(label, value)`` pairs) and the grid cell, press
    Train and wait until the run is in the store."""
    for label, value in settings:
        set_number(page, label, value)
    set_number(page, "Grid cell (km, 0 = auto)", cell_km)
    page.get_by_role("button", name="Train", exact=True).click()
    page.get_by_text("is in the run store", exact=False).wait_for(timeout=timeout_ms)
    settle(page)


def legend_titles(page) -> list[str]:
    return page.locator(".ua-legend > div:first-child").all_inner_texts()


def eventually(check, timeout: float = 30.0, what: str = ""):
    """Poll ``check()`` until it returns a truthy value (the page after a rerun); fail after ``timeout`` s."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = check()
        except AssertionError:
            last = None
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what or check}")


def expect_legend(page, prefix: str, timeout: float = 30.0) -> None:
    """Wait until a map legend's title starts with ``prefix`` (the map drawn after a control changed)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(t.startswith(prefix) for t in legend_titles(page)):
            return
        time.sleep(0.2)
    raise AssertionError(f"no legend titled {prefix!r}; legends: {legend_titles(page)}")


def legend_gradients(page) -> list[str]:
    return [e.evaluate("e => e.style.background") for e in page.locator(".ua-legend > div:nth-child(2)").all()]


def run_headers(page) -> list[str]:
    return page.locator("[data-testid=stMainBlockContainer] h4").all_inner_texts()


def grid_maps(page):
    return page.locator(GRIDMAP)


def wait_grid_drawn(page, index: int = 0, timeout: float = 90.0) -> None:
    """Wait until the grid map's deck.gl canvas exists and its cell lookup is loaded (body[data-ready])."""
    frame = page.frame_locator(GRIDMAP).nth(index)
    frame.locator("canvas").first.wait_for(timeout=timeout * 1000)
    frame.locator("body[data-ready='1']").wait_for(timeout=timeout * 1000)


def xref_text(page) -> str:
    hits = page.get_by_text(re.compile(r"Kernel slice at x_ref = \(")).all_inner_texts()
    return hits[0] if hits else ""


def click_grid(page, fx: float = 0.5, fy: float = 0.5, timeout: float = 30.0) -> str:
    """Click the main grid map at the fraction ``(fx, fy)`` of its box; returns the new x_ref line."""
    wait_grid_drawn(page, 0)
    frame = grid_maps(page).first
    frame.scroll_into_view_if_needed()
    box = frame.bounding_box()
    before = xref_text(page)
    page.mouse.click(box["x"] + box["width"] * fx, box["y"] + box["height"] * fy)
    deadline = time.time() + timeout
    while time.time() < deadline:
        now = xref_text(page)
        if now and now != before:
            settle(page)
            return xref_text(page)
        time.sleep(0.1)
    raise AssertionError(f"the click at ({fx}, {fy}) did not set a new x_ref (still {before!r})")


def screenshot(page, name: str) -> None:
    """The whole page (Streamlit scrolls inside its main block, so grow the viewport to fit it)."""
    ARTIFACTS.mkdir(exist_ok=True)
    height = page.evaluate(
        "() => Math.max(...Array.from(document.querySelectorAll("
        "'[data-testid=stMain], [data-testid=stMainBlockContainer]')).map(e => e.scrollHeight), 900)"
    )
    size = page.viewport_size
    page.set_viewport_size({"width": size["width"], "height": min(int(height) + 80, 4000)})
    time.sleep(1.5)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)
    page.set_viewport_size(size)


def no_exception(page) -> None:
    errors = page.get_by_test_id("stException").all_inner_texts()
    assert not errors, errors
