"""Quantised colour scales for the maps: 255-entry lookup tables, value -> index, legends.

No Streamlit here. A map's colours are computed once per (run, quantity) as one ``uint8`` index
per grid cell (``1..255``; ``0`` is reserved for "no data" / transparent), so a recolour is a
table lookup and the payload is a palette image (see :mod:`app.raster`).

>>> scale = ColorScale("viridis", 0.0, 1.0)
>>> scale.index(np.array([0.0, 0.5, 1.0, np.nan])).tolist()
[1, 128, 255, 0]
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

#: Colour scale names offered in the UI -> plotly scale name.
SCALES = {
    "viridis": "Viridis",
    "cividis": "Cividis",
    "magma": "Magma",
    "plasma": "Plasma",
    "inferno": "Inferno",
    "turbo": "Turbo",
    "rdbu": "RdBu_r",  # diverging, blue (negative) -> red (positive)
    "puor": "PuOr_r",
}
N_COLORS = 255  # palette indices 1..255; 0 = transparent
#: The Change map's palette: the diverging ``rdbu`` on indices 1..254 and :data:`NEUTRAL` at 255 (sign uncertain).
CHANGE = "change"
NEUTRAL = (180, 180, 180)
#: A cell's change has an uncertain sign when UNCERTAIN[0] < P(change > 0) < UNCERTAIN[1] (the central 80 % interval
#: of the change holds 0): such cells are drawn in :data:`NEUTRAL`, whatever their posterior mean.
UNCERTAIN = (0.1, 0.9)


@lru_cache(maxsize=32)
def lut(name: str) -> np.ndarray:
    """``(256, 3)`` uint8 RGB table; row 0 is unused (transparent), rows 1..255 span the scale."""
    import plotly.colors as pc

    if name == CHANGE:
        out = lut("rdbu").copy()
        out[N_COLORS] = NEUTRAL
        return out
    try:
        plotly_name = SCALES[name]
    except KeyError:
        raise ValueError(f"unknown colour scale {name!r}; allowed: {', '.join(SCALES)}") from None
    samples = pc.sample_colorscale(plotly_name, list(np.linspace(0.0, 1.0, N_COLORS)), colortype="rgb")
    rgb = np.array([_parse_rgb(s) for s in samples], dtype=np.uint8)
    out = np.zeros((N_COLORS + 1, 3), dtype=np.uint8)
    out[1:] = rgb
    return out


def _parse_rgb(text: str) -> tuple[int, int, int]:
    inner = text[text.index("(") + 1 : text.index(")")]
    r, g, b = (int(round(float(v))) for v in inner.split(",")[:3])
    return r, g, b


def robust_limits(values: np.ndarray, q: float = 0.02, symmetric: bool = False) -> tuple[float, float]:
    """Colour limits at the ``q`` and ``1 - q`` quantiles of the finite values (symmetric about 0 if asked)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return (-1.0, 1.0) if symmetric else (0.0, 1.0)
    if symmetric:
        m = float(np.quantile(np.abs(v), 1 - q)) or float(np.max(np.abs(v))) or 1.0
        return -m, m
    lo, hi = (float(x) for x in np.quantile(v, [q, 1 - q]))
    if not hi > lo:
        lo, hi = float(v.min()), float(v.max())
    if not hi > lo:
        lo, hi = lo - 0.5, hi + 0.5
    return lo, hi


