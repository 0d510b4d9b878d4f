"""Regions: the bundled state boundaries, the data's hull or box, uploaded polygons.

A region is always returned as a shapely (Multi)Polygon in EPSG:4326 degrees. The box convention
is ``(W, E, S, N)`` (west, east, south, north), as in verde.

>>> w, e, s, n = state_bbox("PR")
>>> round(w, 1) < -67 < -65 < round(e, 1) + 0.5
True
"""

from __future__ import annotations

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely
from shapely.geometry.base import BaseGeometry

from gpcore.data import _bundled
from gpcore.data._crs import WGS84, centre_of, laea_crs, project_geometry
from gpcore.errors import DataError


def available_states() -> list[str]:
    """Postal codes of the bundled state boundaries (e.g. ``["GA", "HI", "MO", "NM", "PR"]``)."""
    return sorted(_bundled.states()["STUSPS"].tolist())


def state_boundary(code: str) -> BaseGeometry:
    """Boundary of a bundled state (U.S. Census cartographic boundary 2022, 1:500k) in EPSG:4326.

    Parameters
    ----------
    code : str
        Postal code, e.g. ``"PR"`` or ``"MO"`` (case-insensitive), or the state's name.
    """
    st = _bundled.states()
    key = str(code).strip()
    hit = st[(st["STUSPS"].str.upper() == key.upper()) | (st["NAME"].str.lower() == key.lower())]
    if hit.empty:
        raise DataError(f"no bundled boundary for state {code!r}; bundled: {', '.join(available_states())}")
    return hit.geometry.iloc[0]


def state_bbox(code: str) -> tuple[float, float, float, float]:
    """``(W, E, S, N)`` of a bundled state in degrees (the DBK protocol scales inputs by it)."""
    minx, miny, maxx, maxy = state_boundary(code).bounds
    return float(minx), float(maxx), float(miny), float(maxy)


def box_region(bounds) -> BaseGeometry:
    """Polygon of a ``(W, E, S, N)`` box in degrees, after checking it."""
    try:
        w, e, s, n = (float(v) for v in bounds)
    except (TypeError, ValueError):
        raise DataError(f"region box {bounds!r} must be four numbers (W, E, S, N) in degrees") from None
    if not (-180 <= w < e <= 180 and -90 <= s < n <= 90):
        raise DataError(
            f"region box (W, E, S, N) = {bounds!r} is not valid; need -180 <= W < E <= 180 and -90 <= S < N <= 90 "
            "(note the order: west, east, south, north)"
        )
    return shapely.box(w, s, e, n)


def region_from_data(gdf, how: str = "hull", buffer_km: float = 0.0) -> BaseGeometry:
    """Region covering a data set: its convex ``"hull"`` or its bounding ``"bbox"``.

    Parameters
    ----------
    gdf : GeoDataFrame or DataFrame with ``lon``/``lat`` columns
        Points (EPSG:4326 or any CRS for a GeoDataFrame).
    how : {"hull", "bbox"}
    buffer_km : float
        Grow the region by this many kilometres (computed in a local equal-area projection).
    """
    if how not in ("hull", "bbox"):
        raise DataError(f"how={how!r} is not known; use 'hull' or 'bbox'")
    if isinstance(gdf, gpd.GeoDataFrame | gpd.GeoSeries) and gdf.crs is not None:
        pts = gdf.to_crs(4326).geometry if isinstance(gdf, gpd.GeoDataFrame) else gdf.to_crs(4326)
        lon, lat = pts.x.to_numpy(dtype=float), pts.y.to_numpy(dtype=float)
    elif isinstance(gdf, pd.DataFrame) and {"lon", "lat"} <= set(gdf.columns):
        lon, lat = gdf["lon"].to_numpy(dtype=float), gdf["lat"].to_numpy(dtype=float)
    else:
        raise DataError("region_from_data needs a GeoDataFrame with a CRS or a table with lon/lat columns")
    ok = np.isfinite(lon) & np.isfinite(lat)
    if ok.sum() < 3:
        raise DataError(f"the data has {int(ok.sum())} usable point(s); a region needs at least 3")
    lon, lat = lon[ok], lat[ok]
    if how == "bbox":
        geom = shapely.box(lon.min(), lat.min(), lon.max(), lat.max())
    else:
        geom = shapely.convex_hull(shapely.multipoints(np.column_stack([lon, lat])))
    if geom.area == 0:
        raise DataError("the data's points are all on one line or one point; the region would have no area")
    if buffer_km:
        local = laea_crs(*centre_of(lon, lat))
        geom = project_geometry(project_geometry(geom, WGS84, local).buffer(buffer_km * 1000), local, WGS84)
    return geom


