"""Cached wrappers (``st_``-prefixed) over gpcore and the pure map helpers.

Runs are immutable once written, so everything about a run is cached by ``(run path, stamp)``
where the stamp is the mtime of its ``run.json``. Heavy objects (frames, models, kernel
features, raster indices) use ``st.cache_resource`` and are treated as read-only; rendered
strings and small tables use ``st.cache_data``.

Cost per click on a map (see ``benchmarks/bench_app.py``): ``st_kernel`` holds the grid's
features, so a slice is one matrix-vector product; the image is a palette PNG from the cached
raster index; the grid-map component's cell lookup is the cached ``st_grid_lookup``.
"""

from __future__ import annotations

import io
import json
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from app import layers as L
from app import raster as R
from app.colors import ColorScale, format_number
from app.state import DatasetSpec

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

    @property
    def n(self) -> int:
        return len(self.frame)

    @property
    def strata_counts(self) -> dict[str, int]:
        return dict(self.frame.attrs.get("strata_counts") or {})


def units_of(column: str) -> str:
    """Units read off a column name (``download_mbps`` -> ``Mbps``); empty when unknown."""
    low = column.lower()
    for suffix, unit in (("_mbps", "Mbps"), ("_kbps", "kbps"), ("_ms", "ms"), ("_km", "km"), ("_m", "m")):
        if low.endswith(suffix):
            return unit
    return ""


@st.cache_resource(show_spinner="Reading the data ...", max_entries=8)
def st_load_dataset(spec: DatasetSpec) -> LoadedData:
    """Read, validate and stratify a data set exactly as a run would (``gpcore.runs.load_frame``)."""
    from gpcore import data as D
    from gpcore.identity import dataset_identity
    from gpcore.runs import frame_hash, load_frame

    cfg = spec.run_config()
    gdf, source, state = load_frame(cfg)
    tr = D.get_transform(spec.transform)
    X = gdf[["lon", "lat"]].to_numpy(dtype=np.float64)
    y_t = tr.forward(gdf[spec.y].to_numpy(dtype=np.float64))
    return LoadedData(
        spec=spec,
        frame=gdf,
        source=source,
        state=state,
        report=gdf.attrs.get("report"),
        data_hash=dataset_identity(cfg.to_dict()) or frame_hash(X, y_t),
        y_t=y_t,
        units=units_of(spec.y),
    )


@dataclass
class Inspection:
    """What a file holds, for the column-mapping widgets (auto-detected picks included)."""

    columns: list[str]
    numeric: list[str]  # number columns as the reader treats them (a few text cells allowed), no coordinates
    lon: str | None
    lat: str | None
    time: str | None
    quarters: list[str]
    rows: int
    report_text: str
    profiles: dict  # name -> gpcore.data.columns.ColumnProfile (of the raw file rows)

    def default_target(self) -> str | None:
        from gpcore.data.columns import guess_target

        return guess_target({n: self.profiles[n] for n in self.numeric}, coordinates=(self.lon, self.lat))


#: Columns the reader adds (never offered as target, weight or strata).
INTERNAL_COLUMNS = {"geometry", "lon", "lat", "time_year"}


@st.cache_resource(show_spinner="Reading the file ...", max_entries=8)
def st_columns(source: str) -> tuple[list[str], dict]:
    """The file's columns as read and their profiles (DataError only when the file cannot be read at all)."""
    from gpcore.data.columns import profile_columns, read_table

    spec = DatasetSpec(source=source)
    path = _path_of(spec)
    df = read_table(path)
    profiles = profile_columns(df)
    return list(profiles), profiles


def _path_of(spec: DatasetSpec):
    from gpcore import data as D

    return D.sample_path(spec.sample_key) if spec.sample_key else _source_path(spec.source)


