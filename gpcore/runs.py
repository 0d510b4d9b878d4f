"""Runs: one validated :class:`RunConfig` -> data, split, fit, metrics, grid predictions, saved to disk.

A *run* is what the dashboard trains and what ``python -m gpcore fit`` writes. Both call
:func:`execute_run`; the dashboard never re-implements a step. A run directory holds::

    run.json                 RunConfig, manifest (data hash, versions, seed, timings, device), metrics
    model/                   the trained model (model.json + model.safetensors; no pickle)
    metrics.csv              tidy metrics per stratum (all / metro / non-metro ...), transformed units
    test_predictions.parquet test rows: lon, lat, y, mean, var_y, stratum (transformed units)
    grid.parquet             prediction grid: cell_id, lon, lat, mean_t, sd_t, mean, lower, upper, width
    grid_cells.parquet       the grid polygons as GeoParquet (cell_id, geometry; for maps and exports)
    history.json             per-epoch loss and validation NLL

A run is written only for a finite model, into a hidden temporary folder renamed into place when
complete (no half runs); ``out_dir`` must be new or empty unless ``overwrite=True`` replaces a run.

Metrics are reported in the space the model is trained in (e.g. log10 Mbps, ALGORITHMS.md 7);
map columns ``mean``, ``lower``, ``upper`` and ``width`` are back-transformed to the data's
original units (for log targets ``mean`` is the predictive median, ``10 ** mean_t``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import re
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpcore import metrics as M
from gpcore.device import describe_device
from gpcore.errors import ConfigError, RunError, TrainingError
from gpcore.identity import dataset_identity

RUN_FORMAT = "gpcore-run"
#: A run being written: ``.tmp-<run id>-<pid>-<8 hex>`` beside its final folder, renamed when complete.
TMP_RE = re.compile(r"\.tmp-.+-(\d+)-[0-9a-f]{8}")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (used to tell a leftover temporary run from one being written)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


@dataclass(frozen=True)
class RunConfig:
    """Everything needed to reproduce a run. The UI builds it, :func:`execute_run` consumes it,
    ``run.json`` stores it.

    ``data`` is a file path or ``sample:<key>`` for bundled data (``sample:puerto_rico``).
    ``strata`` is ``None``, ``"county_metro"``, ``"column:<NAME>"`` or ``"polygons:<PATH>"``.
    ``region`` (grid extent) is ``"auto"`` (state boundary of a bundled sample, else the data's
    convex hull), ``"hull"``, ``"bbox"`` or ``"state:<CODE>"``.
    """

    data: str
    y: str
    model: str = "dbk"
    settings: dict = field(default_factory=dict)
    x: tuple[str, str] | None = None
    transform: str = "identity"
    quarter: str | None = None
    weight: str | None = None
    time: str | None = None
    strata: str | None = None
    split: str = "random"
    block_km: float = 10.0
    seed: int = 0
    allow_drop: bool = True
    grid_kind: str = "square"
    grid_cell_km: float = 0.0
    grid_zoom: int = 13
    grid_target_cells: int = 20000
    region: str = "auto"
    label: str = ""

    def __post_init__(self):
        if self.split not in ("random", "block"):
            raise ConfigError(f"split={self.split!r} is not allowed; allowed values: 'random', 'block'")
        if self.grid_kind not in ("square", "quadkey", "none"):
            raise ConfigError(f"grid_kind={self.grid_kind!r} is not allowed; allowed: 'square', 'quadkey', 'none'")
        if self.strata is not None and not (
            self.strata == "county_metro" or self.strata.startswith(("column:", "polygons:"))
        ):
            raise ConfigError(
                f"strata={self.strata!r} is not allowed; use 'county_metro', 'column:<NAME>' or 'polygons:<PATH>'"
            )
        for name in ("data", "y", "model", "transform", "region", "label"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"{name}={getattr(self, name)!r} must be text")
        if not isinstance(self.settings, dict):
            raise ConfigError(f"settings={self.settings!r} must be a mapping of model settings")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed={self.seed!r} is not allowed; use a whole number >= 0 (e.g. --seed 0)")
        for name, lo, strict in (("block_km", 0.0, True), ("grid_cell_km", 0.0, False)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo or (
                strict and v == lo
            ):
                raise ConfigError(f"{name}={v!r} is not allowed; use a finite number {'>' if strict else '>='} {lo:g}")
        if isinstance(self.grid_zoom, bool) or not isinstance(self.grid_zoom, int) or not 0 <= self.grid_zoom <= 24:
            raise ConfigError(f"grid_zoom={self.grid_zoom!r} is not allowed; use a quadkey zoom level 0..24")
        if not isinstance(self.grid_target_cells, int) or self.grid_target_cells < 1:
            raise ConfigError(f"grid_target_cells={self.grid_target_cells!r} is not allowed; use a count >= 1")
        from gpcore.models import model_spec

        model_spec(self.model)  # raises ConfigError for unknown models

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        if not isinstance(d, dict):
            raise ConfigError(f"a run configuration must be an object of settings, not {type(d).__name__}")
        allowed = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - allowed
        if unknown:
            raise ConfigError(f"unknown run setting(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        d = dict(d)
        if d.get("x") is not None:
            x = d["x"]
            if not isinstance(x, (list, tuple)) or len(x) != 2 or not all(isinstance(c, str) for c in x):
                raise ConfigError(f"x={x!r} must name two coordinate columns, e.g. ['lon', 'lat']")
            d["x"] = tuple(x)
        return cls(**d)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["x"] = list(self.x) if self.x else None
        return d

    def model_settings(self) -> dict:
        return {"seed": self.seed, **self.settings}


# ---------------------------------------------------------------------------------------------
# data preparation
# ---------------------------------------------------------------------------------------------


@dataclass
class PreparedData:
    """Arrays a run trains on, plus what the report and maps need."""

    frame: Any  # GeoDataFrame with lon, lat, target, stratum
    X: np.ndarray  # n x 2 (lon, lat)
    y: np.ndarray  # (n,) transformed target
    strata: np.ndarray | None
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    transform: Any
    data_hash: str
    source_label: str
    state: str | None
    report_text: str
    #: per-row weights (``RunConfig.weight``, e.g. Ookla ``tests``), None for an unweighted run
    weights: np.ndarray | None = None


def _sample_key(data: str) -> str | None:
    return data.split(":", 1)[1] if data.startswith("sample:") else None


def load_frame(cfg: RunConfig):
    """Read and validate the run's data (DataError on any problem). Returns ``(gdf, source, state)``."""
    from gpcore import data as D

    key = _sample_key(cfg.data)
    lon, lat = cfg.x or (None, None)
    if key is not None:
        source = str(D.sample_path(key))
        state = _sample_state(D, key)
        quarter = cfg.quarter or _sample_info(D, key, "default_quarter")
    else:
        source, state, quarter = cfg.data, None, cfg.quarter
    gdf = D.read_measurements(
        source,
        lon=lon,
        lat=lat,
        target=cfg.y,
        transform=cfg.transform,
        weight=cfg.weight,
        time=cfg.time,
        quarter=quarter,
        allow_drop=cfg.allow_drop,
    )
    return apply_strata(gdf, cfg.strata, state), source, state


