"""Cached wrappers (``st_``-prefixed) over gpcore and the pure map helpers.

Runs are immutable once written, so everything about a run is cached by ``(run path, stamp)``
where the stamp says when the run was written (:func:`gpcore.run.rundir.stamp`). The bodies live in gpcore
(:mod:`gpcore.run.rundir`, :mod:`gpcore.run.decisions`, :mod:`gpcore.run.dataset`); this module caches them
(the Decide page's and the Change map's wrappers are in :mod:`app.decide_cache`). For a run with time as an input
the grid-valued wrappers take ``quarter``: :func:`st_run_data` then holds the grid at that quarter
(``grids/<quarter>.parquet``; the cells are the same at every quarter, only the predictions differ).
Heavy objects (frames, models, kernel features, raster indices) use ``st.cache_resource`` and are treated as
read-only; rendered strings and small tables use ``st.cache_data``.

Cost per click on a map (see ``benchmarks/bench_app.py``): ``st_kernel`` holds the grid's
features, so a slice is one matrix-vector product; the image is a palette PNG from the cached
raster index; the grid-map component's cell lookup is the cached ``st_grid_lookup``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from app import layers as L
from app import raster as R
from app.colors import ColorScale, format_number
from app.state import DatasetSpec
from gpcore.run.dataset import INTERNAL_COLUMNS as INTERNAL_COLUMNS  # the pages' names
from gpcore.run.dataset import Inspection, file_columns, inspect_source, units_of
from gpcore.run.predict import KernelCache as KernelCache

# ---------------------------------------------------------------------------------------------
# data sets
# ---------------------------------------------------------------------------------------------


@dataclass
class LoadedData:
    """The active data set, read and validated by gpcore (read-only; shared between sessions)."""

    spec: DatasetSpec
    frame: object  # GeoDataFrame: lon, lat, target, stratum, ...
    source: str
    state: str | None
    report: object | None
    data_hash: str
    y_t: np.ndarray
    units: str
    period_free_hash: str = ""  # the data set's identity whatever its period (runs on its other quarters)

    @property
    def n(self) -> int:
        return len(self.frame)

    @property
    def strata_counts(self) -> dict[str, int]:
        return dict(self.frame.attrs.get("strata_counts") or {})


@st.cache_resource(show_spinner="Reading the data ...", max_entries=8)
def st_load_dataset(spec: DatasetSpec) -> LoadedData:
    """Read, validate and stratify a data set exactly as a run would (``gpcore.run.dataset.load_dataset``)."""
    from gpcore.identity import dataset_identity
    from gpcore.run.dataset import load_dataset

    cfg = spec.run_config()
    d = load_dataset(cfg)
    return LoadedData(spec, d.frame, d.source, d.state, d.frame.attrs.get("report"), d.data_hash, d.y_t,
                      units_of(spec.y), dataset_identity(cfg.to_dict(), period=False) or "")


@st.cache_resource(show_spinner="Reading the file ...", max_entries=8)
def st_columns(source: str) -> tuple[list[str], dict]:
    """The file's columns as read and their profiles (DataError only when the file cannot be read at all)."""
    return file_columns(_path_of(DatasetSpec(source=source)))


def _path_of(spec: DatasetSpec):
    from gpcore import data as D

    return D.sample_path(spec.sample_key) if spec.sample_key else _source_path(spec.source)


@st.cache_resource(show_spinner="Inspecting the file ...", max_entries=8)
def st_inspect(source: str, lon: str | None = None, lat: str | None = None) -> Inspection:
    """What a file holds and what gpcore detects (``gpcore.run.dataset.inspect_source``; DataError if unusable)."""
    return inspect_source(_path_of(DatasetSpec(source=source)), lon, lat, st_columns(source)[1])


def _source_path(source: str) -> Path:
    from app.state import source_path

    return source_path(source)


