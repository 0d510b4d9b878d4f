"""Dashboard speed with a 50,000-cell grid (server side): click -> kernel slice, map switching, payload.

Builds a small fitted DBK-RBF run on the bundled Puerto Rico sample (paper-default rank 128 and
width 64, a few epochs) with a grid of about ``--cells`` cells in a temporary run store, then
measures, with the same functions the Maps page calls (grid maps are the grid-map component,
``app.gridmap.grid_map``, drawn by ``app.mapview.draw_grid``):

* **click -> redrawn kernel slice** (server time): ``k(grid, x_ref)`` from the cached grid
  features, the slice's palette PNG, the component arguments of both grid maps (main map + slice
  map, serialised as Streamlit serialises them) and the point's posterior; against a peer that
  recomputes the slice without the cached features (``model.kernel_slice(grid, x_ref)``, i.e.
  ``phi(grid)`` on every click);
* **switching mean <-> width**: the cached path (no image is rendered again: the PNG encoder's
  call count is reported) against a cold render;
* **payload**: the JSON arguments each grid map sends to the browser (colour image, outlines and,
  for the clickable main map, the cell lookup: index PNG + float32 cell values), split into their
  parts, and the measurements map's pydeck JSON; against a peer that sends the 50k cell polygons as
  a GeoJsonLayer with per-cell colours and tooltip fields;
* the whole Maps page rerun after a click (sent as the browser component sends it, by
  ``tests/app/conftest.py: click_grid``) and after a map switch, run by Streamlit's ``AppTest``:
  the script's own time (``ua_script_ms``, main.py start to end: sidebar, page, URL sync) and
  AppTest's wall time (which adds its thread hand-off and polling); plus the exact component
  arguments (``json_args``) of the page's grid maps.

Targets (issue #5): click <= 100 ms of server time; a switch recomputes nothing; payload < 20 MB.
The browser's side (first content, page switch, click to redrawn slice) is ``bench_browser.py``.

    python benchmarks/bench_app.py            # 50,000 cells
    python benchmarks/bench_app.py --smoke    # seconds-long smoke run (CI)
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def quiet_streamlit() -> None:
    """No "missing ScriptRunContext" / "No runtime found" warnings: the cached functions run bare here."""
    import streamlit.logger

    streamlit.logger.set_log_level("error")
    logging.getLogger("streamlit").setLevel(logging.ERROR)


def cell_km_for(state: str, cells: int) -> float:
    """Square-cell size (km) giving about ``cells`` cells over a bundled state."""
    import geopandas as gpd

    from gpcore import data as D

    gs = gpd.GeoSeries([D.state_boundary(state)], crs="EPSG:4326")
    area_km2 = float(gs.to_crs(gs.estimate_utm_crs()).area.iloc[0]) / 1e6
    return math.sqrt(area_km2 / cells)  # cells touching the coast are kept too: a few % more cells


def build_run(store: Path, cells: int, epochs: int) -> Path:
    from app.state import DatasetSpec
    from gpcore.run.pipeline import execute_run

    spec = DatasetSpec()
    cfg = spec.run_config(model="dbk-rbf", settings={"epochs": epochs, "rank": 128, "hidden": 64},
                          grid_cell_km=round(cell_km_for("PR", cells), 4), label="bench")
    return execute_run(cfg, store / "20250101-000000-000-bench")


def ms(seconds: float) -> float:
    return round(1000 * seconds, 2)


def timeit(fn, repeats: int):
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def summary(times) -> dict:
    return {"median_ms": ms(statistics.median(times)), "p90_ms": ms(sorted(times)[math.ceil(0.9 * (len(times) - 1))]),
            "n": len(times)}


def naive_geojson_payload(run, scale) -> tuple[int, float]:
    """Peer payload: every cell polygon with its colour and tooltip fields in a GeoJsonLayer."""
    import geopandas as gpd
    import pydeck as pdk

    cells = gpd.read_parquet(run.path / "grid_cells.parquet")
    g = cells.merge(run.grid, on="cell_id")
    rgb = scale.rgb(g["mean_t"].to_numpy())
    g["r"], g["gr"], g["b"] = rgb[:, 0], rgb[:, 1], rgb[:, 2]
    t0 = time.perf_counter()
    gj = json.loads(g[["cell_id", "mean", "lower", "upper", "width", "r", "gr", "b", "geometry"]].to_json())
    layer = pdk.Layer("GeoJsonLayer", data=gj, id="cells", get_fill_color="[properties.r, properties.gr, properties.b]",
                      pickable=True)
    text = pdk.Deck(layers=[layer], map_provider=None).to_json()
    return len(text.encode()), time.perf_counter() - t0


class ComponentArgs:
    """Stands in for the grid-map component (``app.gridmap._component``): keeps the arguments of each call.

    ``nbytes`` of a call is the size of the JSON Streamlit sends for it (``json.dumps`` of the keyword
    arguments plus ``default`` and ``key``; ``on_change`` is not sent), as in
    ``streamlit.components.v1.custom_component``.
    """

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(self, *, key=None, default=None, on_change=None, **kwargs):
        self.calls.append(dict(kwargs, default=default, key=key))
        return None

    def last_json(self) -> str:
        return json.dumps(self.calls[-1])


def args_parts_mb(args: dict) -> dict:
    """Size of a grid map's arguments by part (MB): colour image, outlines, cell lookup, the rest."""
    total = len(json.dumps(args))
    parts = {"image": len(json.dumps(args.get("image"))), "outlines": len(json.dumps(args.get("outlines"))),
             "lookup": len(json.dumps(args.get("lookup")))}
    parts["other"] = total - sum(parts.values())
    return {"total": round(total / 1e6, 3), **{k: round(v / 1e6, 3) for k, v in parts.items()}}


