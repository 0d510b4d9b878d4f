"""Prediction grids clipped to a region: square cells in km, or web-mercator quadkey tiles.

* ``kind="square"``: squares of ``cell_km`` in a local metric CRS (the WGS 84 UTM zone of the region's
  centre, or a Lambert equal-area projection for regions wider than 12 degrees of longitude). Cell
  edges are multiples of the cell size in that CRS, so grids of the same size nest.
* ``kind="quadkey"``: the web-mercator tiles of ``zoom`` (Ookla tiles are zoom 16), so a map can draw
  predictions with the tiles' own geometry; ``cell_id`` is the quadkey.

Every cell has a ``cell_id``, its raster position ``row``/``col``, its centre ``lon``/``lat``
(EPSG:4326) and its polygon (EPSG:4326). ``gdf.attrs["grid"]`` holds a :class:`GridSpec`, which
GeoTIFF export uses to place the cells. Selection is vectorised: a cell is kept when its centre lies
in the region (``shapely.contains_xy``) or its square crosses the region's boundary (boundary
segments no longer than a cell, each tested against the at most four cells around it).

>>> g = make_grid((-66.2, -66.0, 18.3, 18.4), cell_km=2.0)
>>> list(g.columns)
['cell_id', 'row', 'col', 'lon', 'lat', 'geometry']
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import geopandas as gpd
import numpy as np
import pyproj
import shapely

from gpcore.data import quadkey as qk
from gpcore.data._crs import WGS84, laea_crs, local_crs, project, project_geometry
from gpcore.data.regions import resolve_region
from gpcore.data.report import JSONFields
from gpcore.errors import ConfigError, DataError

KM_PER_DEG_LAT = 110.574
KM_PER_DEG_LON_EQ = 111.320
#: Most cells of a streamed raster (:class:`RegularGrid`).
MAX_REGION_CELLS = 2_000_000_000
#: Largest grid built unless ``max_cells`` says otherwise.
DEFAULT_MAX_CELLS = 1_000_000
_CHUNK = 2_000_000


@dataclass(frozen=True, eq=False)
class GridSpec(JSONFields):
    """Raster layout of a grid: ``crs`` (string pyproj accepts), GDAL-style affine ``transform``
    ``(a, b, c, d, e, f)`` with ``x = a*col + b*row + c`` and ``y = d*col + e*row + f`` for cell
    corners, ``width`` x ``height`` cells, and the grid's kind, ``cell_km`` or ``zoom``."""

    kind: str
    crs: str
    transform: tuple[float, float, float, float, float, float]
    width: int
    height: int
    cell_size: float
    cell_km: float | None = None
    zoom: int | None = None
    clip: str = "intersects"


