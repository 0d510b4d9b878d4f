"""Maps of a run with time as an input: the quarter slider, the Change map and a clicked cell's change.

A run fitted with ``--time-input`` (run.json's ``"time"`` record) has one grid per quarter
(``grids/<quarter>.parquet``). The quarter slider (view state ``at``, in the URL as ``at=2023Q4``) picks the
quarter every map kind shows (mean, interval width, exceedance, measurements, the kernel slice's ``t_ref``) and
the quarter of the Decide page. The Change map shows, per cell, the posterior of ``f(x, to) - f(x, from)`` from
the model's *joint* posterior (:mod:`gpcore.run.change`) coloured by its mean, with the cells whose sign is
uncertain (``0.1 < P(improved) < 0.9``, :data:`app.colors.UNCERTAIN`) in a neutral grey. Runs without time draw
none of this.
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from app import cache, decide_cache, mapview, state
from app.colors import UNCERTAIN, ColorScale, change_index, change_legend_html, robust_limits
from app.safe_html import md_text


def run_quarters(manifest: dict) -> list[str]:
    """The grid quarters of a run with time as an input (from its manifest), [] for any other run."""
    if not manifest.get("config", {}).get("time_input"):
        return []
    return list((manifest.get("time") or {}).get("grid_quarters") or [])


def quarter_slider(quarters: list[str]) -> str | None:
    """The quarter slider (view state ``at``) over ``quarters``; None (and nothing drawn) without quarters.

    A quarter the run has no grid for (another run's, or a link's) gives way to the run's latest quarter."""
    if not quarters:
        return None
    if state.view().at not in quarters:
        state.update(at=quarters[-1])
    if len(quarters) == 1:
        st.caption(f"Quarter: {quarters[0]} (the run's only quarter)")
        return quarters[0]
    return state.control(st.select_slider, "Quarter", quarters, name="at", valid=quarters.__contains__,
                         help="The quarter every map shows: the model's posterior at the middle of that quarter "
                              "(time is one of its inputs). The Decide page uses it too.")


def change_controls(quarters: list[str]) -> tuple[str, str]:
    """The Change map's "From" and "To" quarters (view state ``change_from``, ``change_to``)."""
    v = state.view()
    if v.change_from not in quarters:
        state.update(change_from=quarters[0])
    if v.change_to not in quarters:
        state.update(change_to=quarters[-1])
    c = st.columns(2)
    with c[0]:
        t_from = state.control(st.selectbox, "From quarter", quarters, name="change_from",
                               valid=quarters.__contains__)
    with c[1]:
        t_to = state.control(st.selectbox, "To quarter", quarters, name="change_to", valid=quarters.__contains__)
    return t_from, t_to


def quarter_of(run_info, at: str | None) -> str | None:
    """The quarter a run is shown at: the slider's when the run has a grid for it, else its latest (None for a
    spatial run)."""
    quarters = run_quarters(run_info.manifest)
    if not quarters:
        return None
    return at if at in quarters else quarters[-1]


def change_label(run: cache.RunData):
    """Legend label of a change in model units: the ratio for a log target (``x1.26``), else ``+0.1``."""
    name = run.transform.name
    if name in ("log10", "log"):
        base = 10.0 if name == "log10" else np.e
        return lambda v: f"×{base ** float(v):.3g}"
    return lambda v: f"{float(v):+.3g}"


def change_title(run: cache.RunData, t_from: str, t_to: str) -> str:
    what = f"Change of {run.target} from {t_from} to {t_to}"
    if run.transform.name in ("log10", "log"):
        return f"{what}: ratio of the medians ({run.t_units} difference; colour = posterior mean)"
    return f"{what} ({run.t_units}; colour = posterior mean)"


def change_map(run: cache.RunData, key, t_from: str, t_to: str, *, widget_key: str, outlines, basemap: bool,
               width_px: int, on_change) -> None:
    """The Change map of a run between two quarters (clickable: a click shows the cell's change)."""
    if t_from == t_to:
        st.info("Choose two different quarters to see the change between them.")
        return
    table = decide_cache.st_change(*key, t_from, t_to)
    mean, p = table["change_mean"].to_numpy(), table["p_increase"].to_numpy()
    lo, hi = robust_limits(mean, symmetric=True)
    scale = ColorScale("rdbu", lo, hi, label=change_label(run))
    from app import raster as R

    image = R.data_url(R.palette_png(change_index(mean, p, lo, hi), cache.st_raster(*key), "change"))
    mapview.draw_grid(run, key, image, widget_key=widget_key, clickable=True, outlines=outlines, basemap=basemap,
                      width_px=width_px, on_change=on_change, lookup=decide_cache.st_change_lookup(*key, t_from, t_to),
                      hint="Click a cell for its change")
    st.html(change_legend_html(scale, change_title(run, t_from, t_to)))
    up, down = int((p >= UNCERTAIN[1]).sum()), int((p <= UNCERTAIN[0]).sum())
    st.caption(f"{up:,} of {len(p):,} cells likely improved (P(improved) ≥ {UNCERTAIN[1]:g}), {down:,} likely "
               f"worse (≤ {UNCERTAIN[0]:g}), {len(p) - up - down:,} with an uncertain sign (grey). P(improved) = "
               "P(change > 0) from the joint posterior of the two quarters (Var = v₁ + v₂ − 2c₁₂), "
               f"{table.attrs.get('hyper', 'at the fitted hyperparameters')}.")


