"""Maps: posterior mean, 95 % PI width and measurements for a run; click a cell for its kernel slice.

Grid maps are the grid-map component (:mod:`app.gridmap`): a colour bitmap drawn by deck.gl with
nothing pickable; a click anywhere on a cell returns that cell (read from the grid's pixel -> cell
index, not by GPU picking), and its centre becomes the reference point ``x_ref`` (kept in the session
and the URL, so it survives recolouring and switching maps). The kernel slice ``k(grid, x_ref)`` is
one matrix-vector product with the grid's cached features.

A run with time as an input (``fit --time-input``) gets a quarter slider that every map kind follows and a
"Change" map kind between two quarters (:mod:`app.timeview`); the kernel slice is then at ``(x_ref, t_ref)``.
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from app import cache, decide_cache, gridmap, mapview, state, timeview, uploads
from app.colors import SCALES, format_number, legend_html
from app.modelinfo import noise_text, training_note, uncertainty_note
from app.safe_html import md_text
from gpcore.errors import GPCoreError

MAP_LABELS = {"mean": "Posterior mean", "width": "95% PI width", "data": "Measurements",
              "exceed": "Exceedance",  # P(below or above the Decide page's threshold) per cell
              "change": "Change"}  # a run with time as an input: the change between two quarters
SLICE_MODES = {
    "kernel": "kernel k(x, x_ref)",
    "correlation": "correlation k / sqrt(k(x,x) k(x_ref,x_ref))",
    "max": "kernel / max |k| over the grid",
}
MAP_SCALES = [s for s in SCALES if s not in ("rdbu", "puor")]


def on_pick(widget_key: str, key: tuple[str, float]) -> None:
    """Click callback of a grid map: the clicked cell's centre becomes ``x_ref`` (kept in the session and URL)."""
    cell = gridmap.picked_cell(st.session_state.get(widget_key))
    if cell is None:
        return
    grid = cache.st_run_data(*key).grid
    if cell >= len(grid):
        return
    state.update(xref=(round(float(grid["lon"].iloc[cell]), 5), round(float(grid["lat"].iloc[cell]), 5)))


def controls(runs, quarters: list[str]) -> state.ViewState:
    """The map controls (the run comes from the sidebar's picker; ``quarters``: the active run's grid quarters
    when it has time as an input, which adds the quarter slider and the Change map); returns the view state."""
    ids = [r.run_id for r in runs]
    titles = cache.run_titles(runs)
    kinds = [k for k in MAP_LABELS if k != "change" or len(quarters) > 1]
    if state.view().map not in kinds:
        state.update(map="mean")
    state.control(st.segmented_control, "Map", kinds, format_func=MAP_LABELS.get, name="map",
                  valid=kinds.__contains__)
    if quarters:
        c = st.columns([3, 2])
        with c[0]:
            timeview.quarter_slider(quarters)
        if state.view().map == "change":
            with c[1]:
                timeview.change_controls(quarters)
    c = st.columns([2, 3, 2, 2])
    with c[0]:
        state.control(st.selectbox, "Colour scale", MAP_SCALES, name="scale", valid=MAP_SCALES.__contains__)
    with c[1]:
        state.control(st.selectbox, "Kernel slice", list(SLICE_MODES), format_func=SLICE_MODES.get, name="slice_mode")
    with c[2]:
        state.control(st.radio, "PI width units", ["model", "original"], horizontal=True, name="width_units",
                      format_func=lambda u: {"model": "model space", "original": "original"}[u])
    with c[3]:
        state.control(st.checkbox, "Strata outlines", name="strata_outline")
        state.control(st.checkbox, "Basemap (needs network)", name="basemap",
                      help="Off by default: with no network the map has no tiles; outlines are drawn locally.")
    c = st.columns([5, 2, 2])
    with c[0]:
        side = state.control(st.toggle, "Second run side by side", name="side")
        others = [i for i in ids if i != state.view().run]
        if side and others:
            state.control(st.selectbox, "Second run", others, format_func=titles.get, name="run2",
                          valid=others.__contains__)
        else:
            if side:
                st.caption("Train another run to compare two maps.")
            state.update(run2=None)
    with c[1]:
        state.control(st.checkbox, "Same colour scale for both runs", name="shared_scale",
                      disabled=not state.view().run2)
    with c[2]:
        if state.view().xref is not None and st.button("Clear x_ref", key="w_clear_xref"):
            state.update(xref=None)
            st.rerun()
    return state.view()