@st.cache_data(show_spinner=False, max_entries=16)
def st_region_outline(state: str | None, data_key: str | None = None, _frame=None) -> tuple[str, tuple]:
    """GeoJSON text and ``(W, S, E, N)`` of a run's or data set's region: the bundled state, else the hull."""
    import geopandas as gpd

    from gpcore import data as D

    if state:
        geom = D.state_boundary(state)
    else:
        geom = D.region_from_data(_frame, how="hull")
    gs = gpd.GeoSeries([geom], crs="EPSG:4326").simplify(0.001)
    return gs.to_json(), tuple(float(v) for v in gs.total_bounds)


@st.cache_data(show_spinner=False, max_entries=16)
def st_strata_outlines(strata: str | None, state: str | None) -> list[tuple[str, str, tuple]]:
    """``[(label, geojson text, rgb)]`` outlines of the strata polygons, if the strata have polygons."""
    import geopandas as gpd

    from gpcore import data as D
    from gpcore.data import _bundled

    if strata == "county_metro":
        counties = _bundled.counties()
        if state:
            counties = counties[counties["STUSPS"].str.upper() == state.upper()]
        out = []
        for label, flag, rgb in (("metro counties", True, (200, 30, 30)), ("non-metro counties", False, (30, 30, 30))):
            part = counties[counties["metro"].astype(bool) == flag]
            if len(part):
                gs = gpd.GeoSeries(part.geometry.values, crs="EPSG:4326").simplify(0.001)
                out.append((label, gs.to_json(), rgb))
        return out
    if strata and strata.startswith("polygons:"):
        ref = strata[len("polygons:") :]
        path = _source_path(ref) if ref.startswith(("upload:", "file:")) else Path(ref)
        polys = D.read_polygons(path)
        gs = gpd.GeoSeries(polys.geometry.values, crs="EPSG:4326").simplify(0.0005)
        return [("strata polygons", gs.to_json(), (200, 30, 30))]
    return []


@st.cache_data(show_spinner=False, max_entries=8)
def st_points_json(_data: LoadedData, key: str, scale_name: str, lo: float, hi: float) -> str:
    """Measurements as coloured points with tooltips (cached per data set and colour scale).

    At most :data:`MAP_POINTS` of them (:func:`map_sample`): the browser parses and draws every point of
    the JSON on each page visit, and 26,000 points made switching to the Data page take 2-5 s.
    """
    from gpcore import data as D

    scale = ColorScale(scale_name, lo, hi)
    tr = D.get_transform(_data.spec.transform)
    f = _data.frame.iloc[map_sample(len(_data.frame))]
    y = f[_data.spec.y].to_numpy(dtype=float)
    fields = {"v": [format_number(v) for v in y]}
    if "stratum" in f.columns:
        fields["s"] = f["stratum"].astype(str).to_numpy()
    rgb = scale.rgb(tr.forward(y))
    return L.points_json(f["lon"].to_numpy(), f["lat"].to_numpy(), rgb, fields)


#: Most measurements a map draws (a fixed random sample above it; every row still trains and is summarised).
MAP_POINTS = 12_000


def map_sample(n: int, limit: int = MAP_POINTS) -> np.ndarray:
    """Row positions a measurement map draws: all ``n`` up to ``limit``, else a seeded sample in row order."""
    if n <= limit:
        return np.arange(n)
    return np.sort(np.random.default_rng(0).choice(n, size=limit, replace=False))


def map_sample_note(n: int) -> str:
    """The caption under a measurement map that draws a sample ("" when it draws every point)."""
    if n <= MAP_POINTS:
        return ""
    return (f"The map draws {MAP_POINTS:,} of the {n:,} measurements (a fixed random sample, so the page stays "
            "fast); every measurement is used for training and in the summary.")


# ---------------------------------------------------------------------------------------------
# runs
# ---------------------------------------------------------------------------------------------


def list_runs():
    """All valid runs in the store (the user's, newest first, then the bundled ones). Not cached: cheap."""
    return list_runs_checked()[0]