def make_grid(
    region,
    *,
    kind: str = "square",
    cell_km: float = 1.0,
    zoom: int = 14,
    max_cells: int = DEFAULT_MAX_CELLS,
    clip: str = "intersects",
    crs=None,
) -> gpd.GeoDataFrame:
    """Cells covering a region.

    Parameters
    ----------
    region : shapely geometry, GeoDataFrame/GeoSeries, str or (W, E, S, N)
        A polygon in EPSG:4326, a polygon layer (any CRS), a bundled state code (``"PR"``, ``"MO"``...),
        the path of a polygon file, or a lon/lat box. See :func:`gpcore.data.region_from_data` for a
        data set's convex hull or bounding box.
    kind : {"square", "quadkey"}
    cell_km : float
        Side of square cells in kilometres (``kind="square"``).
    zoom : int
        Web-mercator zoom of quadkey cells (``kind="quadkey"``; 16 = Ookla tiles, about 610 m).
    max_cells : int
        Refuse to build more cells than this (a clear error suggests a coarser grid).
    clip : {"intersects", "centre", "none"}
        Keep cells that touch the region, cells whose centre is in it, or the whole bounding box.
    crs : optional
        Metric CRS of square cells (default: UTM zone of the region's centre).

    Returns
    -------
    geopandas.GeoDataFrame
        m rows in row-major order with ``cell_id`` (int64 for squares: ``row * width + col``; the quadkey
        string for tiles), ``row``, ``col`` (int64), ``lon``, ``lat`` (centre, float64) and the cell
        polygon in EPSG:4326. ``attrs["grid"]`` is the :class:`GridSpec`.
    """
    if kind not in ("square", "quadkey"):
        raise DataError(f"grid kind {kind!r} is not known; use 'square' or 'quadkey'")
    if clip not in ("intersects", "centre", "center", "none"):
        raise DataError(f"clip={clip!r} is not known; use 'intersects', 'centre' or 'none'")
    clip = "centre" if clip == "center" else clip
    geom = resolve_region(region)
    if kind == "square":
        if not (np.isfinite(cell_km) and cell_km > 0):
            raise DataError(f"cell_km={cell_km!r} must be a positive number of kilometres")
        if crs is None:
            w, s, e, n = geom.bounds
            centre = ((w + e) / 2, (s + n) / 2)
            pcrs = local_crs(*centre) if (e - w) <= 12 else laea_crs(*centre)
        else:
            pcrs = pyproj.CRS.from_user_input(crs)
        size = float(cell_km) * 1000.0
        gp = project_geometry(shapely.segmentize(geom, 0.05), WGS84, pcrs)
        minx, miny, maxx, maxy = gp.bounds
        x0 = np.floor(minx / size) * size
        y1 = np.ceil(maxy / size) * size
    else:
        zoom = int(zoom)
        if not 0 <= zoom <= 24:
            raise DataError(f"zoom={zoom!r} must be an integer from 0 to 24 (Ookla tiles are zoom 16)")
        pcrs = pyproj.CRS.from_epsg(3857)
        lim = shapely.box(-180, -qk.MERC_MAX_LAT, 180, qk.MERC_MAX_LAT)
        merc = shapely.intersection(shapely.segmentize(geom, 0.05), lim)

        def _to_merc(xy: np.ndarray) -> np.ndarray:
            return np.column_stack(qk.lonlat_to_mercator(xy[:, 0], xy[:, 1]))

        gp = shapely.transform(merc, _to_merc)
        size = qk.tile_size_m(zoom)
        minx, miny, maxx, maxy = gp.bounds
        x0 = -qk.MERC_HALF + np.floor((minx + qk.MERC_HALF) / size) * size
        y1 = qk.MERC_HALF - np.floor((qk.MERC_HALF - maxy) / size) * size
    nx = max(int(np.ceil((maxx - x0) / size - 1e-9)), 1)
    ny = max(int(np.ceil((y1 - miny) / size - 1e-9)), 1)
    what = f"{cell_km:g} km cells" if kind == "square" else f"zoom-{zoom} tiles"
    estimate = gp.area / size**2 if clip != "none" else nx * ny
    if estimate > max_cells * 1.02:
        raise DataError(_too_many(estimate, max_cells, kind, cell_km, zoom, what))
    if nx * ny > max(20 * max_cells, 20_000_000):
        raise DataError(f"the region's bounding box spans {nx} x {ny} {what}; split the region or use a coarser grid")
    rows, cols = _select_cells(gp, x0, y1, size, nx, ny, clip)
    if len(rows) > max_cells:
        raise DataError(_too_many(len(rows), max_cells, kind, cell_km, zoom, what))
    if len(rows) == 0:
        raise DataError(f"no {what} fall in the region; use a smaller cell size or check the region")

    if kind == "square":
        cx = x0 + (cols + 0.5) * size
        cy = y1 - (rows + 0.5) * size
        lon, lat = project(cx, cy, pcrs, WGS84)
        cxs = np.stack([cols, cols + 1, cols + 1, cols, cols], axis=1) * size + x0
        cys = y1 - np.stack([rows + 1, rows + 1, rows, rows, rows + 1], axis=1) * size
        px, py = project(cxs.ravel(), cys.ravel(), pcrs, WGS84)
        polys = shapely.polygons(np.stack([px, py], axis=1).reshape(len(rows), 5, 2))
        cell_id = rows * nx + cols
        crs_str = pcrs.to_string()
    else:
        tx0 = int(round((x0 + qk.MERC_HALF) / size))
        ty0 = int(round((qk.MERC_HALF - y1) / size))
        tx, ty = tx0 + cols, ty0 + rows
        lon, lat = qk.tile_centre(tx, ty, zoom)
        w, s, e, n = qk.tile_bounds(tx, ty, zoom)
        polys = shapely.box(w, s, e, n)
        cell_id = qk.tile_to_quadkey(tx, ty, zoom)
        crs_str = "EPSG:3857"
    spec = GridSpec(
        kind=kind,
        crs=crs_str,
        transform=(size, 0.0, float(x0), 0.0, -size, float(y1)),
        width=nx,
        height=ny,
        cell_size=size,
        cell_km=float(cell_km) if kind == "square" else None,
        zoom=zoom if kind == "quadkey" else None,
        clip=clip,
    )
    gdf = gpd.GeoDataFrame(
        {"cell_id": cell_id, "row": rows, "col": cols, "lon": lon, "lat": lat},
        geometry=gpd.GeoSeries(polys, crs="EPSG:4326"),
    )
    gdf.attrs["grid"] = spec
    return gdf