def apply_strata(gdf, strata: str | None, state: str | None = None):
    """Add the ``stratum`` column named by a RunConfig ``strata`` string."""
    from gpcore import data as D

    if not strata:
        return gdf
    if strata == "county_metro":
        return D.assign_strata(gdf, "county_metro", state=state)
    if strata.startswith("column:"):
        return D.assign_strata(gdf, "column", column=strata.split(":", 1)[1])
    return D.assign_strata(gdf, "polygons", polygons=strata.split(":", 1)[1])


def _sample_info(D, key, attr, default=None):
    info = D.SAMPLES.get(key)
    if isinstance(info, dict):
        return info.get(attr, default)
    return getattr(info, attr, default)


def _sample_state(D, key):
    return _sample_info(D, key, "state")


def frame_hash(X: np.ndarray, y: np.ndarray) -> str:
    """Checksum of the arrays a run trained on; a fallback identity only when the source file is gone
    (identity is :func:`gpcore.identity.dataset_identity`: file content + data spec, never floats)."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(X, dtype=np.float64).tobytes())
    h.update(np.ascontiguousarray(y, dtype=np.float64).tobytes())
    return h.hexdigest()[:16]


def prepare(cfg: RunConfig, gdf=None) -> PreparedData:
    """Load (unless ``gdf`` is given), transform, split. Deterministic in ``cfg.seed``."""
    from gpcore import data as D

    if gdf is None:
        gdf, source, state = load_frame(cfg)
    else:
        key = _sample_key(cfg.data)
        source = cfg.data
        state = _sample_state(D, key) if key else None
    tr = D.get_transform(cfg.transform)
    X = gdf[["lon", "lat"]].to_numpy(dtype=np.float64)
    y = tr.forward(gdf[cfg.y].to_numpy(dtype=np.float64))
    strata = gdf["stratum"].astype(str).to_numpy() if "stratum" in gdf.columns else None
    tr_i, va_i, te_i = split_indices(cfg, X)
    report = gdf.attrs.get("report")
    weights = run_weights(gdf, cfg.weight)
    return PreparedData(
        frame=gdf,
        X=X,
        y=y,
        strata=strata,
        train_idx=np.asarray(tr_i),
        val_idx=np.asarray(va_i),
        test_idx=np.asarray(te_i),
        transform=tr,
        data_hash=dataset_identity(cfg.to_dict()) or frame_hash(X, y),
        source_label=source,
        state=state,
        report_text=report.to_text() if hasattr(report, "to_text") else "",
        weights=weights,
    )


def split_indices(cfg: RunConfig, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Train / validation / test row indices of ``X`` (lon, lat) for ``cfg.split``: a seeded random 8:1:1
    split, or whole ``cfg.block_km`` squares (:func:`gpcore.data.block_split`)."""
    from gpcore import data as D

    if cfg.split == "random":
        return D.random_split(len(X), seed=cfg.seed)
    return D.block_split(X[:, 0], X[:, 1], block_km=cfg.block_km, seed=cfg.seed)