def run_info(info, quarter: str | None = None) -> tuple[cache.RunData, tuple[str, float]]:
    """A run's data (its grid at ``quarter`` for a run with time as an input) and its cache key."""
    key = cache.run_key(info)
    return cache.st_run_data(*key, quarter), key


def outline_parts(run: cache.RunData, with_strata: bool):
    """``(region GeoJSON, strata outlines)`` of a run: its state, else the hull of its grid."""
    cfg = run.config
    state_code = run.manifest.get("data", {}).get("state")
    if state_code:
        region_json, _ = cache.st_region_outline(state_code, None)
    else:
        region_json, _ = cache.st_region_outline(None, f"grid:{run.path}", _frame=run.grid)
    strata = cache.st_strata_outlines(cfg.get("strata"), state_code) if with_strata else []
    return region_json, strata


def outlines_for(run: cache.RunData, with_strata: bool) -> list[dict]:
    """Outline layers for the pydeck measurement map."""
    return mapview.outline_layers(*outline_parts(run, with_strata))


def spec_of_run(run: cache.RunData) -> state.DatasetSpec | None:
    """The data set a run was trained on, as a :class:`DatasetSpec` (None if its file is gone)."""
    from pathlib import Path

    cfg = run.config
    data = cfg.get("data", "")
    if data.startswith(state.SAMPLE_PREFIX):
        source = data
    else:
        p = Path(data)
        source = uploads.reference_of(p) or f"file:{p}"
        if not p.is_file():
            return None
    x = cfg.get("x") or [None, None]
    quarter = cfg.get("quarter")
    if cfg.get("time_input") and run.quarters:  # every quarter of the run (the test period too)
        quarter = f"{run.quarters[0]}:{run.quarters[-1]}"
    strata = cfg.get("strata")
    if strata and strata.startswith("polygons:") and not strata.startswith(("polygons:upload:", "polygons:file:")):
        strata = "polygons:file:" + strata[len("polygons:") :]  # a layer the run (e.g. the CLI) named by path
    return state.DatasetSpec(
        source=source, quarter=quarter, y=cfg.get("y"), transform=cfg.get("transform", "identity"),
        lon=x[0], lat=x[1], weight=cfg.get("weight"), time=cfg.get("time"), strata=strata,
    )


def main_map(run: cache.RunData, key, v: state.ViewState, limits, data, width_px: int) -> None:
    if v.map == "data":
        data_map(run, v, data, width_px)
    else:
        grid_map(run, key, v, limits, width_px)


def grid_map(run: cache.RunData, key, v: state.ViewState, limits, width_px: int = 560) -> None:
    kind = v.map
    widget_key = f"pick_{run.run_id}"
    if kind == "change":
        if len(run.quarters) < 2:
            st.info("The Change map needs a run fitted with time as an input over several quarters "
                    "(python -m gpcore fit ... --time-input).")
            return
        timeview.change_map(run, key, v.change_from, v.change_to, widget_key=widget_key,
                            outlines=mapview.outline_specs(*outline_parts(run, v.strata_outline)), basemap=v.basemap,
                            width_px=width_px, on_change=lambda: on_pick(widget_key, key))
        return
    if kind == "exceed":  # P(below the Decide page's threshold), from the run's stored marginals
        from app.colors import ColorScale

        t = mapview.threshold_of(run, v.threshold)
        scale = ColorScale("rdbu", 0.0, 1.0)
        image = cache.slice_image(*key, decide_cache.st_exceedance(*key, t, "original", "below", run.quarter), scale)
        title = f"{mapview.exceed_title(run, t)} (threshold set on the Decide page)"
    else:
        col, scale, title = mapview.grid_scale(run, kind, v.scale, v.width_units, limits)
        image = cache.st_grid_image(*key, col, scale.name, scale.lo, scale.hi, quarter=run.quarter)
    # The main map shows no x_ref marker: its arguments then stay the same across clicks (the slice map
    # carries the marker).
    mapview.draw_grid(run, key, image, widget_key=widget_key, clickable=True,
                      outlines=mapview.outline_specs(*outline_parts(run, v.strata_outline)), basemap=v.basemap,
                      width_px=width_px, on_change=lambda: on_pick(widget_key, key))
    st.html(legend_html(scale, title))