@dataclass(frozen=True)
class ColorScale:
    """A linear colour scale on ``[lo, hi]`` (values outside are clipped).

    ``label`` maps a scale value to the text a legend shows (e.g. ``10 ** v`` for a log10 target,
    so colours are even in log space while the legend reads in Mbps).
    """

    name: str
    lo: float
    hi: float
    label: Callable[[float], str] | None = field(default=None, compare=False)

    def index(self, values: np.ndarray) -> np.ndarray:
        """Palette index per value: ``1..255`` for finite values, ``0`` for NaN/inf. Shape as ``values``."""
        v = np.asarray(values, dtype=np.float64)
        span = self.hi - self.lo if self.hi > self.lo else 1.0
        t = (v - self.lo) / span
        with np.errstate(invalid="ignore"):
            idx = np.clip(np.rint(t * (N_COLORS - 1)), 0, N_COLORS - 1) + 1
        idx = np.where(np.isfinite(v), idx, 0)
        return idx.astype(np.uint8)

    def rgb(self, values: np.ndarray) -> np.ndarray:
        """``(n, 3)`` uint8 colours of ``values`` (NaN -> black)."""
        return lut(self.name)[self.index(values)]

    def ticks(self, n: int = 5) -> list[tuple[float, str]]:
        """``n`` evenly spaced ``(position in [0, 1], label)`` pairs for a legend."""
        fmt = self.label or _default_label
        return [(float(t), fmt(self.lo + t * (self.hi - self.lo))) for t in np.linspace(0.0, 1.0, n)]

    def css_gradient(self, stops: int = 16) -> str:
        table = lut(self.name)[1:]
        pos = np.linspace(0, len(table) - 1, stops).round().astype(int)
        parts = [f"rgb({r},{g},{b}) {100 * i / (stops - 1):.1f}%" for i, (r, g, b) in enumerate(table[pos])]
        return "linear-gradient(to right, " + ", ".join(parts) + ")"


def _default_label(v: float) -> str:
    return format_number(v)


def format_number(v: float, digits: int = 3) -> str:
    """Short human number: 3 significant digits, no exponent for everyday magnitudes."""
    if v is None or not np.isfinite(v):
        return "–"
    a = abs(v)
    if a != 0 and (a < 1e-3 or a >= 1e6):
        return f"{v:.{digits - 1}e}"
    return f"{v:.{digits}g}" if a < 1000 else f"{v:,.0f}"


def legend_html(scale: ColorScale, title: str, n_ticks: int = 5) -> str:
    """A small HTML colour bar with tick labels (rendered with ``st.html``)."""
    ticks = "".join(
        f'<span style="position:absolute;left:{100 * p:.1f}%;transform:translateX(-{100 * p:.0f}%);">'
        f"{html.escape(text)}</span>"
        for p, text in scale.ticks(n_ticks)
    )
    return (
        '<div class="ua-legend" style="font-size:0.8rem;margin:0.1rem 0 0.6rem 0;">'
        f'<div style="font-weight:600;margin-bottom:2px;">{html.escape(title)}</div>'
        f'<div style="height:12px;border-radius:2px;background:{scale.css_gradient()};"></div>'
        f'<div style="position:relative;height:1.2em;margin-top:2px;">{ticks}</div></div>'
    )


def sign_uncertain(p_increase: np.ndarray, band: tuple[float, float] = UNCERTAIN) -> np.ndarray:
    """Cells whose change has an uncertain sign: ``band[0] < P(change > 0) < band[1]``."""
    p = np.asarray(p_increase, dtype=float)
    return (p > band[0]) & (p < band[1])


def change_index(mean: np.ndarray, p_increase: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Palette indices of the Change map (palette :data:`CHANGE`): the change's mean on ``rdbu`` over ``[lo, hi]``
    (indices 1..254), :data:`NEUTRAL` (255) where the sign is uncertain (:func:`sign_uncertain`), 0 for NaN."""
    idx = ColorScale("rdbu", lo, hi).index(mean)
    idx = np.where(idx > 0, np.minimum(idx, N_COLORS - 1), 0)
    return np.where(sign_uncertain(p_increase) & (idx > 0), N_COLORS, idx).astype(np.uint8)


def change_legend_html(scale: ColorScale, title: str, band: tuple[float, float] = UNCERTAIN) -> str:
    """The Change map's legend: the diverging colour bar of the change (``scale``) and a neutral, hatched swatch
    for the cells whose sign is uncertain."""
    r, g, b = NEUTRAL
    swatch = (f"background:repeating-linear-gradient(45deg, rgb({r},{g},{b}) 0 4px, rgb({r - 25},{g - 25},{b - 25}) "
              "4px 6px)")
    entry = (f'<div class="ua-legend-neutral" style="display:flex;align-items:center;gap:6px;margin-top:2px;">'
             f'<span style="display:inline-block;width:28px;height:12px;border-radius:2px;{swatch};"></span>'
             f"<span>sign uncertain: {band[0]:g} &lt; P(improved) &lt; {band[1]:g} (grey on the map)</span></div>")
    bar = legend_html(scale, title)
    return bar[: -len("</div>")] + entry + "</div>"
