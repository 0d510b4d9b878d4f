"""Decide: what the joint posterior says about thresholds, areas, plausible maps and where to measure next.

Everything comes from :mod:`gpcore.decide` over the run's stored grid and model (nothing is retrained):

* a threshold (35 Mbps for mobile download — the FCC's 5G-NR mobile benchmark since 2024 — 100 Mbps for
  fixed, any value and direction otherwise) -> ``P(below)`` per cell on a diverging palette centred at 0.5;
* the areas (bundled counties of the run's state, or its strata) as a choropleth of ``P(area mean below)``
  with a ranked table; a click on an area shows its posterior; GeoJSON / CSV export;
* four plausible maps (joint samples) on one colour scale, re-drawable with another seed;
* where to measure next: ``k`` numbered sites with their expected variance reduction and the map of the
  latent variance after those measurements; CSV / GeoJSON export.

A run with time as an input is decided at one quarter: the Maps page's quarter slider (view state ``at``) is drawn
here too, and every section evaluates the model at that quarter's decimal year (``gpcore.run.decisions``'s ``t``).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import streamlit as st

from app import cache, decide_cache, gridmap, mapview, state, timeview
from app.colors import ColorScale, format_number, legend_html, robust_limits
from app.safe_html import md_text
from gpcore.data.export import spreadsheet_safe
from gpcore.errors import GPCoreError

DIRECTIONS = {"below": "below", "above": "above"}
TARGETS = {"all": "the whole region", "undecided": "undecided cells (0.2 < P < 0.8)"}


def on_area_pick(widget_key: str, labels: np.ndarray) -> None:
    """Click on the choropleth: the clicked cell's area becomes the one whose posterior is shown."""
    cell = gridmap.picked_cell(st.session_state.get(widget_key))
    if cell is not None and cell < len(labels) and labels[cell] is not None:
        state.update(decide_area=str(labels[cell]))


def request_suggestions() -> None:
    """Button callback: remember the settings the suggestions are computed for."""
    ss = st.session_state
    k, target, min_km = (ss[state.widget_key(n)] for n in ("sites_k", "sites_target", "sites_min_km"))
    state.update(decide_request=(int(k), target, float(min_km)))


def redraw_samples() -> None:
    state.update(sample_seed=int(state.view().sample_seed) + 1)


def grid_image(key, values: np.ndarray, scale: ColorScale) -> str:
    return cache.slice_image(*key, values, scale)


def draw(run, key, values, scale, title, widget_key, *, width_px=560, clickable=False, on_change=None,
         labels=None, hint=""):
    outlines = mapview.outline_specs(*_outlines(run))
    mapview.draw_grid(run, key, grid_image(key, values, scale), widget_key=widget_key, clickable=clickable,
                      outlines=outlines, width_px=width_px, on_change=on_change, labels=labels, hint=hint)
    st.html(legend_html(scale, title))


def _outlines(run):
    state_code = run.manifest.get("data", {}).get("state")
    if state_code:
        return cache.st_region_outline(state_code, None)[0], []
    return cache.st_region_outline(None, f"grid:{run.path}", _frame=run.grid)[0], []


def threshold_controls(run) -> tuple[float, str, str]:
    if state.view().threshold_run != run.run_id:  # a new run: its own default threshold
        state.update(threshold=mapview.default_threshold(run), threshold_run=run.run_id)
    c = st.columns([2, 2, 3])
    with c[0]:
        t = state.control(st.number_input, f"Threshold ({run.units or 'original units'})", name="threshold",
                          min_value=1e-6 if run.transform.needs_positive else None, format="%g",
                        help="35 Mbps: the FCC's 5G-NR mobile download benchmark (2024); 100 Mbps for fixed. "
                             "The Maps page draws P(below) at this threshold too.")
    with c[1]:
        direction = state.control(st.segmented_control, "Probability of being", list(DIRECTIONS), name="direction")
    with c[2]:
        st.caption(f"Model space: {run.transform.units_label(run.units)} = "
                   f"{float(run.transform.forward(t)) if run.transform.needs_positive else t:.4g}; "
                   "P uses the latent f (a new measurement adds the noise).")
    return float(t), "original", direction