def run_weights(gdf, column: str | None) -> np.ndarray | None:
    """The run's per-row weights from ``column`` (validated >= 0 by the reader); a model needs > 0."""
    if not column:
        return None
    from gpcore.errors import DataError

    w = gdf[column].to_numpy(dtype=np.float64)
    zero = np.flatnonzero(~(w > 0))
    if zero.size:
        raise DataError(
            f"column '{column}': {zero.size} row(s) have weight 0 (rows {', '.join(map(str, zero[:8]))}"
            f"{', ...' if zero.size > 8 else ''}); a weight is a number of measurements, so a row with none "
            "carries no data: drop those rows or run without --weight"
        )
    return w


# ---------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------


def package_versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("uncertainty-atlas", "torch", "numpy", "pandas", "geopandas", "shapely", "pyproj", "safetensors"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def metrics_table(mean, var_y, y, strata=None) -> pd.DataFrame:
    """Tidy metrics overall and per stratum (transformed units)."""
    return M.evaluate_groups(mean, var_y, y, strata)


#: suffix of the metrics rows of a recalibrated run's model before recalibration
NO_RECAL = " (no recalibration)"


def run_metrics(mean, var_y, y, strata=None, weights=None, weight_name: str | None = None) -> pd.DataFrame:
    """A run's metrics rows: overall, per stratum and, with weights, per measurement-count bin."""
    table = metrics_table(mean, var_y, y, strata)
    if weights is not None:  # 1, 2-4, 5-16, >16 measurements
        table = pd.concat([table, M.evaluate_weight_bins(mean, var_y, y, weights, weight_name or "weight")],
                          ignore_index=True)
    return table


def run_model_settings(cfg: RunConfig, prep: PreparedData) -> dict:
    """The model settings of a run: the config's, plus ``recalibrate="group"`` when the data has strata
    and the config does not set ``recalibrate`` itself."""
    settings = cfg.model_settings()
    if prep.strata is not None and "recalibrate" not in settings:
        settings["recalibrate"] = "group"
    return settings


def build_grid(cfg: RunConfig, prep: PreparedData):
    """The prediction grid for a run (None when ``grid_kind="none"``)."""
    from gpcore import data as D

    if cfg.grid_kind == "none":
        return None
    if cfg.region == "auto":
        region = prep.state if prep.state else D.region_from_data(prep.frame, how="hull")
    elif cfg.region in ("hull", "bbox"):
        region = D.region_from_data(prep.frame, how=cfg.region)
    elif cfg.region.startswith("state:"):
        region = cfg.region.split(":", 1)[1]
    else:
        raise ConfigError(f"region={cfg.region!r} is not allowed; use auto, hull, bbox or state:<CODE>")
    if cfg.grid_kind == "quadkey":
        return D.make_grid(region, kind="quadkey", zoom=cfg.grid_zoom)
    cell_km = cfg.grid_cell_km or auto_cell_km(region, cfg.grid_target_cells)
    return D.make_grid(region, kind="square", cell_km=cell_km)


def auto_cell_km(region, target_cells: int) -> float:
    """Cell size (km, rounded to a 'nice' value) giving about ``target_cells`` cells over the region."""
    from gpcore import data as D

    geom = D.resolve_region(region)
    import geopandas as gpd

    gs = gpd.GeoSeries([geom], crs="EPSG:4326")
    area_km2 = float(gs.to_crs(gs.estimate_utm_crs()).area.iloc[0]) / 1e6
    raw = float(np.sqrt(max(area_km2, 1e-6) / max(target_cells, 1)))
    nice = np.array([0.25, 0.5, 1, 2, 2.5, 5, 10, 20, 25, 50, 100])
    return float(nice[np.argmin(np.abs(np.log(nice / raw)))])


def grid_predictions(model, grid, transform, level: float = 0.95) -> pd.DataFrame:
    """Predict on grid centres; transformed-space mean/sd plus back-transformed map columns."""
    Xg = grid[["lon", "lat"]].to_numpy(dtype=np.float64)
    pred = model.predict(Xg)
    lo_t, hi_t = pred.interval(level)
    out = pd.DataFrame(
        {
            "cell_id": grid["cell_id"].to_numpy(),
            "lon": Xg[:, 0],
            "lat": Xg[:, 1],
            "mean_t": pred.mean,
            "sd_t": pred.sd,
            "width_t": hi_t - lo_t,
            "mean": transform.inverse(pred.mean),
            "lower": transform.inverse(lo_t),
            "upper": transform.inverse(hi_t),
        }
    )
    out["width"] = out["upper"] - out["lower"]
    out["sd"] = out["sd_t"] if transform.name == "identity" else (out["upper"] - out["lower"]) / (2 * M.Z95)
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:60] or "run"