@st.cache_resource(show_spinner="Inspecting the file ...", max_entries=8)
def st_inspect(source: str, lon: str | None = None, lat: str | None = None) -> Inspection:
    """Read a file once without a target to list its columns and what gpcore detects (DataError if unusable).

    ``lon`` / ``lat`` are the user's coordinate columns (None: auto-detect).
    """
    from gpcore import data as D
    from gpcore.data.columns import is_coordinate_name

    spec = DatasetSpec(source=source)
    gdf = D.read_measurements(_path_of(spec), lon=lon, lat=lat, allow_drop=True)
    rep = gdf.attrs["report"]
    _, raw = st_columns(source)
    from gpcore.data.columns import profile_column

    # columns the reader derives (Ookla's download_mbps from avg_d_kbps) are profiled as read
    profiles = {**raw, **{c: profile_column(gdf[c]) for c in gdf.columns if c not in raw and c != "geometry"}}
    columns = [c for c in gdf.columns if c != "geometry"]
    used = {rep.columns.get("lon"), rep.columns.get("lat")}
    numeric = [c for c in columns if c in profiles and profiles[c].numeric and c not in INTERNAL_COLUMNS
               and c not in used and not is_coordinate_name(c)]
    time_col = rep.columns.get("time")
    quarters: list[str] = []
    if time_col:
        labels = pd.Series(D.temporal.quarter_labels(gdf[time_col])).dropna().astype(str)
        quarters = sorted(labels.unique().tolist())
    return Inspection(
        columns=columns,
        numeric=numeric,
        lon=rep.columns.get("lon"),
        lat=rep.columns.get("lat"),
        time=time_col,
        quarters=quarters,
        rows=len(gdf),
        report_text=rep.to_text(),
        profiles=profiles,
    )


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
    from gpcore.store import RunStore

    store = RunStore()
    _clean_store_once(str(store.root))
    runs = store.list()
    return runs, store.invalid()


@st.cache_resource(show_spinner=False)
def _clean_store_once(root: str) -> list[str]:
    """Remove what killed processes left in the store, once per server process (see RunStore.clean_leftovers)."""
    from gpcore.store import RunStore

    return RunStore(root).clean_leftovers()


GRID_COLUMNS = ("cell_id", "lon", "lat", "mean_t", "width_t", "mean", "lower", "upper", "width")


def _read_run_table(p: Path, kind: str, columns=()) -> pd.DataFrame:
    """A run's Parquet/CSV file, checked for its columns; RunError naming run and file when damaged."""
    from gpcore.errors import RunError

    try:
        df = pd.read_csv(p) if kind == "csv" else pd.read_parquet(p)
    except Exception as e:  # noqa: BLE001 - pyarrow/pandas raise many types for damaged files
        raise RunError(f"run '{p.parent.name}': {p.name} cannot be read ({type(e).__name__}); delete or re-run it") \
            from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise RunError(f"run '{p.parent.name}': {p.name} lacks the column(s) {', '.join(missing)}; re-run it")
    return df


def run_key(info) -> tuple[str, float]:
    """Cache key of a run: its path and the mtime of its run.json."""
    path = Path(info.path)
    return str(path), (path / "run.json").stat().st_mtime


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
    """``{run_id: title}`` for the run selectors (bundled runs say so)."""
    return {r.run_id: run_title(r.run_id, r.manifest) + (" (bundled)" if r.bundled else "") for r in runs}


def runs_with_grid(runs) -> list:
    """The runs that have a prediction grid (what Maps and Decide can show)."""
    return [r for r in runs if (r.path / "grid.parquet").is_file()]


@st.cache_resource(show_spinner="Loading the run ...", max_entries=8)
def st_run_data(path: str, stamp: float) -> RunData:
    from scipy.spatial import cKDTree

    from gpcore import data as D
    from gpcore.errors import RunError
    from gpcore.store import read_manifest

    p = Path(path)
    manifest = read_manifest(p)
    grid = _read_run_table(p / "grid.parquet", "parquet", GRID_COLUMNS) if (p / "grid.parquet").is_file() else None
    if grid is not None:
        try:
            grid = grid.astype({c: float for c in GRID_COLUMNS if c != "cell_id"})
        except (TypeError, ValueError):
            raise RunError(f"run '{p.name}': grid.parquet holds non-numeric predictions; re-run it") from None
        if not (np.isfinite(grid["lon"]).all() and np.isfinite(grid["lat"]).all()):
            raise RunError(f"run '{p.name}': grid.parquet has cells without finite coordinates; re-run it")
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
    return RunData(p.name, p, manifest, grid, tr, units_of(cfg.get("y", "")), hw, hh, tree, bounds)


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
    """The trained model of a run (loaded once per run, never retrained)."""
    from gpcore.models import load_model

    return load_model(Path(path) / "model", device="auto")


