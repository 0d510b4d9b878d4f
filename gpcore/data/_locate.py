"""Finding where each row is: coordinate columns, a geometry (WKT, WKB, the file's own), Ookla tiles or quadkeys.

:func:`locate` resolves the location columns in a fixed order of preference (see
:func:`~gpcore.data.read_measurements`) and returns x, y in the input CRS; polygons and lines become centroids
computed in a local equal-area projection. Internal to :mod:`gpcore.data.readers`.
"""

from __future__ import annotations

import re

import geopandas as gpd
import numpy as np
import pandas as pd
import pyproj
import shapely

from gpcore.data import quadkey
from gpcore.data._crs import WGS84, centre_of, crs_name, laea_crs, project, project_geometry
from gpcore.data._parsers import norm_name
from gpcore.data._validate import ReadContext, listing, missing_column, numeric_column
from gpcore.data.report import ReadReport, values_text
from gpcore.errors import DataError

#: Coordinate column names (normalised: lower case, letters and digits only), in order of preference.
LON_NAMES = ("lon", "lng", "long", "longitude", "londeg", "longitudedeg", "decimallongitude", "lonwgs84")
LAT_NAMES = ("lat", "latitude", "latdeg", "latitudedeg", "decimallatitude", "latwgs84")
XY_PAIRS = (("tilex", "tiley"), ("x", "y"), ("pointx", "pointy"), ("xcoord", "ycoord"), ("easting", "northing"))
WKT_NAMES = ("geometry", "geom", "wkt", "thegeom", "wktgeom", "tile", "shape", "footprint")
_WKT_RE = re.compile(
    r"^\s*(SRID=\d+;\s*)?(POINT|MULTIPOINT|LINESTRING|MULTILINESTRING|POLYGON|MULTIPOLYGON|GEOMETRYCOLLECTION)\b",
    re.IGNORECASE,
)


def locate(df: pd.DataFrame, ctx: ReadContext, *, lon, lat, geometry, crs) -> tuple[np.ndarray, np.ndarray, pyproj.CRS]:
    """x, y (shape (n,), NaN where unknown) in the input CRS, which is returned too."""
    report = ctx.report
    user_crs = _parse_crs(crs, ctx)
    file_crs = None
    if isinstance(df, gpd.GeoDataFrame) and df.crs is not None:
        file_crs = pyproj.CRS.from_user_input(df.crs)

    def crs_for(has_file_crs: bool) -> pyproj.CRS:
        if user_crs is not None:
            if has_file_crs and file_crs is not None and user_crs != file_crs:
                report.notes.append(f"crs= overrides the file's CRS {crs_name(file_crs)}")
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
                raise missing_column(ctx, df, col, role)
        report.columns.update(lon=lon, lat=lat)
        report.coordinates = f"columns '{lon}'/'{lat}'"
        return numeric_column(df, lon, ctx, "longitude"), numeric_column(df, lat, ctx, "latitude"), crs_for(False)

    if geometry is not None:
        if geometry not in df.columns:
            raise missing_column(ctx, df, geometry, "geometry")
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
        return numeric_column(df, lon_c, ctx, "longitude"), numeric_column(df, lat_c, ctx, "latitude"), crs_for(False)
    if "tilex" in cols and "tiley" in cols:
        a, b = cols["tilex"], cols["tiley"]
        report.columns.update(lon=a, lat=b)
        report.coordinates = f"Ookla tile centres '{a}'/'{b}'"
        return numeric_column(df, a, ctx, "longitude"), numeric_column(df, b, ctx, "latitude"), crs_for(False)
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
            return numeric_column(df, a, ctx, "x"), numeric_column(df, b, ctx, "y"), crs_for(False)
    raise _no_coordinates(df, ctx)


def _parse_crs(crs, ctx: ReadContext) -> pyproj.CRS | None:
    if crs is None:
        return None
    try:
        return pyproj.CRS.from_user_input(crs)
    except (pyproj.exceptions.CRSError, TypeError, ValueError):
        raise DataError(
            f"{ctx.where()}: crs={crs!r} is not a CRS pyproj knows; pass e.g. 'EPSG:4326' or 'EPSG:32615'"
        ) from None


def _quadkey_crs(user_crs, report: ReadReport) -> pyproj.CRS:
    if user_crs is not None and user_crs != WGS84:
        report.notes.append("crs= ignored: quadkeys define their own (web-mercator) locations")
    return WGS84


def _no_coordinates(df: pd.DataFrame, ctx: ReadContext) -> DataError:
    cols = [str(c) for c in df.columns]
    hint = ""
    if cols and all(_is_number(c) for c in cols):
        hint = " The first line looks like data, not a header: add a header line with column names."
    elif any(d in c for c in cols for d in (";", "\t", "|")):
        hint = " A column name contains a delimiter: pass sep= with the file's delimiter."
    return DataError(
        f"{ctx.where()}: no coordinate columns found; columns are: {listing(cols)}. Name them lon/lat "
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


def _geometry_values(s: pd.Series, ctx: ReadContext, column: str) -> np.ndarray:
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


def _centroids(geoms: np.ndarray, crs: pyproj.CRS, ctx: ReadContext, column: str, quiet_missing: bool = False):
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


def _from_quadkeys(s: pd.Series, ctx: ReadContext, column: str) -> tuple[np.ndarray, np.ndarray]:
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