def exceedance_section(run, key, t, units, direction) -> np.ndarray:
    st.subheader(mapview.exceed_title(run, t, direction))
    p = decide_cache.st_exceedance(*key, t, units, direction, run.quarter)
    scale = ColorScale("rdbu", 0.0, 1.0)
    draw(run, key, p, scale, f"P(f {direction} threshold): 0.5 in the middle", f"exceed_{run.run_id}")
    n = len(p)
    st.caption(f"{int((p > 0.8).sum()):,} of {n:,} cells are likely {direction} (P > 0.8), "
               f"{int((p < 0.2).sum()):,} likely not (P < 0.2), {int(((p > 0.2) & (p < 0.8)).sum()):,} undecided.")
    return p


def areas_section(run, key, t, units) -> None:
    st.subheader("Areas" + mapview.at_quarter(run))
    c = st.columns([2, 2, 3])
    has_strata = bool(run.config.get("strata"))
    sources = ["counties"] + (["strata"] if has_strata else [])
    with c[0]:
        source = state.control(st.radio, "Areas", sources, horizontal=True, name="areas", valid=sources.__contains__,
                               format_func={"counties": "counties", "strata": "strata of the run"}.get)
    with c[1]:
        weights = state.control(st.radio, "Weights", ["uniform", "area"], horizontal=True, name="area_weights",
                           help="How cells count in an area's mean: equally, or by their area in km².")
    try:
        table = decide_cache.st_areas(*key, source, weights, t, units, quarter=run.quarter)
        labels = decide_cache.st_area_labels(*key, source)
    except GPCoreError as exc:
        st.warning(str(exc))
        return
    with c[2]:
        st.caption("Exact in model space: for a log10 target the area value is the geometric mean of the cells.")
    prob = dict(zip(table["area"], table["p_below"], strict=True))
    cell_p = np.array([prob.get(str(a), np.nan) if a is not None else np.nan for a in labels], dtype=float)
    left, right = st.columns([3, 2], gap="medium")
    with left:
        wk = f"area_{run.run_id}"
        draw(run, key, cell_p, ColorScale("rdbu", 0.0, 1.0), "P(area mean below threshold)", wk, clickable=True,
             on_change=lambda: on_area_pick(wk, labels), hint="Click an area for its posterior")
    with right:
        picked = state.view().decide_area
        if picked in prob:
            row = table[table["area"] == picked].iloc[0]
            u = f" {run.units}" if run.units else ""
            st.markdown(f"**{md_text(picked)}**")
            st.metric("Area mean", f"{format_number(row['mean'])}{u}")
            st.metric("95% interval", f"[{format_number(row['lower'])}, {format_number(row['upper'])}]{u}")
            st.metric("P(area mean below)", f"{row['p_below']:.3f}")
            st.caption(f"{int(row['cells'])} cells; model space {row['mean_t']:.3f} ± {1.96 * row['sd_t']:.3f} "
                       f"{run.t_units}.")
        else:
            st.info("Click an area on the map to see its posterior.")
    show = table[["area", "mean", "lower", "upper", "p_below", "cells"]].rename(
        columns={"mean": f"mean ({run.units})", "lower": "95% lower", "upper": "95% upper",
                 "p_below": "P(below)"})
    st.dataframe(show, hide_index=True, width="stretch", height=260,
                 column_config={"P(below)": st.column_config.ProgressColumn(min_value=0.0, max_value=1.0,
                                                                            format="%.3f")})
    c = st.columns(2)
    c[0].download_button("Areas (CSV)", data=spreadsheet_safe(table).to_csv(index=False),
                         file_name=f"{run.run_id}-areas.csv",
                         mime="text/csv", on_click="ignore", icon=":material/download:", key="w_dl_areas_csv")
    c[1].download_button("Areas (GeoJSON)", data=lambda: areas_geojson(run, table, source),
                         file_name=f"{run.run_id}-areas.geojson", mime="application/geo+json", on_click="ignore",
                         icon=":material/download:", key="w_dl_areas_geojson")


