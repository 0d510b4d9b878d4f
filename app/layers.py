"""deck.gl map specs for ``st.pydeck_chart`` (the measurement maps), built as JSON strings.

Measurements are a ``ScatterplotLayer`` of coloured dots with tooltips, outlines (region, strata)
are ``GeoJsonLayer`` line layers. :class:`PrebuiltDeck` hands the finished JSON to
``st.pydeck_chart`` without re-serialising. With no network there is no basemap
(``map_provider=None``); ``basemap=True`` asks for Carto's light tiles. The grid maps (mean, width,
kernel slice) are the grid-map component (:mod:`app.gridmap`); :func:`view_for_bounds` and
:func:`fit_height` serve both. No Streamlit here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pydeck as pdk

MAP_HEIGHT = 460

TOOLTIP_STYLE = {
    "backgroundColor": "rgba(30, 30, 30, 0.88)",
    "color": "white",
    "fontSize": "12px",
    "padding": "6px 8px",
}


@dataclass(frozen=True)
class Raw:
    """A JSON fragment (already serialised) to splice into a spec as-is."""

    text: str


class PrebuiltDeck(pdk.Deck):
    """A ``pydeck.Deck`` whose JSON was assembled elsewhere (see :func:`deck_spec`).

    ``height`` is the pixel height the view was fitted for (pass it to ``st.pydeck_chart``).
    """

    def __init__(self, spec: str, tooltip: dict | bool | None = None, height: int = MAP_HEIGHT):
        # pydeck's own __init__ probes for Jupyter and API keys (several ms per map and rerun);
        # st.pydeck_chart only reads to_json(), _tooltip, mapbox_key and layers.
        self._spec = spec
        self._tooltip = tooltip if tooltip is not None else False
        self.layers = []
        self.mapbox_key = None
        self.deck_widget = None
        self.map_height = int(height)

    def to_json(self) -> str:  # noqa: D102 - pydeck API
        return self._spec

    @property
    def nbytes(self) -> int:
        return len(self._spec.encode("utf-8"))


VIEW_PAD = 0.06  # the margin round a region's bounds in its initial view, a share of each side's span


def view_for_bounds(bounds, width_px: int = 720, height_px: int = MAP_HEIGHT, pad: float = VIEW_PAD) -> dict:
    """Initial view (lon, lat, zoom) fitting ``bounds = (W, S, E, N)`` into a ``width x height`` map."""
    W, S, E, N = (float(v) for v in bounds)
    lon = (W + E) / 2
    y = lambda la: math.log(math.tan(math.pi / 4 + math.radians(max(min(la, 85.0), -85.0)) / 2))  # noqa: E731
    lat = math.degrees(2 * math.atan(math.exp((y(S) + y(N)) / 2)) - math.pi / 2)
    span_x = max(E - W, 1e-6) * (1 + 2 * pad)
    span_y = max(y(N) - y(S), 1e-8) * (1 + 2 * pad)
    zx = math.log2(360.0 * width_px / (512.0 * span_x))
    zy = math.log2(2 * math.pi * height_px / (512.0 * span_y))
    zoom = max(0.0, min(zx, zy, 16.0))
    return {"longitude": lon, "latitude": lat, "zoom": round(zoom, 2), "pitch": 0, "bearing": 0}


def fit_height(bounds, width_px: int, lo: int = 240, hi: int = 560) -> int:
    """A map height (pixels) for ``bounds`` at ``width_px``: wide regions get short maps."""
    W, S, E, N = (float(v) for v in bounds)
    y = lambda la: math.log(math.tan(math.pi / 4 + math.radians(max(min(la, 85.0), -85.0)) / 2))  # noqa: E731
    aspect = (y(N) - y(S)) / max(math.radians(E - W), 1e-9)
    return int(min(max(width_px * aspect * 1.3, lo), hi))


def outline_layer(layer_id: str, geojson: dict | Raw, color=(40, 40, 40), width_px: float = 1.2) -> dict:
    return {
        "@@type": "GeoJsonLayer",
        "id": layer_id,
        "data": geojson,
        "stroked": True,
        "filled": False,
        "getLineColor": [*color, 220],
        "lineWidthUnits": "pixels",
        "getLineWidth": width_px,
        "pickable": False,
    }


def points_layer(layer_id: str, data: Raw, radius_px: float = 1.6) -> dict:
    """Measurements as dots coloured per point (``c``: ``[r, g, b]``) with tooltips."""
    return {
        "@@type": "ScatterplotLayer",
        "id": layer_id,
        "data": data,
        "getPosition": "@@=p",
        "getFillColor": "@@=c",
        "radiusUnits": "pixels",
        "getRadius": radius_px,
        "radiusMinPixels": 1,
        "stroked": False,
        "pickable": True,
    }


def points_json(lon, lat, rgb: np.ndarray, fields: dict[str, np.ndarray], decimals: int = 5) -> str:
    lo = np.round(np.asarray(lon, float), decimals).tolist()
    la = np.round(np.asarray(lat, float), decimals).tolist()
    colors = np.asarray(rgb, dtype=int).tolist()
    cols = {k: [str(v) for v in np.asarray(vals)] for k, vals in fields.items()}
    rows = [{"p": [lo[i], la[i]], "c": colors[i], **{k: v[i] for k, v in cols.items()}} for i in range(len(lo))]
    return json.dumps(rows, separators=(",", ":"))


def deck_spec(layers: list[dict], view: dict, basemap: bool = False) -> str:
    """The deck.gl JSON spec ``st.pydeck_chart`` renders; :class:`Raw` values are spliced in verbatim.

    Without a basemap the spec carries pydeck's ``"__MAP_STYLE__"`` sentinel, which Streamlit
    reads as "no map tiles" (no network request).
    """
    raws: list[str] = []

    def swap(obj):
        if isinstance(obj, Raw):
            raws.append(obj.text)
            return f"__UA_RAW_{len(raws) - 1}__"
        if isinstance(obj, dict):
            return {k: swap(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [swap(v) for v in obj]
        return obj

    spec = {
        "initialViewState": view,
        "layers": swap(layers),
        "views": [{"@@type": "MapView", "controller": True}],
        "mapStyle": "light" if basemap else "__MAP_STYLE__",
    }
    if basemap:
        spec["mapProvider"] = "carto"
        spec["mapStyle"] = "https://basemaps.cartocdn.com/gl/positron-gl-style/style.json"
    text = json.dumps(spec, separators=(",", ":"))
    if not raws:
        return text
    pieces = []
    for i, raw in enumerate(raws):  # one pass: split at each placeholder, join with the fragments
        head, _, text = text.partition(f'"__UA_RAW_{i}__"')
        pieces += [head, raw]
    pieces.append(text)
    return "".join(pieces)


def tooltip(html: str) -> dict:
    return {"html": html, "style": TOOLTIP_STYLE}


