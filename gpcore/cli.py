"""``python -m gpcore ...`` — every job the dashboard does, headless.

    python -m gpcore fit --data FILE --x lon,lat --y COLUMN [--transform log10] --model dbk \\
        [--set key=value ...] --out RUN_DIR
    python -m gpcore predict RUN_DIR --data FILE --out predictions.parquet
    python -m gpcore predict RUN_DIR --grid-region state:MO --cells 10000000 --out mo.tif   # streamed
    torchrun --nproc_per_node=N -m gpcore fit ... --distributed
    python -m gpcore evaluate RUN_DIR --data FILE
    python -m gpcore compare --data FILE --y COL --models dbk-rbf,svgp --strata county_metro --out DIR \\
        [--splits random,block] [--block-km 10]
    python -m gpcore data inspect FILE
    python -m gpcore models
    python -m gpcore exceed RUN_DIR --threshold 35 --units original --out p_below.parquet
    python -m gpcore areas RUN_DIR --areas counties --threshold 35 --out areas.geojson
    python -m gpcore sample RUN_DIR --n 4 --seed 0 --out samples.tif
    python -m gpcore suggest RUN_DIR --k 10 --target undecided --threshold 35 --out picks.geojson

``--data`` takes a path or ``sample:<key>`` (``sample:puerto_rico``, ``sample:missouri_2020Q4``).
Every failure the user can cause (bad data, settings, paths, damaged runs, a diverged fit, no GPU,
out of memory) prints one ``error:`` line to stderr with exit status 2. Anything else is a bug: one
``error: internal error`` line and exit status 3; ``--debug`` shows its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gpcore.errors import GPCoreError


def __getattr__(name):  # ``from gpcore.cli import load_run`` still works; it lives in gpcore.store
    if name == "load_run":
        from gpcore.store import load_run

        return load_run
    raise AttributeError(f"module 'gpcore.cli' has no attribute {name!r}")


def _parse_sets(items: list[str] | None) -> dict:
    out: dict = {}
    for item in items or []:
        if "=" not in item:
            raise GPCoreError(f"--set expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip()] = _auto_type(value.strip())
    return out


def _auto_type(value: str):
    low = value.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def _add_data_args(p: argparse.ArgumentParser, need_y: bool = True) -> None:
    p.add_argument("--data", required=True, help="data file, or sample:<key> for bundled data")
    p.add_argument("--x", help="coordinate columns 'lon,lat' (auto-detected when omitted)")
    p.add_argument("--y", required=need_y, help="target column (e.g. download_mbps)")
    p.add_argument("--transform", default="identity", choices=("identity", "log10", "log"))
    p.add_argument("--quarter", help="keep one quarter ('2023Q1') or year ('2023') of a time column")
    p.add_argument("--weight", help="per-row weight column, a count of measurements per row (e.g. Ookla 'tests'): "
                   "noise tau^2 + sigma^2 / w, metrics per count bin 1, 2-4, 5-16, >16")
    p.add_argument("--time", help="time column (quarter or date) when it is not auto-detected")
    p.add_argument("--strata", help="county_metro | column:<NAME> | polygons:<PATH>")
    p.add_argument("--split", default="random", choices=("random", "block"),
                   help="test split: random (seeded 8:1:1 rows) or block (whole --block-km squares held out)")
    p.add_argument("--block-km", type=float, default=10.0, help="side of the squares of the block split, in km")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-drop", action="store_true", help="fail on NaN/inf rows instead of dropping them")
    p.add_argument("--grid", default="square", choices=("square", "quadkey", "none"), help="prediction grid kind")
    p.add_argument("--cell-km", type=float, default=0.0, help="grid cell size in km (0 = about 20k cells)")
    p.add_argument("--zoom", type=int, default=13, help="quadkey grid zoom level")
    p.add_argument("--region", default="auto", help="grid extent: auto | hull | bbox | state:<CODE>")


def _run_config(args, model: str, settings: dict):
    from gpcore.runs import RunConfig

    return RunConfig(
        data=args.data,
        y=args.y,
        model=model,
        settings=settings,
        x=tuple(args.x.split(",")) if args.x else None,
        transform=args.transform,
        quarter=args.quarter,
        weight=args.weight,
        time=args.time,
        strata=args.strata,
        split=args.split,
        block_km=args.block_km,
        seed=args.seed,
        allow_drop=not args.no_drop,
        grid_kind=args.grid,
        grid_cell_km=args.cell_km,
        grid_zoom=args.zoom,
        region=args.region,
    )


def _progress_printer(prefix: str = ""):
    def cb(p):
        val = f" val_nll={p.val_nll:.4f}" if p.val_nll is not None else ""
        mark = " *" if p.improved else ""
        print(f"{prefix}epoch {p.epoch}/{p.epochs} loss={p.loss:.4f}{val} ({p.elapsed:.1f}s){mark}", file=sys.stderr)

    return cb


def cmd_fit(args) -> int:
    from gpcore.runs import check_out_dir, execute_run

    cfg = _run_config(args, args.model, _parse_sets(args.set))
    check_out_dir(args.out, args.overwrite)  # before any data is read or any rank starts training
    if getattr(args, "distributed", False):  # under torchrun; see gpcore.distributed
        from gpcore.sharded import execute_run_distributed

        log = lambda m: print(m, file=sys.stderr)  # noqa: E731
        out = execute_run_distributed(cfg, args.out, callback=_progress_printer(), log=log, overwrite=args.overwrite)
        if out is None:  # not rank 0: rank 0 writes the run
            return 0
    else:
        out = execute_run(cfg, args.out, callback=_progress_printer(), log=lambda m: print(m, file=sys.stderr),
                          overwrite=args.overwrite)
    manifest = json.loads((out / "run.json").read_text())
    print(_metrics_text(manifest["metrics"]))
    print(f"run written to {out}")
    return 0


def _metrics_text(records) -> str:
    import pandas as pd

    df = pd.DataFrame(records)
    cols = [c for c in ("group", "n", "mae", "rmse", "nll", "crps", "coverage", "pi_width_mean") if c in df]
    return df[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}")


def cmd_predict(args) -> int:
    if args.grid or args.grid_region:  # streamed: bounded memory, sharded under torchrun
        from gpcore.predict_stream import predict_run_stream

        res = predict_run_stream(
            args.run_dir, args.out, grid=args.grid, grid_region=args.grid_region,
            x_cols=tuple(args.x.split(",")) if args.x else None, id_col=args.id_column,
            cell_km=args.cell_km, cell_deg=args.cell_deg, cells=args.cells, batch_size=args.batch_size,
            level=args.level, progress=not args.no_progress,
        )
        if res.world_size == 1 or int(os.environ.get("RANK", "0")) == 0:
            print(f"wrote {res.rows_written} predictions to {res.path} "
                  f"({res.cells} cells in {res.seconds:.1f}s, {res.cells_per_second:,.0f} cells/s)")
        return 0
    if not args.data:
        raise GPCoreError("give --data FILE, --grid GRID.parquet or --grid-region SPEC")
    from gpcore import data as D
    from gpcore.runs import RunConfig, grid_predictions
    from gpcore.store import load_run

    manifest, model = load_run(args.run_dir)
    cfg = RunConfig.from_dict(manifest["config"])
    tr = D.get_transform(cfg.transform)
    gdf = D.read_measurements(args.data, quarter=args.quarter, allow_drop=not args.no_drop)
    if "cell_id" not in gdf.columns:
        gdf["cell_id"] = range(len(gdf))
    out = grid_predictions(model, gdf, tr)
    path = Path(args.out)
    if path.suffix == ".csv":
        from gpcore.data.export import spreadsheet_safe

        spreadsheet_safe(out).to_csv(path, index=False)
    else:
        out.to_parquet(path, index=False)
    print(f"wrote {len(out)} predictions to {path}")
    return 0


def cmd_evaluate(args) -> int:
    from gpcore.runs import RunConfig, apply_strata, run_metrics, run_weights
    from gpcore.store import load_run

    manifest, model = load_run(args.run_dir)
    cfg = RunConfig.from_dict(manifest["config"])
    from gpcore import data as D

    gdf = D.read_measurements(
        args.data, target=cfg.y, transform=cfg.transform, quarter=args.quarter, allow_drop=not args.no_drop,
        weight=cfg.weight,
    )
    strata = args.strata or cfg.strata
    gdf = apply_strata(gdf, strata, manifest["data"].get("state"))
    y = D.get_transform(cfg.transform).forward(gdf[cfg.y].to_numpy(float))
    groups = gdf["stratum"].astype(str).to_numpy() if "stratum" in gdf.columns else None
    w = run_weights(gdf, cfg.weight) if model.weighted else None  # each row with its own measurement count
    pred = model.predict(gdf[["lon", "lat"]].to_numpy(float), weights=w, groups=groups)
    table = run_metrics(pred.mean, pred.var_y, y, groups, w, cfg.weight)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    return 0


def _compare_splits(args) -> list[str]:
    """``compare``'s split kinds: ``--splits`` (default random,block); a lone ``--split X`` means ``--splits X``."""
    from gpcore.compare import parse_splits

    if args.splits is not None and args.split is not None and parse_splits(args.splits) != [args.split]:
        raise GPCoreError(f"--split {args.split} and --splits {args.splits} disagree; give only --splits")
    return parse_splits(args.splits or args.split or "random,block")


