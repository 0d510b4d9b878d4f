"""Issue 23's slider bar: how long the Maps page takes, in headless Chromium, to redraw a run's map after the quarter
slider moves, on a real grid (the bar: ≤ 1 s warm).

A space-time ``vecchia`` run (``--time-input``) is fitted by the CLI on the bundled Puerto Rico tiles of
``--quarters`` (default 2022Q1:2023Q4, eight quarters) with the default grid (about 20,000 cells per quarter, one
grid per quarter) and a short fit (``epochs=2``: the redraw does not depend on how well the model fits); the app is
served from a temporary store (``streamlit run``, as the browser tests do) and opened on that run's Maps page. The
slider then moves one quarter back at a time with the keyboard, as a user would; each move is timed until the map's
legend names the new quarter (**cold**: a quarter not shown before in this session). Then it moves forward over the
same quarters again (**warm**: shown before, the app's caches hold them). Reported: the grid's cells, and the median
/ max seconds of the cold and warm moves.

    python benchmarks/bench_slider.py               # Puerto Rico, 8 quarters (a few minutes)
    python benchmarks/bench_slider.py --smoke       # a tiny synthetic 8-quarter CSV, 5 km cells (CI)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _harness import stamp  # noqa: E402

from tests.e2e.conftest import CHROMIUM_ARGS, chromium_path, start_server, stop_server  # noqa: E402
from tests.e2e.helpers import expect_legend, nav, settle, wait_grid_drawn  # noqa: E402

RUN = "20240102-000000-000-vecchia-slider"
TARGET_WARM_S = 1.0


def fit_run(store: Path, smoke: bool, quarters: str) -> None:
    if smoke:
        from tests.gpcore.test_cli_time import write_spacetime_csv

        csv = write_spacetime_csv(store.parent / "st.csv", n=1500)
        data = ["--data", str(csv), "--cell-km", "5", "--set", "neighbors=8"]
    else:
        data = ["--data", "sample:puerto_rico", "--quarter", quarters]
    cmd = [sys.executable, "-m", "gpcore", "fit", *data, "--y", "download_mbps", "--transform", "log10", "--weight",
           "tests", "--time-input", "--model", "vecchia", "--set", "epochs=2", "--out", str(store / RUN)]
    r = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"fitting the time run failed ({' '.join(cmd)}):\n{r.stderr[-3000:]}")


def slider_value(page) -> str:
    return page.get_by_test_id("stSlider").get_by_role("slider").first.get_attribute("aria-valuetext") or ""


def move(page, key: str, times: list[float]) -> str:
    """Press ``key`` on the slider once and time the redraw until the legend names the new quarter."""
    thumb = page.get_by_test_id("stSlider").get_by_role("slider").first
    thumb.focus()
    before = slider_value(page)
    t0 = time.perf_counter()
    page.keyboard.press(key)
    deadline = time.perf_counter() + 30
    while slider_value(page) == before and time.perf_counter() < deadline:
        page.wait_for_timeout(5)
    quarter = slider_value(page)
    expect_legend(page, f"Posterior mean of download_mbps at {quarter}", timeout=60)
    times.append(time.perf_counter() - t0)
    settle(page)
    return quarter


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quarters", default="2022Q1:2023Q4", help="the Puerto Rico quarters of the run")
    ap.add_argument("--moves", type=int, default=5, help="quarters to move back (cold), then forward again (warm)")
    ap.add_argument("--out", help="also write the report here")
    ap.add_argument("--smoke", action="store_true", help="a tiny synthetic run, 2 moves (CI)")
    args = ap.parse_args(argv)
    chromium = chromium_path()
    if chromium is None:
        raise SystemExit("Chromium not found (apt-get install -y chromium, or set UA_CHROMIUM)")
    moves = 2 if args.smoke else args.moves
    import pandas as pd
    from playwright.sync_api import sync_playwright

    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "runs"
        store.mkdir()
        fit_run(store, args.smoke, args.quarters)
        grids = sorted((store / RUN / "grids").glob("*.parquet"))
        cells = len(pd.read_parquet(grids[-1], columns=["cell_id"])) if grids else 0
        proc, url = start_server(store, Path(tmp) / "streamlit.log")
        cold, warm = [], []
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"{url}/?run={RUN}")
                page.get_by_test_id("stSidebar").get_by_text("Uncertainty Atlas", exact=False).first.wait_for(
                    timeout=120_000)
                settle(page)
                nav(page, "Maps")
                wait_grid_drawn(page, 0)
                first = slider_value(page)
                seen = [first]
                for _ in range(moves):
                    seen.append(move(page, "ArrowLeft", cold))
                for _ in range(moves):
                    move(page, "ArrowRight", warm)
                browser.close()
        finally:
            stop_server(proc)
    lines = [
        stamp(time.perf_counter() - t_start), "",
        f"Run: space-time vecchia, {len(grids)} quarterly grids of {cells:,} cells; moves {' → '.join(seen)} (cold), "
        "then back (warm)", "",
        "| moves | median s | max s | target |", "|---|---|---|---|",
        f"| cold (quarter not shown before) | {statistics.median(cold):.2f} | {max(cold):.2f} | – |",
        f"| warm (shown before) | {statistics.median(warm):.2f} | {max(warm):.2f} | ≤ {TARGET_WARM_S:g} s: "
        f"{'met' if statistics.median(warm) <= TARGET_WARM_S else 'missed'} |",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
