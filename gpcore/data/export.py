"""Write predictions on a grid: GeoTIFF, GeoJSON, GeoPackage, CSV or (Geo)Parquet.

The grid is a frame from :func:`gpcore.data.make_grid` with prediction columns added (by default
``mean``, ``sd``, ``lower``, ``upper``, ``width``, one value per cell), or the predictions are passed
separately as ``predictions={"mean": array, ...}`` aligned with the grid's rows.

* GeoTIFF: one float32 band per column (band descriptions = column names), NaN as nodata outside the
  region, in the grid's own CRS (the UTM zone of square grids, EPSG:3857 for quadkey tiles) with the
  grid's affine transform, so every pixel is exactly one cell.
* GeoJSON / GeoPackage / GeoParquet: cell polygons in EPSG:4326 with all columns.
* CSV: one row per cell, without geometry (``cell_id``, ``row``, ``col``, ``lon``, ``lat`` and the columns).
"""

from __future__ import annotations

from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd

from gpcore.data import quadkey as qk
from gpcore.data.grid import GridSpec
from gpcore.errors import DataError

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
    import rasterio
    from rasterio.transform import Affine

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
    profile = dict(
        driver="GTiff",
        width=spec.width,
        height=spec.height,
        count=len(columns),
        dtype="float32",
        crs=rasterio.crs.CRS.from_user_input(spec.crs),
        transform=Affine(*spec.transform),
        nodata=np.nan,
        compress="deflate",
        predictor=3,
    )
    if spec.width >= 256 and spec.height >= 256:
        profile.update(tiled=True, blockxsize=256, blockysize=256)
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data)
        for b, col in enumerate(columns, start=1):
            dst.set_band_description(b, col)
        meta = {"grid_kind": spec.kind}
        if spec.cell_km is not None:
            meta["cell_km"] = f"{spec.cell_km:g}"
        if spec.zoom is not None:
            meta["zoom"] = str(spec.zoom)
        meta.update({str(k): str(v) for k, v in (tags or {}).items()})
        dst.update_tags(**meta)
