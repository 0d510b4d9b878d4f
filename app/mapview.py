"""Map decks for the pages: grid maps (mean, width, kernel slice) and measurement maps.

Everything heavy comes from :mod:`app.cache`; this module only assembles specs and legends.
"""

from __future__ import annotations

import numpy as np

from app import cache
from app import layers as L
from app.colors import ColorScale, format_number, robust_limits
from app.safe_html import html_text


def inverse_label(transform) -> callable:
    """Legend label of a model-space value in original units (``10 ** v`` for log10)."""
    return lambda v: format_number(float(transform.inverse(np.asarray(v))))


def grid_scale(run: cache.RunData, kind: str, scale_name: str, width_units: str = "model",
               limits: tuple[float, float] | None = None) -> tuple[str, ColorScale, str]:
    """``(column, scale, legend title)`` of the mean or width map of a run."""
    if kind == "mean":
        col = "mean_t"
        lo, hi = limits or _limits(run, col)
        label = inverse_label(run.transform)
        title = f"Posterior mean of {run.target}{at_quarter(run)} ({run.units or 'original units'})"
        if run.transform.name != "identity":
            title += f"; colours even in {run.transform.name}"
        return col, ColorScale(scale_name, lo, hi, label=label), title
    col = "width_t" if width_units == "model" or run.transform.name == "identity" else "width"
    lo, hi = limits or _limits(run, col)
    units = run.t_units if col == "width_t" else run.units
    title = f"95% prediction-interval width{at_quarter(run)} ({units or 'target units'})"
    weights = run.manifest.get("weights")
    if weights:  # a weighted run's interval depends on how many measurements a value averages
        title += f", for a value from {weights.get('grid_measurements', 1)} measurement ({weights.get('column')} = 1)"
    if run.manifest.get("recalibration"):
        title += "; recalibrated (global scale)"
    return col, ColorScale(scale_name, lo, hi), title


def at_quarter(run: cache.RunData) -> str:
    """`` at 2023Q4`` for a run with time as an input (its maps' quarter), else ""."""
    return f" at {run.quarter}" if getattr(run, "quarter", None) and getattr(run, "quarters", None) else ""


def _limits(run: cache.RunData, col: str) -> tuple[float, float]:
    """Colour limits of a grid column: over every quarter for a run with time as an input (one scale for the whole
    slider), else over the grid."""
    if getattr(run, "quarters", None):
        from app import decide_cache

        return decide_cache.st_quarter_limits(*cache.run_key(run), col)
    return robust_limits(run.grid[col].to_numpy())


def outline_layers(region_json: str | None, strata: list[tuple[str, str, tuple]] | None) -> list[dict]:
    out = []
    if region_json:
        out.append(L.outline_layer("region", L.Raw(region_json), color=(60, 60, 60), width_px=1.0))
    for i, (_, text, rgb) in enumerate(strata or []):
        out.append(L.outline_layer(f"strata-{i}", L.Raw(text), color=rgb, width_px=1.3))
    return out


def outline_specs(region_json: str | None, strata: list[tuple[str, str, tuple]] | None) -> list[dict]:
    """Outlines for :func:`app.gridmap.grid_map`: ``{"geojson": text, "color": [r, g, b, a], "width": px}``."""
    out = []
    if region_json:
        out.append({"geojson": region_json, "color": [60, 60, 60, 220], "width": 1.0})
    for _, text, rgb in strata or []:
        out.append({"geojson": text, "color": [*rgb, 220], "width": 1.3})
    return out


def draw_grid(run: cache.RunData, key: tuple[str, float], image_url: str, *, widget_key: str, clickable: bool,
              outlines: list[dict], xref=None, basemap: bool = False, width_px: int = 560, on_change=None,
              labels: list[dict] | None = None, hint: str | None = None, lookup: dict | None = None):
    """A grid map (colour bitmap, outlines, x_ref marker) as the grid-map component; returns its last click.

    ``clickable`` maps carry the cell lookup: hover tooltips (cell id, mean, interval, width; at ``run.quarter``
    for a run with time as an input, or ``lookup``'s values) and a click anywhere on a cell returns that cell,
    however many cells the grid has.
    """
    from app import gridmap

    raster = cache.st_raster(*key)
    height = L.fit_height(run.bounds, width_px)
    view = L.view_for_bounds(run.bounds, width_px=width_px, height_px=height)
    return gridmap.grid_map(
        image=image_url, bounds=raster.bounds, view=view, height=height, outlines=outlines, key=widget_key,
        view_key=f"{run.run_id}:{width_px}", marker=xref,
        lookup=(lookup or cache.st_grid_lookup(*key, quarter=run.quarter)) if clickable else None,
        basemap=basemap, clickable=clickable, on_change=on_change, fit={"bounds": run.bounds, "pad": L.VIEW_PAD},
        hint=hint if hint is not None else ("Click a cell to set x_ref" if clickable else ""), labels=labels,
    )


