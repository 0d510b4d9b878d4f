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
    python -m gpcore fit --data sample:puerto_rico --quarter 2019Q1:2022Q4 --time-input --split forecast \
        --test-period 2023Q1:2023Q4 --model vecchia --out st_run        # one model over space and time
    python -m gpcore predict st_run --data FILE --at 2024Q1 --out next.parquet
    python -m gpcore change st_run --from 2019Q4 --to 2023Q4 --out change.parquet

``--data`` takes a path or ``sample:<key>`` (``sample:puerto_rico``, ``sample:missouri_2020Q4``).
Every failure the user can cause (bad data, settings, paths, damaged runs, a diverged fit, no GPU,
out of memory) prints one ``error:`` line to stderr with exit status 2. Anything else is a bug: one
``error: internal error`` line and exit status 3; ``--debug`` shows its traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from gpcore.cli_decide import add_decision_commands
from gpcore.cli_time import add_time_commands
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
    p.add_argument("--quarter", help="keep one quarter ('2023Q1'), a year ('2023') or a range ('2019Q1:2022Q4') "
                   "of a time column")
    p.add_argument("--weight", help="per-row weight column, a count of measurements per row (e.g. Ookla 'tests'): "
                   "noise tau^2 + sigma^2 / w, metrics per count bin 1, 2-4, 5-16, >16")
    p.add_argument("--time", help="time column (quarter or date) when it is not auto-detected")
    p.add_argument("--time-input", action="store_true",
                   help="one model over all the quarters read, t (decimal years) its last input; vecchia and dbk-nn "
                        "get space_time=separable (--set space_time=gneiting for the other family)")
    p.add_argument("--strata", help="county_metro | column:<NAME> | polygons:<PATH>")
    p.add_argument("--split", default="random", choices=("random", "block", "forecast"),
                   help="test split: random (seeded 8:1:1 rows), block (whole --block-km squares held out) or "
                        "forecast (test on --test-period, train on the quarters before it)")
    p.add_argument("--test-period", help="--split forecast: the quarters to test on, e.g. 2023Q1 or 2023Q1:2023Q4")
    p.add_argument("--block-km", type=float, default=10.0, help="side of the squares of the block split, in km")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-drop", action="store_true", help="fail on NaN/inf rows instead of dropping them")
    p.add_argument("--grid", default="square", choices=("square", "quadkey", "none"), help="prediction grid kind")
    p.add_argument("--cell-km", type=float, default=0.0, help="grid cell size in km (0 = about 20k cells)")
    p.add_argument("--zoom", type=int, default=13, help="quadkey grid zoom level")
    p.add_argument("--region", default="auto", help="grid extent: auto | hull | bbox | state:<CODE>")


def _run_config(args, model: str, settings: dict):
    from gpcore.run.config import RunConfig

    if args.test_period is not None:
        from gpcore.data.temporal import period_bounds

        period_bounds(args.test_period, "--test-period")  # the flag's own error before the config's

    return RunConfig(data=args.data, y=args.y, model=model, settings=settings,
                     x=tuple(args.x.split(",")) if args.x else None, transform=args.transform, quarter=args.quarter,
                     weight=args.weight, time=args.time, strata=args.strata, split=args.split,
                     block_km=args.block_km, seed=args.seed, allow_drop=not args.no_drop, grid_kind=args.grid,
                     grid_cell_km=args.cell_km, grid_zoom=args.zoom, region=args.region,
                     time_input=args.time_input, test_period=args.test_period)


def _progress_printer(prefix: str = ""):
    def cb(p):
        val = f" val_nll={p.val_nll:.4f}" if p.val_nll is not None else ""
        mark = " *" if p.improved else ""
        print(f"{prefix}epoch {p.epoch}/{p.epochs} loss={p.loss:.4f}{val} ({p.elapsed:.1f}s){mark}", file=sys.stderr)

    return cb


def cmd_fit(args) -> int:
    from gpcore.models import DEFAULT_MODEL
    from gpcore.run.pipeline import execute_run
    from gpcore.run.rundir import check_out_dir, read_manifest

    if args.test_period and args.split != "forecast":
        raise GPCoreError(f"--test-period {args.test_period} is only used by --split forecast; add --split forecast")
    cfg = _run_config(args, args.model or DEFAULT_MODEL, _parse_sets(args.set))
    check_out_dir(args.out, args.overwrite)  # before any data is read or any rank starts training
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    if getattr(args, "distributed", False):  # under torchrun; see gpcore.distributed
        from gpcore.run.sharded import execute_run_distributed

        out = execute_run_distributed(cfg, args.out, callback=_progress_printer(), log=log, overwrite=args.overwrite)
        if out is None:  # not rank 0: rank 0 writes the run
            return 0
    else:
        out = execute_run(cfg, args.out, callback=_progress_printer(), log=log, overwrite=args.overwrite)
    print(_metrics_text(read_manifest(out)["metrics"]))
    print(f"run written to {out}")
    return 0