def new_run_id(cfg: RunConfig) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")[:-3]
    return f"{stamp}-{_slug(cfg.model)}"


def check_out_dir(out_dir, overwrite: bool = False) -> Path:
    """``out_dir`` may be missing or empty; a non-empty one only with ``overwrite`` and only if it is a run
    (holds run.json), so ``--overwrite`` never deletes a folder that is not a run. RunError otherwise."""
    out = Path(out_dir)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise RunError(f"--out '{out}' exists and is not a folder; choose a new run folder")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise RunError(
                f"--out '{out}' already holds files (an earlier run?); choose a new folder, or pass --overwrite "
                "to replace that run completely"
            )
        if not (out / "run.json").is_file():
            raise RunError(f"--out '{out}' is not empty and is not a run folder (no run.json); refusing to replace it")
    return out


def data_counts_text(prep: PreparedData) -> str:
    """``"data: 1000 rows read, 990 used, 10 dropped (reasons)"`` from the read report."""
    rep = prep.frame.attrs.get("report") if hasattr(prep.frame, "attrs") else None
    read = int(getattr(rep, "rows_read", 0) or len(prep.y))
    dropped = list(getattr(rep, "dropped", None) or [])
    n_drop = sum(int(d.count) for d in dropped)
    why = f" ({'; '.join(f'{d.count}: {d.reason}' for d in dropped)})" if dropped else ""
    return f"data: {read} rows read, {len(prep.y)} used, {n_drop} dropped{why}"


def check_finite_model(model, pred) -> None:
    """A run is only written for a finite model: finite parameters and finite test predictions."""
    bad = [k for k, v in model.module_.state_dict().items() if v.is_floating_point() and not v.isfinite().all()]
    if bad or not (np.all(np.isfinite(pred.mean)) and np.all(np.isfinite(pred.var_y))):
        what = f"parameters {', '.join(bad[:4])} are NaN/inf" if bad else "its test predictions are NaN/inf"
        raise TrainingError(
            f"training did not produce a finite model ({what}); lower the learning rate (lr), check the target's "
            "scale (rescale huge values or use a log transform) or use dtype='float64'; no run was written"
        )