def cmd_compare(args) -> int:
    from gpcore.compare import compare_models

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    sets = _parse_sets(args.set)
    common = {k: v for k, v in sets.items() if "." not in k}
    overrides: dict[str, dict] = {}
    for k, v in sets.items():
        if "." in k:
            name, key = k.split(".", 1)
            overrides.setdefault(name, {})[key] = v
    splits = _compare_splits(args)
    args.split = splits[0]
    base = _run_config(args, models[0], common)
    table = compare_models(
        base,
        models,
        args.out,
        overrides=overrides,
        log=lambda m: print(m, file=sys.stderr),
        callback_factory=(lambda name: _progress_printer(f"[{name}] ")) if args.verbose else None,
        splits=splits,
    )
    print((Path(args.out) / "metrics.md").read_text())
    return 0 if len(table) else 1


# ------------------------------------------------------------------------ decisions (gpcore.decide)


def _decision_run(run_dir):
    """``(manifest, model, grid GeoDataFrame, transform)`` of a run directory."""
    from gpcore import data as D
    from gpcore.decide import joint_caveat
    from gpcore.runs import load_run_grid
    from gpcore.store import load_run

    manifest, model = load_run(run_dir)
    grid = load_run_grid(run_dir)
    note = joint_caveat(model)
    if note:
        print(f"note: {note}", file=sys.stderr)
    return manifest, model, grid, D.get_transform(manifest["config"].get("transform", "identity"))


