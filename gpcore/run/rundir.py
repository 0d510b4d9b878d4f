"""The run folder's format: the only code that knows the names of the files inside a run folder.

A run folder holds::

    run.json                 RunConfig, manifest (data hash, versions, seed, timings, device), metrics
    model/                   the trained model (model.json + model.safetensors; no pickle)
    metrics.csv              tidy metrics per stratum (all / metro / non-metro ...), transformed units
    test_predictions.parquet test rows: lon, lat, y, mean, var_y, stratum (transformed units)
    grid.parquet             prediction grid: cell_id, lon, lat, mean_t, sd_t, mean, lower, upper, width
    grids/<quarter>.parquet  a run with time as an input: the grid at each quarter of its data (2019Q1.parquet ...;
                             grid.parquet is the latest); run.json "time" lists them
    grid_cells.parquet       the grid polygons as GeoParquet (cell_id, geometry; for maps and exports)
    grid_joint.safetensors   a vecchia / dbk-nn run: the joint posterior's sparse factor over grid.parquet's cells
                             (with time as an input: at its quarter), tied to grid.parquet and model/ by their SHA-256
                             (gpcore.run.grid_joint)
    history.json             per-epoch loss and validation NLL
    hyper_posterior.json     a vecchia / dbk-nn run with time as an input, after its first change between quarters:
                             the kernel hyperparameters' REML posterior, tied to model/ by a digest of its parameters
                             (gpcore.models.vecchia_hyper.to_record); written then, atomically, where the folder is
                             writable; a missing, stale or damaged one is computed again

Writing is atomic (:func:`writing`): every file goes into a hidden ``.tmp-<run id>-<pid>-<hex>`` folder beside
the final one, renamed into place when complete, so a crash or kill never leaves a half run. Reading goes
through one validated schema (:func:`read_manifest`): a malformed ``run.json`` raises :class:`RunError` naming
the field, and damaged tables raise :class:`RunError` naming the run and the file. Everything is JSON, Parquet
and safetensors: nothing is unpickled.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import shutil
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from gpcore.errors import GPCoreError, RunError
from gpcore.run.config import RunConfig

RUN_FORMAT = "gpcore-run"
MANIFEST = "run.json"
MODEL = "model"
#: The files of the model format (``GPModel.save``): nothing else in model/ is ever exported.
MODEL_FILES = ("model.json", "model.safetensors")
GRID = "grid.parquet"
#: the per-quarter grids of a run with time as an input: ``grids/<YYYYQn>.parquet``
GRIDS = "grids"
QUARTER_RE = re.compile(r"\d{4}Q[1-4]")
CELLS = "grid_cells.parquet"
CELLS_GEOJSON = "grid_cells.geojson"  # runs written before the cells were GeoParquet
#: the joint posterior's factor over the grid's cells (safetensors; its metadata ties it to the grid and model)
JOINT = "grid_joint.safetensors"
#: the hyperparameters' posterior a change between quarters averages over (JSON; kept after the first change)
HYPER = "hyper_posterior.json"
METRICS = "metrics.csv"
TEST_PREDICTIONS = "test_predictions.parquet"
HISTORY = "history.json"
#: The grid columns every reader relies on.
GRID_COLUMNS = ("cell_id", "lon", "lat", "mean_t", "width_t", "mean", "lower", "upper", "width")
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


# --------------------------------------------------------------------------------------------
# the manifest
# --------------------------------------------------------------------------------------------


def _is_number(v, allow_none: bool = False) -> bool:
    if v is None:
        return allow_none
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def validate_manifest(manifest, where: str = MANIFEST) -> dict:
    """Check a run manifest against the run schema; return it, or raise :class:`RunError` naming the field.

    What every page and command relies on: an object with the run format, a ``config`` that is a valid
    :class:`gpcore.run.config.RunConfig`, ``created``/``label``/``run_id`` text, ``data`` an object with a text
    ``hash``, ``metrics`` a list of records (``group`` text, finite numbers or null), ``timings`` numbers,
    ``grid`` an object or null, ``noise_variance`` a finite number or null.
    """

    def bad(field: str, why: str) -> RunError:
        return RunError(f"{where}: '{field}' {why}")

    if not isinstance(manifest, dict):
        raise RunError(f"{where} holds {type(manifest).__name__}, not a run manifest object")
    if manifest.get("format") != RUN_FORMAT:
        raise bad("format", f"is {manifest.get('format')!r}, not {RUN_FORMAT!r}")
    for key in ("created", "label", "run_id", "device"):
        if key in manifest and not isinstance(manifest[key], str):
            raise bad(key, f"is {manifest[key]!r}, not text")
    cfg = manifest.get("config")
    if not isinstance(cfg, dict):
        raise bad("config", "is missing or not an object")
    for key in ("data", "y", "model"):
        if not isinstance(cfg.get(key), str):
            raise bad(f"config.{key}", "is missing or not text")
    if "settings" in cfg and not isinstance(cfg["settings"], dict):
        raise bad("config.settings", "is not an object")
    try:
        RunConfig.from_dict(cfg)
    except (GPCoreError, TypeError, ValueError) as e:
        raise bad("config", f"is not a valid run configuration ({e})") from None
    for key in ("data", "timings", "model_config", "train_info", "versions"):
        if key in manifest and not isinstance(manifest[key], dict):
            raise bad(key, "is not an object")
    data = manifest.get("data", {})
    if not isinstance(data.get("hash", ""), str):
        raise bad("data.hash", "is not text")
    if "state" in data and data["state"] is not None and not isinstance(data["state"], str):
        raise bad("data.state", "is not text")
    if not all(_is_number(v, allow_none=True) for v in manifest.get("timings", {}).values()):
        raise bad("timings", "holds a value that is not a finite number")
    metrics = manifest.get("metrics", [])
    if not isinstance(metrics, list) or not all(isinstance(r, dict) for r in metrics):
        raise bad("metrics", "is not a list of records")
    for r in metrics:
        if not isinstance(r.get("group", ""), str):
            raise bad("metrics.group", f"is {r.get('group')!r}, not text")
        if not all(_is_number(v, allow_none=True) for k, v in r.items() if k != "group"):
            raise bad("metrics", f"record {r.get('group')!r} holds a value that is not a finite number")
    if "grid" in manifest and manifest["grid"] is not None and not isinstance(manifest["grid"], dict):
        raise bad("grid", "is not an object")
    if "grid_cells" in manifest and not (isinstance(manifest["grid_cells"], int) and manifest["grid_cells"] >= 0):
        raise bad("grid_cells", "is not a count")
    if "noise_variance" in manifest and not _is_number(manifest["noise_variance"], allow_none=True):
        raise bad("noise_variance", "is not a finite number")
    tm = manifest.get("time")
    if tm is not None and not (isinstance(tm, dict) and isinstance(tm.get("quarters", []), list)
                               and all(isinstance(q, str) for q in tm.get("grid_quarters", []))):
        raise bad("time", "is not an object with lists of quarters")
    return manifest


def is_run_dir(path) -> bool:
    """Whether ``path`` is a (complete) run folder: it holds a regular ``run.json`` that is not a link."""
    mf = Path(path) / MANIFEST
    return not mf.is_symlink() and mf.is_file()


def read_manifest(run_dir) -> dict:
    """The validated ``run.json`` of a run directory (:class:`RunError` when missing or malformed)."""
    run_dir = Path(run_dir)
    path = run_dir / MANIFEST
    if not path.is_file():
        raise RunError(f"'{run_dir}' is not a run directory (no {MANIFEST}); pass the --out of `gpcore fit`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunError(f"'{path}' is not readable JSON ({e}); the run is damaged, re-run the fit") from None
    return validate_manifest(manifest, f"'{path}'")


def manifest_bytes(run_dir) -> bytes:
    """The validated manifest's file as written (for a download of the run's record)."""
    read_manifest(run_dir)
    return (Path(run_dir) / MANIFEST).read_bytes()


def stamp(run_dir) -> float:
    """When the run was written (the mtime of its manifest): with the path, the cache key of a run."""
    return (Path(run_dir) / MANIFEST).stat().st_mtime


def write_manifest(run_dir, manifest: dict) -> None:
    """Write ``run.json`` (strict JSON: NaN and inf are refused)."""
    (Path(run_dir) / MANIFEST).write_text(json.dumps(manifest, indent=2, allow_nan=False))


# --------------------------------------------------------------------------------------------
# writing a run atomically
# --------------------------------------------------------------------------------------------


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
        if not (out / MANIFEST).is_file():
            raise RunError(f"--out '{out}' is not empty and is not a run folder (no {MANIFEST}); "
                           "refusing to replace it")
    return out


@contextmanager
def writing(final, overwrite: bool = False) -> Iterator[Path]:
    """``with writing(out) as tmp:`` write the run's files into ``tmp``; on success the folder is renamed to
    ``out`` (replacing an empty reserved folder, or an old run with ``overwrite``); on any error it is removed."""
    final = check_out_dir(final, overwrite)
    tmp = _tmp_dir(final)
    try:
        yield tmp
        _publish(tmp, final, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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


def write_tables(run_dir, *, model, test_predictions, metrics, history, grid=None, cells=None,
                 quarter_grids: dict | None = None) -> None:
    """Write a run's model, tables and (optional) grid predictions and cell polygons into ``run_dir``;
    ``quarter_grids`` (``{"2019Q1": frame, ...}``) go to ``grids/<quarter>.parquet``."""
    run_dir = Path(run_dir)
    if grid is not None:
        grid.to_parquet(run_dir / GRID, index=False)
    for label, frame in (quarter_grids or {}).items():
        if not QUARTER_RE.fullmatch(label):
            raise RunError(f"grid quarter {label!r} is not a quarter like 2019Q1")
        (run_dir / GRIDS).mkdir(exist_ok=True)
        frame.to_parquet(run_dir / GRIDS / f"{label}.parquet", index=False)
    if cells is not None:
        cells = cells[["cell_id", "geometry"]].copy()
        cells.attrs = {}  # a grid's attrs hold Python objects (GridSpec) that Parquet metadata cannot store
        cells.to_parquet(run_dir / CELLS, index=False)
    model.save(run_dir / MODEL)
    test_predictions.to_parquet(run_dir / TEST_PREDICTIONS, index=False)
    metrics.to_csv(run_dir / METRICS, index=False)
    (run_dir / HISTORY).write_text(json.dumps(history, indent=1, allow_nan=False))


# --------------------------------------------------------------------------------------------
# reading a run
# --------------------------------------------------------------------------------------------


def load_model(run_dir, device: str | None = None):
    """The run's trained model (checked before anything is allocated; InputError names the file)."""
    from gpcore.models import load_model as _load

    return _load(Path(run_dir) / MODEL, device=device)