def read_polygons(source, *, name: str | None = None, layer=None) -> gpd.GeoDataFrame:
    """Read a polygon layer (GeoJSON, GeoPackage, zipped Shapefile, GeoParquet) in EPSG:4326.

    ``source`` is a path, bytes or an upload; polygons without a CRS are taken as EPSG:4326.
    """
    from gpcore.data._parsers import read_ogr, read_parquet
    from gpcore.data._sniff import detect_format
    from gpcore.data._source import DEFAULT_MAX_BYTES, open_source
    from gpcore.data.report import ReadReport

    src = open_source(source, name, DEFAULT_MAX_BYTES)
    fmt = detect_format(src)
    report = ReadReport(file=src.name)
    if fmt == "parquet":
        df, _ = read_parquet(src, report)
    elif fmt == "csv":
        raise DataError(f"{src.where()} is a table; a polygon layer must be GeoJSON, GeoPackage or a zipped Shapefile")
    else:
        df, _ = read_ogr(src, fmt, report, layer=layer)
    if not isinstance(df, gpd.GeoDataFrame):
        raise DataError(f"{src.where()} has no geometry; a polygon layer is needed")
    gdf = df if df.crs is not None else df.set_crs(4326)
    gdf = gdf.to_crs(4326)
    types = set(gdf.geometry.dropna().geom_type)
    if not types & {"Polygon", "MultiPolygon"}:
        raise DataError(
            f"{src.where()} holds {', '.join(sorted(types)) or 'no'} geometries, not polygons; load a polygon layer"
        )
    return gdf[gdf.geometry.geom_type.isin(["Polygon", "MultiPolygon"])].reset_index(drop=True)


def resolve_region(region) -> BaseGeometry:
    """Any region spec as a shapely (Multi)Polygon in EPSG:4326.

    ``region`` may be: a shapely geometry (taken as EPSG:4326); a GeoDataFrame/GeoSeries (reprojected,
    polygons unioned); a state code like ``"PR"``; the path of a polygon file; or ``(W, E, S, N)``.
    """
    if isinstance(region, BaseGeometry):
        geom = region
    elif isinstance(region, gpd.GeoDataFrame | gpd.GeoSeries):
        g = region if region.crs is None else region.to_crs(4326)
        geom = shapely.union_all(np.asarray(g.geometry.values if isinstance(g, gpd.GeoDataFrame) else g.values))
    elif isinstance(region, str) and len(region.strip()) <= 3 and region.strip().isalpha():
        geom = state_boundary(region)
    elif isinstance(region, str) and region.strip().lower() in {n.lower() for n in _bundled.states()["NAME"]}:
        geom = state_boundary(region)
    elif isinstance(region, (tuple, list, np.ndarray)) and len(region) == 4:
        geom = box_region(region)
    elif isinstance(region, (str, bytes)) or hasattr(region, "__fspath__") or hasattr(region, "read"):
        geom = shapely.union_all(np.asarray(read_polygons(region).geometry.values))
    else:
        raise DataError(
            f"region {region!r} is not understood; pass a state code like 'PR', a polygon (shapely or "
            "GeoDataFrame), a polygon file, or a box (W, E, S, N)"
        )
    if geom is None or geom.is_empty:
        raise DataError("the region is empty")
    polys = shapely.get_parts(geom)
    polys = polys[np.isin(shapely.get_type_id(polys), [3, 6])]
    if len(polys) == 0:
        raise DataError(f"the region is a {geom.geom_type}, not a polygon; pass a polygon or a box")
    geom = shapely.union_all(polys) if len(polys) > 1 else polys[0]
    if not geom.is_valid:
        parts = shapely.get_parts(shapely.make_valid(geom))
        geom = shapely.union_all(parts[np.isin(shapely.get_type_id(parts), [3, 6])])
    w, s, e, n = geom.bounds
    if w < -180.0001 or e > 180.0001 or s < -90.0001 or n > 90.0001:
        raise DataError(
            f"the region's bounds ({w:.6g}, {s:.6g}, {e:.6g}, {n:.6g}) are not lon/lat degrees; pass a "
            "GeoDataFrame with its CRS, or reproject the polygon to EPSG:4326"
        )
    return geom
