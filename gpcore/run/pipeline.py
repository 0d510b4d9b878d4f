"""The run pipeline: one validated :class:`RunConfig` -> data, split, fit, metrics, grid predictions, written
as one run folder (:mod:`gpcore.run.rundir`).

A *run* is what the dashboard trains and what ``python -m gpcore fit`` writes. Both call
:func:`execute_run`; the dashboard never re-implements a step. A run is written only for a finite model,
atomically (:func:`gpcore.run.rundir.writing`); ``out_dir`` must be new or empty unless ``overwrite=True``
replaces a run.

Metrics are reported in the space the model is trained in (e.g. log10 Mbps, docs/metrics.md §7);
map columns ``mean``, ``lower``, ``upper`` and ``width`` are back-transformed to the data's
original units (for log targets ``mean`` is the predictive median, ``10 ** mean_t``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import platform
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpcore import metrics as M
from gpcore.device import describe_device
from gpcore.errors import ConfigError, DataError, TrainingError
from gpcore.identity import HASH_OF, dataset_identity
from gpcore.run import grid_joint, rundir
from gpcore.run.config import RunConfig
from gpcore.run.predict import grid_predictions, input_columns, quarter_grid_predictions, run_inputs, time_summary
from gpcore.run.timespan import check_time_rows

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
    #: per-row decimal years of the time column (None without one); with ``time_input`` also ``X[:, 2]``
    t: np.ndarray | None = None


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
        over_time = cfg.time_input or cfg.test_period  # every quarter unless --quarter says otherwise
        quarter = cfg.quarter or (None if over_time else _sample_info(D, key, "default_quarter"))
    else:
        source, state, quarter = cfg.data, None, cfg.quarter
    if cfg.test_period and quarter not in (None, "", "all"):  # the forecast split's test period is read too
        quarter = f"{quarter},{cfg.test_period}"
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
    t = gdf["time_year"].to_numpy(dtype=np.float64) if "time_year" in gdf.columns else None
    if t is None and (cfg.time_input or cfg.split == "forecast"):
        raise DataError(f"{'--time-input' if cfg.time_input else '--split forecast'} needs a time column (quarters "
                        "like 2023Q1 or dates) and none was found; name it with --time COLUMN")
    check_time_rows(t, cfg.time_input, cfg.quarter)
    X = gdf[list(input_columns(cfg.time_input))].to_numpy(dtype=np.float64)
    y = tr.forward(gdf[cfg.y].to_numpy(dtype=np.float64))
    strata = gdf["stratum"].astype(str).to_numpy() if "stratum" in gdf.columns else None
    tr_i, va_i, te_i = split_indices(cfg, X, t)
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
        t=t,
    )


def split_indices(cfg: RunConfig, X: np.ndarray, t: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Train / validation / test row indices of ``X`` (lon, lat[, t]) for ``cfg.split``: a seeded random 8:1:1
    split, whole ``cfg.block_km`` squares (:func:`gpcore.data.block_split`), or the quarters before
    ``cfg.test_period`` and those in it (:func:`gpcore.data.splits.forecast_split`, by the decimal years ``t``)."""
    from gpcore import data as D

    if cfg.split == "random":
        return D.random_split(len(X), seed=cfg.seed)
    if cfg.split == "forecast":
        from gpcore.data.splits import forecast_split

        if t is None:
            raise DataError("--split forecast needs a time column (quarters like 2023Q1 or dates); name it with --time")
        return forecast_split(t, cfg.test_period, seed=cfg.seed, what="--test-period")
    return D.block_split(X[:, 0], X[:, 1], block_km=cfg.block_km, seed=cfg.seed)


def run_weights(gdf, column: str | None) -> np.ndarray | None:
    """The run's per-row weights from ``column`` (validated >= 0 by the reader); a model needs > 0."""
    if not column:
        return None
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


def metrics_table(mean, var_y, y, strata=None, *, shape=None, var_f=None) -> pd.DataFrame:
    """Tidy metrics overall and per stratum (transformed units); ``shape``: a skewed predictive
    (:mod:`gpcore.metrics`)."""
    return M.evaluate_groups(mean, var_y, y, strata, shape=shape, var_f=var_f)


#: suffix of the metrics rows of a recalibrated run's model before recalibration
NO_RECAL = " (no recalibration)"


def run_metrics(mean, var_y, y, strata=None, weights=None, weight_name: str | None = None, *, shape=None,
                var_f=None) -> pd.DataFrame:
    """A run's metrics rows: overall, per stratum and, with weights, per measurement-count bin; with the model's
    noise ``shape`` (and ``var_f``) those of its skewed predictive."""
    kw = {"shape": shape, "var_f": var_f}
    table = metrics_table(mean, var_y, y, strata, **kw)
    if weights is not None:  # 1, 2-4, 5-16, >16 measurements
        table = pd.concat([table, M.evaluate_weight_bins(mean, var_y, y, weights, weight_name or "weight", **kw)],
                          ignore_index=True)
    return table