def points_deck(data: cache.LoadedData, scale: ColorScale, outlines: list[dict], basemap: bool = False,
                data_key: str = "", bounds=None, width_px: int = 560) -> L.PrebuiltDeck:
    """Measurements coloured by the (transformed) target, with tooltips."""
    text = cache.st_points_json(data, data_key or data.data_hash, scale.name, scale.lo, scale.hi)
    layers = [L.points_layer("measurements", L.Raw(text))] + outlines
    f = data.frame
    if bounds is None:
        lon, lat = f["lon"].to_numpy(), f["lat"].to_numpy()
        q = [0.005, 0.995]
        (w, e), (s, n) = np.quantile(lon, q), np.quantile(lat, q)
        bounds = (float(w), float(s), float(e), float(n))
    unit = data.units
    tip_lines = [f"<b>{html_text(data.spec.y)}</b> {{v}} {html_text(unit)}"]
    if "stratum" in f.columns:
        tip_lines.append("stratum {s}")
    tip = L.tooltip("<br/>".join(tip_lines))
    height = L.fit_height(bounds, width_px)
    view = L.view_for_bounds(bounds, width_px=width_px, height_px=height)
    return L.PrebuiltDeck(L.deck_spec(layers, view, basemap=basemap), tooltip=tip, height=height)


def measurement_scale(data: cache.LoadedData, scale_name: str) -> tuple[ColorScale, str]:
    from gpcore import data as D

    tr = D.get_transform(data.spec.transform)
    lo, hi = robust_limits(data.y_t)
    title = f"Measured {data.spec.y} ({data.units or 'target units'})"
    if tr.name != "identity":
        title += f"; colours even in {tr.name}"
    return ColorScale(scale_name, lo, hi, label=inverse_label(tr)), title


def slice_scale(values: np.ndarray, mode: str, top: float | None = None) -> ColorScale:
    """Sequential colours when the slice is (nearly) non-negative, else diverging around 0. ``top``: the kernel
    mode's upper limit (default the largest ``|k|``; a time run's slice at another quarter passes ``k(x_ref, x_ref)``
    so that its decay in time shows)."""
    v = values[np.isfinite(values)]
    m = float(np.max(np.abs(v))) if v.size else 1.0
    m = top if top else (m or 1.0)
    lo_q = float(np.quantile(v, 0.01)) if v.size else 0.0
    if lo_q < -0.05 * m:
        top = 1.0 if mode != "kernel" else m
        return ColorScale("rdbu", -top, top)
    hi = 1.0 if mode != "kernel" else m
    lo = max(float(np.quantile(v, 0.005)), 0.0) if v.size else 0.0
    return ColorScale("magma", lo if lo < hi else 0.0, hi)


def default_threshold(run: cache.RunData) -> float:
    """35 Mbps for mobile download speeds (the FCC's 5G-NR mobile benchmark since 2024), 100 Mbps for fixed,
    else the median of the posterior mean (original units)."""
    y = run.target.lower()
    if run.units == "Mbps" and "download" in y:
        label = (run.manifest.get("label", "") + " " + run.config.get("data", "")).lower()
        return 100.0 if "fixed" in label else 35.0
    return float(np.round(np.median(run.grid["mean"].to_numpy()), 3))


def threshold_of(run: cache.RunData, threshold: float | None) -> float:
    """The threshold set on the Decide page (the view state's ``threshold``), else the run's default."""
    return float(threshold) if threshold is not None else default_threshold(run)


def exceed_title(run: cache.RunData, t: float, direction: str = "below") -> str:
    return f"P({run.target} {direction} {format_number(t)} {run.units})".replace(" )", ")") + at_quarter(run)
