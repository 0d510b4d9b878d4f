"""The grid map as a small Streamlit component: deck.gl draws it, a click anywhere returns the cell.

``st.pydeck_chart`` reports a click only when deck.gl's GPU picking finds an object. In Chromium with
software WebGL (the tests, remote desktops, machines without a GPU) picking over tens of thousands of
cells is slow and misses most clicks: 0 of 7 clicks set x_ref on California's 20,179 cells. This
component (``app/components/gridmap/``: an HTML page, ``gridmap.js`` and the vendored, MIT-licensed
deck.gl 9.4 bundle) draws the same layers with nothing pickable, turns a click into a coordinate with
the viewport, and reads the cell under it from the grid's pixel -> cell index (the raster the colours
are drawn from). It returns ``{"cell": row of the grid, "lon", "lat", "t"}``; hover tooltips use the
same index and the cell values, sent once per run. No Streamlit state is written here.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import streamlit.components.v1 as components

from app import raster as R

_PATH = Path(__file__).resolve().parent / "components" / "gridmap"
_component = components.declare_component("ua_gridmap", path=str(_PATH))

NO_CELL = 0xFFFFFF


def index_png(raster: R.RasterIndex) -> str:
    """The pixel -> cell map as an RGB PNG data URL (cell row = r << 16 | g << 8 | b; white = no cell)."""
    from PIL import Image

    idx = np.where(raster.pix2cell >= raster.n_cells, NO_CELL, raster.pix2cell).astype(np.uint32)
    rgb = np.stack([(idx >> 16) & 255, (idx >> 8) & 255, idx & 255], axis=-1).astype(np.uint8)
    im = Image.fromarray(rgb.reshape(raster.height, raster.width, 3), "RGB")
    buf = io.BytesIO()
    im.save(buf, format="PNG", compress_level=6)
    return R.data_url(buf.getvalue())


def _b64(a: np.ndarray, dtype) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype=dtype).tobytes()).decode("ascii")


def lookup(raster: R.RasterIndex, cell_ids, values: dict[str, np.ndarray], units: str, t_units: str, key: str,
           kind: str = "grid", index_url: str | None = None) -> dict:
    """What the browser needs for tooltips and clicks: the index PNG, cell ids and float32 values.

    ``values`` has ``m, lo, hi, w`` (original units) and ``wt`` (model space), one per grid row. ``kind="change"``
    (the Change map): ``m, lo, hi`` are the change's mean and interval and ``p`` is P(change > 0), in ``units``.
    ``index_url``: :func:`index_png` of ``raster`` made before (it is the same for every quarter of a time run).
    """
    return {
        "kind": kind,
        "key": key,
        "index_png": index_url or index_png(raster),
        "w": int(raster.width),
        "h": int(raster.height),
        "bounds": [float(v) for v in raster.bounds],
        "ids": _b64(np.asarray(cell_ids), np.int32),
        "vals": {k: _b64(np.asarray(v, dtype=float), np.float32) for k, v in values.items()},
        "units": units or "",
        "tunits": t_units or "",
    }


def grid_map(*, image: str, bounds, view: dict, height: int, outlines: list[dict], key: str, view_key: str,
             marker=None, lookup: dict | None = None, basemap: bool = False, clickable: bool = False,
             on_change=None, hint: str = "", labels: list[dict] | None = None, fit: dict | None = None):
    """Draw the map; returns the last click ``{"cell", "lon", "lat", "t"}`` (None before any).

    ``labels``: optional numbered points ``[{"p": [lon, lat], "text": "1"}, ...]`` drawn on top.
    ``fit``: ``{"bounds": (W, S, E, N), "pad": 0.06}`` makes the browser fit its first view (and the first after
    ``view_key`` changes) to those bounds at the map's real width, as :func:`app.layers.view_for_bounds` does at
    an assumed one; ``view`` is then only the fallback.
    """
    extra = {"labels": labels} if labels else {}
    if fit is not None:
        extra["fit"] = {"bounds": [float(v) for v in fit["bounds"]], "pad": float(fit.get("pad", 0.0))}
    return _component(
        image=image, bounds=[float(v) for v in bounds], view=view, height=int(height), outlines=outlines,
        marker=None if marker is None else [float(marker[0]), float(marker[1])], lookup=lookup, basemap=basemap,
        clickable=clickable, view_key=view_key, hint=hint, key=key, default=None, on_change=on_change, **extra,
    )


def picked_cell(value) -> int | None:
    """The grid row of a click value (None for no click or a malformed value)."""
    if not isinstance(value, dict):
        return None
    try:
        cell = int(value.get("cell"))
    except (TypeError, ValueError):
        return None
    return cell if cell >= 0 else None