def _too_many(n, max_cells: int, kind: str, cell_km: float, zoom: int, what: str) -> str:
    if kind == "square":
        need = cell_km * np.sqrt(n / max_cells) * 1.05
        fix = f"use cell_km >= {need:.3g}"
    else:
        levels = int(np.ceil(np.log(max(n / max_cells, 1)) / np.log(4)))
        fix = f"use zoom <= {zoom - max(levels, 1)}"
    return f"the grid would have about {int(n):,} {what}, above max_cells={max_cells:,}; {fix} or raise max_cells"


def _select_cells(gp, x0: float, y1: float, size: float, nx: int, ny: int, clip: str) -> tuple[np.ndarray, np.ndarray]:
    """Row and column (int64, shape (m,), row-major order) of the cells kept by ``clip``."""
    if clip == "none":
        rows, cols = np.divmod(np.arange(nx * ny, dtype=np.int64), nx)
        return rows, cols
    shapely.prepare(gp)
    flat = []
    rows_per_chunk = max(1, _CHUNK // nx)
    colv = np.arange(nx, dtype=np.int64)
    for r0 in range(0, ny, rows_per_chunk):
        r = np.arange(r0, min(ny, r0 + rows_per_chunk), dtype=np.int64)
        rr = np.repeat(r, nx)
        cc = np.tile(colv, len(r))
        inside = shapely.contains_xy(gp, x0 + (cc + 0.5) * size, y1 - (rr + 0.5) * size)
        flat.append(rr[inside] * nx + cc[inside])
    keep = np.concatenate(flat) if flat else np.zeros(0, dtype=np.int64)
    if clip == "intersects":
        keep = np.union1d(keep, _boundary_cells(gp, x0, y1, size, nx, ny))
    rows, cols = np.divmod(np.sort(keep), nx)
    return rows, cols


def _boundary_cells(gp, x0: float, y1: float, size: float, nx: int, ny: int) -> np.ndarray:
    """Flat indices of cells whose square meets the region's boundary."""
    lines = shapely.get_parts(shapely.segmentize(shapely.boundary(gp), size * 0.5))
    coords, idx = shapely.get_coordinates(lines, return_index=True)
    if len(coords) < 2:
        return np.zeros(0, dtype=np.int64)
    same = idx[1:] == idx[:-1]
    a, b = coords[:-1][same], coords[1:][same]
    c_lo = np.floor((np.minimum(a[:, 0], b[:, 0]) - x0) / size).astype(np.int64)
    c_hi = np.floor((np.maximum(a[:, 0], b[:, 0]) - x0) / size).astype(np.int64)
    r_lo = np.floor((y1 - np.maximum(a[:, 1], b[:, 1])) / size).astype(np.int64)
    r_hi = np.floor((y1 - np.minimum(a[:, 1], b[:, 1])) / size).astype(np.int64)
    cand_r = np.concatenate([r_lo, r_lo, r_hi, r_hi])
    cand_c = np.concatenate([c_lo, c_hi, c_lo, c_hi])
    seg = np.tile(np.arange(len(a)), 4)
    ok = (cand_r >= 0) & (cand_r < ny) & (cand_c >= 0) & (cand_c < nx)
    cand_r, cand_c, seg = cand_r[ok], cand_c[ok], seg[ok]
    key = cand_r * nx + cand_c
    _, first = np.unique(np.column_stack([key, seg]), axis=0, return_index=True)
    key, cand_r, cand_c, seg = key[first], cand_r[first], cand_c[first], seg[first]
    boxes = shapely.box(x0 + cand_c * size, y1 - (cand_r + 1) * size, x0 + (cand_c + 1) * size, y1 - cand_r * size)
    segs = shapely.linestrings(np.stack([a[seg], b[seg]], axis=1))
    hit = shapely.intersects(boxes, segs)
    return np.unique(key[hit])


# --------------------------------------------------------------------------------------------
# cell sources for streamed prediction (gpcore.run.predict): batches of cells, never all at once
# --------------------------------------------------------------------------------------------


@dataclass
class Chunk:
    """One batch of cells: ids, ``(m, 2)`` lon/lat, an optional inside-region mask, raster rows."""

    index: int
    cell_id: np.ndarray
    X: np.ndarray
    inside: np.ndarray | None = None
    row0: int | None = None
    nrows: int | None = None


@dataclass
class RegularGrid:
    """A north-up lon/lat raster over ``(west, east, south, north)`` with ``nx x ny`` cells (EPSG:4326), read
    as a source of cell batches. Its layout is a :class:`GridSpec` (:attr:`spec`, kind ``"lonlat"``), the same
    layout :func:`make_grid` records, so one GeoTIFF writer (:mod:`gpcore.data.export`) places both.

    Cell ``cell_id = row * nx + col`` (row 0 at the north edge) has its centre at
    ``(west + (col + 0.5) dx, north - (row + 0.5) dy)``.
    """

    west: float
    east: float
    south: float
    north: float
    nx: int
    ny: int
    mask_geometry: object = None  # optional shapely polygon; cells outside are dropped / NaN

    @property
    def dx(self) -> float:
        return (self.east - self.west) / self.nx

    @property
    def dy(self) -> float:
        return (self.north - self.south) / self.ny

    @property
    def n_cells(self) -> int:
        return self.nx * self.ny

    @property
    def spec(self) -> GridSpec:
        """The raster layout (cell corners ``x = west + col dx``, ``y = north - row dy``, EPSG:4326)."""
        return GridSpec("lonlat", "EPSG:4326", (self.dx, 0.0, self.west, 0.0, -self.dy, self.north), self.nx,
                        self.ny, self.dx)

    @classmethod
    def from_bounds(
        cls,
        bounds: tuple[float, float, float, float],
        *,
        cell_km: float | None = None,
        cell_deg: float | None = None,
        cells: int | None = None,
        mask_geometry=None,
    ) -> RegularGrid:
        """Grid over ``(W, E, S, N)`` with square-ish cells of ``cell_km`` km (at the mid-latitude),
        ``cell_deg`` degrees, or about ``cells`` cells in total (exactly one of them)."""
        w, e, s, n = (float(v) for v in bounds)
        if not (-180 <= w < e <= 180 and -90 <= s < n <= 90):
            raise ConfigError(
                f"region (W, E, S, N) = {bounds!r} is not valid; need -180 <= W < E <= 180 and -90 <= S < N <= 90"
            )
        given = [v is not None and v != 0 for v in (cell_km, cell_deg, cells)]
        if sum(given) != 1:
            raise ConfigError("give exactly one of cell_km, cell_deg or cells for a generated grid")
        kx = KM_PER_DEG_LON_EQ * math.cos(math.radians(0.5 * (s + n)))
        ky = KM_PER_DEG_LAT
        if cells is not None and cells:
            if cells < 1:
                raise ConfigError(f"cells must be >= 1, got {cells}")
            # square cells in km: nx / ny = (width_km / height_km)
            aspect = ((e - w) * kx) / ((n - s) * ky)
            ny = max(1, int(round(math.sqrt(cells / aspect))))
            nx = max(1, int(round(cells / ny)))
        elif cell_km:
            if cell_km <= 0:
                raise ConfigError(f"cell_km must be > 0, got {cell_km}")
            nx = max(1, int(math.ceil((e - w) * kx / cell_km)))
            ny = max(1, int(math.ceil((n - s) * ky / cell_km)))
            e, s = w + nx * cell_km / kx, n - ny * cell_km / ky
        else:
            if cell_deg <= 0:
                raise ConfigError(f"cell_deg must be > 0, got {cell_deg}")
            nx = max(1, int(math.ceil((e - w) / cell_deg)))
            ny = max(1, int(math.ceil((n - s) / cell_deg)))
            e, s = w + nx * cell_deg, n - ny * cell_deg
        if nx * ny > MAX_REGION_CELLS:
            raise ConfigError(f"the grid would have {nx * ny:,} cells; use larger cells")
        return cls(w, e, s, n, nx, ny, mask_geometry)

    def rows_per_batch(self, batch_size: int) -> int:
        return max(1, batch_size // self.nx)

    def n_chunks(self, batch_size: int) -> int:
        return math.ceil(self.ny / self.rows_per_batch(batch_size))

    def chunk(self, k: int, batch_size: int) -> Chunk:
        """Chunk ``k``: whole raster rows ``[k R, (k + 1) R)`` with ``R = rows_per_batch``."""
        R = self.rows_per_batch(batch_size)
        row0 = k * R
        nrows = min(R, self.ny - row0)
        rows = np.arange(row0, row0 + nrows, dtype=np.int64)
        cols = np.arange(self.nx, dtype=np.int64)
        lon = self.west + (cols + 0.5) * self.dx
        lat = self.north - (rows + 0.5) * self.dy
        X = np.empty((nrows * self.nx, 2))
        X[:, 0] = np.tile(lon, nrows)
        X[:, 1] = np.repeat(lat, self.nx)
        cell_id = (rows[:, None] * self.nx + cols[None, :]).ravel()
        inside = None
        if self.mask_geometry is not None:
            import shapely

            inside = shapely.contains_xy(self.mask_geometry, X[:, 0], X[:, 1])
        return Chunk(k, cell_id, X, inside, row0, nrows)

    def chunks(self, batch_size: int, rank: int = 0, world: int = 1) -> Iterator[Chunk]:
        for k in range(rank, self.n_chunks(batch_size), world):
            yield self.chunk(k, batch_size)

    def rank_cells(self, batch_size: int, rank: int = 0, world: int = 1) -> int:
        """How many cells :meth:`chunks` hands ``rank`` (whole raster rows per chunk, chunks round-robin)."""
        R = self.rows_per_batch(batch_size)
        return self.nx * sum(min(R, self.ny - k * R) for k in range(rank, self.n_chunks(batch_size), world))


class ParquetGrid:
    """Cells from a Parquet file (``cell_id`` optional, coordinates ``x_cols``), read by row groups."""

    def __init__(self, path, x_cols: tuple[str, str] | None = None, id_col: str | None = None):
        from gpcore.data.parquet_stream import ParquetSource

        probe = ParquetSource(path)
        names = probe.schema_names
        if x_cols is None:
            for cand in (("lon", "lat"), ("longitude", "latitude"), ("x", "y"), ("lng", "lat")):
                if all(c in names for c in cand):
                    x_cols = cand
                    break
            else:
                raise DataError(
                    f"cannot find coordinate columns in '{path}' (looked for lon/lat, longitude/latitude, x/y); "
                    f"give their names in x_cols. Columns: {', '.join(names)}"
                )
        if id_col is None and "cell_id" in names:
            id_col = "cell_id"
        cols = list(x_cols) + ([id_col] if id_col else [])
        self.source = ParquetSource(path, cols)
        self.x_cols, self.id_col = tuple(x_cols), id_col
        self.n_cells = self.source.num_rows

    def n_chunks(self, batch_size: int) -> int:
        return math.ceil(self.n_cells / batch_size) if self.n_cells else 0

    def chunks(self, batch_size: int, rank: int = 0, world: int = 1) -> Iterator[Chunk]:
        start = 0
        for k, b in enumerate(self.source.iter_batches(batch_size)):
            m = len(b[self.x_cols[0]])
            if k % world == rank:
                X = np.column_stack([np.asarray(b[c], dtype=np.float64) for c in self.x_cols])
                ids = b[self.id_col] if self.id_col else np.arange(start, start + m, dtype=np.int64)
                yield Chunk(k, ids, X)
            start += m


def region_grid(spec: str, model=None, *, cell_km=None, cell_deg=None, cells=None) -> RegularGrid:
    """A :class:`RegularGrid` from ``bbox:W,E,S,N``, ``state:CODE`` (bounding box, cells outside the
    state dropped / NaN) or ``run`` (the model's training bounding box)."""
    spec = spec.strip()
    mask = None
    if spec.startswith("bbox:"):
        try:
            bounds = tuple(float(v) for v in spec[5:].split(","))
        except ValueError:
            raise ConfigError(f"grid region {spec!r}: expected bbox:W,E,S,N (four numbers, degrees)") from None
        if len(bounds) != 4:
            raise ConfigError(f"grid region {spec!r}: expected bbox:W,E,S,N (four numbers, degrees)")
    elif spec.startswith("state:"):
        from gpcore.data.regions import state_bbox, state_boundary

        code = spec.split(":", 1)[1]
        bounds = state_bbox(code)
        import shapely

        mask = state_boundary(code)
        shapely.prepare(mask)
    elif spec == "run":
        if model is None or getattr(model, "d_", None) != 2:
            raise ConfigError("grid region 'run' needs a model trained on (lon, lat) inputs")
        lo, span = model.x_lo_, model.x_span_
        bounds = (lo[0], lo[0] + span[0], lo[1], lo[1] + span[1])
    else:
        raise ConfigError(f"grid region {spec!r} is not understood; use bbox:W,E,S,N, state:CODE or run")
    return RegularGrid.from_bounds(bounds, cell_km=cell_km, cell_deg=cell_deg, cells=cells, mask_geometry=mask)