def data_map(run: cache.RunData, v: state.ViewState, active: cache.LoadedData, width_px: int = 560) -> None:
    """The measurements the run was trained on (else the active data set ``active``, with a warning)."""
    spec = spec_of_run(run)
    data = active
    if spec is None:
        st.warning("The data this run was trained on is not available here; showing the active data set.")
    else:
        try:
            data = cache.st_load_dataset(spec)
        except GPCoreError as exc:
            st.warning(f"The run's data could not be read ({md_text(exc)}); showing the active data set.")
    scale, title = mapview.measurement_scale(data, v.scale)  # one scale for every quarter of a time run
    data, data_key = timeview.data_at_quarter(data, run.quarter if run.quarters else None)
    if run.quarters:
        title += f" in {run.quarter} ({data.n:,} rows)"
    deck = mapview.points_deck(data, scale, outlines_for(run, v.strata_outline), basemap=v.basemap,
                               bounds=run.bounds, width_px=width_px, data_key=data_key)
    st.pydeck_chart(deck, height=deck.map_height, key=f"data_{run.run_id}")
    st.html(legend_html(scale, title))
    if cache.map_sample_note(data.n):
        st.caption(cache.map_sample_note(data.n))
    st.caption("Click a cell on the mean or width map to choose the kernel-slice reference point.")


def kernel_panel(run: cache.RunData, key, v: state.ViewState, slice_control: bool = True) -> None:
    """Kernel slice map around ``x_ref`` and the point's posterior mean and 95 % interval."""
    xref = v.xref
    if xref is None:
        st.info("Click a grid cell on the map (mean, width, exceedance or change) to show the kernel slice "
                "k(·, x_ref) there.")
        return
    i = run.nearest_cell(*xref)
    cell_id = run.grid["cell_id"].iloc[i]
    shown = timeview.slice_quarter(run, slice_control)  # time run: the slice at (x_ref, t_ref) at this quarter
    kc = cache.st_kernel(*key, t=run.t if shown == run.quarter else cache.st_run_data(*key, shown).t)
    x_ref = timeview.point_inputs(xref, run.t)
    values = kc.slice(x_ref, v.slice_mode)
    top = float(kc.model.kernel_diag(x_ref[None, :])[0]) if run.quarters else None  # decay in time shows
    scale = mapview.slice_scale(values, v.slice_mode, top)
    if v.slice_mode == "kernel":
        title = f"Kernel slice k(·, x_ref) in ({run.t_units})²"
    else:
        title = "Kernel slice: " + SLICE_MODES[v.slice_mode]
    if run.quarters:
        title += f"; x_ref at {run.quarter}, map at {shown}"
    image = cache.slice_image(*key, values, scale)
    st.markdown(f"**Kernel slice at x_ref** = ({xref[0]:.5f}, {xref[1]:.5f}), cell `{cell_id}`")
    mapview.draw_grid(run, key, image, widget_key=f"slice_{run.run_id}", clickable=False,
                      outlines=mapview.outline_specs(*outline_parts(run, v.strata_outline)), xref=xref,
                      basemap=v.basemap, width_px=560)
    st.html(legend_html(scale, title))
    point_summary(run, key, xref)


