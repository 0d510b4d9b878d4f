"""Grid cells -> a palette PNG for a deck.gl ``BitmapLayer`` (the colour layer of every grid map).

A run's prediction grid has one value per cell; sending 50,000 coloured polygons to the browser
on every click is slow and heavy. Instead the cells are rasterised once per grid
(:func:`build_raster_index`: which cell each image pixel shows) and each map is then a palette
image: ``png = palette_png(cell_index[pix2cell], lut)`` — a gather and a PNG encode, a few
milliseconds for 50k cells, and a payload of tens of kilobytes.

Image rows are uniform in Web-Mercator ``y`` and columns uniform in longitude, which is how
deck.gl's ``BitmapLayer`` stretches an image between lon/lat ``bounds`` in a map view.
No Streamlit here.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass

import numpy as np

from app.colors import lut

MERC_MAX_LAT = 85.0511287798066


def merc_y(lat: np.ndarray) -> np.ndarray:
    """Web-Mercator ``y`` (unitless, radians) of latitudes in degrees."""
    phi = np.radians(np.clip(np.asarray(lat, dtype=float), -MERC_MAX_LAT, MERC_MAX_LAT))
    return np.log(np.tan(np.pi / 4 + phi / 2))


def inv_merc_y(y: np.ndarray) -> np.ndarray:
    return np.degrees(2 * np.arctan(np.exp(np.asarray(y, dtype=float))) - np.pi / 2)


@dataclass(frozen=True)
class RasterIndex:
    """Which grid cell each pixel of a ``height x width`` image shows.

    Attributes
    ----------
    bounds : (W, S, E, N) in degrees, the image's extent (``BitmapLayer.bounds`` is ``[W, S, E, N]``).
    width, height : image size in pixels.
    pix2cell : (height * width,) int32, row-major from the north-west corner; ``n_cells`` = no cell.
    n_cells : number of grid cells.
    """

    bounds: tuple[float, float, float, float]
    width: int
    height: int
    pix2cell: np.ndarray
    n_cells: int

    @property
    def coverage(self) -> float:
        """Fraction of cells that own at least one pixel (1.0 when every cell is visible)."""
        shown = np.unique(self.pix2cell[self.pix2cell < self.n_cells])
        return shown.size / max(self.n_cells, 1)


def cell_half_sizes(bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Half width and height in degrees from an ``(n, 4)`` array of cell bounds ``(minx, miny, maxx, maxy)``."""
    b = np.asarray(bounds, dtype=float)
    return (b[:, 2] - b[:, 0]) / 2, (b[:, 3] - b[:, 1]) / 2


