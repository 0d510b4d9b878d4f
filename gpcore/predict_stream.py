"""Streamed prediction over millions of grid cells with bounded memory.

``python -m gpcore predict RUN_DIR --grid GRID.parquet --out PRED.parquet`` or
``python -m gpcore predict RUN_DIR --grid-region bbox:W,E,S,N --cells 10000000 --out PRED.tif``:
cells are read (Parquet row groups, :mod:`gpcore.data.parquet_stream`) or generated (a regular
lon/lat raster, row by row) ``batch_size`` at a time, predicted, and written incrementally --
Parquet/CSV by ``pyarrow`` writers (one row group per batch), GeoTIFF by windowed writes of whole
raster rows (``rasterio``). Peak memory is one batch plus the model, whatever the number of cells.

Output columns are those of ``grid.parquet`` in a run directory (:func:`gpcore.runs.grid_predictions`):
``cell_id, lon, lat, mean_t, sd_t, width_t, mean, lower, upper, width, sd``; GeoTIFF bands are
``mean, sd, lower, upper, width`` (float32, NaN outside the region).

Under ``torchrun --nproc_per_node=N -m gpcore predict ...`` batch ``k`` is predicted by rank
``k mod N`` (each process on its own GPU when there are GPUs) into a part file; rank 0 then
stitches the parts, in order, into the output and removes them.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpcore.errors import ConfigError, DataError

KM_PER_DEG_LAT = 110.574
KM_PER_DEG_LON_EQ = 111.320
TIFF_BANDS = ("mean", "sd", "lower", "upper", "width")
DEFAULT_BATCH = 65536
MAX_REGION_CELLS = 2_000_000_000


# --------------------------------------------------------------------------------------------
# progress
# --------------------------------------------------------------------------------------------


class TextProgress:
    """A dependency-free progress bar on stderr: ``[#####.....] 52% 5.2M/10M cells 180k/s ETA 28s``.

    On a terminal it redraws one line (at most every ``interval`` s); otherwise (logs, CI) it
    prints a line every 10% of the work.
    """

    def __init__(self, total: int, label: str = "cells", stream=None, interval: float = 0.5, enabled: bool = True):
        self.total = max(int(total), 0)
        self.label = label
        self.stream = stream or sys.stderr
        self.interval = interval
        self.enabled = enabled
        self.done = 0
        self.t0 = time.perf_counter()
        self._last = 0.0
        self._last_decile = -1
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    @staticmethod
    def _fmt(v: float) -> str:
        for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
            if v >= div:
                return f"{v / div:.1f}{unit}"
        return f"{v:.0f}"

    def line(self) -> str:
        el = time.perf_counter() - self.t0
        frac = self.done / self.total if self.total else 1.0
        rate = self.done / el if el > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        bar = "#" * int(round(30 * frac))
        eta_s = f"ETA {eta:.0f}s" if math.isfinite(eta) else "ETA ?"
        return (
            f"[{bar:<30}] {100 * frac:5.1f}% {self._fmt(self.done)}/{self._fmt(self.total)} {self.label} "
            f"{self._fmt(rate)}/s {eta_s}"
        )

    def update(self, k: int) -> None:
        self.done += int(k)
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.tty:
            if now - self._last >= self.interval or self.done >= self.total:
                self._last = now
                self.stream.write("\r" + self.line())
                self.stream.flush()
        else:
            decile = int(10 * self.done / self.total) if self.total else 10
            if decile > self._last_decile:
                self._last_decile = decile
                self.stream.write(self.line() + "\n")
                self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\r" + self.line() + "\n")
            self.stream.flush()


# --------------------------------------------------------------------------------------------
# cell sources
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
    """A north-up lon/lat raster over ``(west, east, south, north)`` with ``nx x ny`` cells (EPSG:4326).

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
    def transform(self):
        from rasterio.transform import Affine

        return Affine(self.dx, 0.0, self.west, 0.0, -self.dy, self.north)

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
            raise ConfigError("give exactly one of --cell-km, --cell-deg or --cells for a generated grid")
        kx = KM_PER_DEG_LON_EQ * math.cos(math.radians(0.5 * (s + n)))
        ky = KM_PER_DEG_LAT
        if cells is not None and cells:
            if cells < 1:
                raise ConfigError(f"--cells must be >= 1, got {cells}")
            # square cells in km: nx / ny = (width_km / height_km)
            aspect = ((e - w) * kx) / ((n - s) * ky)
            ny = max(1, int(round(math.sqrt(cells / aspect))))
            nx = max(1, int(round(cells / ny)))
        elif cell_km:
            if cell_km <= 0:
                raise ConfigError(f"--cell-km must be > 0, got {cell_km}")
            nx = max(1, int(math.ceil((e - w) * kx / cell_km)))
            ny = max(1, int(math.ceil((n - s) * ky / cell_km)))
            e, s = w + nx * cell_km / kx, n - ny * cell_km / ky
        else:
            if cell_deg <= 0:
                raise ConfigError(f"--cell-deg must be > 0, got {cell_deg}")
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
                    f"pass --x LON,LAT. Columns: {', '.join(names)}"
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


# --------------------------------------------------------------------------------------------
# sinks
# --------------------------------------------------------------------------------------------


class TableSink:
    """Incremental Parquet (``pyarrow.parquet.ParquetWriter``) or CSV (``pyarrow.csv.CSVWriter``)."""

    def __init__(self, path, fmt: str = "parquet"):
        self.path = Path(path)
        self.fmt = fmt
        self._w = None
        self.rows = 0

    def write(self, table) -> None:
        if self._w is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.fmt == "csv":
                import pyarrow.csv as pacsv

                self._w = pacsv.CSVWriter(str(self.path), table.schema)
            else:
                import pyarrow.parquet as pq

                self._w = pq.ParquetWriter(str(self.path), table.schema, compression="zstd")
        if self.fmt == "csv":
            self._w.write_table(_spreadsheet_safe_table(table))
        else:
            self._w.write_table(table, row_group_size=max(table.num_rows, 1))
        self.rows += table.num_rows

    def close(self) -> None:
        if self._w is not None:
            self._w.close()
            self._w = None


def _spreadsheet_safe_table(table):
    """Text columns of an Arrow table made spreadsheet-safe (see :func:`gpcore.data.export.spreadsheet_safe`)."""
    import pyarrow as pa

    if not any(pa.types.is_string(f.type) or pa.types.is_large_string(f.type) for f in table.schema):
        return table
    from gpcore.data.export import spreadsheet_safe

    return pa.Table.from_pandas(spreadsheet_safe(table.to_pandas()), schema=table.schema, preserve_index=False)


class GeoTiffSink:
    """Windowed GeoTIFF writer for a :class:`RegularGrid` (bands :data:`TIFF_BANDS`, float32)."""

    def __init__(self, path, grid: RegularGrid, bands=TIFF_BANDS, tags: dict | None = None):
        import rasterio

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.grid, self.bands = grid, tuple(bands)
        self._env = rasterio.Env(GDAL_CACHEMAX=64)
        self._env.__enter__()
        profile = dict(
            driver="GTiff", width=grid.nx, height=grid.ny, count=len(self.bands), dtype="float32",
            crs="EPSG:4326", transform=grid.transform, nodata=np.nan, compress="deflate", predictor=3,
            BIGTIFF="IF_SAFER",
        )
        self._dst = rasterio.open(self.path, "w", **profile)
        for b, name in enumerate(self.bands, start=1):
            self._dst.set_band_description(b, name)
        self._dst.update_tags(grid_kind="lonlat", **{str(k): str(v) for k, v in (tags or {}).items()})
        self.rows = 0

    def write(self, chunk: Chunk, cols: dict[str, np.ndarray]) -> None:
        from rasterio.windows import Window

        g = self.grid
        data = np.empty((len(self.bands), chunk.nrows, g.nx), dtype=np.float32)
        for b, name in enumerate(self.bands):
            v = np.asarray(cols[name], dtype=np.float32)
            if chunk.inside is not None:
                v = np.where(chunk.inside, v, np.float32(np.nan))
            data[b] = v.reshape(chunk.nrows, g.nx)
        self._dst.write(data, window=Window(0, chunk.row0, g.nx, chunk.nrows))
        self.rows += chunk.nrows * g.nx if chunk.inside is None else int(chunk.inside.sum())

    def close(self) -> None:
        if self._dst is not None:
            self._dst.close()
            self._dst = None
            self._env.__exit__(None, None, None)


# --------------------------------------------------------------------------------------------
# prediction
# --------------------------------------------------------------------------------------------


def predict_columns(model, chunk: Chunk, transform, level: float = 0.95) -> dict[str, np.ndarray]:
    """The ``grid.parquet`` columns for one chunk (same definitions as :func:`gpcore.runs.grid_predictions`)."""
    import pandas as pd

    from gpcore.runs import grid_predictions

    frame = pd.DataFrame({"cell_id": chunk.cell_id, "lon": chunk.X[:, 0], "lat": chunk.X[:, 1]})
    out = grid_predictions(model, frame, transform, level)
    return {c: out[c].to_numpy() for c in out.columns}


def _table(cols: dict[str, np.ndarray], keep: np.ndarray | None = None):
    import pyarrow as pa

    if keep is not None:
        cols = {k: v[keep] for k, v in cols.items()}
    return pa.table(cols)


def _output_format(path: Path) -> str:
    suf = path.suffix.lower()
    if suf in (".parquet", ".geoparquet"):
        return "parquet"
    if suf == ".csv":
        return "csv"
    if suf in (".tif", ".tiff"):
        return "geotiff"
    raise ConfigError(f"cannot tell the output format of '{path.name}'; use .parquet, .csv or .tif")


@dataclass
class StreamResult:
    path: Path
    cells: int
    rows_written: int
    seconds: float
    world_size: int = 1

    @property
    def cells_per_second(self) -> float:
        return self.cells / self.seconds if self.seconds > 0 else float("inf")


def stream_predict(
    model,
    source,
    out,
    transform=None,
    *,
    batch_size: int = DEFAULT_BATCH,
    level: float = 0.95,
    progress: bool = True,
    ctx=None,
    tags: dict | None = None,
) -> StreamResult:
    """Predict every cell of ``source`` (:class:`RegularGrid` or :class:`ParquetGrid`) into ``out``.

    ``ctx`` (a :class:`gpcore.distributed.DistContext`) shards batches over ranks; every rank must
    call this with the same arguments; the result (and the file) is complete on rank 0.
    """
    from gpcore.data.transforms import get_transform

    out = Path(out)
    fmt = _output_format(out)
    transform = get_transform(transform)
    if fmt == "geotiff" and not isinstance(source, RegularGrid):
        raise ConfigError("GeoTIFF output needs a generated raster grid (--grid-region); write .parquet for --grid")
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {batch_size}")
    world = ctx.world_size if ctx is not None else 1
    rank = ctx.rank if ctx is not None else 0
    t0 = time.perf_counter()
    total = source.n_cells
    bar = TextProgress(
        (total + world - 1) // world if world > 1 else total,
        label="cells" if world == 1 else f"cells (rank 0 of {world})",
        enabled=progress and rank == 0,
    )
    if world == 1:
        sink = GeoTiffSink(out, source, tags=tags) if fmt == "geotiff" else TableSink(out, fmt)
        try:
            for chunk in source.chunks(batch_size):
                cols = predict_columns(model, chunk, transform, level)
                if fmt == "geotiff":
                    sink.write(chunk, cols)
                else:
                    sink.write(_table(cols, chunk.inside))
                bar.update(len(chunk.cell_id))
            if fmt != "geotiff" and sink.rows == 0 and sink._w is None:
                _write_empty(out, fmt)
        finally:
            sink.close()
            bar.close()
        return StreamResult(out, total, sink.rows, time.perf_counter() - t0)

    # distributed: each rank writes its batches (all rows, plus the inside mask) to a part file
    from gpcore import distributed as D

    parts = out.with_name(out.name + ".parts")
    if rank == 0:
        if parts.exists():
            shutil.rmtree(parts)
        parts.mkdir(parents=True)
    D.barrier(ctx)
    part = TableSink(parts / f"part-{rank:05d}.parquet", "parquet")
    try:
        for chunk in source.chunks(batch_size, rank, world):
            cols = predict_columns(model, chunk, transform, level)
            if chunk.inside is not None:
                cols["_inside"] = chunk.inside
            part.write(_table(cols))
            bar.update(len(chunk.cell_id))
    finally:
        part.close()
        bar.close()
    D.barrier(ctx)
    rows = 0
    if rank == 0:
        rows = _merge_parts(parts, out, fmt, source, batch_size, world, tags)
        shutil.rmtree(parts, ignore_errors=True)
    D.barrier(ctx)
    return StreamResult(out, total, rows, time.perf_counter() - t0, world)


def _write_empty(out: Path, fmt: str) -> None:
    import pyarrow as pa

    cols = ["cell_id", "lon", "lat", "mean_t", "sd_t", "width_t", "mean", "lower", "upper", "width", "sd"]
    schema = pa.schema([(c, pa.int64() if c == "cell_id" else pa.float64()) for c in cols])
    sink = TableSink(out, fmt)
    sink.write(schema.empty_table())
    sink.close()


def _merge_parts(parts: Path, out: Path, fmt: str, source, batch_size: int, world: int, tags) -> int:
    """Stitch part files (batch ``k`` = row group ``k // world`` of part ``k % world``) into ``out``."""
    import pyarrow.parquet as pq

    files = [pq.ParquetFile(str(parts / f"part-{r:05d}.parquet")) if (parts / f"part-{r:05d}.parquet").exists()
             else None for r in range(world)]
    n_chunks = source.n_chunks(batch_size)
    sink = GeoTiffSink(out, source, tags=tags) if fmt == "geotiff" else TableSink(out, fmt)
    try:
        for k in range(n_chunks):
            table = files[k % world].read_row_group(k // world)
            inside = None
            if "_inside" in table.column_names:
                inside = table.column("_inside").to_numpy(zero_copy_only=False)
                table = table.drop_columns(["_inside"])
            if fmt == "geotiff":
                chunk = source.chunk(k, batch_size)
                sink.write(chunk, {c: table.column(c).to_numpy() for c in TIFF_BANDS})
            else:
                sink.write(table.filter(inside) if inside is not None else table)
        if fmt != "geotiff" and sink._w is None:
            _write_empty(out, fmt)
    finally:
        sink.close()
    return sink.rows


# --------------------------------------------------------------------------------------------
# region specs and the run-directory entry point
# --------------------------------------------------------------------------------------------


def region_grid(spec: str, model=None, *, cell_km=None, cell_deg=None, cells=None) -> RegularGrid:
    """A :class:`RegularGrid` from ``bbox:W,E,S,N``, ``state:CODE`` (bounding box, cells outside the
    state dropped / NaN) or ``run`` (the model's training bounding box)."""
    spec = spec.strip()
    mask = None
    if spec.startswith("bbox:"):
        try:
            bounds = tuple(float(v) for v in spec[5:].split(","))
        except ValueError:
            raise ConfigError(f"--grid-region {spec!r}: expected bbox:W,E,S,N (four numbers, degrees)") from None
        if len(bounds) != 4:
            raise ConfigError(f"--grid-region {spec!r}: expected bbox:W,E,S,N (four numbers, degrees)")
    elif spec.startswith("state:"):
        from gpcore.data.regions import state_bbox, state_boundary

        code = spec.split(":", 1)[1]
        bounds = state_bbox(code)
        import shapely

        mask = state_boundary(code)
        shapely.prepare(mask)
    elif spec == "run":
        if model is None or getattr(model, "d_", None) != 2:
            raise ConfigError("--grid-region run needs a run trained on (lon, lat) inputs")
        lo, span = model.x_lo_, model.x_span_
        bounds = (lo[0], lo[0] + span[0], lo[1], lo[1] + span[1])
    else:
        raise ConfigError(f"--grid-region {spec!r} is not understood; use bbox:W,E,S,N, state:CODE or run")
    return RegularGrid.from_bounds(bounds, cell_km=cell_km, cell_deg=cell_deg, cells=cells, mask_geometry=mask)


def predict_run_stream(
    run_dir,
    out,
    *,
    grid: str | None = None,
    grid_region: str | None = None,
    x_cols: tuple[str, str] | None = None,
    id_col: str | None = None,
    cell_km: float | None = None,
    cell_deg: float | None = None,
    cells: int | None = None,
    batch_size: int = DEFAULT_BATCH,
    level: float = 0.95,
    progress: bool = True,
    distributed: bool | None = None,
) -> StreamResult:
    """``python -m gpcore predict RUN_DIR --grid ... | --grid-region ...``; sharded under torchrun."""
    from gpcore import distributed as D
    from gpcore.runs import RunConfig
    from gpcore.store import load_run

    if distributed is None:
        distributed = D.launched_by_torchrun() and int(os.environ.get("WORLD_SIZE", "1")) > 1
    ctx = D.init_distributed(backend="gloo") if distributed else None
    try:
        manifest, model = load_run(run_dir)
        transform = RunConfig.from_dict(manifest["config"]).transform
        if (grid is None) == (grid_region is None):
            raise ConfigError("give exactly one of --grid FILE.parquet or --grid-region SPEC")
        if grid is not None:
            source = ParquetGrid(grid, x_cols, id_col)
        else:
            source = region_grid(grid_region, model, cell_km=cell_km, cell_deg=cell_deg, cells=cells)
        tags = {"model": manifest.get("config", {}).get("model", ""), "transform": transform,
                "level": f"{level:g}", "run": Path(run_dir).name}
        return stream_predict(
            model, source, out, transform, batch_size=batch_size, level=level, progress=progress, ctx=ctx, tags=tags
        )
    finally:
        if ctx is not None:
            D.shutdown()