def execute_run(cfg: RunConfig, out_dir, callback=None, prepared: PreparedData | None = None, log=None,
                overwrite: bool = False) -> Path:
    """Run everything for ``cfg`` and write the run directory ``out_dir``. Returns its path.

    ``callback(progress)`` is forwarded to ``model.fit`` (return ``False`` to cancel; the best
    model so far is kept and the run is still written, marked cancelled).

    ``out_dir`` must be missing or empty (a folder :meth:`gpcore.store.RunStore.new_run_dir` reserved);
    ``overwrite=True`` replaces an existing run there completely. The run is written to a hidden temporary
    folder beside ``out_dir`` and renamed into place, so a crash or kill never leaves a half run. A fit
    that produced no finite model raises :class:`TrainingError` and writes nothing.
    """
    from gpcore.models import make_model

    log = log or (lambda msg: None)
    out = check_out_dir(out_dir, overwrite)
    t_all = time.perf_counter()
    prep = prepared or prepare(cfg)
    log(data_counts_text(prep))
    log(f"data: {len(prep.y)} rows, train/val/test = {len(prep.train_idx)}/{len(prep.val_idx)}/{len(prep.test_idx)}")
    model = make_model(cfg.model, **run_model_settings(cfg, prep))
    w = prep.weights
    st = prep.strata
    t0 = time.perf_counter()
    model.fit(
        prep.X[prep.train_idx],
        prep.y[prep.train_idx],
        prep.X[prep.val_idx],
        prep.y[prep.val_idx],
        callback=callback,
        **({} if w is None else {"weights": w[prep.train_idx], "val_weights": w[prep.val_idx]}),
        **({} if st is None else {"groups": st[prep.train_idx], "val_groups": st[prep.val_idx]}),
    )
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    w_te = None if w is None else w[prep.test_idx]
    st_te = st[prep.test_idx] if st is not None else None
    pred = model.predict(prep.X[prep.test_idx], weights=w_te, groups=st_te)  # each test row with its own count
    predict_s = time.perf_counter() - t0
    check_finite_model(model, pred)
    y_te = prep.y[prep.test_idx]
    table = run_metrics(pred.mean, pred.var_y, y_te, st_te, w_te, cfg.weight)
    if model.recal_:  # the same metrics before recalibration, labelled '<group> (no recalibration)'
        raw = run_metrics(pred.mean, pred.var_y / model.variance_scale(len(y_te), st_te), y_te, st_te, w_te,
                          cfg.weight)
        raw["group"] = raw["group"] + NO_RECAL
        table = pd.concat([table, raw], ignore_index=True)
    table["fit_seconds"] = fit_s
    table["predict_seconds"] = predict_s
    grid = build_grid(cfg, prep)
    final, out = out, _tmp_dir(out)
    try:
        _write_run(cfg, out, final, model, prep, pred, table, grid, fit_s, predict_s, t_all)
        _publish(out, final, overwrite)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    log(f"wrote {final}")
    return final