def _metrics_text(records) -> str:
    import pandas as pd

    df = pd.DataFrame(records)
    cols = [c for c in ("group", "n", "mae", "rmse", "nll", "crps", "coverage", "pi_width_mean") if c in df]
    return df[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}")


def cmd_predict(args) -> int:
    if args.grid or args.grid_region:  # streamed: bounded memory, sharded under torchrun
        return _predict_stream(args)
    if not args.data:
        raise GPCoreError("give --data FILE, --grid GRID.parquet or --grid-region SPEC")
    from gpcore.data.export import write_frame
    from gpcore.run.predict import predict_points

    out = predict_points(args.run_dir, args.data, quarter=args.quarter, allow_drop=not args.no_drop, at=args.at)
    path = Path(args.out)
    write_frame(out, path, "csv" if path.suffix == ".csv" else "parquet")
    print(f"wrote {len(out)} predictions to {path}")
    return 0


#: the flag of each keyword of :func:`gpcore.run.predict.predict_run_stream` a library error may name
PREDICT_FLAGS = {"x_cols": "--x", "cell_km": "--cell-km", "cell_deg": "--cell-deg", "batch_size": "--batch-size",
                 "grid_region": "--grid-region"}


def _predict_stream(args) -> int:
    import re

    from gpcore.run.predict import predict_run_stream

    if args.grid and args.grid_region:
        raise GPCoreError("give exactly one of --grid FILE.parquet or --grid-region SPEC")
    try:
        res = predict_run_stream(
            args.run_dir, args.out, grid=args.grid, grid_region=args.grid_region,
            x_cols=tuple(args.x.split(",")) if args.x else None, id_col=args.id_column,
            cell_km=args.cell_km, cell_deg=args.cell_deg, cells=args.cells, batch_size=args.batch_size,
            level=args.level, progress=None if args.no_progress else TextProgress, at=args.at,
        )
    except GPCoreError as e:  # name the command line's flags where the library names its keywords
        text = re.sub(r"\b(x_cols|cell_km|cell_deg|batch_size|grid_region)\b", lambda m: PREDICT_FLAGS[m[1]], str(e))
        raise type(e)(re.sub(r"\bcells(?= must| for)", "--cells", text)) from None
    if res.world_size == 1 or int(os.environ.get("RANK", "0")) == 0:
        print(f"wrote {res.rows_written} predictions to {res.path} "
              f"({res.cells} cells in {res.seconds:.1f}s, {res.cells_per_second:,.0f} cells/s)")
    return 0


class TextProgress:
    """A dependency-free progress bar on stderr: ``[#####.....] 52% 5.2M/10M cells 180k/s ETA 28s``.

    On a terminal it redraws one line (at most every ``interval`` s); otherwise (logs, CI) it
    prints a line every 10% of the work.
    """

    def __init__(self, total: int, label: str = "cells", stream=None, interval: float = 0.5):
        self.total, self.label, self.interval, self.done = max(int(total), 0), label, interval, 0
        self.stream = stream or sys.stderr
        self.t0, self._last, self._last_decile = time.perf_counter(), 0.0, -1
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    @staticmethod
    def _fmt(v: float) -> str:
        return next((f"{v / div:.1f}{unit}" for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)) if v >= div),
                    f"{v:.0f}")

    def line(self) -> str:
        el = time.perf_counter() - self.t0
        frac = min(self.done / self.total, 1.0) if self.total else 1.0
        rate = self.done / el if el > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta_s = f"ETA {eta:.0f}s" if math.isfinite(eta) else "ETA ?"
        done = f"{self._fmt(self.done)}/{self._fmt(self.total)}"
        return f"[{'#' * int(round(30 * frac)):<30}] {100 * frac:5.1f}% {done} {self.label} {self._fmt(rate)}/s {eta_s}"

    def update(self, k: int) -> None:
        self.done += int(k)
        if self.tty:
            now = time.perf_counter()
            if now - self._last >= self.interval or self.done >= self.total:
                self._last = now
                self.stream.write("\r" + self.line())
        elif (decile := int(10 * self.done / self.total) if self.total else 10) > self._last_decile:
            self._last_decile = decile
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r" + self.line() + "\n")
            self.stream.flush()