def _out_format(path: Path, allowed: tuple[str, ...]) -> str:
    fmt = {".csv": "csv", ".parquet": "parquet", ".geojson": "geojson", ".json": "geojson", ".tif": "geotiff",
           ".tiff": "geotiff"}.get(path.suffix.lower())
    if fmt not in allowed:
        want = ", ".join(sorted({k for k, v in {".csv": "csv", ".parquet": "parquet", ".geojson": "geojson",
                                                 ".tif": "geotiff"}.items() if v in allowed}))
        raise GPCoreError(f"--out '{path.name}': use a file ending in {want}")
    return fmt


def _write_frame(df, path: Path, fmt: str) -> None:
    import geopandas as gpd

    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "csv":
        from gpcore.data.export import spreadsheet_safe

        table = df.drop(columns=df.geometry.name) if isinstance(df, gpd.GeoDataFrame) else df
        spreadsheet_safe(table).to_csv(path, index=False)
    elif fmt == "parquet":
        df.to_parquet(path, index=False)
    else:
        if not isinstance(df, gpd.GeoDataFrame):
            raise GPCoreError(f"--out '{path.name}': these areas have no polygons; write .csv or .parquet instead")
        if path.exists():
            path.unlink()
        df.to_crs(4326).to_file(path, driver="GeoJSON", engine="pyogrio")


