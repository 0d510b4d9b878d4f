"""Cached wrappers of the Decide page and of the Change map (``st_``-prefixed), keyed like :mod:`app.cache`.

Decisions are :mod:`gpcore.run.decisions` over a run's stored grid and model (nothing is retrained); the change
between two quarters is :mod:`gpcore.run.change` (the joint posterior). For a run with time as an input every
wrapper takes ``quarter`` (``"2023Q4"``): the grid's stored marginals and the model's inputs are those at that
quarter (the decimal year ``t`` is appended as the model's last input); a spatial run passes ``None``. Cached per
``(run path, stamp, ...)`` like :mod:`app.cache`: runs are immutable once written.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from app.cache import st_model, st_run_data


@st.cache_resource(show_spinner=False, max_entries=4)
def st_run_cells(path: str, stamp: float):
    """The run's grid with its cell polygons (``gpcore.run.rundir.read_grid_frame``), for areas and exports."""
    from gpcore.run.rundir import read_grid_frame

    return read_grid_frame(path)


@st.cache_data(show_spinner=False, max_entries=16)
def st_exceedance(path: str, stamp: float, threshold: float, units: str, direction: str,
                  quarter: str | None = None) -> np.ndarray:
    """P(f below/above the threshold) per grid cell from the run's stored marginals (``O(cells)``), at ``quarter``
    for a run with time as an input."""
    from gpcore.run import decisions

    run = st_run_data(path, stamp, quarter)
    return decisions.exceedance(st_model(path, stamp), run.grid, threshold, units=units, transform=run.transform,
                                direction=direction, t=run.t).p_f


@st.cache_data(show_spinner="Assigning cells to areas ...", max_entries=8)
def st_area_labels(path: str, stamp: float, source: str) -> np.ndarray:
    """The area of each grid cell: ``counties`` (bundled, the run's state) or ``strata`` (the run's strata)."""
    from gpcore.run import decisions

    run = st_run_data(path, stamp)
    return decisions.area_labels(run.grid, source, state=run.manifest.get("data", {}).get("state"),
                                 strata=run.config.get("strata"))[0]


@st.cache_data(show_spinner=False, max_entries=16)
def st_joint_unavailable(path: str, stamp: float) -> str | None:
    """Why the run's model has no joint posterior, or None when it has one (every registered model has one)."""
    from gpcore.posterior import joint_unavailable

    return joint_unavailable(st_model(path, stamp))


@st.cache_data(show_spinner="Computing the areas' posteriors ...", max_entries=8)
def st_areas(path: str, stamp: float, source: str, weights: str, threshold: float, units: str,
             samples: int = 0, quarter: str | None = None) -> pd.DataFrame:
    """Posterior of each area's weighted mean (at ``quarter``), ranked by P(area mean below the threshold)."""
    from gpcore.run import decisions

    run = st_run_data(path, stamp, quarter)
    w = decisions.area_weights(run.grid, weights, cells=st_run_cells(path, stamp) if weights == "area" else None)
    return decisions.area_table(st_model(path, stamp), run.grid, st_area_labels(path, stamp, source), weights=w,
                                threshold=threshold, units=units, transform=run.transform, samples=samples, t=run.t)


@st.cache_data(show_spinner="Drawing joint samples ...", max_entries=8)
def st_samples(path: str, stamp: float, seed: int, n: int = 4, quarter: str | None = None) -> np.ndarray:
    """``n`` joint posterior samples over the grid (model space, at ``quarter``), seeded."""
    from gpcore.run import decisions

    run = st_run_data(path, stamp, quarter)
    return decisions.samples(st_model(path, stamp), run.grid, n, seed=seed, t=run.t)


