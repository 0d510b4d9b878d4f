"""Write predictions on a grid: GeoTIFF, GeoJSON, GeoPackage, CSV or (Geo)Parquet.

The grid is a frame from :func:`gpcore.data.make_grid` with prediction columns added (by default
``mean``, ``sd``, ``lower``, ``upper``, ``width``, one value per cell), or the predictions are passed
separately as ``predictions={"mean": array, ...}`` aligned with the grid's rows.

* GeoTIFF: one float32 band per column (band descriptions = column names), NaN as nodata outside the
  region, in the grid's own CRS (the UTM zone of square grids, EPSG:3857 for quadkey tiles) with the
  grid's affine transform, so every pixel is exactly one cell.
* GeoJSON / GeoPackage / GeoParquet: cell polygons in EPSG:4326 with all columns.
* CSV: one row per cell, without geometry (``cell_id``, ``row``, ``col``, ``lon``, ``lat`` and the columns).

Streamed prediction (:mod:`gpcore.run.predict`) writes through the sinks :func:`open_sink` opens: Parquet and
CSV batch by batch, GeoTIFF by windows of raster rows (:class:`GeoTiffWriter`, the same writer as above).
"""

from __future__ import annotations

from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd

from gpcore.data import quadkey as qk
from gpcore.data.grid import GridSpec
from gpcore.errors import ConfigError, DataError

PRED_COLUMNS = ("mean", "sd", "lower", "upper", "width")
FORMATS = {
    ".tif": "geotiff",
    ".tiff": "geotiff",
    ".geojson": "geojson",
    ".json": "geojson",
    ".gpkg": "gpkg",
    ".csv": "csv",
    ".parquet": "parquet",
    ".geoparquet": "parquet",
}