def list_runs_checked() -> tuple[list, list[tuple[str, str]]]:
    """``(runs, skipped)``: the valid runs, and ``(run id, reason)`` of those whose run.json is malformed."""
    from gpcore.run.store import RunStore

    store = RunStore()
    _clean_store_once(str(store.root))
    runs = store.list()
    return runs, store.invalid()


@st.cache_resource(show_spinner=False)
def _clean_store_once(root: str) -> list[str]:
    """Remove what killed processes left in the store, once per server process (see RunStore.clean_leftovers)."""
    from gpcore.run.store import RunStore

    return RunStore(root).clean_leftovers()


def run_key(info) -> tuple[str, float]:
    """Cache key of a run: its path and when it was written."""
    from gpcore.run.rundir import stamp

    return str(info.path), stamp(info.path)


@dataclass
class RunData:
    """A run's manifest and prediction grid plus lookup helpers (read-only)."""

    run_id: str
    path: Path
    manifest: dict
    grid: pd.DataFrame | None
    transform: object
    units: str
    half_w: float
    half_h: float
    _tree: object
    bounds: tuple[float, float, float, float] = (0.0, 0.0, 1.0, 1.0)
    """``(W, S, E, N)`` of the grid's cells in degrees."""
    quarter: str | None = None
    """A run with time as an input: the quarter of ``grid``'s predictions (None for a spatial run)."""

    @property
    def quarters(self) -> list[str]:
        """The quarters a run with time as an input has grids for, in time order ([] for a spatial run)."""
        if not self.config.get("time_input"):
            return []
        return list((self.manifest.get("time") or {}).get("grid_quarters") or [])

    @property
    def t(self) -> float | None:
        """The decimal year of :attr:`quarter` (the model's last input), or None for a spatial run."""
        from gpcore.data.temporal import parse_quarter

        return parse_quarter(self.quarter) if self.quarter and self.config.get("time_input") else None

    @property
    def config(self) -> dict:
        return self.manifest.get("config", {})

    @property
    def model(self) -> str:
        return self.config.get("model", "?")

    @property
    def target(self) -> str:
        return self.config.get("y", "y")

    @property
    def t_units(self) -> str:
        """Units of the model space, e.g. ``log10(Mbps)``."""
        return self.transform.units_label(self.units) or self.units

    def nearest_cell(self, lon: float, lat: float) -> int:
        c = np.cos(np.radians(float(np.median(self.grid.lat))))
        _, i = self._tree.query([lon * c, lat])
        return int(i)

    def title(self) -> str:
        return run_title(self.run_id, self.manifest)


def run_title(run_id: str, manifest: dict) -> str:
    model = manifest.get("config", {}).get("model", "?")
    created = (manifest.get("created") or "")[:16].replace("T", " ")
    label = manifest.get("label") or model
    cfg = manifest.get("config", {})
    if cfg.get("split") == "block" and "block" not in label:  # which test split the run's metrics come from
        label += f" · spatial blocks {float(cfg.get('block_km', 10.0)):g} km"
    return f"{label} · {created}" if created else f"{label} · {run_id}"


def run_titles(runs) -> dict[str, str]:
    """``{run_id: title}`` for the run selectors (bundled runs say so; :func:`unique_labels`)."""
    return unique_labels({r.run_id: run_title(r.run_id, r.manifest) + (" (bundled)" if r.bundled else "")
                          for r in runs})


def unique_labels(titles: dict[str, str]) -> dict[str, str]:
    """``titles`` with the run id added to every label that two runs share: a selectbox tells its options apart by
    their labels (two runs of one model in the same minute with the same NLL would otherwise pick the first)."""
    seen: dict[str, int] = {}
    for label in titles.values():
        seen[label] = seen.get(label, 0) + 1
    return {rid: f"{label} · {rid}" if seen[label] > 1 else label for rid, label in titles.items()}


