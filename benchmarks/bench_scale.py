"""Scale on one machine (issue 22, part 2): fit time and peak memory of ``vecchia`` and ``dbk-nn`` against n, and
streamed prediction over a 10-million-cell grid.

Data: the synthetic Ookla world (:func:`gpcore.data.synthetic.ookla_points`: dense cities, sparse countryside; log10
download Mbps with a known mean and noise) at n = 250,000, 500,000 and 1,000,000 places. Each model is fitted with
its defaults on the n places (a seeded 10 % of them validates, for early stopping) and then predicts n / 10 new
places of the same world (the held-out 10 %): seconds, test NLL and 95 % coverage, beside the NLL of the truth
itself (the best any model can score). Every (model, n) runs in a fresh process, so its peak RSS (``ru_maxrss``) is
that fit's own; the columns time(n) / time(smallest n) and n / smallest n show how close the cost is to linear.

Grid: each model as fitted at the smallest n (saved by that fit, loaded as ``gpcore predict`` loads a run) streams
``--grid-cells`` cells of a raster over the synthetic box through :func:`gpcore.run.predict.stream_predict` (batches
of :data:`gpcore.run.predict.DEFAULT_BATCH` cells) into a temporary Parquet file (``--grid-sink discard``: predicted,
not written), in a fresh process: seconds and peak RSS.

Bar (issue 22): 1 M points fitted by ``vecchia`` in <= 20 min and by ``dbk-nn`` in <= 30 min on the 2-core CPU VM,
peak memory <= 8 GB; 10 M grid cells predicted in <= 10 min. Results: docs/benchmarks/scale.md.

    OMP_NUM_THREADS=1 python benchmarks/bench_scale.py --out scale.md   # 250k, 500k, 1M; 10M cells (hours)
    python benchmarks/bench_scale.py --sizes 20000,40000 --grid-cells 200000 --models vecchia
    python benchmarks/bench_scale.py --smoke              # 1,500 and 3,000 points, 20,000 cells, tiny models (CI)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from _harness import add_race_args, known_models, parse_sets, report, smoke_settings, stamp, stderr, warm_up_torch

from gpcore import load_model, make_model
from gpcore import metrics as M
from gpcore.data.export import TableSink
from gpcore.data.grid import RegularGrid
from gpcore.data.synthetic import SYNTH_BBOX, ookla_points
from gpcore.errors import ConfigError
from gpcore.run.predict import DEFAULT_BATCH, stream_predict

#: the issue's bars: seconds to fit 1 M points, peak memory, seconds to predict 10 M cells
FIT_BAR_S = {"vecchia": 20 * 60, "dbk-nn": 30 * 60}
MEMORY_BAR_GB = 8.0
GRID_BAR_S = 10 * 60


def peak_rss_gb() -> float:
    """This process's peak resident memory so far, in GB (``ru_maxrss`` is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def scale_data(n: int, seed: int):
    """``n`` places to fit (a seeded 10 % of them for validation) and ``n // 10`` held-out places of the synthetic
    world: ``(X_train, y_train, X_val, y_val, X_test, y_test, mu_test, sd_test)``."""
    tenth = max(1, n // 10)
    X, y, mu, sd = ookla_points(n + tenth, seed=seed)
    perm = np.random.default_rng(seed + 1).permutation(n)
    va, tr = perm[:tenth], perm[tenth:]
    return X[tr], y[tr], X[va], y[va], X[n:], y[n:], mu[n:], sd[n:]


def fit_child(job: dict) -> dict:
    """One fit of ``job["model"]`` on ``job["n"]`` places and its prediction of the held-out ones (in a fresh
    process); with ``job["save"]`` the fitted model is saved there for the grid."""
    t0 = time.perf_counter()
    X, y, X_val, y_val, X_test, y_test, mu_test, sd_test = scale_data(job["n"], job["seed"])
    data_s = time.perf_counter() - t0
    if job["warm_up"]:
        warm_up_torch()
    rss_before = peak_rss_gb()
    model = make_model(job["model"], **{"seed": job["seed"], **job["settings"]})
    t0 = time.perf_counter()
    model.fit(X, y, X_val, y_val)
    fit_s = time.perf_counter() - t0
    rss_fit = peak_rss_gb()
    t0 = time.perf_counter()
    pred = model.predict(X_test)
    predict_s = time.perf_counter() - t0
    mean, var_y = np.asarray(pred.mean), np.asarray(pred.var_y)
    finite = bool(np.isfinite(mean).all() and np.isfinite(var_y).all())
    info = getattr(model, "train_info_", {})
    check = info.get("feature_check")
    row = {"model": job["model"], "job": "fit", "n": job["n"], "n_test": len(y_test), "seconds": fit_s,
           "predict_s": predict_s, "data_s": data_s, "epochs": info.get("epochs_run"),
           "peak_rss_gb": peak_rss_gb(), "fit_peak_rss_gb": rss_fit, "start_rss_gb": rss_before,
           "test_nll": M.nll(mean, var_y, y_test), "truth_nll": M.nll(mu_test, sd_test**2, y_test),
           "coverage": M.coverage(mean, var_y, y_test), "finite": finite,
           "features": None if not check else bool(check["kept"]), "torch_threads": torch.get_num_threads()}
    if job.get("save"):
        model.save(job["save"])
    return row


class DiscardSink:
    """A streamed-prediction sink that counts the rows it is given and keeps none (``--grid-sink discard``)."""

    def __init__(self):
        self.path, self.rows = None, 0

    def write(self, cols: dict, chunk=None) -> None:
        self.rows += len(next(iter(cols.values())))

    def close(self, complete: bool = True) -> None:
        pass


def grid_child(job: dict) -> dict:
    """Load the model saved at ``job["load"]`` and stream-predict ``job["cells"]`` cells over the synthetic box."""
    if job["warm_up"]:
        warm_up_torch()
    model = load_model(job["load"])
    rss_before = peak_rss_gb()
    grid = RegularGrid.from_bounds(SYNTH_BBOX, cells=job["cells"])
    with tempfile.TemporaryDirectory() as tmp:
        sink = DiscardSink() if job["sink"] == "discard" else TableSink(Path(tmp) / "grid.parquet")
        res = stream_predict(model, grid, sink, "identity", batch_size=DEFAULT_BATCH)
        size = res.path.stat().st_size / 1e9 if res.path is not None else None
    return {"model": job["model"], "job": f"grid ({job['sink']}), model of n = {job['fit_n']:,}",
            "n": grid.n_cells, "seconds": res.seconds, "rows_written": res.rows_written, "file_gb": size,
            "peak_rss_gb": peak_rss_gb(), "start_rss_gb": rss_before, "torch_threads": torch.get_num_threads(),
            "finite": res.rows_written == grid.n_cells}


def run_child(job: dict) -> dict:
    """Run ``job`` in a fresh Python process (its log on our stderr) and return the JSON row it prints last."""
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], stdout=subprocess.PIPE, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    why = "killed (out of memory?)" if proc.returncode in (-9, 137) else f"exit status {proc.returncode}"
    stderr(f"{job['model']} {job['kind']} n={job.get('n', job.get('cells')):,}: the child process failed ({why})")
    return {"model": job["model"], "job": f"{job['kind']} FAILED ({why})", "n": job.get("n", job.get("cells")),
            "finite": False}