@dataclass
class KernelCache:
    """Per-grid kernel pieces: ``slicer(x_ref) -> k(grid, x_ref)`` and, on first use, ``k(x, x)`` on the grid."""

    slicer: object
    grid_X: np.ndarray
    model: object
    _diag: np.ndarray | None = None

    @property
    def diag(self) -> np.ndarray:
        """Prior variance ``k(x, x)`` at every grid cell (computed once, for the correlation view)."""
        if self._diag is None:
            self._diag = self.model.kernel_diag(self.grid_X)
        return self._diag

    def slice(self, x_ref, mode: str = "kernel") -> np.ndarray:
        """``k(grid, x_ref)``; ``mode`` "correlation" divides by ``sqrt(k(x,x) k(x_ref,x_ref))``,
        "max" by the largest ``|k|`` over the grid (the paper's Fig. 5)."""
        k = self.slicer(np.asarray(x_ref, dtype=float))
        if mode == "correlation":
            k_ref = float(self.model.kernel_diag(np.asarray(x_ref, dtype=float)[None, :])[0])
            with np.errstate(invalid="ignore", divide="ignore"):
                return k / np.sqrt(np.maximum(self.diag, 1e-300) * max(k_ref, 1e-300))
        if mode == "max":
            m = float(np.max(np.abs(k))) or 1.0
            return k / m
        return k


@st.cache_resource(show_spinner="Caching the grid's kernel features ...", max_entries=4)
def st_kernel(path: str, stamp: float) -> KernelCache:
    run = st_run_data(path, stamp)
    model = st_model(path, stamp)
    Xg = run.grid[["lon", "lat"]].to_numpy(dtype=np.float64)
    return KernelCache(model.kernel_slicer(Xg), Xg, model)


@st.cache_resource(show_spinner=False, max_entries=8)
def st_raster(path: str, stamp: float) -> R.RasterIndex:
    run = st_run_data(path, stamp)
    g = run.grid
    n = len(g)
    return R.build_raster_index(
        g["lon"].to_numpy(), g["lat"].to_numpy(), np.full(n, run.half_w), np.full(n, run.half_h)
    )


@st.cache_resource(show_spinner="Preparing the map cells ...", max_entries=8)
def st_grid_lookup(path: str, stamp: float) -> dict:
    """Tooltip and click lookup of a run's grid for :func:`app.gridmap.grid_map` (made once per run)."""
    from app import gridmap

    run = st_run_data(path, stamp)
    g = run.grid
    values = {k: g[c].to_numpy() for k, c in (("m", "mean"), ("lo", "lower"), ("hi", "upper"), ("w", "width"),
                                                ("wt", "width_t"))}
    return gridmap.lookup(st_raster(path, stamp), g["cell_id"].to_numpy(), values, run.units, run.t_units,
                          key=f"{path}:{stamp}")


@st.cache_data(show_spinner=False, max_entries=32)
def st_grid_image(path: str, stamp: float, column: str, scale_name: str, lo: float, hi: float) -> str:
    """Data URL of one grid column coloured on ``[lo, hi]`` (cached: switching maps recomputes nothing)."""
    scale = ColorScale(scale_name, lo, hi)
    run = st_run_data(path, stamp)
    values = run.grid[column].to_numpy(dtype=float)
    return R.data_url(R.palette_png(scale.index(values), st_raster(path, stamp), scale.name))


def slice_image(path: str, stamp: float, values: np.ndarray, scale: ColorScale) -> str:
    """Data URL of a kernel slice (not cached: it changes with every click)."""
    return R.data_url(R.palette_png(scale.index(values), st_raster(path, stamp), scale.name))


@st.cache_data(show_spinner=False, max_entries=16)
def st_test_predictions(path: str, stamp: float) -> pd.DataFrame:
    p = Path(path) / "test_predictions.parquet"
    return _read_run_table(p, "parquet", ("y", "mean", "var_y", "stratum")) if p.is_file() else pd.DataFrame()


@st.cache_data(show_spinner=False, max_entries=16)
def st_metrics(path: str, stamp: float) -> pd.DataFrame:
    p = Path(path) / "metrics.csv"
    return _read_run_table(p, "csv", ("group", "nll")) if p.is_file() else pd.DataFrame()