def _threshold_args(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--threshold", type=float, required=required,
                   help="threshold, e.g. 35 (Mbps) with --units original")
    p.add_argument("--units", default="original", choices=("original", "model"),
                   help="threshold in the target's original units (through the run's transform) or model space")


def cmd_exceed(args) -> int:
    from gpcore import decide

    manifest, model, grid, tr = _decision_run(args.run_dir)
    stored = (decide.grid_prediction(grid, model.noise_variance, model.variance_scale(len(grid)))
              if {"mean_t", "sd_t"} <= set(grid.columns) else None)
    e = decide.exceedance(model, grid[["lon", "lat"]].to_numpy(float), args.threshold, units=args.units,
                          transform=tr, direction=args.direction, pred=stored)
    side = args.direction
    out = grid[["cell_id", "lon", "lat", "geometry"]].copy()
    out[f"p_{side}"] = e.p_f
    out[f"p_{side}_y"] = e.p_y
    undecided = int(decide.undecided_mask(e.p_f).sum())
    print(f"threshold {args.threshold:g} ({args.units} units; {e.threshold_model:.4f} in model space), "
          f"{len(out)} cells: P(f {side}) > 0.8 in {int((e.p_f > 0.8).sum())}, < 0.2 in {int((e.p_f < 0.2).sum())}, "
          f"undecided in {undecided}")
    if args.out:
        path = Path(args.out)
        fmt = _out_format(path, ("csv", "parquet", "geojson", "geotiff"))
        if fmt == "geotiff":
            from gpcore import data as D

            D.export_predictions(out, path, columns=[f"p_{side}", f"p_{side}_y"],
                                 tags={"threshold": args.threshold, "units": args.units})
        else:
            _write_frame(out, path, fmt)
        print(f"wrote {path}")
    return 0


def _area_labels(args, manifest, places, is_grid: bool):
    """``(labels, polygons or None)`` for --areas counties | strata | column:NAME | FILE."""
    from gpcore import decide
    from gpcore.runs import apply_strata

    spec = args.areas
    lon, lat = places["lon"].to_numpy(float), places["lat"].to_numpy(float)
    if spec == "counties":
        polys = decide.bundled_counties(manifest.get("data", {}).get("state"))
        return decide.assign_areas(lon, lat, polys, "NAME"), polys.rename(columns={"NAME": "area"})
    if spec == "strata":
        strata = manifest["config"].get("strata")
        if not strata:
            raise GPCoreError("--areas strata: this run has no strata; use counties, column:NAME or a polygon FILE")
        lab = apply_strata(places[["lon", "lat"]].copy(), strata, manifest.get("data", {}).get("state"))
        return lab["stratum"].to_numpy(dtype=object), None
    if spec.startswith("column:"):
        col = spec.split(":", 1)[1]
        if col not in places.columns:
            where = "the run's grid" if is_grid else f"'{args.points}'"
            cols = ", ".join(map(str, places.columns))
            raise GPCoreError(f"--areas {spec}: {where} has no column '{col}'; columns: {cols}")
        return places[col].to_numpy(dtype=object), None
    from gpcore.data.regions import read_polygons

    polys = read_polygons(spec)
    name = args.name_column or next((c for c in ("NAME", "name", "Name") if c in polys.columns), None)
    if name is None or name not in polys.columns:
        raise GPCoreError(f"--areas {spec}: pass --name-column, one of: {', '.join(map(str, polys.columns))}")
    return decide.assign_areas(lon, lat, polys, name), polys.rename(columns={name: "area"})