def micro(run_dir: Path, repeats: int) -> dict:
    """The Maps page's per-click and per-switch work, with its own cached functions."""
    from app import cache, gridmap, mapview
    from app import raster as R
    from app.colors import robust_limits
    from app.mapview import slice_scale
    from app.state import DatasetSpec

    key = (str(run_dir), (run_dir / "run.json").stat().st_mtime)
    res: dict = {}
    t0 = time.perf_counter()
    run = cache.st_run_data(*key)
    res["cells"] = len(run.grid)
    res["cold_run_data_ms"] = ms(time.perf_counter() - t0)
    t0 = time.perf_counter()
    kc = cache.st_kernel(*key)
    res["cold_kernel_features_ms"] = ms(time.perf_counter() - t0)
    t0 = time.perf_counter()
    raster = cache.st_raster(*key)
    res["cold_raster_index_ms"] = ms(time.perf_counter() - t0)
    res["raster_px"] = f"{raster.width}x{raster.height}"
    t0 = time.perf_counter()
    cache.st_grid_lookup(*key)
    res["cold_grid_lookup_ms"] = ms(time.perf_counter() - t0)

    region_json = cache.st_region_outline("PR", None)[0]
    outlines = mapview.outline_specs(region_json, None)
    model = cache.st_model(*key)
    Xg = run.grid[["lon", "lat"]].to_numpy()
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(Xg), size=repeats)

    recorder = ComponentArgs()
    real_component = gridmap._component
    gridmap._component = recorder

    def main_map(kind: str) -> str:
        """The clickable main map as the Maps page draws it; returns the JSON its component call sends."""
        col, scale, _ = mapview.grid_scale(run, kind, "viridis")
        img = cache.st_grid_image(*key, col, scale.name, scale.lo, scale.hi)
        mapview.draw_grid(run, key, img, widget_key="pick", clickable=True, outlines=outlines)
        return recorder.last_json()

    def slice_map(values, xref) -> str:
        img = cache.slice_image(*key, values, slice_scale(values, "kernel"))
        mapview.draw_grid(run, key, img, widget_key="slice", clickable=False, outlines=outlines, xref=xref)
        return recorder.last_json()

    try:
        # cold render of both maps, then the switch (cache hits only)
        calls = {"png": 0}
        orig_png = R.palette_png

        def counting_png(*a, **k):
            calls["png"] += 1
            return orig_png(*a, **k)

        R.palette_png = counting_png
        t0 = time.perf_counter()
        main_map("mean")
        mean_args = recorder.calls[-1]
        res["cold_mean_map_ms"] = ms(time.perf_counter() - t0)
        t0 = time.perf_counter()
        main_map("width")
        res["cold_width_map_ms"] = ms(time.perf_counter() - t0)
        before = calls["png"]
        switch = timeit(lambda: (main_map("mean"), main_map("width")), repeats)
        res["switch_mean_width"] = {**summary([t / 2 for t in switch]), "images_rendered": calls["png"] - before}
        R.palette_png = orig_png

        def click(i: int, cached: bool):
            xref = (float(Xg[i, 0]), float(Xg[i, 1]))
            values = kc.slice(np.asarray(xref), "kernel") if cached else model.kernel_slice(Xg, np.asarray(xref))
            slice_map(values, xref)
            main_map("mean")
            pred = model.predict(np.asarray(xref)[None, :])
            pred.interval(0.95)

        click(int(picks[0]), True)  # warm-up
        slice_args = recorder.calls[-2]
        parts = {"slice": [], "image": [], "component_args": [], "posterior": []}
        for i in picks:
            xref = (float(Xg[i, 0]), float(Xg[i, 1]))
            t0 = time.perf_counter()
            values = kc.slice(np.asarray(xref), "kernel")
            t1 = time.perf_counter()
            img = cache.slice_image(*key, values, slice_scale(values, "kernel"))
            t2 = time.perf_counter()
            mapview.draw_grid(run, key, img, widget_key="slice", clickable=False, outlines=outlines, xref=xref)
            recorder.last_json()
            main_map("mean")
            t3 = time.perf_counter()
            model.predict(np.asarray(xref)[None, :]).interval(0.95)
            t4 = time.perf_counter()
            parts["slice"].append(t1 - t0)
            parts["image"].append(t2 - t1)
            parts["component_args"].append(t3 - t2)
            parts["posterior"].append(t4 - t3)
        res["click_parts_median_ms"] = {k: ms(statistics.median(v)) for k, v in parts.items()}
        res["click_cached"] = summary([timeit(lambda i=i: click(int(i), True), 1)[0] for i in picks])
        peer_n = max(3, repeats // 4)
        peer = [timeit(lambda i=i: click(int(i), False), 1)[0] for i in picks[:peer_n]]
        res["click_peer_no_feature_cache"] = summary(peer)
        ratio = res["click_peer_no_feature_cache"]["median_ms"] / res["click_cached"]["median_ms"]
        res["click_speedup_vs_peer"] = round(ratio, 1)
    finally:
        gridmap._component = real_component
        R.palette_png = orig_png

    data = cache.st_load_dataset(DatasetSpec())
    pscale, _ = mapview.measurement_scale(data, "viridis")
    pdeck = mapview.points_deck(data, pscale, mapview.outline_layers(region_json, None))
    lo, hi = robust_limits(run.grid["mean_t"].to_numpy())
    from app.colors import ColorScale

    naive_bytes, naive_s = naive_geojson_payload(run, ColorScale("viridis", lo, hi))
    res["payload_mb"] = {
        "main_map": args_parts_mb(mean_args),
        "slice_map": args_parts_mb(slice_args),
        "measurements_map": round(pdeck.nbytes / 1e6, 2),
        "peer_geojson_polygons": round(naive_bytes / 1e6, 2),
    }
    res["peer_geojson_serialise_ms"] = ms(naive_s)
    return res


def apptest(store: Path, run_id: str, repeats: int) -> dict:
    """Whole Maps-page reruns (server side) after a click and after a map switch, and the maps' real payload."""
    import pandas as pd
    import streamlit.testing.v1.app_test as app_test_module
    from streamlit.runtime.scriptrunner.script_cache import ScriptCache
    from streamlit.testing.v1 import AppTest

    from tests.app.conftest import click_grid, gridmaps, open_page

    # A running server compiles each page once (its ScriptCache lives as long as the server);
    # AppTest makes a new cache per run. Share one, so the timing is the server's per-rerun work.
    shared = ScriptCache()
    app_test_module.ScriptCache = lambda: shared
    os.environ["UA_RUN_STORE"] = str(store)
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=600)
    at.query_params["run"] = run_id
    at.run()
    open_page(at, "maps").run()
    grid = pd.read_parquet(store / run_id / "grid.parquet")
    rng = np.random.default_rng(1)
    pick_key = f"pick_{run_id}"

    def pick(i: int):
        lon, lat = float(grid.lon.iloc[i]), float(grid.lat.iloc[i])
        t0 = time.perf_counter()
        click_grid(at, pick_key, i, lon, lat)
        dt = time.perf_counter() - t0
        assert not at.exception, [e.value for e in at.exception]
        text = f"**Kernel slice at x_ref** = ({round(lon, 5):.5f}, {round(lat, 5):.5f})"
        assert any(m.value.startswith(text) for m in at.markdown), f"no {text!r} after the click on row {i}"
        return dt, at.session_state["ua_script_ms"] / 1000

    pick(int(rng.integers(len(grid))))  # warm: features, raster, cell lookup
    clicks = [pick(int(rng.integers(len(grid)))) for _ in range(repeats)]
    maps = gridmaps(at)
    sent = {k: round(len(json.dumps({n: v for n, v in a.items() if n != "_id"})) / 1e6, 3) for k, a in maps.items()}
    switches = []
    for k in range(repeats + 1):
        t0 = time.perf_counter()
        at.segmented_control(key="w_map_kind").set_value("width" if k % 2 == 0 else "mean").run()
        switches.append((time.perf_counter() - t0, at.session_state["ua_script_ms"] / 1000))
        assert not at.exception, [e.value for e in at.exception]
    switches = switches[2:] or switches  # the first visit of each map renders its image once
    return {
        "click_rerun_script": summary([s for _, s in clicks]),
        "click_rerun_apptest_wall": summary([w for w, _ in clicks]),
        "switch_rerun_script": summary([s for _, s in switches]),
        "switch_rerun_apptest_wall": summary([w for w, _ in switches]),
        "apptest_component_args_mb": sent,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", type=int, default=50_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--smoke", action="store_true", help="tiny grid, few repeats (seconds)")
    parser.add_argument("--no-apptest", action="store_true", help="skip the whole-page AppTest timing")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.smoke:
        args.cells, args.epochs, args.repeats = 1500, 1, 3
    quiet_streamlit()
    import torch

    threads = int(os.environ.get("UA_TORCH_THREADS", "1"))
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "runs"
        os.environ["UA_RUN_STORE"] = str(store)
        t0 = time.perf_counter()
        run_dir = build_run(store, args.cells, args.epochs)
        results = {"setup_run_s": round(time.perf_counter() - t0, 1), "torch_threads": threads,
                   "cpu_count": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)}
        results.update(micro(run_dir, args.repeats))
        if not args.no_apptest:
            results.update(apptest(store, run_dir.name, max(3, args.repeats // 3)))
    click_ms = results.get("click_rerun_script", results["click_cached"])["median_ms"]
    pay = results["payload_mb"]
    results["targets"] = {
        "click_le_100ms": click_ms <= 100,
        "switch_recomputes_nothing": results["switch_mean_width"]["images_rendered"] == 0,
        "payload_lt_20mb": max(pay["main_map"]["total"], pay["slice_map"]["total"], pay["measurements_map"]) < 20,
    }
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