def run_model_settings(cfg: RunConfig, prep: PreparedData) -> dict:
    """The model settings of a run: the config's, plus, when the config does not set ``recalibrate`` itself, the
    model's ``run_recalibration`` (``"group"``; ``"none"`` for ``vecchia`` and ``dbk-nn``) on data with strata; on a
    forecast split never ``"none"``: ``"group"`` with strata, else ``"global"`` (its validation quarter is a
    one-quarter-ahead forecast, whose error has a part no earlier quarter shows, and not equally in every stratum:
    docs/methods/spacetime.md, "The forecast split"); plus
    ``space_time="separable"`` for a ``time_input`` run of a model that has that setting and no value for it; plus
    :func:`cv_settings` unless the intervals are recalibrated on the validation rows."""
    from gpcore.models import model_spec

    settings = cfg.model_settings()
    cls = model_spec(cfg.model).cls
    if cfg.time_input and "space_time" in cls.Config.field_names():
        settings.setdefault("space_time", "separable")
    if "recalibrate" not in settings:
        kind = cls.run_recalibration if prep.strata is not None else "none"
        if cfg.split == "forecast" and kind == "none":
            kind = "group" if prep.strata is not None else "global"
        if kind != "none" or prep.strata is not None:
            settings["recalibrate"] = kind
    for key, value in cv_settings(cfg, cls, settings.get("recalibrate", "none")).items():
        settings.setdefault(key, value)
    if settings.get("cv_calibration") == "none" and "noise_shape" not in cfg.model_settings():
        settings.pop("noise_shape", None)  # the user turned the cross-validation off: no shape without it
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


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:60] or "run"


def new_run_id(cfg: RunConfig) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")[:-3]
    return f"{stamp}-{_slug(cfg.model)}"


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


def cv_settings(cfg: RunConfig, cls, recalibrate: str = "none") -> dict:
    """The cross-validated latent scale a spatial run gives a model with the ``cv_calibration`` setting
    (``vecchia``, ``dbk-nn``; docs/calibration.md, "The latent scale from cross-validation"): folds like the run's
    test split, rows for a random split, ``block_km`` squares for a block split; fitted with the skewed noise
    ``noise_shape="two_component"`` (docs/calibration.md, "A skewed noise from cross-validation"). None for a
    ``time_input`` run or a
    forecast split (their folds would be quarters), another model, or a model whose intervals are recalibrated on the
    validation rows (``recalibrate`` not ``"none"``: one calibration of the intervals, not two)."""
    if "cv_calibration" not in cls.Config.field_names() or cfg.time_input or cfg.split not in ("random", "block") \
            or recalibrate != "none":
        return {}
    shape = {"noise_shape": "two_component"}
    if cfg.split == "random":
        return {"cv_calibration": "rows", **shape}
    return {"cv_calibration": "blocks", "cv_block_km": float(cfg.block_km), **shape}


def uncalibrated_var_y(model, pred, groups=None, weights=None) -> np.ndarray | None:
    """``var_y`` of ``pred`` before the model's calibration: the validation recalibration's scale divided out, or the
    cross-validated latent scale ``c`` of ``vecchia`` / ``dbk-nn`` (``var_y - var_f (1 - 1/c)``, docs/calibration.md),
    and with a noise shape the Gaussian noise in place of the mixture's, without the noise scales per tests count
    (``var_f / c + s``; ``weights``: the rows' counts, as ``pred`` was predicted with); None for a model without
    either. The metrics of it are Gaussian."""
    if model.recal_:
        return pred.var_y / model.variance_scale(len(pred.var_y), groups)
    from gpcore.models.vecchia_cv import applied

    cv = applied(getattr(model, "train_info_", None))
    if cv is None:
        return None
    if pred.shape is not None:
        return pred.var_f / cv["scale"] + pred.noise() / model.noise_multiplier(weights, len(pred.var_f))
    return pred.var_y - pred.var_f * (1.0 - 1.0 / cv["scale"])