def change_panel(run: cache.RunData, key, t_from: str, t_to: str, xref) -> None:
    """The clicked cell's change: its posterior mean, 95 % interval and P(improved)."""
    if t_from == t_to:
        return
    if xref is None:
        st.info("Click a cell on the Change map to see its change, interval and P(improved).")
        return
    table = decide_cache.st_change(*key, t_from, t_to)
    i = run.nearest_cell(*xref)
    row = table.iloc[i]
    label = change_label(run)
    mean, lo, hi, p = (float(row[c]) for c in ("change_mean", "change_lo", "change_hi", "p_increase"))
    st.markdown(f"**Change {md_text(t_from)} → {md_text(t_to)} at cell `{int(row['cell_id'])}`** "
                f"({xref[0]:.5f}, {xref[1]:.5f}), in {md_text(run.t_units)}")
    c = st.columns([2, 3, 2])
    c[0].metric("Change", f"{mean:+.3f}", help=f"Posterior mean of f(x, to) − f(x, from), in {run.t_units}.")
    c[1].metric("Change 95% interval", f"[{lo:+.3f}, {hi:+.3f}]")
    c[2].metric("P(improved)", f"{p:.3f}", help="P(change > 0) from the joint posterior: Φ(mean / sd) at one set of "
                "hyperparameters, averaged over draws of them where the model has their posterior (vecchia, dbk-nn "
                "without features).")
    sign = "uncertain" if UNCERTAIN[0] < p < UNCERTAIN[1] else ("improved" if p >= UNCERTAIN[1] else "worse")
    ratio = (f" The median changed by {label(mean)} (95% interval {label(lo)} to {label(hi)})."
             if run.transform.name in ("log10", "log") else "")
    st.caption(f"Sign: **{sign}**; sd of the change {float(row['change_sd']):.3f} {md_text(run.t_units)}.{ratio}")


def slice_quarter(run: cache.RunData, draw: bool = True) -> str | None:
    """The "Slice shown at" control of a time run's kernel panel: the quarter whose grid cells the slice at
    ``(x_ref, t_ref = the slider's quarter)`` is evaluated at ("" = the same quarter); None for a spatial run.
    ``draw=False`` (a second map side by side) reads the choice without drawing the control again."""
    if not run.quarters:
        return None
    if not draw:
        chosen = state.view().slice_at
        return chosen if chosen in run.quarters else run.quarter
    options = ["", *run.quarters]
    shown = state.control(st.selectbox, "Slice shown at", options, name="slice_at", valid=options.__contains__,
                          format_func=lambda q: q or f"the slider's quarter ({run.quarter})",
                          help="k((x, t), (x_ref, t_ref)) with t_ref the slider's quarter and t this quarter: how "
                               "strongly the value at x_ref then is tied to the map at another time.")
    return shown or run.quarter


def data_at_quarter(data: cache.LoadedData, quarter: str | None) -> tuple[cache.LoadedData, str]:
    """The measurements of one quarter (rows whose time falls in it) and the cache key of their points."""
    from dataclasses import replace

    if quarter is None or "time_year" not in data.frame.columns:
        return data, data.data_hash
    from gpcore.data.temporal import parse_quarter, quarter_index

    rows = quarter_index(data.frame["time_year"].to_numpy(dtype=float)) == quarter_index(
        np.array([parse_quarter(quarter)]))[0]
    return replace(data, frame=data.frame[rows], y_t=data.y_t[rows]), f"{data.data_hash}:{quarter}"


def point_inputs(xref, t: float | None) -> np.ndarray:
    """``x_ref`` as the model's input row: ``(lon, lat)`` or, with time, ``(lon, lat, t)``."""
    return np.asarray([*xref] + ([] if t is None else [t]), dtype=float)