def has_grid(run_dir) -> bool:
    """Whether the run has a prediction grid (what maps and decisions need)."""
    return (Path(run_dir) / GRID).is_file()


def _table(p: Path, columns=()):
    """A run's Parquet/CSV file, checked for its columns; RunError naming run and file when damaged."""
    import pandas as pd

    try:
        df = pd.read_csv(p) if p.suffix == ".csv" else pd.read_parquet(p)
    except Exception as e:  # noqa: BLE001 - pyarrow/pandas raise many types for damaged files
        raise RunError(f"run '{p.parent.name}': {p.name} cannot be read ({type(e).__name__}); delete or re-run it") \
            from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise RunError(f"run '{p.parent.name}': {p.name} lacks the column(s) {', '.join(missing)}; re-run it")
    return df


def grid_quarters(run_dir) -> list[str]:
    """The quarters a run with time as an input has grids for (``grids/<quarter>.parquet``), in time order."""
    folder = Path(run_dir) / GRIDS
    if folder.is_symlink() or not folder.is_dir():
        return []
    return sorted(f.stem for f in folder.glob("*.parquet") if QUARTER_RE.fullmatch(f.stem) and f.is_file())


def read_grid(run_dir, quarter: str | None = None):
    """The run's grid predictions (``grid.parquet``, or with ``quarter`` the run's grid at that quarter), checked:
    the :data:`GRID_COLUMNS`, numeric predictions, finite coordinates. ``None`` when the run has no grid (RunError
    for a quarter it has no grid for)."""
    p = Path(run_dir)
    if not has_grid(p):
        return None
    path = p / GRID
    if quarter is not None:
        have = grid_quarters(p)
        if quarter not in have:
            what = ", ".join(have) if have else "no per-quarter grids (it was not fitted with --time-input)"
            raise RunError(f"run '{p.name}' has no grid for the quarter {quarter!r}; it has {what}")
        path = p / GRIDS / f"{quarter}.parquet"
    grid = _table(path, GRID_COLUMNS)
    try:
        grid = grid.astype({c: float for c in GRID_COLUMNS if c != "cell_id"})
    except (TypeError, ValueError):
        raise RunError(f"run '{p.name}': {GRID} holds non-numeric predictions; re-run it") from None
    if not (np.isfinite(grid["lon"]).all() and np.isfinite(grid["lat"]).all()):
        raise RunError(f"run '{p.name}': {GRID} has cells without finite coordinates; re-run it")
    return grid