def cmd_evaluate(args) -> int:
    from gpcore.run.pipeline import evaluate_run

    table = evaluate_run(args.run_dir, args.data, quarter=args.quarter, strata=args.strata,
                         allow_drop=not args.no_drop)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    return 0


def _compare_splits(args) -> list[str]:
    """``compare``'s split kinds: ``--splits`` (default random,block); a lone ``--split X`` means ``--splits X``."""
    from gpcore.run.compare import parse_splits

    if args.splits is not None and args.split is not None and parse_splits(args.splits) != [args.split]:
        raise GPCoreError(f"--split {args.split} and --splits {args.splits} disagree; give only --splits")
    return parse_splits(args.splits or args.split or "random,block")


def _compare_seeds(text: str | None) -> list[int] | None:
    """``--seeds 0,1,2`` as integers (None without it)."""
    if text is None:
        return None
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise GPCoreError(f"--seeds {text!r}: give whole numbers separated by commas, e.g. --seeds 0,1,2") from None
    if len(set(seeds)) < 2 or min(seeds) < 0:
        raise GPCoreError(f"--seeds {text!r}: give two different seeds >= 0 or more, e.g. --seeds 0,1,2")
    return seeds


def cmd_compare(args) -> int:
    from gpcore.run.compare import compare_models, compare_seeds, split_settings

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    common, overrides = split_settings(_parse_sets(args.set))
    splits = _compare_splits(args)
    seeds = _compare_seeds(args.seeds)
    args.split = splits[0]
    kw = {"overrides": overrides, "log": lambda m: print(m, file=sys.stderr), "splits": splits,
          "callback_factory": (lambda name: _progress_printer(f"[{name}] ")) if args.verbose else None}
    base = _run_config(args, models[0], common)
    if seeds is not None:
        table = compare_seeds(base, models, args.out, seeds, **kw)
        print((Path(args.out) / "seed_summary.md").read_text())
        return 0 if len(table) else 1
    table = compare_models(base, models, args.out, **kw)
    print((Path(args.out) / "metrics.md").read_text())
    return 0 if len(table) else 1


def cmd_models(args) -> int:
    from gpcore.models import DEFAULT_MODEL, available_models, model_spec

    for name in available_models():
        spec = model_spec(name)
        preset = ", ".join(f"{k}={v}" for k, v in spec.preset.items())
        default = "  (default)" if name == DEFAULT_MODEL else ""
        print(f"{name:10s} {spec.description}" + (f"  [{preset}]" if preset else "") + default)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gpcore", description=__doc__.split("\n")[0])
    parser.add_argument("--debug", action="store_true", help="show the traceback of an internal error")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("fit", help="train a model on a data file and write a run directory")
    _add_data_args(p)
    p.add_argument("--model", help="registry name (see `python -m gpcore models`; default: the one marked there, "
                   "the winner of docs/benchmarks/race.md)")
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
    p.add_argument("--at", help="a run with time as an input: predict every row or cell at this quarter (2024Q1)")
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
                   help="comma-separated split kinds to evaluate on: random, block, forecast (default random,block); "
                        "block holds out whole --block-km squares, so its test rows lie inside gaps; forecast tests "
                        "on --test-period")
    p.set_defaults(split=None)  # compare takes --splits; a lone --split X still means --splits X
    p.add_argument("--models", required=True, help="comma-separated registry names")
    p.add_argument("--seeds", help="several split seeds, e.g. 0,1,2: the comparison on each (OUT/seed<k>/) and the "
                                   "models paired over them (OUT/seed_summary.{csv,md}); replaces --seed")
    p.add_argument("--set", action="append", metavar="[MODEL.]KEY=VALUE")
    p.add_argument("--out", required=True)
    p.add_argument("--verbose", action="store_true", help="print per-epoch progress")
    p.set_defaults(func=cmd_compare)

    add_decision_commands(sub)
    add_time_commands(sub)

    p = sub.add_parser("models", help="list the registered models")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("data", help="data utilities")
    dsub = p.add_subparsers(dest="data_command", required=True)
    pi = dsub.add_parser("inspect", help="print what a data file holds and what would be dropped")
    from gpcore.data.inspect import add_inspect_arguments, run_inspect

    add_inspect_arguments(pi)
    pi.set_defaults(func=run_inspect)
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
