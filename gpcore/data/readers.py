"""One entry point for measurement files: :func:`read_measurements`.

It finds the locations (coordinate columns, a WKT or file geometry, Ookla quadkeys or tiles),
reprojects them to EPSG:4326, validates the target, weight and time columns, and either returns a
point GeoDataFrame or raises a :class:`DataError` that names file, column, rows and the fix.
Nothing is dropped silently: rows with missing, non-finite or out-of-range values are an error
unless ``allow_drop=True``, and then each reason is counted in ``gdf.attrs["report"]``.
"""

from __future__ import annotations

import geopandas as gpd
import numpy as np
import pandas as pd

from gpcore.data import temporal
from gpcore.data._locate import locate
from gpcore.data._parsers import read_frame
from gpcore.data._reproject import to_wgs84
from gpcore.data._source import DEFAULT_MAX_BYTES, open_source
from gpcore.data._validate import ReadContext, listing, missing_column, numeric_column, resolve_problems
from gpcore.data.columns import read_table
from gpcore.data.report import ReadReport, values_text
from gpcore.data.transforms import get_transform
from gpcore.errors import DataError

__all__ = ["MIN_POINTS", "read_measurements"]

#: Fewest usable points a read may return.
MIN_POINTS = 10


def read_measurements(
    source,
    *,
    name: str | None = None,
    lon: str | None = None,
    lat: str | None = None,
    geometry: str | None = None,
    crs=None,
    layer: str | int | None = None,
    target: str | None = None,
    transform: str = "identity",
    weight: str | None = None,
    time: str | None = None,
    quarter=None,
    allow_drop: bool = False,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    sep: str | None = None,
    decimal: str = ".",
    min_points: int = MIN_POINTS,
) -> gpd.GeoDataFrame:
    """Read point measurements from a file or upload into an EPSG:4326 GeoDataFrame.

    Formats (detected from the content, then the name): CSV/TSV/text (delimiter sniffed), Parquet and
    GeoParquet, GeoJSON, GeoPackage (``layer`` picks the layer), Shapefile (zipped, or a ``.shp`` path
    beside its parts), a zip holding one CSV/Parquet file, or a DataFrame/GeoDataFrame.

    Locations, in order of preference: ``lon``/``lat`` columns when given; the ``geometry`` column when
    given (WKT text, WKB bytes or shapely objects); the file's own geometry; columns named
    lon/lng/long/longitude and lat/latitude (any case); Ookla ``tile_x``/``tile_y`` (tile centres);
    Ookla ``quadkey`` (web-mercator tile centres); a WKT column (``geometry``, ``wkt``, Ookla ``tile``...);
    ``x``/``y`` or ``easting``/``northing``. Polygons and lines become their centroids, computed in a
    local equal-area projection. The CRS is the file's when it has one, else ``crs``, else EPSG:4326;
    everything is reprojected to EPSG:4326.

    Parameters
    ----------
    source : path, bytes, file-like, DataFrame or GeoDataFrame
        The data. For bytes and uploads, ``name`` (the file name) drives format detection and messages.
    name : str, optional
        File name shown in messages (default: the path's name, or the upload's ``.name``).
    lon, lat : str, optional
        Coordinate columns (both or neither).
    geometry : str, optional
        A geometry column (WKT text, WKB or shapely objects).
    crs : str, int or pyproj.CRS, optional
        CRS of the coordinates when the file does not say (e.g. ``"EPSG:32615"``); overrides the file's with a note.
    layer : str or int, optional
        Layer of a GeoPackage or of a zip holding several Shapefiles (default: the first, with a note).
    target : str, optional
        Column to model; validated to be numeric and finite (and positive under a log transform).
        ``"download_mbps"``/``"upload_mbps"`` are available for Ookla files (``avg_d_kbps / 1000``).
    transform : {"identity", "log10", "log"}
        Target transform the target is validated for (the values are not transformed here).
    weight : str, optional
        Per-row weight column (e.g. Ookla ``tests``); must be finite and >= 0.
    time : str, optional
        Quarter/date column; found automatically under the names in ``temporal.TIME_COLUMN_NAMES``.
        When a time column is used, a float column ``time_year`` (decimal years) is added.
    quarter : str or list, optional
        Keep only this period: ``"2023"``, ``"2023Q1"``, ``"2021Q3:2022Q2"``, a list, or ``"all"``.
    allow_drop : bool
        Drop unusable rows (missing, non-finite, non-numeric, out of range, non-positive under a log
        transform) instead of raising; each reason is counted in the report.
    max_bytes : int or None
        Largest file size read (default :data:`DEFAULT_MAX_BYTES`, 200 MB); None for no limit.
    sep, decimal : str, optional
        CSV delimiter (default: sniffed among ``, TAB ; |``) and decimal mark (default ``"."``).
    min_points : int
        Fewest usable points accepted (default 10).

    Returns
    -------
    geopandas.GeoDataFrame
        n rows (the usable ones, in file order), point geometry in EPSG:4326, float columns ``lon`` and
        ``lat`` (degrees), the original columns, ``download_mbps``/``upload_mbps`` for Ookla files and
        ``time_year`` when a time column is used. ``attrs``: ``report`` (:class:`ReadReport`), ``target``,
        ``transform``, ``weight``, ``time``.

    Raises
    ------
    DataError
        For any problem with the input; the message names file, column, rows (1-based data rows) and the fix.

    Examples
    --------
    >>> from gpcore.data import read_measurements, sample_path
    >>> gdf = read_measurements(sample_path("missouri_2020Q4"), target="download_mbps", transform="log10")
    >>> gdf.crs.to_epsg(), len(gdf)
    (4326, 22559)
    """
    tr = get_transform(transform)
    if isinstance(source, pd.DataFrame):
        label = name or "table"
        report = ReadReport(file=label, format="table")
        df = source.copy()
        delim = None
    else:
        src = open_source(source, name, max_bytes)
        report = ReadReport(file=src.name)
        df, fmt, delim = read_frame(src, report, layer=layer, sep=sep, decimal=decimal)
        report.format = fmt
    report.transform = tr.name
    if len(df) == 0:
        raise DataError(f"file '{report.file}' has no rows; choose a file with data")
    df = df.reset_index(drop=True)
    df.columns = [str(c) for c in df.columns] if not isinstance(df, gpd.GeoDataFrame) else df.columns
    report.rows_read = len(df)
    ctx = ReadContext(report.file, report, np.arange(1, len(df) + 1), decimal_comma_ok=delim not in (None, ","))

    # 1. time column and period filter
    time_col, time_values = _time_column(df, ctx, time, quarter)
    if quarter is not None and not (isinstance(quarter, str) and quarter.strip().lower() == "all"):
        if time_col is None:
            raise DataError(
                f"{ctx.where()}: quarter={quarter!r} was requested but no time column was found; columns: "
                f"{listing(df.columns)}. Pass time='COLUMN' naming the quarter or date column"
            )
        keep = temporal.select_time(df[time_col], quarter)
        if not keep.any():
            available = pd.unique(pd.Series(temporal.quarter_labels(df[time_col])).dropna())
            raise DataError(
                f"{ctx.where()}, column '{time_col}': no rows in the period {quarter!r}; the file has "
                f"{listing(sorted(map(str, available)), 24)}"
            )
        if not keep.all():
            report.drop(f"outside the requested period {quarter!r} (column '{time_col}')", ctx.rows[~keep])
        df = df.loc[keep].reset_index(drop=True)
        time_values = time_values[keep]
        ctx.rows = ctx.rows[keep]

    # 2. locations
    x, y, crs_in = locate(df, ctx, lon=lon, lat=lat, geometry=geometry, crs=crs)
    lon_v, lat_v = to_wgs84(x, y, crs_in, ctx, explicit=lon is not None and lat is not None)

    # 3. derived Ookla columns, then target, weight and time checks
    df = _ookla_extras(df, report)
    if target is not None or weight is not None:
        df = df.copy()
    if target is not None:
        df[target] = _check_target(df, ctx, target, tr)
    if weight is not None:
        df[weight] = _check_weight(df, ctx, weight)
    if time_col is not None:
        bad = ~np.isfinite(time_values)
        ctx.problem(
            "values not readable as a date or quarter",
            time_col,
            bad,
            "write quarters like '2023Q1' or dates like '2023-02-17'",
        )
        report.columns["time"] = time_col

    # 4. drop or raise
    keep = resolve_problems(ctx, allow_drop)
    n_keep = int(keep.sum())
    if n_keep < min_points:
        dropped = len(keep) - n_keep
        why = f" ({dropped} dropped: {'; '.join(d.reason for d in report.dropped)})" if report.dropped else ""
        raise DataError(
            f"{ctx.where()}: only {n_keep} usable point(s) of {report.rows_read} read{why}; at least {min_points} "
            "are needed to fit a model. Load more data (a longer period, a larger region) or fix the dropped rows"
        )

    # 5. assemble the result
    out = pd.DataFrame(df.drop(columns=df.geometry.name)) if isinstance(df, gpd.GeoDataFrame) else df
    out = out.loc[keep].reset_index(drop=True)
    for col in ("lon", "lat"):
        if col in out.columns and report.columns.get(col) != col:
            report.notes.append(f"the original column '{col}' was replaced by the coordinates read")
    out["lon"] = lon_v[keep]
    out["lat"] = lat_v[keep]
    if time_col is not None:
        out["time_year"] = time_values[keep]
    if "geometry" in out.columns:
        out = out.rename(columns={"geometry": "geometry_wkt"})
    gdf = gpd.GeoDataFrame(out, geometry=gpd.points_from_xy(out["lon"], out["lat"]), crs="EPSG:4326")
    report.rows_kept = len(gdf)
    if target is not None:
        report.columns["target"] = target
        yv = gdf[target].to_numpy(dtype=float)
        with np.errstate(over="ignore", invalid="ignore"):  # values near the float limit: the fit explains
            report.target_summary = {
                "min": float(np.min(yv)),
                "median": float(np.median(yv)),
                "mean": float(np.mean(yv)),
                "max": float(np.max(yv)),
            }
    if weight is not None:
        report.columns["weight"] = weight
    gdf.attrs.update(report=report, target=target, transform=tr.name, weight=weight, time=time_col)
    return gdf