def read_cells(run_dir):
    """The grid's cell polygons (GeoDataFrame ``cell_id, geometry``), or ``None`` when the run kept none."""
    import geopandas as gpd

    p = Path(run_dir)
    try:
        if (p / CELLS).is_file():
            return gpd.read_parquet(p / CELLS)
        if (p / CELLS_GEOJSON).is_file():
            return gpd.read_file(p / CELLS_GEOJSON, engine="pyogrio")
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types for damaged files
        raise RunError(f"run '{p.name}': its grid cells cannot be read ({type(e).__name__}); re-run the fit") \
            from None
    return None


def grid_spec(manifest: dict):
    """The run's grid layout (:class:`gpcore.data.grid.GridSpec`) recorded in its manifest, or ``None``."""
    from gpcore.data.grid import GridSpec

    spec = manifest.get("grid")
    if isinstance(spec, dict) and "transform" in spec:
        return GridSpec(**{**spec, "transform": tuple(spec["transform"])})
    return None


def read_grid_frame(run_dir, manifest: dict | None = None, quarter: str | None = None):
    """The run's grid as a GeoDataFrame: predictions (at ``quarter`` for a run with time as an input, see
    :func:`read_grid`) joined to the cell polygons (cell centres as points when the run kept no polygons), with its
    ``GridSpec`` in ``attrs["grid"]`` when the run recorded one."""
    import geopandas as gpd

    p = Path(run_dir)
    manifest = read_manifest(p) if manifest is None else manifest
    if not has_grid(p):
        raise GPCoreError(f"run '{p}' has no prediction grid (it was trained with --grid none); refit with a grid")
    preds = read_grid(p, quarter)
    cells = read_cells(p)
    if cells is not None:
        grid = cells.merge(preds, on="cell_id", how="inner")
    else:
        grid = gpd.GeoDataFrame(preds, geometry=gpd.points_from_xy(preds["lon"], preds["lat"]), crs=4326)
    spec = grid_spec(manifest)
    if spec is not None:
        if "row" not in grid.columns and spec.kind == "square":
            grid["row"], grid["col"] = np.divmod(grid["cell_id"].to_numpy(dtype=np.int64), spec.width)
        grid.attrs["grid"] = spec
    return grid


