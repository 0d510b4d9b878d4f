"""Strata (urban / rural and any other grouping) as a ``stratum`` column.

Three sources:

* ``"column"`` — an existing column of the data (missing values become ``"unknown"``);
* ``"polygons"`` — a polygon layer: inside any polygon (boundary included) is ``"urban"``, else ``"rural"``
  (labels configurable), e.g. Census urban-area polygons;
* ``"county_metro"`` — the bundled counties with USDA Rural-Urban Continuum Codes 2023: RUCC 1-3 is
  ``"metro"``, 4-9 ``"non-metro"``; points in no county get ``"unknown"`` (counted, never dropped).
  The interface calls this split "metro / non-metro (county)".

The result carries ``attrs["strata_label"]`` (what the split means) and ``attrs["strata_counts"]``
(label -> count), and, when the frame came from :func:`read_measurements`, the report's strata counts.
"""

from __future__ import annotations

import copy

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely

from gpcore.data import _bundled
from gpcore.data.regions import read_polygons
from gpcore.errors import DataError

STRATA_SOURCES = ("column", "polygons", "county_metro")
COUNTY_METRO_LABEL = "metro / non-metro (county)"
UNKNOWN = "unknown"


def _points(gdf) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(gdf, pd.DataFrame) and {"lon", "lat"} <= set(gdf.columns):
        return gdf["lon"].to_numpy(dtype=float), gdf["lat"].to_numpy(dtype=float)
    if isinstance(gdf, gpd.GeoDataFrame):
        g = gdf.geometry if gdf.crs is None else gdf.geometry.to_crs(4326)
        c = g.centroid if not (g.geom_type == "Point").all() else g
        return c.x.to_numpy(dtype=float), c.y.to_numpy(dtype=float)
    raise DataError("assign_strata needs a GeoDataFrame or a table with lon/lat columns")


def _inside_any(lon: np.ndarray, lat: np.ndarray, polys: np.ndarray) -> np.ndarray:
    """Index of the first polygon holding each point (-1 for none), shape (n,)."""
    pts = shapely.points(lon, lat)
    tree = shapely.STRtree(polys)
    pi, gi = tree.query(pts, predicate="intersects")
    out = np.full(len(lon), -1, dtype=np.int64)
    # keep the lowest polygon index per point
    order = np.lexsort((gi, pi))
    pi, gi = pi[order], gi[order]
    first = np.ones(len(pi), dtype=bool)
    first[1:] = pi[1:] != pi[:-1]
    out[pi[first]] = gi[first]
    return out