def _ookla_extras(df: pd.DataFrame, report: ReadReport) -> pd.DataFrame:
    pairs = (("avg_d_kbps", "download_mbps"), ("avg_u_kbps", "upload_mbps"))
    found = [(k, m) for k, m in pairs if k in df.columns]
    if not found:
        return df
    df = df.copy()
    for kbps, mbps in found:
        df[mbps] = pd.to_numeric(df[kbps], errors="coerce").astype(float) / 1000.0
    report.notes.append("Ookla speeds: " + ", ".join(f"{m} = {k} / 1000" for k, m in found) + " (Mbps)")
    return df


def _check_target(df: pd.DataFrame, ctx: ReadContext, target: str, tr) -> np.ndarray:
    if target not in df.columns:
        extra = ""
        if target in ("download_mbps", "upload_mbps"):
            extra = " 'download_mbps'/'upload_mbps' exist only for Ookla files with avg_d_kbps/avg_u_kbps columns."
        raise missing_column(ctx, df, target, "target", extra)
    numeric = [
        str(c) for c in df.columns if pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])
    ]
    y = numeric_column(
        df, target, ctx, "target", numeric_hint=f"choose a numeric target column: {listing(numeric, 15)}"
    )
    bad = tr.invalid(y)
    if bad.any():
        vals = values_text([float(v) for v in y[bad][:5]])
        hint = "use transform='identity', or remove or offset those values"
        if bad.sum() > 0.5 * np.isfinite(y).sum():
            raise DataError(
                f"{ctx.where(target)}: {int(bad.sum())} values are zero or negative (e.g. {vals} in "
                f"{ctx.rows_of(bad)}), so a {tr.name} transform is impossible; {hint}"
            )
        ctx.problem(f"zero or negative values ({vals}) under a {tr.name} transform", target, bad, hint)
    return y