def point_summary(run: cache.RunData, key, xref) -> None:
    model = cache.st_model(*key)
    pred = model.predict(timeview.point_inputs(xref, run.t)[None, :])
    lo_t, hi_t = pred.interval(0.95)
    tr = run.transform
    mean, lo, hi = (float(tr.inverse(v)[0]) for v in (pred.mean, lo_t, hi_t))
    u = f" {run.units}" if run.units else ""
    c = st.columns([2, 3])
    c[0].metric("Posterior mean at x_ref", f"{format_number(mean)}{u}",
                help="Back-transformed: the predictive median for a log target.")
    c[1].metric("95% interval", f"[{format_number(lo)}, {format_number(hi)}]{u}",
                help=f"Width {format_number(hi - lo)}{u}; in model space {float(hi_t[0] - lo_t[0]):.3f} {run.t_units}")
    st.caption(
        f"x_ref posterior{mapview.at_quarter(run)}: mean {format_number(mean)}{u}, "
        f"95% interval [{format_number(lo)}, {format_number(hi)}]{u}"
        f" (model space {float(pred.mean[0]):.3f} ± {float(hi_t[0] - pred.mean[0]):.3f} {run.t_units})."
    )


def run_header(run: cache.RunData) -> None:
    st.markdown(f"#### {md_text(run.title())}")
    bits = [f"model `{run.model}`", noise_text(run.manifest, run.t_units), f"{len(run.grid):,} grid cells"]
    st.caption(" · ".join(b for b in bits if b))
    note = uncertainty_note(run.model)
    if note:
        st.caption(f"Uncertainty: {note}")
    decided = training_note(run.manifest)
    if decided:
        st.caption(f"Training: {decided}")


def shared_limits(runs: list[cache.RunData], kind: str, width_units: str):
    if len(runs) < 2 or kind in ("data", "exceed", "change"):
        return None
    from app.colors import robust_limits

    col = mapview.grid_scale(runs[0], kind, "viridis", width_units)[0]
    values = np.concatenate([r.grid[col].to_numpy() for r in runs])
    return robust_limits(values)


def render(data: cache.LoadedData, runs: list) -> None:
    """The Maps page of the active run (the sidebar's picker) and, side by side, an optional second run."""
    st.title("Maps")
    runs = cache.runs_with_grid(runs)
    if not runs:
        st.info("No run with a prediction grid yet: train one on the Train page.")
        return
    by_id = {r.run_id: r for r in runs}
    active = by_id.get(state.view().run, runs[0])
    v = controls(runs, timeview.run_quarters(active.manifest))
    chosen = [by_id[v.run]] if v.run in by_id else [runs[0]]
    if v.run not in by_id:
        title = cache.run_titles(chosen)[runs[0].run_id]
        st.caption(f"The active run has no prediction grid: showing {md_text(title)}.")
    if v.run2 in by_id:
        chosen.append(by_id[v.run2])
    loaded = [run_info(r, timeview.quarter_of(r, v.at)) for r in chosen]
    limits = shared_limits([r for r, _ in loaded], v.map, v.width_units) if v.shared_scale else None
    if len(loaded) == 1:
        run, key = loaded[0]
        run_header(run)
        left, right = st.columns(2, gap="medium")
        with left:
            main_map(run, key, v, limits, data, width_px=560)
        with right:
            if v.map == "change" and len(run.quarters) > 1:
                timeview.change_panel(run, key, v.change_from, v.change_to, v.xref)
            kernel_panel(run, key, v)
    else:
        cols = st.columns(2, gap="medium")
        for i, ((run, key), col) in enumerate(zip(loaded, cols, strict=True)):
            with col:
                run_header(run)
                main_map(run, key, v, limits, data, width_px=560)
                if v.map == "change" and len(run.quarters) > 1:
                    timeview.change_panel(run, key, v.change_from, v.change_to, v.xref)
                kernel_panel(run, key, v, slice_control=i == 0)