def _tmp_dir(final: Path) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    for p in final.parent.glob(".tmp-*"):  # leftovers of killed writers of this folder's runs
        m = TMP_RE.fullmatch(p.name)
        if m and p.is_dir() and not p.is_symlink() and not pid_alive(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{os.urandom(4).hex()}"
    tmp.mkdir()
    return tmp


def _publish(tmp: Path, final: Path, overwrite: bool) -> None:
    """Rename the complete run into place (replacing an empty reserved folder, or an old run on overwrite)."""
    old = None
    if final.is_dir() and any(final.iterdir()):
        check_out_dir(final, overwrite)  # something filled it while this run trained
        old = final.parent / f".tmp-{final.name}-{os.getpid()}-{os.urandom(4).hex()}"
        os.replace(final, old)
    try:
        os.replace(tmp, final)
    except OSError:
        if old is not None:
            os.replace(old, final)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write_run(cfg, out, final, model, prep, pred, table, grid, fit_s, predict_s, t_all) -> float:
    """Write every file of a run into ``out`` (named ``final`` in the manifest); returns the grid seconds."""
    grid_s = 0.0
    y_te = prep.y[prep.test_idx]
    st_te = prep.strata[prep.test_idx] if prep.strata is not None else None
    w = prep.weights
    w_te = None if w is None else w[prep.test_idx]
    if grid is not None:
        t0 = time.perf_counter()
        gp = grid_predictions(model, grid, prep.transform)
        grid_s = time.perf_counter() - t0
        gp.to_parquet(out / "grid.parquet", index=False)
        cells = grid[["cell_id", "geometry"]].copy()
        cells.attrs = {}  # the grid's attrs hold Python objects (GridSpec) that Parquet metadata cannot store
        cells.to_parquet(out / "grid_cells.parquet", index=False)
    model.save(out / "model")
    test_df = pd.DataFrame(
        {
            "lon": prep.X[prep.test_idx, 0],
            "lat": prep.X[prep.test_idx, 1],
            "y": y_te,
            "mean": pred.mean,
            "var_y": pred.var_y,
            "var_f": pred.var_f,
            "stratum": st_te if st_te is not None else "all",
        }
    )
    if w_te is not None:
        test_df["weight"] = w_te
    test_df.to_parquet(out / "test_predictions.parquet", index=False)
    table.to_csv(out / "metrics.csv", index=False)
    (out / "history.json").write_text(json.dumps(_clean(model.history_), indent=1, allow_nan=False))
    manifest = {
        "format": RUN_FORMAT,
        "run_id": final.name,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "label": cfg.label or f"{cfg.model} on {Path(prep.source_label).name}",
        "config": cfg.to_dict(),
        "model_config": model.config.to_dict(),
        "data": {
            "source": prep.source_label,
            "hash": prep.data_hash,
            "hash_of": "file content + data spec",  # gpcore.identity; older runs hashed floats
            "rows": int(len(prep.y)),
            "n_train": int(len(prep.train_idx)),
            "n_val": int(len(prep.val_idx)),
            "n_test": int(len(prep.test_idx)),
            "state": prep.state,
            "target": cfg.y,
            "transform": cfg.transform,
            "report": prep.report_text,
        },
        "timings": {
            "fit_seconds": fit_s,
            "predict_test_seconds": predict_s,
            "predict_grid_seconds": grid_s,
            "total_seconds": time.perf_counter() - t_all,
        },
        "train_info": model.train_info_,
        "noise_variance": model.noise_variance,
        "weights": None if w is None else {
            "column": cfg.weight,
            "nugget_variance": model.nugget_variance,
            "measurement_noise_variance": model.measurement_noise_variance,
            "grid_measurements": 1,
        },
        "recalibration": model.recal_,
        "device": describe_device(model.config.device),
        "versions": package_versions(),
        "metrics": table.replace({np.nan: None}).to_dict(orient="records"),
        "grid_cells": 0 if grid is None else int(len(grid)),
        "grid": _grid_spec(grid),
    }
    (out / "run.json").write_text(json.dumps(_clean(manifest), indent=2, allow_nan=False))
    return grid_s


def _grid_spec(grid) -> dict | None:
    """The grid layout (CRS, cell size, origin) so exports need not rebuild the grid."""
    spec = None if grid is None else grid.attrs.get("grid")
    if spec is None:
        return None
    return dataclasses.asdict(spec) if dataclasses.is_dataclass(spec) else dict(spec)


def _clean(obj):
    from gpcore.models import jsonable as _jsonable

    return _jsonable(obj)


def load_run_grid(run_dir):
    """A run's prediction grid as a GeoDataFrame (``grid.parquet`` joined to ``grid_cells.parquet`` polygons),
    with its ``GridSpec`` in ``attrs["grid"]`` when the run recorded one (needed for GeoTIFF output).

    Used by the decision commands (``python -m gpcore exceed|areas|sample|suggest``) so nothing is retrained.
    """
    import geopandas as gpd

    from gpcore import data as D
    from gpcore.errors import GPCoreError

    p = Path(run_dir)
    if not (p / "run.json").is_file():
        raise GPCoreError(f"'{p}' is not a run directory (no run.json); pass the --out of `gpcore fit`")
    if not (p / "grid.parquet").is_file():
        raise GPCoreError(f"run '{p}' has no prediction grid (it was trained with --grid none); refit with a grid")
    manifest = json.loads((p / "run.json").read_text())
    try:
        preds = pd.read_parquet(p / "grid.parquet")
        cells = gpd.read_parquet(p / "grid_cells.parquet") if (p / "grid_cells.parquet").is_file() else None
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types for damaged files
        raise RunError(f"run '{p}': its grid files cannot be read ({type(e).__name__}); re-run the fit") from None
    if cells is not None:
        grid = cells.merge(preds, on="cell_id", how="inner")
    else:
        grid = gpd.GeoDataFrame(preds, geometry=gpd.points_from_xy(preds["lon"], preds["lat"]), crs=4326)
    spec = manifest.get("grid")
    if isinstance(spec, dict) and "transform" in spec:
        spec = D.GridSpec(**{**spec, "transform": tuple(spec["transform"])})
        if "row" not in grid.columns and spec.kind == "square":
            grid["row"], grid["col"] = np.divmod(grid["cell_id"].to_numpy(dtype=np.int64), spec.width)
        grid.attrs["grid"] = spec
    return grid
