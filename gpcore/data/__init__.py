"""Spatial data layer: everything gpcore reads or writes about places.

Coordinate convention (used by every function here and by the models)
-----------------------------------------------------------------------
Locations are ``(lon, lat)`` in degrees, EPSG:4326, in that order: ``X[:, 0]`` is longitude and
``X[:, 1]`` latitude (a third column, when present, is time in decimal years). Files in any CRS are
reprojected to EPSG:4326 on reading; projected CRSs are used only inside this package (local UTM or
equal-area projections for centroids, km grids and spatial blocks). A region box is ``(W, E, S, N)``.
Models do their own input scaling (the DBK protocol maps ``(lon, lat)`` to ``[-1, 1]^2`` with the state's
bounding box, :func:`state_bbox`); nothing here rescales coordinates.
The formats read and this convention in full: docs/data.md.

Parts
-----
* reading: :func:`read_measurements` (CSV/TSV, Parquet, GeoParquet, GeoJSON, GeoPackage, zipped Shapefile,
  Ookla tiles) -> point GeoDataFrame with ``attrs["report"]`` (:class:`ReadReport`);
* preparing: :func:`get_transform` (identity, log10, log), :func:`model_inputs`, :func:`random_split`,
  :func:`block_split`, :mod:`~gpcore.data.temporal` (quarters and dates);
* strata: :func:`assign_strata` (a column, a polygon layer, or the bundled county metro / non-metro split);
* grids: :func:`make_grid` (square km cells or quadkey tiles), :func:`region_from_data`, :func:`state_boundary`;
* exports: :func:`export_predictions` (GeoTIFF, GeoJSON, GeoPackage, CSV, Parquet);
* bundled data: :data:`SAMPLES`, :func:`sample_path`, :func:`resolve_data`, :func:`load_sample`,
  :mod:`~gpcore.data.synthetic`;
* large tables: :class:`gpcore.data.parquet_stream.ParquetSource` (batches / per-rank shards of a Parquet file);
* ``python -m gpcore data inspect FILE``: :mod:`gpcore.data.inspect`.

Every problem with user data raises :class:`~gpcore.errors.DataError`, whose message names the file,
column, rows (1-based data rows) and the fix.
"""

from gpcore.data import synthetic, temporal
from gpcore.data._source import DEFAULT_MAX_BYTES
from gpcore.data.export import PRED_COLUMNS, export_predictions
from gpcore.data.grid import DEFAULT_MAX_CELLS, GridSpec, make_grid
from gpcore.data.inputs import ModelInputs, model_inputs
from gpcore.data.readers import MIN_POINTS, read_measurements
from gpcore.data.regions import (
    available_states,
    read_polygons,
    region_from_data,
    resolve_region,
    state_bbox,
    state_boundary,
)
from gpcore.data.report import Dropped, ReadReport
from gpcore.data.samples import OOKLA_ATTRIBUTION, SAMPLES, SampleInfo, load_sample, resolve_data, sample_path
from gpcore.data.splits import block_ids, block_split, random_split
from gpcore.data.strata import COUNTY_METRO_LABEL, STRATA_SOURCES, assign_strata, strata_counts
from gpcore.data.transforms import TRANSFORMS, TargetTransform, get_transform
from gpcore.errors import DataError

__all__ = [
    "COUNTY_METRO_LABEL",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_CELLS",
    "MIN_POINTS",
    "OOKLA_ATTRIBUTION",
    "PRED_COLUMNS",
    "SAMPLES",
    "STRATA_SOURCES",
    "TRANSFORMS",
    "DataError",
    "Dropped",
    "GridSpec",
    "ModelInputs",
    "ReadReport",
    "SampleInfo",
    "TargetTransform",
    "assign_strata",
    "available_states",
    "block_ids",
    "block_split",
    "export_predictions",
    "get_transform",
    "load_sample",
    "make_grid",
    "model_inputs",
    "random_split",
    "read_measurements",
    "read_polygons",
    "region_from_data",
    "resolve_region",
    "resolve_data",
    "sample_path",
    "state_bbox",
    "state_boundary",
    "strata_counts",
    "synthetic",
    "temporal",
]