# ---------------------------------------------------------------------------------------------
# exports (called lazily by download buttons)
# ---------------------------------------------------------------------------------------------


def export_grid_bytes(path: str, fmt: str) -> bytes:
    """The run's prediction grid as GeoTIFF, GeoJSON or CSV bytes (via ``gpcore.data.export_predictions``)."""
    from gpcore import data as D

    grid = run_grid_frame(path)
    cols = [c for c in (*D.PRED_COLUMNS, "mean_t", "sd_t", "width_t") if c in grid.columns]
    manifest = json.loads((Path(path) / "run.json").read_text())
    tags = {
        "model": manifest.get("config", {}).get("model", ""),
        "target": manifest.get("config", {}).get("y", ""),
        "transform": manifest.get("config", {}).get("transform", ""),
        "run_id": manifest.get("run_id", Path(path).name),
    }
    suffix = {"geotiff": ".tif", "geojson": ".geojson", "csv": ".csv"}[fmt]
    with tempfile.TemporaryDirectory() as tmp:
        out = D.export_predictions(grid, Path(tmp) / f"predictions{suffix}", columns=cols,
                                   tags=tags if fmt == "geotiff" else None)
        return out.read_bytes()


def run_grid_frame(path: str):
    """The run's grid as a GeoDataFrame with its predictions and its ``GridSpec`` (for GeoTIFF).

    The spec is read from ``run.json["grid"]`` when the run recorded it, else the grid is rebuilt
    with :func:`gpcore.runs.build_grid` (deterministic) and matched by ``cell_id``.
    """
    import geopandas as gpd

    from gpcore import data as D
    from gpcore import runs
    from gpcore.errors import GPCoreError

    p = Path(path)
    manifest = json.loads((p / "run.json").read_text())
    preds = pd.read_parquet(p / "grid.parquet")
    spec = manifest.get("grid")
    if isinstance(spec, dict) and "transform" in spec:
        cells = (gpd.read_parquet(p / "grid_cells.parquet") if (p / "grid_cells.parquet").is_file()
                 else gpd.read_file(p / "grid_cells.geojson", engine="pyogrio"))
        grid = cells.merge(preds, on="cell_id", how="inner")
        spec = D.GridSpec(**{**spec, "transform": tuple(spec["transform"])})
        if "row" not in grid.columns and spec.kind == "square":
            grid["row"], grid["col"] = np.divmod(grid["cell_id"].to_numpy(dtype=np.int64), spec.width)
        grid.attrs["grid"] = spec
        return grid
    cfg = runs.RunConfig.from_dict(manifest["config"])

    class _Prep:  # what build_grid reads: the state, and the frame when the region is the data's hull
        state = manifest.get("data", {}).get("state")

        @property
        def frame(self):
            return runs.load_frame(cfg)[0]

    rebuilt = runs.build_grid(cfg, _Prep())
    if rebuilt is None:
        raise GPCoreError("this run has no prediction grid to export")
    spec_obj = rebuilt.attrs.get("grid")
    grid = rebuilt[["cell_id", "row", "col", "geometry"]].merge(preds, on="cell_id", how="inner")
    if len(grid) != len(preds):
        raise GPCoreError(
            f"the rebuilt grid matches {len(grid)} of the run's {len(preds)} cells; export GeoJSON or CSV instead"
        )
    grid.attrs["grid"] = spec_obj
    return grid


#: The files of the model format (GPModel.save): nothing else in model/ is ever exported.
MODEL_FILES = ("model.json", "model.safetensors")


def model_zip_bytes(path: str) -> bytes:
    """The run's model (``model.json`` + ``model.safetensors``) as a zip. Only those two names, only regular
    files (a symlink, e.g. to a system file, is refused), only inside the run folder."""
    from gpcore.errors import RunError

    folder = Path(path) / "model"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in MODEL_FILES:
            f = folder / name
            if folder.is_symlink() or f.is_symlink() or not f.is_file():
                raise RunError(f"run '{Path(path).name}': model/{name} is missing or not a regular file")
            zf.writestr(f"model/{name}", f.read_bytes())
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------
# Decide page (gpcore.decide over a run's stored grid; nothing is retrained)
# ---------------------------------------------------------------------------------------------