#: A text cell starting with one of these is a formula in spreadsheets (``=cmd|' /C calc'!A0``).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every text cell that a spreadsheet would run as a formula prefixed by ``'`` (as
    spreadsheet-safe CSV writers do); numeric columns are untouched. Use it for every CSV written."""
    out = frame
    for col in frame.columns:
        s = frame[col]
        if pd.api.types.is_object_dtype(s) or pd.api.types.is_string_dtype(s):
            text = s.astype("string")
            risky = text.str.startswith(FORMULA_START).fillna(False).to_numpy(dtype=bool) & s.map(
                lambda v: isinstance(v, str)
            ).to_numpy(dtype=bool)
            if risky.any():
                if out is frame:
                    out = frame.copy()
                out[col] = s.where(~risky, "'" + text)
    return out


def export_predictions(
    grid: gpd.GeoDataFrame,
    path,
    *,
    predictions=None,
    columns=PRED_COLUMNS,
    format: str | None = None,
    tags: dict | None = None,
    layer: str = "predictions",
) -> Path:
    """Write per-cell predictions to ``path``.

    Parameters
    ----------
    grid : GeoDataFrame
        m cells from :func:`make_grid` (``cell_id``, ``row``, ``col``, ``lon``, ``lat``, polygon), holding the
        prediction ``columns`` unless ``predictions`` gives them.
    path : str or Path
        Output file; its folder is created. The suffix picks the format unless ``format`` is given.
    predictions : mapping or DataFrame, optional
        ``{name: array of shape (m,)}`` added to the grid before writing.
    columns : sequence of str
        Prediction columns to write (GeoTIFF bands in this order). Default mean, sd, lower, upper, width.
    format : {"geotiff", "geojson", "gpkg", "csv", "parquet"}, optional
    tags : dict, optional
        GeoTIFF metadata (e.g. ``{"units": "log10(Mbps)", "model": "dbk"}``).
    layer : str
        GeoPackage layer name.

    Returns
    -------
    Path
        The file written.
    """
    path = Path(path)
    fmt = format or FORMATS.get(path.suffix.lower())
    if fmt not in set(FORMATS.values()):
        raise DataError(
            f"cannot tell the export format of '{path.name}'; use a suffix among {', '.join(sorted(FORMATS))} "
            "or pass format="
        )
    if not isinstance(grid, gpd.GeoDataFrame):
        raise DataError("export_predictions needs the grid GeoDataFrame from make_grid")
    out = grid.copy()
    if predictions is not None:
        for name, values in dict(predictions).items():
            arr = np.asarray(values, dtype=float).ravel()
            if len(arr) != len(out):
                raise DataError(f"prediction '{name}' has {len(arr)} values but the grid has {len(out)} cells")
            out[name] = arr
    columns = list(columns)
    missing = [c for c in columns if c not in out.columns]
    if missing:
        raise DataError(
            f"the grid has no column(s) {', '.join(missing)}; add them (one value per cell) "
            "or pass predictions= / columns="
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if fmt == "geotiff":
            _write_geotiff(out, path, columns, tags)
        elif fmt == "csv":
            spreadsheet_safe(pd.DataFrame(out.drop(columns=out.geometry.name))).to_csv(path, index=False)
        elif fmt == "parquet":
            out.to_parquet(path, index=False)
        elif fmt == "geojson":
            if path.exists():
                path.unlink()
            out.to_crs(4326).to_file(path, driver="GeoJSON", engine="pyogrio")
        else:
            out.to_crs(4326).to_file(path, driver="GPKG", layer=layer, engine="pyogrio")
    except DataError:
        raise
    except OSError as e:
        raise DataError(f"cannot write '{path}': {e}") from None
    return path


def grid_spec(grid: gpd.GeoDataFrame) -> GridSpec:
    """The :class:`GridSpec` of a grid: from ``attrs["grid"]``, or rebuilt from quadkey cell ids."""
    spec = grid.attrs.get("grid")
    if isinstance(spec, GridSpec):
        return spec
    if isinstance(spec, dict) and {"kind", "crs", "transform", "width", "height"} <= set(spec):
        # a layout that went through Parquet metadata (JSON) comes back as a dict
        return GridSpec(**{**spec, "transform": tuple(spec["transform"])})
    if "cell_id" in grid.columns and not pd.api.types.is_numeric_dtype(grid["cell_id"]):
        tx, ty, zoom, ok = qk.parse_quadkeys(grid["cell_id"].astype("string").to_numpy(dtype=object, na_value=None))
        if ok.all() and len(ok) and (zoom == zoom[0]).all():
            z = int(zoom[0])
            size = qk.tile_size_m(z)
            x0 = -qk.MERC_HALF + tx.min() * size
            y1 = qk.MERC_HALF - ty.min() * size
            return GridSpec(
                "quadkey",
                "EPSG:3857",
                (size, 0.0, x0, 0.0, -size, y1),
                int(tx.max() - tx.min() + 1),
                int(ty.max() - ty.min() + 1),
                size,
                zoom=z,
            )
    raise DataError(
        "GeoTIFF export needs a grid from make_grid (its attrs['grid'] layout was lost, e.g. by pd.concat); "
        "export from the grid frame itself or use GeoJSON/GeoPackage/CSV/Parquet"
    )


def _write_geotiff(grid: gpd.GeoDataFrame, path: Path, columns: list[str], tags: dict | None) -> None:
    spec = grid_spec(grid)
    if {"row", "col"} <= set(grid.columns) and isinstance(grid.attrs.get("grid"), dict):
        rows = grid["row"].to_numpy(dtype=np.int64)
        cols = grid["col"].to_numpy(dtype=np.int64)
    elif spec.kind == "square":
        rows, cols = np.divmod(grid["cell_id"].to_numpy(dtype=np.int64), spec.width)
    else:
        tx, ty, _, _ = qk.parse_quadkeys(grid["cell_id"].astype("string").to_numpy(dtype=object, na_value=None))
        a, _, x0, _, _, y1 = spec.transform
        rows = ty - int(round((qk.MERC_HALF - y1) / a))
        cols = tx - int(round((x0 + qk.MERC_HALF) / a))
    if len(rows) and (rows.min() < 0 or cols.min() < 0 or rows.max() >= spec.height or cols.max() >= spec.width):
        raise DataError("the grid's row/col columns do not fit its layout; export the grid returned by make_grid")
    data = np.full((len(columns), spec.height, spec.width), np.nan, dtype=np.float32)
    for b, col in enumerate(columns):
        data[b, rows, cols] = grid[col].to_numpy(dtype=float)
    with GeoTiffWriter(path, spec, columns, tags, tiled=spec.width >= 256 and spec.height >= 256) as dst:
        dst.write_rows(data, 0)


class GeoTiffWriter:
    """The one GeoTIFF writer: float32 bands named after their columns, NaN as nodata, placed by a
    :class:`GridSpec` (its CRS and affine transform, so every pixel is exactly one cell), written whole or by
    windows of raster rows (``write_rows``; a streamed raster never holds more than one batch)."""

    def __init__(self, path, spec: GridSpec, bands, tags: dict | None = None, tiled: bool = False):
        import rasterio
        from rasterio.transform import Affine

        self.path, self.spec, self.bands = Path(path), spec, tuple(bands)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._env = rasterio.Env(GDAL_CACHEMAX=64)
        self._env.__enter__()
        profile = dict(
            driver="GTiff", width=spec.width, height=spec.height, count=len(self.bands), dtype="float32",
            crs=rasterio.crs.CRS.from_user_input(spec.crs), transform=Affine(*spec.transform), nodata=np.nan,
            compress="deflate", predictor=3, BIGTIFF="IF_SAFER",
        )
        if tiled:
            profile.update(tiled=True, blockxsize=256, blockysize=256)
        self._dst = rasterio.open(self.path, "w", **profile)
        for b, name in enumerate(self.bands, start=1):
            self._dst.set_band_description(b, name)
        meta = {"grid_kind": spec.kind}
        if spec.cell_km is not None:
            meta["cell_km"] = f"{spec.cell_km:g}"
        if spec.zoom is not None:
            meta["zoom"] = str(spec.zoom)
        meta.update({str(k): str(v) for k, v in (tags or {}).items()})
        self._dst.update_tags(**meta)

    def write_rows(self, data: np.ndarray, row0: int) -> None:
        """Write ``data`` (bands x rows x width, float32) at raster rows ``row0 ...``."""
        from rasterio.windows import Window

        self._dst.write(data, window=Window(0, row0, self.spec.width, data.shape[1]))

    def close(self) -> None:
        if self._dst is not None:
            self._dst.close()
            self._dst = None
            self._env.__exit__(None, None, None)

    def __enter__(self) -> GeoTiffWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# sinks of streamed prediction (gpcore.run.predict): written batch by batch, bounded memory
# --------------------------------------------------------------------------------------------

#: GeoTIFF bands of streamed predictions
TIFF_BANDS = ("mean", "sd", "lower", "upper", "width")
#: the columns of a run's grid predictions (``gpcore.run.predict.grid_predictions``)
STREAM_COLUMNS = ("cell_id", "lon", "lat", "mean_t", "sd_t", "width_t", "mean", "lower", "upper", "width", "sd")
STREAM_FORMATS = {".parquet": "parquet", ".geoparquet": "parquet", ".csv": "csv", ".tif": "geotiff",
                  ".tiff": "geotiff"}


def stream_format(path) -> str:
    """``"parquet"``, ``"csv"`` or ``"geotiff"`` from a file name (ConfigError otherwise)."""
    fmt = STREAM_FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise ConfigError(f"cannot tell the output format of '{Path(path).name}'; use .parquet, .csv or .tif")
    return fmt


class TableSink:
    """Incremental Parquet (``pyarrow.parquet.ParquetWriter``, one row group per batch) or CSV
    (``pyarrow.csv.CSVWriter``, spreadsheet-safe). Nothing is created before the first write or close."""

    def __init__(self, path, fmt: str = "parquet"):
        self.path = Path(path)
        self.fmt = fmt
        self._w = None
        self.rows = 0

    def write(self, cols: dict[str, np.ndarray], chunk=None) -> None:
        """Write a batch of columns (only the cells inside the region when ``chunk.inside`` says which)."""
        import pyarrow as pa

        keep = getattr(chunk, "inside", None)
        self.write_table(pa.table(cols if keep is None else {k: v[keep] for k, v in cols.items()}))

    def write_table(self, table) -> None:
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

    def close(self, complete: bool = True) -> None:
        """Finish the file (an empty table with the prediction columns when nothing was written; nothing at all
        when ``complete`` is False, after a failure)."""
        if self._w is None:
            if not complete:
                return
            import pyarrow as pa

            schema = pa.schema([(c, pa.int64() if c == "cell_id" else pa.float64()) for c in STREAM_COLUMNS])
            self.write_table(schema.empty_table())
        self._w.close()


def _spreadsheet_safe_table(table):
    """Text columns of an Arrow table made spreadsheet-safe (see :func:`spreadsheet_safe`)."""
    import pyarrow as pa

    if not any(pa.types.is_string(f.type) or pa.types.is_large_string(f.type) for f in table.schema):
        return table
    return pa.Table.from_pandas(spreadsheet_safe(table.to_pandas()), schema=table.schema, preserve_index=False)


class RasterSink:
    """Streamed GeoTIFF of a :class:`gpcore.data.grid.RegularGrid`: batches of whole raster rows, bands
    :data:`TIFF_BANDS`, NaN outside the region. Nothing is created before the first write or close."""

    def __init__(self, path, grid, bands=TIFF_BANDS, tags: dict | None = None):
        self.path, self.grid, self.bands, self.tags = Path(path), grid, tuple(bands), tags
        self._w: GeoTiffWriter | None = None
        self.rows = 0

    def _writer(self) -> GeoTiffWriter:
        if self._w is None:
            self._w = GeoTiffWriter(self.path, self.grid.spec, self.bands, self.tags)
        return self._w

    def write(self, cols: dict[str, np.ndarray], chunk) -> None:
        nx = self.grid.nx
        data = np.empty((len(self.bands), chunk.nrows, nx), dtype=np.float32)
        for b, name in enumerate(self.bands):
            v = np.asarray(cols[name], dtype=np.float32)
            if chunk.inside is not None:
                v = np.where(chunk.inside, v, np.float32(np.nan))
            data[b] = v.reshape(chunk.nrows, nx)
        self._writer().write_rows(data, chunk.row0)
        self.rows += chunk.nrows * nx if chunk.inside is None else int(chunk.inside.sum())

    def close(self, complete: bool = True) -> None:
        if self._w is not None or complete:
            self._writer().close()


def open_sink(path, source, tags: dict | None = None):
    """The sink for ``path``'s format: :class:`TableSink` (Parquet, CSV) or :class:`RasterSink` (GeoTIFF, only
    for a generated raster source: cells read from a file have no raster layout)."""
    from gpcore.data.grid import RegularGrid

    fmt = stream_format(path)
    if fmt != "geotiff":
        return TableSink(path, fmt)
    if not isinstance(source, RegularGrid):
        raise ConfigError("GeoTIFF output needs a generated raster grid (a region); write .parquet or .csv for "
                          "cells read from a file")
    return RasterSink(path, source, tags=tags)


#: formats of :func:`write_frame` by suffix
FRAME_FORMATS = {".csv": "csv", ".parquet": "parquet", ".geojson": "geojson", ".json": "geojson", ".tif": "geotiff",
                 ".tiff": "geotiff"}


def frame_format(path, allowed: tuple[str, ...]) -> str:
    """The format of an output file among ``allowed`` (DataError naming the suffixes to use otherwise)."""
    path = Path(path)
    fmt = FRAME_FORMATS.get(path.suffix.lower())
    if fmt not in allowed:
        want = ", ".join(sorted({k for k, v in FRAME_FORMATS.items() if v in allowed and k not in (".json", ".tiff")}))
        raise DataError(f"'{path.name}': use a file ending in {want}")
    return fmt


def write_frame(df, path, fmt: str) -> None:
    """Write a table (CSV spreadsheet-safe and without geometry, Parquet) or a GeoDataFrame (also GeoJSON)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "csv":
        table = df.drop(columns=df.geometry.name) if isinstance(df, gpd.GeoDataFrame) else df
        spreadsheet_safe(pd.DataFrame(table)).to_csv(path, index=False)
    elif fmt == "parquet":
        df.to_parquet(path, index=False)
    else:
        if not isinstance(df, gpd.GeoDataFrame):
            raise DataError(f"'{path.name}': these rows have no polygons; write .csv or .parquet instead")
        if path.exists():
            path.unlink()
        df.to_crs(4326).to_file(path, driver="GeoJSON", engine="pyogrio")