def areas_geojson(run, table: pd.DataFrame, source: str) -> str:
    """Areas with their posterior as GeoJSON (county polygons, or the union of each stratum's cells)."""
    import geopandas as gpd

    from gpcore import decide

    if source == "counties":
        polys = decide.bundled_counties(run.manifest.get("data", {}).get("state"))[["NAME", "geometry"]]
        polys = polys.rename(columns={"NAME": "area"}).drop_duplicates("area")
    else:
        cells = decide_cache.st_run_cells(*cache.run_key(run))
        lab = pd.Series(decide_cache.st_area_labels(*cache.run_key(run), source),
                        index=run.grid["cell_id"].to_numpy())
        cells = cells.assign(area=lab.reindex(cells["cell_id"].to_numpy()).to_numpy())
        polys = cells.dissolve(by="area").reset_index()[["area", "geometry"]]
    gdf = gpd.GeoDataFrame(table.merge(polys, on="area", how="left"), geometry="geometry", crs=4326)
    return gdf.to_json()


def samples_section(run, key) -> None:
    st.subheader("Plausible maps" + mapview.at_quarter(run))
    c = st.columns([2, 2, 5])
    with c[0]:
        seed = state.control(st.number_input, "Seed", min_value=0, step=1, name="sample_seed")
    with c[1]:
        st.button("Draw another four", key="w_decide_redraw", on_click=redraw_samples)
    with c[2]:
        st.caption("Four joint posterior samples: each is a map the model finds plausible as a whole. "
                   "Where they differ, the data do not pin the map down.")
    S = decide_cache.st_samples(*key, int(seed), quarter=run.quarter)
    lo, hi = robust_limits(S.ravel())
    label = mapview.inverse_label(run.transform)
    scale = ColorScale("viridis", lo, hi, label=label)
    cols = st.columns(4, gap="small")
    for i, col in enumerate(cols):
        with col:
            st.caption(f"Sample {i + 1}")
            mapview.draw_grid(run, key, grid_image(key, S[i], scale), widget_key=f"sample_{i}_{run.run_id}",
                              clickable=False, outlines=mapview.outline_specs(*_outlines(run)), width_px=260)
    st.html(legend_html(scale, f"{run.target} ({run.units or 'original units'}), one scale for all four"))