def has_grid(path) -> bool:
    """Whether the run at ``path`` has a prediction grid."""
    from gpcore.run.rundir import has_grid as run_has_grid

    return run_has_grid(path)


def runs_with_grid(runs) -> list:
    """The runs that have a prediction grid (what Maps and Decide can show)."""
    return [r for r in runs if has_grid(r.path)]


@st.cache_resource(show_spinner="Loading the run ...", max_entries=32)
def st_run_data(path: str, stamp: float, quarter: str | None = None) -> RunData:
    """A run's manifest and grid; for a run with time as an input its grid at ``quarter`` (default its latest)."""
    from dataclasses import replace

    from scipy.spatial import cKDTree

    from gpcore import data as D
    from gpcore.run import rundir

    if quarter is not None:  # the same cells (lookup helpers shared) with that quarter's predictions
        base = st_run_data(path, stamp)
        if quarter == base.quarter or not base.quarters:
            return base
        return replace(base, grid=rundir.read_grid(path, quarter), quarter=quarter)
    p = Path(path)
    manifest = rundir.read_manifest(p)
    grid = rundir.read_grid(p)
    cfg = manifest.get("config", {})
    tr = D.get_transform(cfg.get("transform", "identity"))
    hw = hh = 0.01
    tree = None
    bounds = (0.0, 0.0, 1.0, 1.0)
    if grid is not None and len(grid):
        hws, hhs = R.spacing_half_sizes(grid["lon"].to_numpy(), grid["lat"].to_numpy())
        hw, hh = float(hws[0]), float(hhs[0])
        c = np.cos(np.radians(float(np.median(grid["lat"]))))
        tree = cKDTree(np.column_stack([grid["lon"].to_numpy() * c, grid["lat"].to_numpy()]))
        lon, lat = grid["lon"].to_numpy(), grid["lat"].to_numpy()
        bounds = (float(lon.min() - hw), float(lat.min() - hh), float(lon.max() + hw), float(lat.max() + hh))
    latest = (manifest.get("time") or {}).get("grid_quarter") if cfg.get("time_input") else None
    return RunData(p.name, p, manifest, grid, tr, units_of(cfg.get("y", "")), hw, hh, tree, bounds, latest)


def get_run(run_id: str | None):
    """``RunData`` of a run id in the store (None if there is no such run, or it is damaged: with a warning)."""
    from gpcore.errors import GPCoreError

    if not run_id:
        return None
    for info in list_runs():
        if info.run_id == run_id:
            try:
                return st_run_data(*run_key(info))
            except GPCoreError as exc:
                from app.safe_html import md_text

                st.warning(md_text(exc))
                return None
    return None


@st.cache_resource(show_spinner="Loading the model ...", max_entries=6)
def st_model(path: str, stamp: float):
    """The trained model of a run (loaded once per run, never retrained); a ``vecchia`` / ``dbk-nn`` run's stored
    grid factor goes back into it (``gpcore.run.grid_joint.prime``; a run with time as an input: at its grid's
    quarter), so decisions on the grid start there."""
    from gpcore.run import grid_joint
    from gpcore.run.rundir import load_model

    model = load_model(path, device="auto")
    run = st_run_data(path, stamp)
    grid_joint.prime(path, model, run.grid, run.quarter)
    return model


@st.cache_resource(show_spinner="Caching the grid's kernel features ...", max_entries=4)
def st_kernel(path: str, stamp: float, t: float | None = None) -> KernelCache:
    """The grid's kernel pieces; for a run with time as an input the grid cells at the decimal year ``t``
    (a slice is then ``k((x, t), (x_ref, t_ref))``: pass ``x_ref`` with its ``t_ref``)."""
    run = st_run_data(path, stamp)
    model = st_model(path, stamp)
    Xg = run.grid[["lon", "lat"]].to_numpy(dtype=np.float64)
    if t is not None:
        Xg = np.column_stack([Xg, np.full(len(Xg), float(t))])
    return KernelCache(model.kernel_slicer(Xg), Xg, model)