def _check_weight(df: pd.DataFrame, ctx: ReadContext, weight: str) -> np.ndarray:
    if weight not in df.columns:
        raise missing_column(ctx, df, weight, "weight")
    w = numeric_column(df, weight, ctx, "weight")
    with np.errstate(invalid="ignore"):
        neg = np.isfinite(w) & (w < 0)
    ctx.problem("negative weights", weight, neg, "weights must be >= 0")
    return w


def _time_column(df: pd.DataFrame, ctx: ReadContext, time, quarter) -> tuple[str | None, np.ndarray]:
    if time is not None:
        if time not in df.columns:
            raise missing_column(ctx, df, time, "time")
        vals = temporal.decimal_year(df[time])
        if np.isnan(vals).all():
            raise DataError(
                f"{ctx.where(time)}: no value is a date, quarter or year (e.g. "
                f"{values_text(df[time].head(5).tolist())}); write quarters like '2023Q1' or dates like '2023-02-17'"
            )
        return time, vals
    auto, vals = _auto_time(df)
    if auto is not None and vals is None:
        ctx.report.notes.append(f"column '{auto}' is not used as time (its values are not dates or quarters)")
    if vals is None:
        return None, np.full(len(df), np.nan)
    return auto, vals


def _auto_time(df: pd.DataFrame) -> tuple[str | None, np.ndarray | None]:
    """The column named like a time column (:func:`temporal.find_time_column`) and its decimal years; the years
    are None when no column is so named or fewer than 90 % of its values are times (it is then not used)."""
    auto = temporal.find_time_column(
        [c for c in df.columns if not (isinstance(df, gpd.GeoDataFrame) and c == df.geometry.name)]
    )
    if auto is None:
        return None, None
    vals = temporal.decimal_year(df[auto])
    return (auto, vals) if np.mean(np.isfinite(vals)) >= 0.9 else (auto, None)


def detected_time_column(source) -> str | None:
    """The time column :func:`read_measurements` uses for ``source`` when none is named (None when none is).

    Reads the file as :func:`read_measurements` does with its defaults; raises :class:`DataError` as it would.
    """
    df = read_table(source)
    df.columns = [str(c) for c in df.columns] if not isinstance(df, gpd.GeoDataFrame) else df.columns
    auto, vals = _auto_time(df)
    return auto if vals is not None else None