def suggest_section(run, key, t, units) -> None:
    st.subheader("Where to measure next" + mapview.at_quarter(run))
    targets = dict(TARGETS)
    if run.config.get("strata"):
        for name in sorted({str(v) for v in decide_cache.st_area_labels(*key, "strata") if v is not None}):
            targets[f"stratum:{name}"] = f"stratum {name}"
    c = st.columns([2, 3, 2, 2])
    with c[0]:
        state.control(st.slider, "Sites k", 1, 20, name="sites_k")
    with c[1]:
        state.control(st.selectbox, "Reduce the variance over", list(targets), format_func=targets.get,
                      name="sites_target", valid=targets.__contains__)
    with c[2]:
        state.control(st.number_input, "Minimum spacing (km)", min_value=0.0, step=1.0, name="sites_min_km")
    with c[3]:
        st.button("Suggest sites", key="w_decide_suggest", on_click=request_suggestions, type="primary")
    req = state.view().decide_request
    if not req:
        st.info("Choose how many sites and where the uncertainty matters, then press Suggest sites.")
        return
    k, target, min_km = req
    if target not in targets:
        target = "all"
    res, mask = decide_cache.st_suggest(*key, k, target, t, units, min_km, quarter=run.quarter)
    if res is None:
        st.warning("No cell is in that target set at this threshold; choose another target.")
        return
    g = run.grid
    picks = pd.DataFrame({
        "site": np.arange(1, len(res.index) + 1),
        "cell_id": g["cell_id"].to_numpy()[res.index],
        "lon": g["lon"].to_numpy()[res.index].round(5),
        "lat": g["lat"].to_numpy()[res.index].round(5),
        "variance reduction": res.reduction,
    })
    left, right = st.columns([3, 2], gap="medium")
    with left:
        var_after = res.var_after_candidates
        scale = ColorScale("magma", *robust_limits(np.concatenate([var_after, res.var_after_candidates])))
        labels = [{"p": [float(r.lon), float(r.lat)], "text": str(int(r.site))} for r in picks.itertuples()]
        draw(run, key, var_after, scale, f"Latent variance after the {len(picks)} measurements ({run.t_units})²",
             f"suggest_{run.run_id}", labels=labels)
    with right:
        st.caption(f"Target: {targets[target]} ({int(mask.sum()):,} cells); mean latent variance "
                   f"{res.mean_var_before:.4g} → {res.mean_var_after:.4g} ({run.t_units})². "
                   f"Settings: k = {k}, minimum spacing {min_km:g} km.")
        st.dataframe(picks, hide_index=True, width="stretch",
                     column_config={"variance reduction": st.column_config.NumberColumn(format="%.3g")})
        from gpcore.decide import joint_caveat

        note = joint_caveat(cache.st_model(*key))
        if note:
            st.caption(f"Note: {note}.")
        c = st.columns(2)
        c[0].download_button("Sites (CSV)", data=spreadsheet_safe(picks).to_csv(index=False),
                             file_name=f"{run.run_id}-sites.csv",
                             mime="text/csv", on_click="ignore", icon=":material/download:", key="w_dl_sites_csv")
        c[1].download_button("Sites (GeoJSON)", data=sites_geojson(picks), file_name=f"{run.run_id}-sites.geojson",
                             mime="application/geo+json", on_click="ignore", icon=":material/download:",
                             key="w_dl_sites_geojson")


def sites_geojson(picks: pd.DataFrame) -> str:
    feats = [{"type": "Feature", "geometry": {"type": "Point", "coordinates": [float(lon), float(lat)]},
              "properties": {"site": int(site), "cell_id": int(cell), "variance_reduction": float(red)}}
             for site, cell, lon, lat, red in zip(picks["site"], picks["cell_id"], picks["lon"], picks["lat"],
                                                  picks["variance reduction"], strict=True)]
    return json.dumps({"type": "FeatureCollection", "features": feats})


def render(data: cache.LoadedData, runs: list) -> None:
    """The Decide page of the active run (the sidebar's picker; the first run with a grid if it has none)."""
    st.title("Decide")
    runs = cache.runs_with_grid(runs)
    if not runs:
        st.info("No run with a prediction grid yet: train one on the Train page.")
        return
    info = next((r for r in runs if r.run_id == state.view().run), None)
    if info is None:
        info = runs[0]
        title = cache.run_titles([info])[info.run_id]
        st.caption(f"The active run has no prediction grid: showing {md_text(title)}.")
    key = cache.run_key(info)
    quarters = timeview.run_quarters(info.manifest)
    if quarters:  # a run with time as an input: decide at the slider's quarter (shared with the Maps page)
        timeview.quarter_slider(quarters)
    run = cache.st_run_data(*key, timeview.quarter_of(info, state.view().at))
    at = f" · at {run.quarter} (time is an input of this run)" if quarters else ""
    st.caption(f"model `{run.model}` · {len(run.grid):,} grid cells · from the run's stored grid and model{at}")
    t, units, direction = threshold_controls(run)
    exceedance_section(run, key, t, units, direction)
    reason = decide_cache.st_joint_unavailable(*key)
    if reason:
        st.warning(f"Areas, plausible maps and where to measure next need the joint posterior, which this run's "
                   f"model does not give. {reason}")
        return
    areas_section(run, key, t, units)
    samples_section(run, key)
    suggest_section(run, key, t, units)
