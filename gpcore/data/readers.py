"""One entry point for measurement files: :func:`read_measurements`.

It finds the locations (coordinate columns, a WKT or file geometry, Ookla quadkeys or tiles),
reprojects them to EPSG:4326, validates the target, weight and time columns, and either returns a
point GeoDataFrame or raises a :class:`DataError` that names file, column, rows and the fix.
Nothing is dropped silently: rows with missing, non-finite or out-of-range values are an error
unless ``allow_drop=True``, and then each reason is counted in ``gdf.attrs["report"]``.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

import geopandas as gpd
import numpy as np
import pandas as pd
import pyproj
import shapely

from gpcore.data import _bundled, quadkey, temporal
from gpcore.data._crs import WGS84, centre_of, laea_crs, project, project_geometry
from gpcore.data._formats import (
    DEFAULT_MAX_BYTES,
    Source,
    detect_format,
    norm_name,
    open_source,
    read_csv,
    read_ogr,
    read_parquet,
)
from gpcore.data.report import ROWS_NOTE, ReadReport, rows_text, values_text
from gpcore.data.transforms import get_transform
from gpcore.errors import DataError

__all__ = ["DEFAULT_MAX_BYTES", "MIN_POINTS", "read_measurements"]

#: Fewest usable points a read may return.
MIN_POINTS = 10

#: Coordinate column names (normalised: lower case, letters and digits only), in order of preference.
LON_NAMES = ("lon", "lng", "long", "longitude", "londeg", "longitudedeg", "decimallongitude", "lonwgs84")
LAT_NAMES = ("lat", "latitude", "latdeg", "latitudedeg", "decimallatitude", "latwgs84")
XY_PAIRS = (("tilex", "tiley"), ("x", "y"), ("pointx", "pointy"), ("xcoord", "ycoord"), ("easting", "northing"))
WKT_NAMES = ("geometry", "geom", "wkt", "thegeom", "wktgeom", "tile", "shape", "footprint")
NA_TOKENS = {"", "na", "n/a", "nan", "null", "none", "-", "--", "?", "missing", "#n/a", "nd", "<na>"}
_WKT_RE = re.compile(
    r"^\s*(SRID=\d+;\s*)?(POINT|MULTIPOINT|LINESTRING|MULTILINESTRING|POLYGON|MULTIPOLYGON|GEOMETRYCOLLECTION)\b",
    re.IGNORECASE,
)
_DECIMAL_COMMA = re.compile(r"^[+-]?\d+,\d+$")
_PROJECTED_GUESSES = (
    "EPSG:3857",
    "EPSG:5070",
    "EPSG:32604",
    "EPSG:32605",
    "EPSG:32612",
    "EPSG:32613",
    "EPSG:32615",
    "EPSG:32616",
    "EPSG:32617",
    "EPSG:32619",
    "EPSG:32620",
)


@dataclass
class _Problem:
    """Rows that cannot be used for one reason (dropped only with ``allow_drop``)."""

    reason: str
    column: str | None
    mask: np.ndarray
    hint: str = ""


@dataclass
class _Ctx:
    src_name: str
    report: ReadReport
    rows: np.ndarray  # 1-based row numbers of the current frame
    decimal_comma_ok: bool = False
    crs_from_file: bool = False
    problems: list[_Problem] = field(default_factory=list)

    def where(self, column=None) -> str:
        return f"file '{self.src_name}'" + (f", column '{column}'" if column is not None else "")

    def rows_of(self, mask: np.ndarray) -> str:
        idx = np.flatnonzero(mask)
        return f"{rows_text(self.rows[idx], len(idx))}; {ROWS_NOTE}"

    def problem(self, reason: str, column, mask: np.ndarray, hint: str = "") -> None:
        if mask.any():
            self.problems.append(_Problem(reason, column, mask.copy(), hint))


# --------------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------------


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
        df, fmt, delim = _read_frame(src, report, layer=layer, sep=sep, decimal=decimal)
        report.format = fmt
    report.transform = tr.name
    if len(df) == 0:
        raise DataError(f"file '{report.file}' has no rows; choose a file with data")
    df = df.reset_index(drop=True)
    df.columns = [str(c) for c in df.columns] if not isinstance(df, gpd.GeoDataFrame) else df.columns
    report.rows_read = len(df)
    ctx = _Ctx(report.file, report, np.arange(1, len(df) + 1), decimal_comma_ok=delim not in (None, ","))

    # 1. time column and period filter
    time_col, time_values = _time_column(df, ctx, time, quarter)
    if quarter is not None and not (isinstance(quarter, str) and quarter.strip().lower() == "all"):
        if time_col is None:
            raise DataError(
                f"{ctx.where()}: quarter={quarter!r} was requested but no time column was found; columns: "
                f"{_listing(df.columns)}. Pass time='COLUMN' naming the quarter or date column"
            )
        keep = temporal.select_time(df[time_col], quarter)
        if not keep.any():
            available = pd.unique(pd.Series(temporal.quarter_labels(df[time_col])).dropna())
            raise DataError(
                f"{ctx.where()}, column '{time_col}': no rows in the period {quarter!r}; the file has "
                f"{_listing(sorted(map(str, available)), 24)}"
            )
        if not keep.all():
            report.drop(f"outside the requested period {quarter!r} (column '{time_col}')", ctx.rows[~keep])
        df = df.loc[keep].reset_index(drop=True)
        time_values = time_values[keep]
        ctx.rows = ctx.rows[keep]

    # 2. locations
    x, y, crs_in = _locate(df, ctx, lon=lon, lat=lat, geometry=geometry, crs=crs)
    lon_v, lat_v = _to_wgs84(x, y, crs_in, ctx, explicit=lon is not None and lat is not None)

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
    keep = _resolve_problems(ctx, allow_drop)
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


# --------------------------------------------------------------------------------------------------
# Reading the file
# --------------------------------------------------------------------------------------------------


def _read_frame(src: Source, report: ReadReport, *, layer, sep, decimal) -> tuple[pd.DataFrame, str, str | None]:
    fmt = detect_format(src)
    if fmt == "csv":
        df, delim = read_csv(src, report, sep=sep, decimal=decimal)
        return df, "csv" if delim == "," else f"csv (delimiter {delim!r})", delim
    if fmt == "parquet":
        df, kind = read_parquet(src, report)
        return df, kind, None
    df, kind = read_ogr(src, fmt, report, layer=layer)
    return df, kind, ";" if kind.startswith("csv (") else ("," if kind == "csv" else None)


def _listing(names, limit: int = 30) -> str:
    names = [str(n) for n in names]
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "") if names else "(none)"


def _missing_column(ctx: _Ctx, df: pd.DataFrame, column: str, role: str, extra: str = "") -> DataError:
    cols = [str(c) for c in df.columns if not (isinstance(df, gpd.GeoDataFrame) and c == df.geometry.name)]
    close = difflib.get_close_matches(str(column), cols, n=3, cutoff=0.6)
    lower = [c for c in cols if c.lower() == str(column).lower()]
    hint = f" Did you mean {', '.join(repr(c) for c in (lower or close))}?" if (lower or close) else ""
    return DataError(f"{ctx.where()}: no {role} column '{column}'; columns are: {_listing(cols)}.{hint}{extra}")


# --------------------------------------------------------------------------------------------------
# Numbers
# --------------------------------------------------------------------------------------------------


def _numeric(df: pd.DataFrame, column: str, ctx: _Ctx, role: str, *, numeric_hint: str = "") -> np.ndarray:
    """Column as float array, shape (n,); records missing / non-numeric / infinite rows as problems."""
    s = df[column]
    if isinstance(s, pd.DataFrame):
        raise DataError(f"{ctx.where(column)}: the name appears more than once; rename the duplicate columns")
    n = len(s)
    if pd.api.types.is_bool_dtype(s):
        raise DataError(f"{ctx.where(column)}: holds True/False values, not numbers; choose a numeric {role} column")
    if pd.api.types.is_numeric_dtype(s):
        v = s.to_numpy(dtype=float, na_value=np.nan)
        text_bad = np.zeros(n, dtype=bool)
        missing = np.isnan(v)
    else:
        text = s.astype("string").str.strip()
        missing = (text.isna() | text.str.lower().isin(NA_TOKENS)).to_numpy(dtype=bool)
        num = pd.to_numeric(text.mask(missing), errors="coerce")
        v = num.to_numpy(dtype=float, na_value=np.nan)
        text_bad = np.isnan(v) & ~missing
        if text_bad.any():
            bad_vals = text[text_bad]
            commas = bad_vals.str.fullmatch(_DECIMAL_COMMA.pattern).fillna(False).to_numpy(dtype=bool)
            if commas.all() and ctx.decimal_comma_ok:
                fixed = pd.to_numeric(bad_vals.str.replace(",", ".", regex=False), errors="coerce")
                v[text_bad] = fixed.to_numpy(dtype=float, na_value=np.nan)
                ctx.report.notes.append(f"column '{column}': {int(text_bad.sum())} decimal commas read as points")
                text_bad = np.isnan(v) & ~missing
            n_present = int((~missing).sum())
            if text_bad.any():
                examples = values_text(text[text_bad].tolist())
                comma_hint = (
                    "; values like '12,5' use a decimal comma: save the file with '.' as decimal separator or "
                    "pass decimal=','"
                    if commas.any()
                    else ""
                )
                if text_bad.sum() > 0.5 * max(n_present, 1):
                    raise DataError(
                        f"{ctx.where(column)}: not numeric ({int(text_bad.sum())} of {n_present} values are text, "
                        f"e.g. {examples} in {ctx.rows_of(text_bad)}){comma_hint}; "
                        f"{numeric_hint or f'choose a numeric {role} column'}"
                    )
                ctx.problem(
                    f"values with text where a number is expected ({examples})",
                    column,
                    text_bad,
                    "fix those cells" + comma_hint,
                )
    if missing.all():
        raise DataError(f"{ctx.where(column)}: all {n} values are missing; choose a column with data")
    ctx.problem("missing values (empty, NA or NaN)", column, missing & ~text_bad)
    inf = np.isinf(v)
    ctx.problem("infinite values", column, inf)
    return v


# --------------------------------------------------------------------------------------------------
# Locations
# --------------------------------------------------------------------------------------------------


def _parse_crs(crs, ctx: _Ctx) -> pyproj.CRS | None:
    if crs is None:
        return None
    try:
        return pyproj.CRS.from_user_input(crs)
    except (pyproj.exceptions.CRSError, TypeError, ValueError):
        raise DataError(
            f"{ctx.where()}: crs={crs!r} is not a CRS pyproj knows; pass e.g. 'EPSG:4326' or 'EPSG:32615'"
        ) from None


def _crs_name(crs: pyproj.CRS) -> str:
    epsg = crs.to_epsg()
    return f"EPSG:{epsg} ({crs.name})" if epsg else crs.name


def _locate(df: pd.DataFrame, ctx: _Ctx, *, lon, lat, geometry, crs) -> tuple[np.ndarray, np.ndarray, pyproj.CRS]:
    """x, y (shape (n,), NaN where unknown) in the input CRS, which is returned too."""
    report = ctx.report
    user_crs = _parse_crs(crs, ctx)
    file_crs = None
    if isinstance(df, gpd.GeoDataFrame) and df.crs is not None:
        file_crs = pyproj.CRS.from_user_input(df.crs)

    def crs_for(has_file_crs: bool) -> pyproj.CRS:
        if user_crs is not None:
            if has_file_crs and file_crs is not None and user_crs != file_crs:
                report.notes.append(f"crs= overrides the file's CRS {_crs_name(file_crs)}")
            return user_crs
        if has_file_crs and file_crs is not None:
            ctx.crs_from_file = True
            return file_crs
        report.notes.append("no CRS in the input: EPSG:4326 (lon/lat degrees) assumed; pass crs= if not")
        return WGS84

    if (lon is None) != (lat is None):
        raise DataError(f"{ctx.where()}: pass both lon= and lat= (got only {'lon' if lon else 'lat'}={lon or lat!r})")
    if lon is not None:
        for col, role in ((lon, "longitude"), (lat, "latitude")):
            if col not in df.columns:
                raise _missing_column(ctx, df, col, role)
        report.columns.update(lon=lon, lat=lat)
        report.coordinates = f"columns '{lon}'/'{lat}'"
        return _numeric(df, lon, ctx, "longitude"), _numeric(df, lat, ctx, "latitude"), crs_for(False)

    if geometry is not None:
        if geometry not in df.columns:
            raise _missing_column(ctx, df, geometry, "geometry")
        geoms = _geometry_values(df[geometry], ctx, geometry)
        report.columns["geometry"] = geometry
        is_file_geom = isinstance(df, gpd.GeoDataFrame) and geometry == df.geometry.name
        c = crs_for(is_file_geom)
        x, y = _centroids(geoms, c, ctx, geometry)
        return x, y, c

    cols = {norm_name(c): c for c in reversed(list(df.columns))}
    if isinstance(df, gpd.GeoDataFrame):
        geoms = df.geometry.values
        present = ~(shapely.is_missing(geoms) | shapely.is_empty(geoms))
        if present.any():
            c = crs_for(True)
            report.columns["geometry"] = df.geometry.name
            x, y = _centroids(np.asarray(geoms), c, ctx, df.geometry.name, quiet_missing="quadkey" in cols)
            if "quadkey" in cols and not present.all():
                qx, qy, ok = quadkey.quadkey_centres(
                    df[cols["quadkey"]].astype("string").to_numpy(dtype=object, na_value=None)
                )
                fill = ~present & ok
                qx, qy = project(qx[fill], qy[fill], WGS84, c)
                x[fill], y[fill] = qx, qy
                report.notes.append(f"{int(fill.sum())} features without geometry placed at their quadkey tile centre")
                ctx.problem("features without geometry or valid quadkey", df.geometry.name, ~present & ~ok)
            return x, y, c
        report.notes.append("the file's geometry is empty for every feature; looking for coordinate columns")

    lon_c = next((cols[n] for n in LON_NAMES if n in cols), None)
    lat_c = next((cols[n] for n in LAT_NAMES if n in cols), None)
    if lon_c is not None and lat_c is not None:
        report.columns.update(lon=lon_c, lat=lat_c)
        report.coordinates = f"columns '{lon_c}'/'{lat_c}'"
        return _numeric(df, lon_c, ctx, "longitude"), _numeric(df, lat_c, ctx, "latitude"), crs_for(False)
    if "tilex" in cols and "tiley" in cols:
        a, b = cols["tilex"], cols["tiley"]
        report.columns.update(lon=a, lat=b)
        report.coordinates = f"Ookla tile centres '{a}'/'{b}'"
        return _numeric(df, a, ctx, "longitude"), _numeric(df, b, ctx, "latitude"), crs_for(False)
    if "quadkey" in cols:
        q = cols["quadkey"]
        return (*_from_quadkeys(df[q], ctx, q), _quadkey_crs(user_crs, report))
    for n in WKT_NAMES:
        if n in cols and _looks_wkt(df[cols[n]]):
            g = cols[n]
            geoms = _geometry_values(df[g], ctx, g)
            report.columns["geometry"] = g
            c = crs_for(False)
            x, y = _centroids(geoms, c, ctx, g)
            return x, y, c
    for a_name, b_name in XY_PAIRS[1:]:
        if a_name in cols and b_name in cols:
            a, b = cols[a_name], cols[b_name]
            report.columns.update(lon=a, lat=b)
            report.coordinates = f"columns '{a}'/'{b}'"
            return _numeric(df, a, ctx, "x"), _numeric(df, b, ctx, "y"), crs_for(False)
    raise _no_coordinates(df, ctx)


def _quadkey_crs(user_crs, report: ReadReport) -> pyproj.CRS:
    if user_crs is not None and user_crs != WGS84:
        report.notes.append("crs= ignored: quadkeys define their own (web-mercator) locations")
    return WGS84


def _no_coordinates(df: pd.DataFrame, ctx: _Ctx) -> DataError:
    cols = [str(c) for c in df.columns]
    hint = ""
    if cols and all(_is_number(c) for c in cols):
        hint = " The first line looks like data, not a header: add a header line with column names."
    elif any(d in c for c in cols for d in (";", "\t", "|")):
        hint = " A column name contains a delimiter: pass sep= with the file's delimiter."
    return DataError(
        f"{ctx.where()}: no coordinate columns found; columns are: {_listing(cols)}. Name them lon/lat "
        "(or longitude/latitude, lng, x/y), pass lon='COLUMN' and lat='COLUMN', pass geometry='COLUMN' for a WKT "
        f"column, or include an Ookla 'quadkey' column.{hint}"
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _looks_wkt(s: pd.Series) -> bool:
    sample = s.dropna().head(20)
    if sample.empty:
        return False
    if sample.map(lambda v: isinstance(v, shapely.Geometry)).all():
        return True
    if sample.map(lambda v: isinstance(v, (bytes, bytearray))).all():
        return True
    return bool(sample.astype(str).str.match(_WKT_RE.pattern, case=False).mean() > 0.5)


def _geometry_values(s: pd.Series, ctx: _Ctx, column: str) -> np.ndarray:
    """Geometry objects (None where missing or invalid) from WKT/WKB/shapely values, shape (n,)."""
    if isinstance(s, gpd.GeoSeries) or isinstance(getattr(s, "array", None), gpd.array.GeometryArray):
        return np.asarray(s.values, dtype=object)
    vals = s.to_numpy(dtype=object)
    out = np.full(len(vals), None, dtype=object)
    is_geom = np.array([isinstance(v, shapely.Geometry) for v in vals], dtype=bool)
    out[is_geom] = vals[is_geom]
    is_bytes = np.array([isinstance(v, (bytes, bytearray)) for v in vals], dtype=bool)
    if is_bytes.any():
        out[is_bytes] = shapely.from_wkb(vals[is_bytes], on_invalid="ignore")
    is_text = np.array([isinstance(v, str) and v.strip() != "" for v in vals], dtype=bool)
    if is_text.any():
        text = np.array([re.sub(r"^\s*SRID=\d+;", "", v) for v in vals[is_text]], dtype=object)
        out[is_text] = shapely.from_wkt(text, on_invalid="ignore")
    invalid = (is_text | is_bytes) & np.array([g is None for g in out], dtype=bool)
    if invalid.any():
        if invalid.sum() > 0.5 * max(int((is_text | is_bytes).sum()), 1):
            raise DataError(
                f"{ctx.where(column)}: not valid WKT geometry (e.g. {values_text(vals[invalid][:5].tolist())} in "
                f"{ctx.rows_of(invalid)}); write geometries like 'POINT (-66.1 18.4)' or use lon/lat columns"
            )
        ctx.problem("invalid WKT geometries", column, invalid, "fix those geometries")
    return out


def _centroids(geoms: np.ndarray, crs: pyproj.CRS, ctx: _Ctx, column: str, quiet_missing: bool = False):
    """Point coordinates, or centroids computed in an equal-area projection; shape (n,) each."""
    geoms = np.asarray(geoms, dtype=object)
    missing = shapely.is_missing(geoms) | shapely.is_empty(geoms)
    types = shapely.get_type_id(geoms)
    x = np.full(len(geoms), np.nan)
    y = np.full(len(geoms), np.nan)
    pts = (types == 0) & ~missing
    x[pts] = shapely.get_x(geoms[pts])
    y[pts] = shapely.get_y(geoms[pts])
    other = ~pts & ~missing
    kinds = sorted({_GEOM_NAMES.get(int(t), "geometry") for t in np.unique(types[other])})
    report = ctx.report
    if other.any():
        sub = geoms[other]
        if crs.is_geographic:
            cx, cy = _geographic_centroids(sub, crs)
        else:
            cen = shapely.centroid(sub)
            cx, cy = shapely.get_x(cen), shapely.get_y(cen)
        x[other], y[other] = cx, cy
        where = "a local equal-area projection" if crs.is_geographic else "the file's projected CRS"
        report.coordinates = f"{'/'.join(kinds)} centroids (computed in {where}) of '{column}'"
        if pts.any():
            report.coordinates += " and points"
    else:
        report.coordinates = f"points of '{column}'"
    if not quiet_missing:
        ctx.problem("missing or empty geometries", column, missing)
    return x, y


_GEOM_NAMES = {1: "line", 2: "ring", 3: "polygon", 4: "multipoint", 5: "multiline", 6: "multipolygon", 7: "collection"}


def _geographic_centroids(geoms: np.ndarray, crs: pyproj.CRS) -> tuple[np.ndarray, np.ndarray]:
    """Centroids of lon/lat geometries, each computed in an equal-area projection centred within 10 deg of it."""
    b = shapely.bounds(geoms)
    cx0 = np.clip(np.nan_to_num((b[:, 0] + b[:, 2]) / 2), -180, 180)
    cy0 = np.clip(np.nan_to_num((b[:, 1] + b[:, 3]) / 2), -89, 89)
    cells = np.floor(cx0 / 10) * 1000 + np.floor(cy0 / 10)
    x = np.full(len(geoms), np.nan)
    y = np.full(len(geoms), np.nan)
    for cell in np.unique(cells):
        sel = cells == cell
        lon0, lat0 = centre_of(cx0[sel], cy0[sel])
        local = laea_crs(lon0, lat0)
        with np.errstate(all="ignore"):
            cen = shapely.centroid(project_geometry(geoms[sel], crs, local))
            x[sel], y[sel] = project(shapely.get_x(cen), shapely.get_y(cen), local, crs)
    return x, y


def _from_quadkeys(s: pd.Series, ctx: _Ctx, column: str) -> tuple[np.ndarray, np.ndarray]:
    report = ctx.report
    if pd.api.types.is_numeric_dtype(s):
        v = s.to_numpy(dtype=float, na_value=np.nan)
        text = np.array([str(int(a)) if np.isfinite(a) else None for a in v], dtype=object)
        lengths = [len(t) for t in text if t]
        if lengths and max(lengths) <= 16:
            text = np.array([t.zfill(16) if t else None for t in text], dtype=object)
            report.notes.append(f"column '{column}' holds numbers: leading zeros restored assuming zoom 16 (Ookla)")
    else:
        text = s.astype("string").to_numpy(dtype=object, na_value=None)
    x, y, ok = quadkey.quadkey_centres(text)
    has = np.array([t is not None and str(t).strip() != "" for t in text], dtype=bool)
    bad = has & ~ok
    if bad.sum() > 0.5 * max(int(has.sum()), 1):
        raise DataError(
            f"{ctx.where(column)}: not quadkeys (digits 0-3), e.g. {values_text(text[bad][:5].tolist())} in "
            f"{ctx.rows_of(bad)}; pass lon=/lat= to use other columns"
        )
    ctx.problem("invalid quadkeys (digits 0-3 expected)", column, bad)
    ctx.problem("missing quadkeys", column, ~has)
    report.columns["geometry"] = column
    report.coordinates = f"quadkey tile centres (web mercator) of '{column}'"
    report.notes.append("Ookla tiles: locations are the centres of the quadkey tiles")
    return x, y


# --------------------------------------------------------------------------------------------------
# Coordinate checks and reprojection
# --------------------------------------------------------------------------------------------------


def _names(ctx: _Ctx) -> tuple[str, str]:
    c = ctx.report.columns
    g = c.get("geometry")
    return (c.get("lon") or (f"{g} (x)" if g else "x")), (c.get("lat") or (f"{g} (y)" if g else "y"))


def _to_wgs84(x, y, crs_in: pyproj.CRS, ctx: _Ctx, *, explicit: bool) -> tuple[np.ndarray, np.ndarray]:
    """Check degrees (swapped, projected, out of range) and reproject to EPSG:4326."""
    report = ctx.report
    report.crs_in = _crs_name(crs_in)
    lon_name, lat_name = _names(ctx)
    fin = np.isfinite(x) & np.isfinite(y)
    if crs_in.is_geographic:
        x = x.copy()
        _check_degrees(x, y, fin, ctx, lon_name, lat_name, explicit, assumed=not ctx.crs_from_file)
        lon, lat = project(x, y, crs_in, WGS84) if crs_in != WGS84 else (x, y)
    else:
        if fin.sum() >= 3 and np.all(np.abs(x[fin]) <= 180) and np.all(np.abs(y[fin]) <= 90):
            declared = "the file declares" if ctx.crs_from_file else "crs= gives"
            raise DataError(
                f"{ctx.where()}: {declared} the projected CRS {report.crs_in} (coordinates in metres or feet), "
                f"but all {int(fin.sum())} coordinates lie within +-180 / +-90, like degrees; the file's CRS is "
                "probably wrong: set the file's CRS to EPSG:4326 (lon/lat degrees), or read it with crs='EPSG:4326'"
            )
        lon = np.full(len(x), np.nan)
        lat = np.full(len(y), np.nan)
        if fin.any():
            with np.errstate(all="ignore"):
                lon[fin], lat[fin] = project(x[fin], y[fin], crs_in, WGS84)
        outside = fin & ~(np.isfinite(lon) & np.isfinite(lat) & (np.abs(lat) <= 90) & (np.abs(lon) <= 180))
        if outside.sum() > 0.5 * max(int(fin.sum()), 1):
            raise DataError(
                f"{ctx.where()}: most coordinates cannot be converted from {report.crs_in} to lon/lat "
                f"(e.g. {ctx.rows_of(outside)}); check the CRS passed as crs= or stored in the file"
            )
        ctx.problem(f"points outside the valid area of {report.crs_in}", None, outside, "check the CRS")
        lon = np.where(outside, np.nan, lon)
        lat = np.where(outside, np.nan, lat)
        good = np.isfinite(lon)
        frac, _ = _bundled.fraction_in_states(lon[good], lat[good])
        if good.any() and frac < 0.05:
            swapped, code = _bundled.fraction_in_states(lat[good], lon[good])
            if swapped > 0.9:
                report.notes.append(
                    f"the points would fall in {code} if lon and lat were swapped; check the axis order"
                )
    return lon, lat


def _check_degrees(x, y, fin, ctx: _Ctx, lon_name: str, lat_name: str, explicit: bool, assumed: bool) -> None:
    """Range, swap and projected-CRS checks of lon/lat degrees; fixes 0-360 longitudes in place."""
    report = ctx.report
    n_fin = int(fin.sum())
    if n_fin == 0:
        return
    ax, ay = np.abs(x), np.abs(y)
    with np.errstate(invalid="ignore"):
        bad_lat = fin & (ay > 90)
        bad_lon = fin & (ax > 180)
    bad = bad_lat | bad_lon
    crs_hint = "pass crs= if the file is projected" if assumed else "check the CRS stored in the file"
    if bad.any():
        wrap = bad_lon & ~bad_lat & (x > 180) & (x <= 360)
        if wrap.sum() == bad.sum() and np.nanmin(x[fin]) >= 0:
            x[wrap] -= 360.0
            report.notes.append(f"column '{lon_name}': {int(wrap.sum())} longitudes in 0-360 converted to -180..180")
            bad = bad_lat = bad_lon = np.zeros(len(x), dtype=bool)
    if bad.sum() > 0.5 * n_fin:
        mag = np.nanmedian(np.maximum(ax[fin], ay[fin]))
        if mag > 1000:
            raise DataError(_projected_message(x[fin], y[fin], ctx, lon_name, lat_name, assumed))
        looks_swapped = np.mean((ay[fin] <= 180) & (ax[fin] <= 90)) > 0.9 and np.mean(ay[fin] > 90) > 0.5
        if looks_swapped:
            raise DataError(
                f"{ctx.where()}: column '{lat_name}' has {int(bad_lat.sum())} of {n_fin} values outside [-90, 90] "
                f"({ctx.rows_of(bad_lat)}) while '{lon_name}' stays within +-90, so the columns look swapped; pass "
                f"lon='{_col(lat_name)}', lat='{_col(lon_name)}' to swap them, or check that '{lat_name}' holds "
                "latitude in degrees"
            )
        col, word, lim, mask = (
            (lat_name, "latitude", 90, bad_lat)
            if bad_lat.sum() >= bad_lon.sum()
            else (lon_name, "longitude", 180, bad_lon)
        )
        raise DataError(
            f"{ctx.where(col)}: {int(mask.sum())} of {n_fin} values outside [-{lim}, {lim}] ({ctx.rows_of(mask)}); "
            f"check that the column holds {word} in degrees, or {crs_hint}"
        )
    ctx.problem(
        "values outside [-90, 90]",
        lat_name,
        bad_lat,
        f"check that the column holds latitude in degrees, or {crs_hint}",
    )
    ctx.problem(
        "values outside [-180, 180]",
        lon_name,
        bad_lon,
        f"check that the column holds longitude in degrees, or {crs_hint}",
    )
    ok = fin & ~bad_lat & ~bad_lon
    if not ok.any():
        return
    given, _ = _bundled.fraction_in_states(x[ok], y[ok])
    swapped, code = _bundled.fraction_in_states(y[ok], x[ok])
    if given < 0.05 and swapped > 0.9:
        name = _state_name(code)
        msg = (
            f"columns '{lon_name}' and '{lat_name}' look swapped: as given the points fall in the ocean or "
            f"Antarctica, but swapped they fall in {name}"
        )
        if explicit:
            report.notes.append(msg + " (kept as given because lon=/lat= were passed)")
        else:
            raise DataError(
                f"{ctx.where()}: {msg}; pass lon='{_col(lat_name)}', lat='{_col(lon_name)}' to swap them "
                "(or pass lon=/lat= as they are to keep them)"
            )


def _col(label: str) -> str:
    return label.split(" (")[0]


def _state_name(code: str | None) -> str:
    if code is None:
        return "a bundled state"
    st = _bundled.states()
    names = st.loc[st["STUSPS"] == code, "NAME"]
    return f"{names.iloc[0]} ({code})" if len(names) else code


def _projected_message(x, y, ctx: _Ctx, lon_name: str, lat_name: str, assumed: bool) -> str:
    sample = np.linspace(0, len(x) - 1, min(len(x), 400)).astype(int)
    sx, sy = x[sample], y[sample]
    guess = ""
    for cand in _PROJECTED_GUESSES:
        with np.errstate(all="ignore"):
            lo, la = project(sx, sy, cand, WGS84)
        ok = np.isfinite(lo) & np.isfinite(la)
        if ok.mean() < 0.9:
            continue
        frac, code = _bundled.fraction_in_states(lo[ok], la[ok])
        if frac > 0.9:
            crs = pyproj.CRS.from_user_input(cand)
            guess = f"pass crs='{cand}' (in {crs.name} they fall in {_state_name(code)})"
            break
    if not guess:
        guess = "pass crs='EPSG:xxxx' with the file's projected CRS (e.g. a UTM zone such as EPSG:32615)"
    example = f"{x[0]:.6g}, {y[0]:.6g}"
    if assumed:
        lead = (
            f"columns '{lon_name}'/'{lat_name}': the data looks projected (values like {example} are metres, "
            "not degrees)"
        )
    else:
        lead = (
            f"the data looks projected (values like {example}) although the file's CRS is geographic; the stored "
            "CRS is probably wrong"
        )
    return f"{ctx.where()}: {lead}; {guess}"


# --------------------------------------------------------------------------------------------------
# Target, weight, time
# --------------------------------------------------------------------------------------------------


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


def _check_target(df: pd.DataFrame, ctx: _Ctx, target: str, tr) -> np.ndarray:
    if target not in df.columns:
        extra = ""
        if target in ("download_mbps", "upload_mbps"):
            extra = " 'download_mbps'/'upload_mbps' exist only for Ookla files with avg_d_kbps/avg_u_kbps columns."
        raise _missing_column(ctx, df, target, "target", extra)
    numeric = [
        str(c) for c in df.columns if pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])
    ]
    y = _numeric(df, target, ctx, "target", numeric_hint=f"choose a numeric target column: {_listing(numeric, 15)}")
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


def _check_weight(df: pd.DataFrame, ctx: _Ctx, weight: str) -> np.ndarray:
    if weight not in df.columns:
        raise _missing_column(ctx, df, weight, "weight")
    w = _numeric(df, weight, ctx, "weight")
    with np.errstate(invalid="ignore"):
        neg = np.isfinite(w) & (w < 0)
    ctx.problem("negative weights", weight, neg, "weights must be >= 0")
    return w


def _time_column(df: pd.DataFrame, ctx: _Ctx, time, quarter) -> tuple[str | None, np.ndarray]:
    if time is not None:
        if time not in df.columns:
            raise _missing_column(ctx, df, time, "time")
        vals = temporal.decimal_year(df[time])
        if np.isnan(vals).all():
            raise DataError(
                f"{ctx.where(time)}: no value is a date, quarter or year (e.g. "
                f"{values_text(df[time].head(5).tolist())}); write quarters like '2023Q1' or dates like '2023-02-17'"
            )
        return time, vals
    auto = temporal.find_time_column(
        [c for c in df.columns if not (isinstance(df, gpd.GeoDataFrame) and c == df.geometry.name)]
    )
    if auto is None:
        return None, np.full(len(df), np.nan)
    vals = temporal.decimal_year(df[auto])
    if np.mean(np.isfinite(vals)) < 0.9:
        ctx.report.notes.append(f"column '{auto}' is not used as time (its values are not dates or quarters)")
        return None, np.full(len(df), np.nan)
    return auto, vals


# --------------------------------------------------------------------------------------------------
# Dropping
# --------------------------------------------------------------------------------------------------


_SINGULAR = {
    "values": "value",
    "weights": "weight",
    "geometries": "geometry",
    "quadkeys": "quadkey",
    "points": "point",
    "features": "feature",
}


def _counted(n: int, phrase: str) -> str:
    """``"3 missing values"`` / ``"1 missing value"``: the first plural noun of ``phrase`` agrees with ``n``."""
    if n == 1:
        words = phrase.split(" ")
        for i, w in enumerate(words):
            if w in _SINGULAR:
                words[i] = _SINGULAR[w]
                break
        phrase = " ".join(words)
    return f"{n} {phrase}"


def _resolve_problems(ctx: _Ctx, allow_drop: bool) -> np.ndarray:
    """Boolean keep-mask of shape (n,); raises when rows are unusable and dropping was not allowed."""
    n = len(ctx.rows)
    if not ctx.problems:
        return np.ones(n, dtype=bool)
    any_bad = np.zeros(n, dtype=bool)
    for p in ctx.problems:
        any_bad |= p.mask
    if not allow_drop:
        lines = []
        for p in ctx.problems:
            col = f"column '{p.column}': " if p.column is not None else ""
            hint = f"; {p.hint}" if p.hint else ""
            lines.append(f"{col}{_counted(int(p.mask.sum()), p.reason)} ({ctx.rows_of(p.mask)}){hint}")
        fix = (
            "fix the file, or drop these rows (Python: allow_drop=True; CLI: fit, predict and evaluate drop them "
            "unless --no-drop is given, `data inspect` needs --allow-drop)"
        )
        if len(lines) == 1:
            raise DataError(f"{ctx.where()}, {lines[0]}; {fix}")
        body = "\n".join(f"  - {ln}" for ln in lines)
        raise DataError(
            f"{ctx.where()}: {int(any_bad.sum())} of {n} rows cannot be used:\n{body}\n{fix[0].upper()}{fix[1:]}"
        )
    for p in ctx.problems:
        col = f"column '{p.column}': " if p.column is not None else ""
        ctx.report.drop(f"{col}{p.reason}", ctx.rows[p.mask])
    return ~any_bad