def assign_strata(
    gdf,
    source: str,
    *,
    column: str | None = None,
    polygons=None,
    state: str | None = None,
    layer=None,
    inside: str = "urban",
    outside: str = "rural",
    labels: dict | None = None,
) -> gpd.GeoDataFrame:
    """Add a ``stratum`` column (string) to a copy of ``gdf``.

    Parameters
    ----------
    gdf : GeoDataFrame
        Points (n rows), e.g. from :func:`read_measurements`.
    source : {"column", "polygons", "county_metro"}
    column : str
        The column to use (``source="column"``). Booleans named like ``county_metro``/``metro`` become
        ``"metro"``/``"non-metro"``; ``labels`` maps values to labels otherwise.
    polygons : path, bytes, upload, GeoDataFrame or shapely geometry
        The polygon layer (``source="polygons"``); layers without a CRS are taken as EPSG:4326.
    state : str, optional
        Restrict the bundled counties to one state (``source="county_metro"``), e.g. ``"MO"``.
    layer : str or int, optional
        Layer of a polygon GeoPackage.
    inside, outside : str
        Labels for points inside / outside the polygons.

    Returns
    -------
    GeoDataFrame
        A copy with ``stratum`` (n,), ``attrs["strata_label"]`` and ``attrs["strata_counts"]``.
    """
    if source not in STRATA_SOURCES:
        raise DataError(f"strata source {source!r} is not known; use one of {', '.join(STRATA_SOURCES)}")
    out = gdf.copy()
    notes: list[str] = []
    if source == "column":
        if column is None:
            raise DataError("source='column' needs column='NAME'")
        if column not in out.columns:
            raise DataError(f"no column '{column}' for strata; columns are: {', '.join(map(str, out.columns))}")
        values = out[column]
        mapping = labels
        if mapping is None and pd.api.types.is_bool_dtype(values) and "metro" in column.lower():
            mapping = {True: "metro", False: "non-metro"}
        missing = values.isna().to_numpy()
        if mapping is not None:
            stratum = values.map(mapping)
            unmapped = stratum.isna().to_numpy() & ~missing
            if unmapped.any():
                raise DataError(
                    f"column '{column}': values {sorted(map(str, values[unmapped].unique()))[:5]} "
                    "have no label in labels="
                )
            stratum = stratum.astype("string")
        else:
            stratum = values.astype("string")
        stratum = stratum.fillna(UNKNOWN).to_numpy(dtype=object)
        n_unique = len(pd.unique(stratum))
        if n_unique > 50:
            raise DataError(
                f"column '{column}' has {n_unique} distinct values; strata need a grouping with few values "
                "(e.g. urban/rural)"
            )
        label = COUNTY_METRO_LABEL if column == "county_metro" else f"column '{column}'"
        if missing.any():
            notes.append(f"{int(missing.sum())} points with no value in '{column}' labelled '{UNKNOWN}'")
    elif source == "polygons":
        if polygons is None:
            raise DataError("source='polygons' needs polygons= (a GeoJSON, GeoPackage or zipped Shapefile)")
        if isinstance(polygons, gpd.GeoDataFrame | gpd.GeoSeries):
            pg = polygons if polygons.crs is None else polygons.to_crs(4326)
            geoms = np.asarray(pg.geometry.values if isinstance(pg, gpd.GeoDataFrame) else pg.values)
            name = "polygons"
        elif isinstance(polygons, shapely.Geometry):
            geoms = shapely.get_parts(np.asarray([polygons]))
            name = "polygon"
        else:
            geoms = np.asarray(read_polygons(polygons, layer=layer).geometry.values)
            name = str(getattr(polygons, "name", polygons))
            name = name.rsplit("/", 1)[-1] if len(name) < 300 else "upload"
        lon, lat = _points(out)
        hit = _inside_any(lon, lat, geoms) >= 0
        stratum = np.where(hit, inside, outside).astype(object)
        label = f"{inside} / {outside} (inside / outside {name})"
    else:
        counties = _bundled.counties()
        if state is not None:
            counties = counties[counties["STUSPS"].str.upper() == str(state).upper()]
            if counties.empty:
                have = ", ".join(sorted(_bundled.counties()["STUSPS"].unique()))
                raise DataError(f"no bundled counties for state {state!r}; bundled: {have}")
        lon, lat = _points(out)
        idx = _inside_any(lon, lat, np.asarray(counties.geometry.values))
        metro = counties["metro"].to_numpy(dtype=bool)
        stratum = np.where(idx < 0, UNKNOWN, np.where(metro[np.maximum(idx, 0)], "metro", "non-metro")).astype(object)
        label = COUNTY_METRO_LABEL
        n_unknown = int((idx < 0).sum())
        if n_unknown:
            where = f"{state} " if state else "bundled "
            notes.append(
                f"{n_unknown} points in no {where}county polygon (outside the bundled states, offshore or on the "
                f"coast) labelled '{UNKNOWN}'"
            )
    out["stratum"] = pd.array(stratum, dtype="string")
    counts = strata_counts(out)
    out.attrs["strata_label"] = label
    out.attrs["strata_counts"] = counts
    report = out.attrs.get("report")
    if report is not None:
        report = copy.deepcopy(report)
        report.strata = counts
        report.strata_label = label
        report.notes.extend(notes)
        out.attrs["report"] = report
    else:
        out.attrs["strata_notes"] = notes
    return out


def strata_counts(gdf) -> dict[str, int]:
    """Points per stratum, largest first with ``"unknown"`` last: ``{label: count}``."""
    vc = pd.Series(gdf["stratum"]).value_counts(dropna=False)
    items = [(str(k), int(v)) for k, v in vc.items() if str(k) != UNKNOWN]
    if UNKNOWN in vc.index:
        items.append((UNKNOWN, int(vc[UNKNOWN])))
    return dict(items)