@st.cache_resource(show_spinner="Choosing where to measure next ...", max_entries=8)
def st_suggest(path: str, stamp: float, k: int, target: str, threshold: float, units: str, min_km: float,
               quarter: str | None = None):
    """Greedy suggestions over the grid cells (``gpcore.run.decisions.suggest``, measurements at ``quarter``) and the
    target mask used."""
    from gpcore.run import decisions

    run = st_run_data(path, stamp, quarter)
    model = st_model(path, stamp)
    mask = decisions.target_mask(model, run.grid, target, threshold=threshold, units=units, transform=run.transform,
                                 strata=run.config.get("strata"), state=run.manifest.get("data", {}).get("state"),
                                 t=run.t)
    if not mask.any():
        return None, mask
    return decisions.suggest(model, run.grid, mask, k, min_km=min_km, t=run.t), mask


# ---------------------------------------------------------------------------------------------
# the Change map (a run with time as an input)
# ---------------------------------------------------------------------------------------------


@st.cache_data(show_spinner="Computing the change between the quarters (joint posterior, over the hyperparameters' "
                             "posterior: a run's first change takes two to three minutes at 100,000 rows on a 2-core "
                             "CPU, later ones seconds) ...",
               max_entries=16)
def st_change(path: str, stamp: float, t_from: str, t_to: str, level: float = 0.95) -> pd.DataFrame:
    """The posterior of ``f(x, to) - f(x, from)`` at every grid cell (:func:`gpcore.run.change.change_table`: the
    joint posterior's ``v1 + v2 - 2 c12``, not two marginals, averaged over 16 draws of the hyperparameters where the
    model has their posterior, at its REML mode where that posterior is narrow) with ``p_increase = P(change > 0)``,
    in model units. Cached per ``(run, from, to)``; the hyperparameters' posterior is kept on the cached model and in
    the run folder (:func:`gpcore.run.change.run_change_table`), so another pair of quarters, or the same run after a
    restart, reuses it."""
    from gpcore.data.temporal import parse_quarter
    from gpcore.run.change import run_change_table

    run = st_run_data(path, stamp)
    t1, t2 = parse_quarter(t_from, "from"), parse_quarter(t_to, "to")
    return run_change_table(path, st_model(path, stamp), run.grid[["cell_id", "lon", "lat"]], t1, t2, level=level)


def change_file_bytes(path: str, stamp: float, t_from: str, t_to: str, fmt: str) -> bytes:
    """The change of :func:`st_change` as CSV, GeoJSON or GeoTIFF bytes, for the Export page's downloads
    (``gpcore.run.decisions.export_change_bytes``)."""
    from gpcore.run.decisions import export_change_bytes

    return export_change_bytes(path, st_change(path, stamp, t_from, t_to), fmt, t_from, t_to)


@st.cache_resource(show_spinner=False, max_entries=16)
def st_change_lookup(path: str, stamp: float, t_from: str, t_to: str) -> dict:
    """Tooltip and click lookup of the Change map (change, its 95 % interval and P(improved) per cell)."""
    from app import gridmap
    from app.cache import st_index_png, st_raster

    run = st_run_data(path, stamp)
    c = st_change(path, stamp, t_from, t_to)
    values = {"m": c["change_mean"].to_numpy(), "lo": c["change_lo"].to_numpy(), "hi": c["change_hi"].to_numpy(),
              "w": (c["change_hi"] - c["change_lo"]).to_numpy(), "wt": c["change_sd"].to_numpy(),
              "p": c["p_increase"].to_numpy()}
    return gridmap.lookup(st_raster(path, stamp), c["cell_id"].to_numpy(), values, run.t_units, run.t_units,
                          key=f"{path}:{stamp}:change:{t_from}:{t_to}", kind="change",
                          index_url=st_index_png(path, stamp))


@st.cache_data(show_spinner=False, max_entries=32)
def st_quarter_limits(path: str, stamp: float, column: str) -> tuple[float, float]:
    """Colour limits of a grid column over every quarter of a run with time as an input (one scale for the whole
    slider, so a trend shows as a change of colour)."""
    from app.colors import robust_limits

    run = st_run_data(path, stamp)
    values = [st_run_data(path, stamp, q).grid[column].to_numpy(dtype=float) for q in run.quarters]
    return robust_limits(np.concatenate(values) if values else run.grid[column].to_numpy(dtype=float))