def with_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Per model, fit seconds and n relative to the model's smallest fitted n (``time_x``, ``n_x``)."""
    df = df.copy()
    df["time_x"], df["n_x"] = np.nan, np.nan
    fits = (df["job"] == "fit") & df["seconds"].notna()
    for _, g in df[fits].groupby("model"):
        first = g.loc[g["n"].idxmin()]
        df.loc[g.index, "time_x"] = g["seconds"] / first["seconds"]
        df.loc[g.index, "n_x"] = g["n"] / first["n"]
    return df


def markdown(df: pd.DataFrame) -> str:
    """One table: a row per fit and per grid prediction."""
    def f(v, fmt):
        return "" if v is None or (isinstance(v, float) and not np.isfinite(v)) else format(v, fmt)

    lines = ["| model | job | n | seconds | time / first | n / first | µs per point | peak RSS (GB) | "
             "held-out predict (s) | test NLL | truth NLL | 95 % coverage | epochs |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in df.to_dict("records"):
        fit = r["job"] == "fit"
        seconds = r.get("seconds", np.nan)
        per_point = 1e6 * seconds / r["n"] if r.get("n") else np.nan
        epochs = r.get("epochs")
        epochs = "" if epochs is None or epochs != epochs else f"{int(epochs)}"
        if fit and r.get("features") is not None and r["features"] == r["features"]:
            epochs += f" (features {'kept' if r['features'] else 'dropped'})"
        lines.append(
            f"| {r['model']} | {r['job']} | {r['n']:,} | {f(seconds, '.1f')} | {f(r.get('time_x'), '.2f')} | "
            f"{f(r.get('n_x'), '.1f')} | {f(per_point, '.1f')} | {f(r.get('peak_rss_gb'), '.2f')} | "
            f"{f(r.get('predict_s'), '.1f') if fit else ''} | {f(r.get('test_nll'), '.4f')} | "
            f"{f(r.get('truth_nll'), '.4f')} | {f(r.get('coverage'), '.3f')} | {epochs} |")
    return "\n".join(lines)


def bars(df: pd.DataFrame) -> list[str]:
    """The issue's bars, for the rows at the sizes they name (1 M points, 10 M cells)."""
    out = []
    for r in df.to_dict("records"):
        s, gb = r.get("seconds", np.nan), r.get("peak_rss_gb", np.nan)
        if r["job"] == "fit" and r["n"] == 1_000_000 and r["model"] in FIT_BAR_S:
            ok = s <= FIT_BAR_S[r["model"]] and gb <= MEMORY_BAR_GB
            out.append(f"- bar: {r['model']} fits 1,000,000 points in <= {FIT_BAR_S[r['model']] // 60} min at <= "
                       f"{MEMORY_BAR_GB:g} GB: {'met' if ok else 'NOT met'} ({s / 60:.1f} min, {gb:.2f} GB)")
        if r["job"].startswith("grid") and r["n"] >= 10_000_000 and np.isfinite(s):
            ok = s * 10_000_000 / r["n"] <= GRID_BAR_S and gb <= MEMORY_BAR_GB
            out.append(f"- bar: {r['model']} predicts 10 M cells in <= {GRID_BAR_S // 60} min: "
                       f"{'met' if ok else 'NOT met'} ({s / 60:.1f} min for {r['n']:,} cells, {gb:.2f} GB)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="250000,500000,1000000", help="comma-separated n (places fitted)")
    ap.add_argument("--models", default="vecchia,dbk-nn")
    ap.add_argument("--grid-cells", type=int, default=10_000_000,
                    help="cells of the streamed grid, predicted by each model as fitted at the smallest n (0: none)")
    ap.add_argument("--grid-sink", choices=("parquet", "discard"), default="parquet",
                    help="write the grid's predictions to a temporary Parquet file, or only predict them")
    ap.add_argument("--seed", type=int, default=0, help="seed of the data, the validation share and the models")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # one job, run by the parent in a fresh process
    add_race_args(ap, "vecchia.neighbors=20", "1,500 and 3,000 points, tiny models, a 20,000-cell grid (the first "
                  "model only)")
    args = ap.parse_args(argv)
    if args.child:
        job = json.loads(args.child)
        print(json.dumps(fit_child(job) if job["kind"] == "fit" else grid_child(job)), flush=True)
        return 0
    if args.smoke:
        args.sizes, args.grid_cells = "1500,3000", 20_000
    sizes = sorted({int(v) for v in args.sizes.split(",") if v.strip()})
    # the parent only starts children (each warms torch up outside its timings, except in smoke mode: seconds)
    models = known_models([m for m in args.models.split(",") if m], log=stderr)
    sets = parse_sets(args.set)
    warm = not args.smoke
    t_start = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            settings = dict(smoke_settings(name)) if args.smoke else {}  # dbk-nn's DBK stage tiny too
            settings.update(sets.get(name, {}))
            try:  # a bad --set fails here, once, not in every child
                make_model(name, **settings)
            except ConfigError as e:
                raise SystemExit(f"--set {name}: {e}") from None
            saved = Path(tmp) / name
            for n in sizes:
                save = str(saved) if args.grid_cells and n == sizes[0] else None
                row = run_child({"kind": "fit", "model": name, "n": n, "seed": args.seed, "settings": settings,
                                 "save": save, "warm_up": warm})
                rows.append(row)
                if "seconds" in row:
                    stderr(f"{name} n={n:,}: fit {row['seconds']:.1f} s, held-out predict {row['predict_s']:.1f} s, "
                           f"peak RSS {row['peak_rss_gb']:.2f} GB")
            if args.grid_cells and saved.exists() and not (args.smoke and name != models[0]):
                row = run_child({"kind": "grid", "model": name, "load": str(saved), "cells": args.grid_cells,
                                 "sink": args.grid_sink, "fit_n": sizes[0], "warm_up": warm})
                rows.append(row)
                if "seconds" in row:
                    stderr(f"{name} grid {row['n']:,} cells: {row['seconds']:.1f} s, "
                           f"peak RSS {row['peak_rss_gb']:.2f} GB")
    df = pd.DataFrame(rows)
    for col in ("seconds", "peak_rss_gb"):  # absent when every child failed
        if col not in df:
            df[col] = np.nan
    df = with_ratios(df)
    threads = sorted({int(t) for t in df.get("torch_threads", pd.Series(dtype=float)).dropna()})
    threads = "/".join(map(str, threads or [torch.get_num_threads()]))  # the children's (the parent's if none ran)
    settings_note = "; ".join(f"{m}: {', '.join(f'{k}={v}' for k, v in s.items())}" for m, s in sets.items())
    header = (f"Scale on one machine (issue 22): the synthetic Ookla world (gpcore.data.synthetic.ookla_points, seed "
              f"{args.seed}); each model with its defaults{' (smoke settings)' if args.smoke else ''}"
              f"{' and ' + settings_note if settings_note else ''}, fitted on n places (a seeded 10 % validates), "
              f"predicting n / 10 new places; each fit and each grid in a fresh process (peak RSS its own); "
              f"'time / first' and 'n / first' against the model's smallest n; the grid rows' µs per point are per "
              f"cell\n\n" + stamp(time.perf_counter() - t_start, threads))
    md = "\n".join([markdown(df), "", *bars(df)]).rstrip()
    report(header, md, df, args.out)
    return 0 if bool(df["finite"].fillna(False).all()) else 1


if __name__ == "__main__":
    sys.exit(main())
