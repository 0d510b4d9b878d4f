"""``python -m gpcore ...`` — every job the dashboard does, headless.

    python -m gpcore fit --data FILE --x lon,lat --y COLUMN [--transform log10] --model dbk \\
        [--set key=value ...] --out RUN_DIR
    python -m gpcore predict RUN_DIR --data FILE --out predictions.parquet
    python -m gpcore predict RUN_DIR --grid-region state:MO --cells 10000000 --out mo.tif   # streamed
    torchrun --nproc_per_node=N -m gpcore fit ... --distributed
    python -m gpcore evaluate RUN_DIR --data FILE
    python -m gpcore compare --data FILE --y COL --models dbk-rbf,svgp --strata county_metro --out DIR
    python -m gpcore data inspect FILE
    python -m gpcore models

``--data`` takes a path or ``sample:<key>`` (``sample:puerto_rico``, ``sample:missouri_2020Q4``).
Errors are printed to stderr with a non-zero exit status (2 for bad input or settings).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gpcore.errors import GPCoreError


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
    p.add_argument("--split", default="random", choices=("random", "block"))
    p.add_argument("--block-km", type=float, default=10.0)
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
    from gpcore.runs import execute_run

    cfg = _run_config(args, args.model, _parse_sets(args.set))
    if getattr(args, "distributed", False):  # under torchrun; see gpcore.distributed
        from gpcore.distributed import execute_run_distributed

        log = lambda m: print(m, file=sys.stderr)  # noqa: E731
        out = execute_run_distributed(cfg, args.out, callback=_progress_printer(), log=log)
        if out is None:  # not rank 0: rank 0 writes the run
            return 0
    else:
        out = execute_run(cfg, args.out, callback=_progress_printer(), log=lambda m: print(m, file=sys.stderr))
    manifest = json.loads((out / "run.json").read_text())
    print(_metrics_text(manifest["metrics"]))
    print(f"run written to {out}")
    return 0


def _metrics_text(records) -> str:
    import pandas as pd

    df = pd.DataFrame(records)
    cols = [c for c in ("group", "n", "mae", "rmse", "nll", "crps", "coverage", "pi_width_mean") if c in df]
    return df[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}")


def load_run(run_dir):
    """``(manifest, model)`` of a run directory written by :func:`gpcore.runs.execute_run`."""
    from gpcore.models.base import load_model

    run_dir = Path(run_dir)
    path = run_dir / "run.json"
    if not path.exists():
        raise GPCoreError(f"'{run_dir}' is not a run directory (no run.json); pass the --out of `gpcore fit`")
    manifest = json.loads(path.read_text())
    return manifest, load_model(run_dir / "model")


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

    manifest, model = load_run(args.run_dir)
    cfg = RunConfig.from_dict(manifest["config"])
    tr = D.get_transform(cfg.transform)
    gdf = D.read_measurements(args.data, quarter=args.quarter, allow_drop=not args.no_drop)
    if "cell_id" not in gdf.columns:
        gdf["cell_id"] = range(len(gdf))
    out = grid_predictions(model, gdf, tr)
    path = Path(args.out)
    if path.suffix == ".csv":
        out.to_csv(path, index=False)
    else:
        out.to_parquet(path, index=False)
    print(f"wrote {len(out)} predictions to {path}")
    return 0


def cmd_evaluate(args) -> int:
    from gpcore.runs import RunConfig, apply_strata, run_metrics, run_weights

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
    base = _run_config(args, models[0], common)
    table = compare_models(
        base,
        models,
        args.out,
        overrides=overrides,
        log=lambda m: print(m, file=sys.stderr),
        callback_factory=(lambda name: _progress_printer(f"[{name}] ")) if args.verbose else None,
    )
    print((Path(args.out) / "metrics.md").read_text())
    return 0 if len(table) else 1


def cmd_models(args) -> int:
    from gpcore.models.base import available_models, model_spec

    for name in available_models():
        spec = model_spec(name)
        preset = ", ".join(f"{k}={v}" for k, v in spec.preset.items())
        print(f"{name:10s} {spec.description}" + (f"  [{preset}]" if preset else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gpcore", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("fit", help="train a model on a data file and write a run directory")
    _add_data_args(p)
    p.add_argument("--model", default="dbk", help="registry name (see `python -m gpcore models`)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="model setting (repeatable)")
    p.add_argument("--out", required=True, help="run directory to write")
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

    p = sub.add_parser("compare", help="fit several models on one split and rank them")
    _add_data_args(p)
    p.add_argument("--models", required=True, help="comma-separated registry names")
    p.add_argument("--set", action="append", metavar="[MODEL.]KEY=VALUE")
    p.add_argument("--out", required=True)
    p.add_argument("--verbose", action="store_true", help="print per-epoch progress")
    p.set_defaults(func=cmd_compare)

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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except GPCoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