def cmd_areas(args) -> int:
    import geopandas as gpd
    import numpy as np

    from gpcore import decide

    manifest, model, grid, tr = _decision_run(args.run_dir)
    if args.points:
        from gpcore import data as D

        places = D.read_measurements(args.points, allow_drop=True)
        is_grid = False
    else:
        places, is_grid = grid, True
    labels, polys = _area_labels(args, manifest, places, is_grid)
    weights = None
    if args.weights == "area":
        if not is_grid or "geometry" not in places or (places.geometry.geom_type == "Point").all():
            raise GPCoreError("--weights area needs the run's grid cells (polygons); use uniform or a column")
        weights = decide.cell_areas_km2(places)
    elif args.weights != "uniform":
        if args.weights not in places.columns:
            cols = ", ".join(map(str, places.columns))
            raise GPCoreError(f"--weights {args.weights}: no such column; columns: {cols}")
        weights = places[args.weights].to_numpy(float)
        bad = ~np.isfinite(weights) | (weights < 0)
        if bad.any():
            rows = ", ".join(map(str, np.flatnonzero(bad)[:8]))
            raise GPCoreError(f"--weights column '{args.weights}' has missing or negative values in rows {rows}; "
                              "fill them or drop those rows")
    meas = None
    if args.measurements:
        from gpcore import data as D

        pts = D.read_measurements(args.measurements, allow_drop=True)
        meas, _ = _area_labels(args, manifest, pts, False) if not args.areas.startswith("column:") else (
            pts[args.areas.split(":", 1)[1]].to_numpy(dtype=object), None)
    table = decide.area_posteriors(model, places[["lon", "lat"]].to_numpy(float), labels, weights=weights,
                                   threshold=args.threshold, units=args.units, transform=tr, samples=args.samples,
                                   seed=args.seed, measurements=meas)
    if args.threshold is not None:
        table = table.sort_values("p_below", ascending=False).reset_index(drop=True)
    out = table
    if polys is not None:
        shapes = polys[["area", "geometry"]].drop_duplicates("area")
        out = gpd.GeoDataFrame(table.merge(shapes, on="area", how="left"), geometry="geometry", crs=polys.crs)
    cols = [c for c in ("area", "cells", "measurements", "mean", "lower", "upper", "p_below", "mean_arith")
            if c in table.columns]
    print(table[cols].head(args.show).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.out:
        path = Path(args.out)
        _write_frame(out, path, _out_format(path, ("csv", "parquet", "geojson")))
        print(f"wrote {len(table)} areas to {path}")
    return 0


def cmd_sample(args) -> int:
    from gpcore import data as D
    from gpcore import decide

    manifest, model, grid, tr = _decision_run(args.run_dir)
    if args.n < 1:
        raise GPCoreError(f"--n {args.n}: ask for at least one sample")
    S = decide.plausible_maps(model, grid[["lon", "lat"]].to_numpy(float), args.n, seed=args.seed)
    if args.units == "original":
        S = tr.inverse(S)
    cols = [f"sample_{i + 1}" for i in range(args.n)]
    path = Path(args.out)
    _out_format(path, ("csv", "parquet", "geojson", "geotiff"))
    out = grid[["cell_id", "lon", "lat", "geometry"] + [c for c in ("row", "col") if c in grid]].copy()
    out.attrs = grid.attrs
    D.export_predictions(out, path, predictions=dict(zip(cols, S, strict=True)), columns=cols,
                         tags={"seed": args.seed, "units": args.units, "samples": args.n})
    print(f"wrote {args.n} joint samples over {len(grid)} cells (seed {args.seed}) to {path}")
    return 0


def cmd_suggest(args) -> int:
    import geopandas as gpd
    import numpy as np
    import pandas as pd

    from gpcore import decide

    manifest, model, grid, tr = _decision_run(args.run_dir)
    Xg = grid[["lon", "lat"]].to_numpy(float)
    if args.candidates:
        from gpcore import data as D

        cand = D.read_measurements(args.candidates, allow_drop=True)
        Xc = cand[["lon", "lat"]].to_numpy(float)
    else:
        cand, Xc = grid, Xg
    target = args.target
    if target == "all":
        Xt = Xg
    elif target == "undecided":
        if args.threshold is None:
            raise GPCoreError("--target undecided needs --threshold (cells with 0.2 < P(below) < 0.8)")
        e = decide.exceedance(model, Xg, args.threshold, units=args.units, transform=tr)
        Xt = Xg[decide.undecided_mask(e.p_f)]
        if len(Xt) == 0:
            raise GPCoreError(f"no cell is undecided at threshold {args.threshold:g}; use --target all")
    elif target.startswith("stratum:"):
        from gpcore.runs import apply_strata

        strata = manifest["config"].get("strata")
        if not strata:
            raise GPCoreError("--target stratum:NAME: this run has no strata; use all or undecided")
        lab = apply_strata(grid[["lon", "lat"]].copy(), strata, manifest.get("data", {}).get("state"))["stratum"]
        name = target.split(":", 1)[1]
        Xt = Xg[(lab == name).to_numpy()]
        if len(Xt) == 0:
            raise GPCoreError(f"--target {target}: no cell in stratum '{name}'; strata: {', '.join(sorted(set(lab)))}")
    else:
        raise GPCoreError(f"--target {target!r}: use all, undecided or stratum:NAME")
    res = decide.suggest(model, Xc, Xt, k=args.k, min_km=args.min_km, engine=args.engine, seed=args.seed)
    picks = pd.DataFrame({
        "rank": np.arange(1, len(res.index) + 1),
        "lon": Xc[res.index, 0],
        "lat": Xc[res.index, 1],
        "reduction": res.reduction,
        "mean_var_after": res.mean_var_before - np.cumsum(res.reduction),
    })
    if "cell_id" in cand.columns:
        picks.insert(1, "cell_id", cand["cell_id"].to_numpy()[res.index])
    print(f"{len(picks)} sites over {len(Xt)} target cells ({res.engine} engine); mean latent variance "
          f"{res.mean_var_before:.4g} -> {res.mean_var_after:.4g} (model units squared)")
    print(picks.to_string(index=False, float_format=lambda v: f"{v:.5g}"))
    if args.out:
        path = Path(args.out)
        fmt = _out_format(path, ("csv", "parquet", "geojson"))
        gdf = gpd.GeoDataFrame(picks, geometry=gpd.points_from_xy(picks["lon"], picks["lat"]), crs=4326)
        _write_frame(gdf, path, fmt)
        print(f"wrote {path}")
    return 0


def cmd_models(args) -> int:
    from gpcore.models import available_models, model_spec

    for name in available_models():
        spec = model_spec(name)
        preset = ", ".join(f"{k}={v}" for k, v in spec.preset.items())
        print(f"{name:10s} {spec.description}" + (f"  [{preset}]" if preset else ""))
    return 0


def fit_command(cfg: dict, out: str = "runs/reproduced") -> str:
    """The ``python -m gpcore fit`` command that reproduces a run configuration (``RunConfig.to_dict()``)."""
    parts = ["python -m gpcore fit", f"--data {cfg.get('data')}", f"--y {cfg.get('y')}"]
    if cfg.get("x"):
        parts.append(f"--x {','.join(cfg['x'])}")
    for key, flag in (("transform", "--transform"), ("quarter", "--quarter"), ("weight", "--weight"),
                      ("strata", "--strata")):
        if cfg.get(key) not in (None, "", "identity"):
            parts.append(f"{flag} {cfg[key]}")
    if cfg.get("split", "random") != "random":
        parts.append(f"--split {cfg['split']} --block-km {cfg.get('block_km', 10.0):g}")
    parts.append(f"--seed {cfg.get('seed', 0)}")
    if cfg.get("grid_cell_km"):
        parts.append(f"--cell-km {cfg['grid_cell_km']:g}")
    parts.append(f"--model {cfg.get('model')}")
    for k, v in (cfg.get("settings") or {}).items():
        parts.append(f"--set {k}={v}")
    parts.append(f"--out {out}")
    return " \\\n    ".join(parts)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gpcore", description=__doc__.split("\n")[0])
    parser.add_argument("--debug", action="store_true", help="show the traceback of an internal error")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("fit", help="train a model on a data file and write a run directory")
    _add_data_args(p)
    p.add_argument("--model", default="dbk", help="registry name (see `python -m gpcore models`)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="model setting (repeatable)")
    p.add_argument("--out", required=True, help="run directory to write (must be new or empty)")
    p.add_argument("--overwrite", action="store_true", help="replace the run already in --out (the whole folder)")
    p.add_argument("--distributed", action="store_true",
                   help="train across the processes torchrun started (NCCL on GPUs, gloo on CPUs); rank 0 writes")
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("predict", help="predict at the locations of a data file, or stream a grid of any size")
    p.add_argument("run_dir")
    p.add_argument("--data", help="data file: predict at its rows (held in memory)")
    p.add_argument("--quarter")
    p.add_argument("--no-drop", action="store_true")
    p.add_argument("--out", required=True, help="output .parquet or .csv (.tif with --grid-region)")
    p.add_argument("--grid", help="streamed: Parquet file of cells (lon, lat[, cell_id]), read by row groups")
    p.add_argument("--grid-region", help="streamed: generated lon/lat raster over bbox:W,E,S,N | state:CODE | run")
    p.add_argument("--cell-km", type=float, help="generated grid: cell size in km")
    p.add_argument("--cell-deg", type=float, help="generated grid: cell size in degrees")
    p.add_argument("--cells", type=int, help="generated grid: about this many cells")
    p.add_argument("--x", help="coordinate columns of --grid, 'lon,lat' (auto-detected when omitted)")
    p.add_argument("--id-column", help="cell id column of --grid (default cell_id if present, else row number)")
    p.add_argument("--batch-size", type=int, default=65536, help="cells per streamed batch (bounds memory)")
    p.add_argument("--level", type=float, default=0.95, help="prediction-interval level")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("evaluate", help="metrics of a trained run on a labelled data file")
    p.add_argument("run_dir")
    p.add_argument("--data", required=True)
    p.add_argument("--quarter")
    p.add_argument("--strata")
    p.add_argument("--no-drop", action="store_true")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser(
        "compare", help="fit several models on random and spatial-block splits and rank them within each",
        description="Fit each model on each split kind (default: a seeded random 8:1:1 split AND spatial blocks of "
                    "--block-km squares held out whole) and rank them by test NLL within each split. Runs go to "
                    "OUT/runs/<split>/<model>; OUT/metrics.{csv,md,json} has a split column, and "
                    "OUT/split_summary.csv the random-vs-block change in NLL and 95% coverage per model.",
    )
    _add_data_args(p)
    p.add_argument("--splits", default=None,
                   help="comma-separated split kinds to evaluate on: random, block or random,block (the default); "
                        "block holds out whole --block-km squares, so its test rows lie inside gaps")
    p.set_defaults(split=None)  # compare takes --splits; a lone --split X still means --splits X
    p.add_argument("--models", required=True, help="comma-separated registry names")
    p.add_argument("--set", action="append", metavar="[MODEL.]KEY=VALUE")
    p.add_argument("--out", required=True)
    p.add_argument("--verbose", action="store_true", help="print per-epoch progress")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("exceed", help="P(below/above a threshold) per grid cell of a run")
    p.add_argument("run_dir")
    _threshold_args(p, True)
    p.add_argument("--direction", default="below", choices=("below", "above"))
    p.add_argument("--out", help="output .parquet, .csv, .geojson or .tif (bands: P for f and for a new measurement)")
    p.set_defaults(func=cmd_exceed)

    p = sub.add_parser("areas", help="posterior of the (weighted) mean over each area: counties, strata, polygons")
    p.add_argument("run_dir")
    p.add_argument("--areas", default="counties",
                   help="counties (bundled, the run's state) | strata (the run's) | column:NAME | polygon FILE")
    p.add_argument("--name-column", help="area name column of a polygon FILE (default NAME/name)")
    p.add_argument("--weights", default="uniform", help="uniform | area (cell area) | a column of the places")
    p.add_argument("--points", help="average over these measurement locations instead of the run's grid cells")
    p.add_argument("--measurements", help="count the measurements of this file in each area")
    _threshold_args(p, False)
    p.add_argument("--samples", type=int, default=0,
                   help="joint samples for the arithmetic mean in original units (0 = skip)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--show", type=int, default=20, help="rows to print")
    p.add_argument("--out", help="output .geojson (polygon areas), .csv or .parquet")
    p.set_defaults(func=cmd_areas)

    p = sub.add_parser("sample", help="joint posterior samples over a run's grid (plausible maps)")
    p.add_argument("run_dir")
    p.add_argument("--n", type=int, default=4, help="number of samples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--units", default="original", choices=("original", "model"))
    p.add_argument("--out", required=True, help="output .tif (one band per sample), .parquet, .csv or .geojson")
    p.set_defaults(func=cmd_sample)

    p = sub.add_parser("suggest", help="where to measure next: k sites that most reduce the posterior variance")
    p.add_argument("run_dir")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--target", default="all", help="all | undecided (needs --threshold) | stratum:NAME")
    _threshold_args(p, False)
    p.add_argument("--candidates", help="candidate sites file (default: the run's grid cells)")
    p.add_argument("--min-km", type=float, default=0.0, help="minimum distance between picks in km")
    p.add_argument("--engine", default="auto", choices=("auto", "features", "dense"))
    p.add_argument("--seed", type=int, default=0, help="seed of the residual's random features (SVGP family)")
    p.add_argument("--out", help="output .geojson, .csv or .parquet")
    p.set_defaults(func=cmd_suggest)

    p = sub.add_parser("models", help="list the registered models")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("data", help="data utilities")
    dsub = p.add_subparsers(dest="data_command", required=True)
    pi = dsub.add_parser("inspect", help="print what a data file holds and what would be dropped")
    try:
        from gpcore.data.inspect import add_inspect_arguments, run_inspect

        add_inspect_arguments(pi)
        pi.set_defaults(func=run_inspect)
    except ImportError:  # pragma: no cover - data layer missing
        pi.set_defaults(func=lambda a: 1)
    return parser


def user_error_text(exc: BaseException) -> str | None:
    """The ``error:`` text of a failure the user caused (bad input, settings, paths, resources), else None."""
    torch = sys.modules.get("torch")  # only loaded when a model was involved

    if isinstance(exc, GPCoreError):
        return str(exc)
    if isinstance(exc, OSError):  # missing/unreadable files, full disk, permissions
        where = f" ('{exc.filename}')" if getattr(exc, "filename", None) else ""
        return f"{exc.strerror or exc}{where}"
    if isinstance(exc, MemoryError):
        return "out of memory; use a smaller file, a smaller grid (--cell-km) or smaller model settings"
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        return "the GPU ran out of memory; use smaller settings (batch_size, rank) or --set device=cpu"
    linalg = (torch.linalg.LinAlgError,) if torch is not None else ()
    if isinstance(exc, linalg) or type(exc).__name__ == "LinAlgError":
        return (f"a matrix factorisation failed ({str(exc).splitlines()[0][:200] if str(exc) else 'LinAlgError'}); "
                "the model's matrices are not positive definite (damaged model files, or a fit that diverged: "
                "re-run it with a lower lr or dtype=float64)")
    if isinstance(exc, json.JSONDecodeError):
        return f"a JSON file is not valid JSON ({exc})"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI's one boundary: user errors exit 2, bugs exit 3
        text = user_error_text(exc)
        if args.debug:
            import traceback

            traceback.print_exc()
        if text is not None:
            print(f"error: {text}", file=sys.stderr)
            return 2
        print(f"error: internal error ({type(exc).__name__}: {str(exc)[:300]}); this is a bug, please report it "
              "(--debug shows the traceback)", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