def spacing_half_sizes(lon: np.ndarray, lat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Half sizes estimated from the nearest-neighbour spacing (when no cell polygons are at hand)."""
    from scipy.spatial import cKDTree

    lon = np.asarray(lon, float)
    lat = np.asarray(lat, float)
    if lon.size < 2:
        return np.full(lon.shape, 0.01), np.full(lon.shape, 0.01)
    c = np.cos(np.radians(np.median(lat)))
    pts = np.column_stack([lon * c, lat])
    k = min(5, lon.size)
    _, idx = cKDTree(pts).query(pts, k=k)
    d = pts[idx[:, 1:]] - pts[:, None, :]  # offsets to the nearest neighbours, n x (k-1) x 2
    dx, dy = np.abs(d[..., 0]).ravel(), np.abs(d[..., 1]).ravel()
    horiz = dx[(dx > 2 * dy) & (dx > 0)]
    vert = dy[(dy > 2 * dx) & (dy > 0)]
    iso = float(np.median(np.hypot(d[:, 0, 0], d[:, 0, 1]))) or 0.01
    step_x = float(np.median(horiz)) if horiz.size else iso
    step_y = float(np.median(vert)) if vert.size else iso
    return np.full(lon.shape, step_x / c / 2), np.full(lon.shape, step_y / 2)


def build_raster_index(
    lon: np.ndarray,
    lat: np.ndarray,
    half_w: np.ndarray,
    half_h: np.ndarray,
    px_per_cell: float = 2.0,
    max_side: int = 2048,
    max_pixels: int = 1_500_000,
    tol: float = 1.2,
) -> RasterIndex:
    """Rasterise axis-aligned cells (centres ``lon, lat``, half sizes in degrees) to a pixel -> cell map.

    Each pixel takes the cell whose centre is nearest (in a locally isotropic metric) and is kept
    only when it lies inside that cell's box grown by ``tol`` (cells of a UTM grid are slightly
    rotated in lon/lat), so gaps and the region's edge stay transparent. About ``px_per_cell``
    pixels span a median cell, within ``max_side`` and ``max_pixels``. Cost: one KD-tree query
    per pixel, done once per grid.
    """
    from scipy.spatial import cKDTree

    lon = np.asarray(lon, dtype=float)
    lat = np.asarray(lat, dtype=float)
    hw = np.asarray(half_w, dtype=float)
    hh = np.asarray(half_h, dtype=float)
    n = lon.size
    if n == 0:
        return RasterIndex((0.0, 0.0, 1.0, 1.0), 1, 1, np.zeros(1, dtype=np.int32), 0)
    W, E = float(np.min(lon - hw)), float(np.max(lon + hw))
    S, N = float(np.min(lat - hh)), float(np.max(lat + hh))
    yS, yN = float(merc_y(S)), float(merc_y(N))
    # pixel size from the median cell, in lon degrees and mercator units
    cell_x = float(np.median(2 * hw))
    cell_y = float(np.median(merc_y(lat + hh) - merc_y(lat - hh)))
    px_x, px_y = cell_x / px_per_cell, cell_y / px_per_cell
    width = max(1, int(np.ceil((E - W) / px_x)))
    height = max(1, int(np.ceil((yN - yS) / px_y)))
    shrink = max(width / max_side, height / max_side, np.sqrt(width * height / max_pixels), 1.0)
    if shrink > 1.0:
        width = max(1, int(np.ceil(width / shrink)))
        height = max(1, int(np.ceil(height / shrink)))
    xs = W + (np.arange(width) + 0.5) * (E - W) / width
    ys = inv_merc_y(yN - (np.arange(height) + 0.5) * (yN - yS) / height)  # north -> south
    px_lon = np.tile(xs, height)
    px_lat = np.repeat(ys, width)
    c = np.cos(np.radians((S + N) / 2))
    tree = cKDTree(np.column_stack([lon * c, lat]))
    _, nearest = tree.query(np.column_stack([px_lon * c, px_lat]), k=1)
    nearest = nearest.astype(np.int64)
    inside = (np.abs(px_lon - lon[nearest]) <= hw[nearest] * tol) & (np.abs(px_lat - lat[nearest]) <= hh[nearest] * tol)
    pix2cell = np.where(inside, nearest, n).astype(np.int32)
    return RasterIndex((W, S, E, N), width, height, pix2cell, n)


def palette_png(cell_index: np.ndarray, raster: RasterIndex, scale_name: str) -> bytes:
    """PNG bytes of the map whose cell ``i`` has palette index ``cell_index[i]`` (``0`` = transparent)."""
    from PIL import Image

    ext = np.zeros(raster.n_cells + 1, dtype=np.uint8)
    ext[: raster.n_cells] = cell_index
    img = ext[raster.pix2cell].reshape(raster.height, raster.width)
    im = Image.frombuffer("P", (raster.width, raster.height), np.ascontiguousarray(img).data, "raw", "P", 0, 1)
    im.putpalette(lut(scale_name).reshape(-1).tobytes())
    buf = io.BytesIO()
    im.save(buf, format="PNG", compress_level=1, transparency=0)
    return buf.getvalue()


def data_url(png: bytes) -> str:
    """``data:image/png;base64,...`` for a BitmapLayer ``image``."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