def read_metrics(run_dir):
    """The run's metrics table (empty when the run has none)."""
    import pandas as pd

    p = Path(run_dir) / METRICS
    return _table(p, ("group", "nll")) if p.is_file() else pd.DataFrame()


def read_test_predictions(run_dir):
    """The run's test rows with their predictions (empty when the run has none)."""
    import pandas as pd

    p = Path(run_dir) / TEST_PREDICTIONS
    return _table(p, ("y", "mean", "var_y", "stratum")) if p.is_file() else pd.DataFrame()


def file_digest(*paths: Path) -> str:
    """SHA-256 over the bytes of ``paths`` (files; a folder: its files in name order): what ties a run's stored
    grid factor to the grid and model it was built from."""
    import hashlib

    h = hashlib.sha256()
    for p in paths:
        for f in sorted(Path(p).iterdir()) if Path(p).is_dir() else [Path(p)]:
            h.update(f.name.encode() + b"\0")
            h.update(f.read_bytes())
    return h.hexdigest()


def write_joint(run_dir, tensors: dict, identity: dict) -> None:
    """Write the grid factor's tensors with ``identity`` (JSON: what it was built from) as safetensors metadata."""
    from safetensors.torch import save

    # like model.safetensors (gpcore.models.io): written by Python so that it follows the umask (save_file: 0600)
    (Path(run_dir) / JOINT).write_bytes(save(tensors, metadata={"identity": json.dumps(identity, sort_keys=True)}))