def execute_run(cfg: RunConfig, out_dir, callback=None, prepared: PreparedData | None = None, log=None,
                overwrite: bool = False) -> Path:
    """Run everything for ``cfg`` and write the run directory ``out_dir``. Returns its path.

    ``callback(progress)`` is forwarded to ``model.fit`` (return ``False`` to cancel; the best
    model so far is kept and the run is still written, marked cancelled).

    ``out_dir`` must be missing or empty (a folder :meth:`gpcore.run.store.RunStore.new_run_dir` reserved);
    ``overwrite=True`` replaces an existing run there completely. The run is written atomically
    (:func:`gpcore.run.rundir.writing`), so a crash or kill never leaves a half run. A fit that produced no
    finite model raises :class:`TrainingError` and writes nothing.
    """
    from gpcore.models import make_model

    log = log or (lambda msg: None)
    out = rundir.check_out_dir(out_dir, overwrite)
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
    table = run_metrics(pred.mean, pred.var_y, y_te, st_te, w_te, cfg.weight, shape=pred.shape, var_f=pred.var_f)
    raw_var = uncalibrated_var_y(model, pred, st_te, w_te)
    if raw_var is not None:  # the same metrics before recalibration, labelled '<group> (no recalibration)'
        raw = run_metrics(pred.mean, raw_var, y_te, st_te, w_te, cfg.weight)
        raw["group"] = raw["group"] + NO_RECAL
        table = pd.concat([table, raw], ignore_index=True)
    table["fit_seconds"] = fit_s
    table["predict_seconds"] = predict_s
    grid = build_grid(cfg, prep)
    with rundir.writing(out, overwrite) as tmp:
        _write_run(cfg, tmp, out, model, prep, pred, table, grid, fit_s, predict_s, t_all)
    log(f"wrote {out}")
    return out


def _write_run(cfg, out, final, model, prep, pred, table, grid, fit_s, predict_s, t_all) -> None:
    """Write every file of a run into ``out`` (named ``final`` in the manifest)."""
    grid_s = 0.0
    y_te = prep.y[prep.test_idx]
    st_te = prep.strata[prep.test_idx] if prep.strata is not None else None
    w = prep.weights
    w_te = None if w is None else w[prep.test_idx]
    gp = None
    quarter_grids, time_info = None, None
    if grid is not None and cfg.time_input:  # one grid per quarter; grid.parquet is the latest one
        t0 = time.perf_counter()
        quarter_grids = quarter_grid_predictions(model, grid, prep.transform, prep.t)
        gp = quarter_grids[max(quarter_grids)]
        grid_s = time.perf_counter() - t0
    elif grid is not None:
        t0 = time.perf_counter()
        gp = grid_predictions(model, grid, prep.transform)
        grid_s = time.perf_counter() - t0
    if prep.t is not None:
        time_info = time_summary(cfg, prep.t, quarter_grids, prep.frame.attrs.get("time"))
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
    if pred.shape is not None:  # the skewed predictive the metrics scored (gpcore.models.noise_shape.of_rows)
        test_df = test_df.assign(**pred.shape.columns())
    if prep.t is not None:
        test_df["t"] = prep.t[prep.test_idx]
    rundir.write_tables(out, model=model, test_predictions=test_df, metrics=table, history=_clean(model.history_),
                        grid=gp, cells=grid, quarter_grids=quarter_grids)
    # vecchia / dbk-nn: decisions start here (a run with time as an input: at its grid's quarter)
    joint_s = grid_joint.write(out, model, gp, time_info["grid_quarter"] if cfg.time_input and time_info else None)
    manifest = {
        "format": rundir.RUN_FORMAT,
        "run_id": final.name,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "label": cfg.label or f"{cfg.model} on {Path(prep.source_label).name}",
        "config": cfg.to_dict(),
        "model_config": model.config.to_dict(),
        "data": {
            "source": prep.source_label,
            "hash": prep.data_hash,
            "hash_of": HASH_OF,
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
            "grid_joint_seconds": joint_s,
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
        "time": time_info,
    }
    rundir.write_manifest(out, _clean(manifest))


def _grid_spec(grid) -> dict | None:
    """The grid layout (CRS, cell size, origin) so exports need not rebuild the grid."""
    spec = None if grid is None else grid.attrs.get("grid")
    if spec is None:
        return None
    return dataclasses.asdict(spec) if dataclasses.is_dataclass(spec) else dict(spec)


def _clean(obj):
    from gpcore.models import jsonable as _jsonable

    return _jsonable(obj)


def evaluate_run(run_dir, data: str, *, quarter: str | None = None, strata: str | None = None,
                 allow_drop: bool = True) -> pd.DataFrame:
    """A stored run's metrics on a labelled data file (its strata, or ``strata``; each row with its own weight)."""
    from gpcore import data as D
    from gpcore.run.store import load_run

    manifest, model = load_run(run_dir)
    cfg = RunConfig.from_dict(manifest["config"])
    gdf = D.read_measurements(D.resolve_data(data), target=cfg.y, transform=cfg.transform, quarter=quarter,
                              allow_drop=allow_drop, weight=cfg.weight, time=cfg.time if cfg.time_input else None)
    gdf = apply_strata(gdf, strata or cfg.strata, manifest["data"].get("state"))
    y = D.get_transform(cfg.transform).forward(gdf[cfg.y].to_numpy(float))
    groups = gdf["stratum"].astype(str).to_numpy() if "stratum" in gdf.columns else None
    w = run_weights(gdf, cfg.weight) if model.weighted else None  # each row with its own measurement count
    pred = model.predict(run_inputs(cfg, gdf), weights=w, groups=groups)
    return run_metrics(pred.mean, pred.var_y, y, groups, w, cfg.weight, shape=pred.shape, var_f=pred.var_f)