@st.cache_resource(show_spinner=False, max_entries=4)
def st_run_cells(path: str, stamp: float):
    """The run's grid with its cell polygons (``gpcore.runs.load_run_grid``), for areas and exports."""
    from gpcore.runs import load_run_grid

    return load_run_grid(path)


@st.cache_data(show_spinner=False, max_entries=16)
def st_exceedance(path: str, stamp: float, threshold: float, units: str, direction: str) -> np.ndarray:
    """P(f below/above the threshold) per grid cell from the run's stored marginals (``O(cells)``)."""
    from gpcore import decide

    run = st_run_data(path, stamp)
    model = st_model(path, stamp)
    pred = decide.grid_prediction(run.grid, model.noise_variance, model.variance_scale(len(run.grid)))
    return decide.exceedance(model, run.grid[["lon", "lat"]].to_numpy(float), threshold, units=units,
                             transform=run.transform, direction=direction, pred=pred).p_f


@st.cache_data(show_spinner="Assigning cells to areas ...", max_entries=8)
def st_area_labels(path: str, stamp: float, source: str) -> np.ndarray:
    """The area of each grid cell: ``counties`` (bundled, the run's state) or ``strata`` (the run's strata)."""
    from gpcore import decide
    from gpcore.runs import apply_strata

    run = st_run_data(path, stamp)
    state_code = run.manifest.get("data", {}).get("state")
    g = run.grid
    if source == "strata":
        return apply_strata(g[["lon", "lat"]].copy(), run.config.get("strata"), state_code)["stratum"].to_numpy(
            dtype=object)
    return decide.assign_areas(g["lon"].to_numpy(), g["lat"].to_numpy(), decide.bundled_counties(state_code), "NAME")


@st.cache_data(show_spinner=False, max_entries=16)
def st_joint_unavailable(path: str, stamp: float) -> str | None:
    """Why the run's model has no joint posterior (vecchia, dbk-nn), or None when it has one."""
    from gpcore.posterior import joint_unavailable

    return joint_unavailable(st_model(path, stamp))


@st.cache_data(show_spinner="Computing the areas' posteriors ...", max_entries=8)
def st_areas(path: str, stamp: float, source: str, weights: str, threshold: float, units: str,
             samples: int = 0) -> pd.DataFrame:
    """Posterior of each area's weighted mean, ranked by P(area mean below the threshold)."""
    from gpcore import decide

    run = st_run_data(path, stamp)
    model = st_model(path, stamp)
    labels = st_area_labels(path, stamp, source)
    w = None
    if weights == "area":
        cells = st_run_cells(path, stamp)
        area = pd.Series(decide.cell_areas_km2(cells), index=cells["cell_id"].to_numpy())
        w = area.reindex(run.grid["cell_id"].to_numpy()).fillna(0.0).to_numpy()
    tab = decide.area_posteriors(model, run.grid[["lon", "lat"]].to_numpy(float), labels, weights=w,
                                 threshold=threshold, units=units, transform=run.transform, samples=samples)
    return tab.sort_values("p_below", ascending=False).reset_index(drop=True)


@st.cache_data(show_spinner="Drawing joint samples ...", max_entries=8)
def st_samples(path: str, stamp: float, seed: int, n: int = 4) -> np.ndarray:
    """``n`` joint posterior samples over the grid (model space), seeded."""
    from gpcore import decide

    run = st_run_data(path, stamp)
    return decide.plausible_maps(st_model(path, stamp), run.grid[["lon", "lat"]].to_numpy(float), n, seed=seed)


@st.cache_resource(show_spinner="Choosing where to measure next ...", max_entries=8)
def st_suggest(path: str, stamp: float, k: int, target: str, threshold: float, units: str, min_km: float):
    """Greedy suggestions over the grid cells (``gpcore.decide.suggest``) and the target mask used."""
    from gpcore import decide

    run = st_run_data(path, stamp)
    model = st_model(path, stamp)
    X = run.grid[["lon", "lat"]].to_numpy(float)
    if target == "undecided":
        mask = decide.undecided_mask(st_exceedance(path, stamp, threshold, units, "below"))
    elif target.startswith("stratum:"):
        mask = st_area_labels(path, stamp, "strata") == target.split(":", 1)[1]
    else:
        mask = np.ones(len(X), dtype=bool)
    if not mask.any():
        return None, mask
    return decide.suggest(model, X, X[mask], k=k, min_km=min_km), mask