def read_joint(run_dir) -> tuple[dict, dict] | None:
    """``(tensors, identity)`` of the run's stored grid factor; ``None`` when it has none; :class:`RunError` naming the
    file when it cannot be read."""
    from safetensors import safe_open

    p = Path(run_dir) / JOINT
    if not p.is_file():
        return None
    try:
        with safe_open(str(p), framework="pt") as f:
            identity = json.loads((f.metadata() or {}).get("identity", "null"))
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - safetensors and json raise several types for damaged files
        raise RunError(f"run '{p.parent.name}': {JOINT} cannot be read ({type(e).__name__}); delete it") from None
    if not isinstance(identity, dict):
        raise RunError(f"run '{p.parent.name}': {JOINT} has no identity in its metadata; delete it")
    return tensors, identity


def read_hyper(run_dir):
    """The parsed ``hyper_posterior.json`` of a run, or ``None`` when it has none or it is not JSON (it is derived
    data: the caller computes it again and overwrites it)."""
    p = Path(run_dir) / HYPER
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def write_hyper(run_dir, record: dict) -> bool:
    """Write ``record`` as the run's ``hyper_posterior.json`` (strict JSON), atomically: a temporary file beside it,
    renamed into place. ``False`` (nothing written) where the run folder is not writable."""
    p = Path(run_dir) / HYPER
    tmp = p.with_name(f".{HYPER}.{os.getpid()}.{os.urandom(4).hex()}")
    try:
        tmp.write_text(json.dumps(record, allow_nan=False))
        os.replace(tmp, p)
        return True
    except OSError:
        with contextlib.suppress(OSError):  # e.g. no such folder: nothing to remove
            tmp.unlink()
        return False


def model_zip(run_dir) -> bytes:
    """The run's model (``model.json`` + ``model.safetensors``) as a zip. Only those two names, only regular
    files (a symlink, e.g. to a system file, is refused), only inside the run folder."""
    folder = Path(run_dir) / MODEL
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in MODEL_FILES:
            f = folder / name
            if folder.is_symlink() or f.is_symlink() or not f.is_file():
                raise RunError(f"run '{Path(run_dir).name}': {MODEL}/{name} is missing or not a regular file")
            zf.writestr(f"{MODEL}/{name}", f.read_bytes())
    return buf.getvalue()