@st.cache_resource(show_spinner=False, max_entries=8)
def st_raster(path: str, stamp: float) -> R.RasterIndex:
    run = st_run_data(path, stamp)
    g = run.grid
    n = len(g)
    return R.build_raster_index(
        g["lon"].to_numpy(), g["lat"].to_numpy(), np.full(n, run.half_w), np.full(n, run.half_h)
    )


@st.cache_resource(show_spinner=False, max_entries=8)
def st_index_png(path: str, stamp: float) -> str:
    """The grid's pixel -> cell index PNG (:func:`app.gridmap.index_png`), shared by every lookup of the run."""
    from app import gridmap

    return gridmap.index_png(st_raster(path, stamp))


@st.cache_resource(show_spinner="Preparing the map cells ...", max_entries=16)
def st_grid_lookup(path: str, stamp: float, quarter: str | None = None) -> dict:
    """Tooltip and click lookup of a run's grid (at ``quarter``) for :func:`app.gridmap.grid_map` (made once)."""
    from app import gridmap

    run = st_run_data(path, stamp, quarter)
    g = run.grid
    values = {k: g[c].to_numpy() for k, c in (("m", "mean"), ("lo", "lower"), ("hi", "upper"), ("w", "width"),
                                                ("wt", "width_t"))}
    return gridmap.lookup(st_raster(path, stamp), g["cell_id"].to_numpy(), values, run.units, run.t_units,
                          key=f"{path}:{stamp}" + (f":{quarter}" if quarter else ""),
                          index_url=st_index_png(path, stamp))


@st.cache_data(show_spinner=False, max_entries=64)
def st_grid_image(path: str, stamp: float, column: str, scale_name: str, lo: float, hi: float,
                  quarter: str | None = None) -> str:
    """Data URL of one grid column (at ``quarter``) coloured on ``[lo, hi]`` (cached: switching maps or quarters
    back recomputes nothing)."""
    scale = ColorScale(scale_name, lo, hi)
    run = st_run_data(path, stamp, quarter)
    values = run.grid[column].to_numpy(dtype=float)
    return R.data_url(R.palette_png(scale.index(values), st_raster(path, stamp), scale.name))


def slice_image(path: str, stamp: float, values: np.ndarray, scale: ColorScale) -> str:
    """Data URL of a kernel slice (not cached: it changes with every click)."""
    return R.data_url(R.palette_png(scale.index(values), st_raster(path, stamp), scale.name))


@st.cache_data(show_spinner=False, max_entries=16)
def st_test_predictions(path: str, stamp: float) -> pd.DataFrame:
    from gpcore.run.rundir import read_test_predictions

    return read_test_predictions(path)


@st.cache_data(show_spinner=False, max_entries=16)
def st_metrics(path: str, stamp: float) -> pd.DataFrame:
    from gpcore.run.rundir import read_metrics

    return read_metrics(path)


# ---------------------------------------------------------------------------------------------
# exports (called lazily by download buttons)
# ---------------------------------------------------------------------------------------------


def export_grid_bytes(path: str, fmt: str, quarter: str | None = None) -> bytes:
    """The run's prediction grid (a run with time as an input: at ``quarter``) as GeoTIFF, GeoJSON or CSV bytes
    (``gpcore.run.decisions.export_grid_bytes``)."""
    from gpcore.run.decisions import export_grid_bytes as grid_bytes

    return grid_bytes(path, fmt, quarter)


def model_zip_bytes(path: str) -> bytes:
    """The run's model (``model.json`` + ``model.safetensors``) as a zip (``gpcore.run.rundir.model_zip``)."""
    from gpcore.run.rundir import model_zip

    return model_zip(path)


def manifest_bytes(path: str) -> bytes:
    """The run's validated manifest file, for its download (``gpcore.run.rundir.manifest_bytes``)."""
    from gpcore.run.rundir import manifest_bytes as read_bytes

    return read_bytes(path)

