"""Issue 23's bar: space-time ``vecchia`` / ``dbk-nn`` against per-quarter models and GPBoost's space-time Vecchia GP.

Data: the bundled Puerto Rico sample (Ookla mobile, 20 quarters 2019Q1-2023Q4, 142,803 tiles), log10 download
Mbps, weights ``tests``, strata county metro / non-metro (``unknown``: tiles outside the municipio polygons), read by
the project's own data path (:func:`gpcore.run.pipeline.prepare` with ``time_input=True``: inputs lon, lat, t in
decimal years). Metrics are in log10 units. Two tasks (``--tasks``):

* ``forecast``: the forecast split (:func:`gpcore.data.splits.forecast_split`, docs/methods/spacetime.md): train on
  2019Q1-2022Q4 (validation = 2022Q4), test on the 2023Q1 tiles and on all of 2023Q1-Q4. Rows per ``--models`` model:
  the space-time model with a forecast run's defaults (:func:`gpcore.run.pipeline.run_model_settings`:
  ``space_time=separable``, the validation quarter's variance scale per metro / non-metro stratum;
  ``--set vecchia.space_time=gneiting`` for the other family), (a) the same model fitted per quarter on 2022Q4
  alone (lon, lat; a seeded 10 % of those rows validates and sets one global variance scale), and
  (b) GPBoost's space-time Vecchia GP (``cov_function="matern_space_time"``, ``gp_approx="vecchia"``, package
  defaults otherwise, ``gp_coords`` = (t, lon, lat) as GPBoost wants time first, an intercept as fixed effect) on
  every labelled row the gpcore space-time models saw (training and validation).
* ``interp``: interpolation in time: a seeded 20 % of the tiles of every quarter are held out; the space-time model
  trains on the other 80 % of all quarters (a seeded 10 % of them validates), each per-quarter model on its quarter's
  80 % (10 % of it validates). Test NLL and CRPS per quarter and overall (the bar: the space-time model wins every
  quarter, most on the sparse 2020Q2).

Reported per row: test NLL, CRPS, 95 % coverage ± two binomial SEs overall and per metro / non-metro (``✗`` when
outside), training rows, fit seconds. ``--subsample N``: every model trains on its part of the same seeded N-row
pool of labelled rows (the per-quarter models on that pool's rows of their quarter), so all see the same data;
test rows are never subsampled. Weights: a gpcore model that supports them is fitted with ``tests`` and scored per
test row with its own count (``vecchia`` and ``dbk-nn`` both do). GPBoost: unweighted by default (``--gpboost
weighted`` passes its ``weights``: error variance divided by the row's count).

    python benchmarks/bench_spacetime.py                              # the full bar (long: all 142,803 rows)
    python benchmarks/bench_spacetime.py --subsample 3000 --out st.md # a quick look
    python benchmarks/bench_spacetime.py --smoke                      # tiny synthetic space-time data, seconds (CI)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from _harness import add_race_args, fit_predict, report, smoke_settings, start, stderr
from _peers import gpboost_available

from gpcore import metrics as M
from gpcore.data.temporal import decimal_year, quarter_index, quarter_label
from gpcore.run.config import RunConfig
from gpcore.run.pipeline import prepare, run_model_settings

MODELS = "vecchia,dbk-nn"
GPBOOST = "GPBoost space-time vecchia"
TEST_PERIOD = "2023Q1:2023Q4"


def pr_config(**kw) -> RunConfig:
    return RunConfig(data="sample:puerto_rico", y="download_mbps", transform="log10", weight="tests",
                     strata="county_metro", time_input=True, grid_kind="none", **kw)


def tiny(name: str, smoke: bool) -> dict:
    """The ``--smoke`` settings of model ``name`` (empty otherwise; dbk-nn without its feature check)."""
    if not smoke:
        return {}
    return {**smoke_settings(name), **({"feature_check": False} if name == "dbk-nn" else {})}


def smoke_csv(path: Path, n: int = 360, seed: int = 0) -> Path:
    """A tiny space-time CSV over 2022Q3-2023Q4 (6 quarters) with a field that rises in time and a metro column."""
    rng = np.random.default_rng(seed)
    q = rng.choice(["2022Q3", "2022Q4", "2023Q1", "2023Q2", "2023Q3", "2023Q4"], n)
    lon, lat = rng.uniform(-67.2, -65.6, n), rng.uniform(17.95, 18.45, n)
    f = 1.3 + 0.3 * np.sin(3 * lon) * np.cos(4 * lat) + 0.3 * (decimal_year(q) - 2022)
    pd.DataFrame({"quarter": q, "lon": lon, "lat": lat, "download_mbps": 10 ** (f + 0.08 * rng.normal(size=n)),
                  "tests": rng.integers(1, 9, n), "metro": np.where(lon > -66.4, "metro", "non-metro")}
                 ).to_csv(path, index=False)
    return path


# ---------------------------------------------------------------------------------------------
# scoring
# ---------------------------------------------------------------------------------------------


def coverage_cell(mean, var_y, y) -> tuple[str, bool]:
    """``"94.8 ± 0.9"`` (coverage and two binomial SEs, in %), with ``✗`` when outside; and whether inside."""
    if len(y) == 0:
        return "-", True
    cov, two_se = M.coverage(mean, var_y, y), 2 * M.coverage_se(len(y))
    ok = abs(cov - 0.95) <= two_se
    return f"{100 * cov:.1f} ± {100 * two_se:.1f}{'' if ok else ' ✗'}", ok


def score(task: str, test: str, model: str, kind: str, mean, var_y, y, strata, fit_s: float, n_train: int) -> dict:
    cov, ok = coverage_cell(mean, var_y, y)
    row = {"task": task, "test": test, "model": model, "kind": kind, "n_train": n_train, "n_test": len(y),
           "nll": M.nll(mean, var_y, y), "crps": M.crps(mean, var_y, y), "coverage": M.coverage(mean, var_y, y),
           "coverage_cell": cov, "all_within_2se": ok, "fit_s": fit_s}
    for label in ("metro", "non-metro"):
        sel = strata == label
        row[label.replace("-", "_")], good = coverage_cell(mean[sel], var_y[sel], y[sel])
        row["all_within_2se"] &= good
    return row


def _pool(idx_parts, n_max: int, seed: int):
    """The parts of ``idx_parts`` restricted to one seeded pool of at most ``n_max`` of their rows (0 = all)."""
    pool = np.concatenate(idx_parts)
    if n_max and n_max < len(pool):
        keep = set(np.random.default_rng(seed).choice(pool, n_max, replace=False).tolist())
        return [np.array([i for i in p if i in keep], dtype=np.int64) for p in idx_parts]
    return list(idx_parts)


def _split_val(idx, seed: int, share: float = 0.1):
    """``(train, val)`` of ``idx``: a seeded ``share`` validates."""
    perm = np.random.default_rng(seed).permutation(idx)
    n_val = max(1, int(round(share * len(idx))))
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def _fit(name, settings, X, y, w, tr, va, te, seed, g=None):
    wkw = {} if w is None else {"weights": w[tr], "val_weights": w[va], "test_weights": w[te]}
    if settings.get("recalibrate") == "group" and g is not None:  # per-stratum scales: the rows' strata
        wkw.update(val_groups=g[va], test_groups=g[te])
    return fit_predict(name, settings, X[tr], y[tr], X[va], y[va], X[te], seed=seed, **wkw)


def gpboost_space_time(X, y, X_pred, weights=None, weights_pred=None, trend: bool = False) -> dict:
    """GPBoost's space-time Vecchia GP on ``X`` = (lon, lat, t) (passed to GPBoost as (t, lon, lat): time first),
    an intercept as fixed effect (``trend``: an intercept and t, the fixed effects of gpcore's ``time_trend``),
    package defaults otherwise. Returns mean, var_y, fit and predict seconds."""
    import gpboost as gpb

    def coords(A):
        return np.ascontiguousarray(np.column_stack([A[:, 2], A[:, 0], A[:, 1]]), dtype=np.float64)

    def fixed(A):
        return np.column_stack([np.ones(len(A)), A[:, 2] - X[:, 2].mean()]) if trend else np.ones((len(A), 1))

    kw = {} if weights is None else {"weights": np.asarray(weights, dtype=np.float64)}
    t0 = time.perf_counter()
    gp = gpb.GPModel(gp_coords=coords(X), cov_function="matern_space_time", gp_approx="vecchia",
                     likelihood="gaussian", **kw)
    gp.fit(y=y, X=fixed(X))
    fit_s = time.perf_counter() - t0
    q = gp.predict(gp_coords_pred=coords(X_pred), X_pred=fixed(X_pred), predict_var=True,
                   predict_response=weights is None)
    mean, var = np.asarray(q["mu"], dtype=np.float64), np.asarray(q["var"], dtype=np.float64)
    cov = gp.get_cov_pars()
    if weights is not None:
        w = np.ones(len(X_pred)) if weights_pred is None else np.asarray(weights_pred, dtype=np.float64)
        var = var + float(cov["Error_var"].iloc[0]) / w
    return {"mean": mean, "var_y": var, "fit_seconds": fit_s,
            "cov_pars": {k: round(float(cov[k].iloc[0]), 5) for k in cov.columns}}


# ---------------------------------------------------------------------------------------------
# the two tasks
# ---------------------------------------------------------------------------------------------


def forecast_task(cfg: RunConfig, models, sets, args, smoke: bool) -> list[dict]:
    prep = prepare(cfg)
    X, y, w, g, t = prep.X, prep.y, prep.weights, prep.strata, prep.t
    tr, va = _pool([prep.train_idx, prep.val_idx], args.subsample, args.seed)
    te = prep.test_idx
    qi = quarter_index(t)
    first = te[qi[te] == qi[te].min()]
    tests = [(quarter_label(qi[te].min()), first), (cfg.test_period, te)]
    last = quarter_label(qi[va].max())
    stderr(f"forecast: train/val {len(tr)}/{len(va)} (validation = {last}), test {len(first)} ({tests[0][0]}) and "
           f"{len(te)} ({cfg.test_period})")
    rows = []

    def add(model, kind, r, n_train):
        for label, idx in tests:
            sel = np.isin(te, idx)
            rows.append(score("forecast", label, model, kind, r["mean"][sel], r["var_y"][sel], y[idx], g[idx],
                              r["fit_seconds"], n_train))
        stderr(f"  {model} [{kind}]: fit {r['fit_seconds']:.1f} s on {n_train} rows, test NLL "
               f"{rows[-2]['nll']:.4f} ({tests[0][0]}), {rows[-1]['nll']:.4f} ({cfg.test_period})")

    for name in models:
        base = {**tiny(name, smoke), **sets.get(name, {})}
        # the space-time model with a forecast run's defaults (space_time, the validation quarter's variance scales:
        # per stratum here), as `gpcore fit --split forecast` and the app fit it
        st = {**run_model_settings(dataclasses.replace(cfg, model=name, settings={}), prep), **base}
        add(name, f"space-time {st['space_time']}, recalibrate {st.get('recalibrate', 'none')}",
            _fit(name, st, X, y, w, tr, va, te, args.seed, g), len(tr) + len(va))
        q_rows = np.concatenate([tr, va])
        q_rows = np.sort(q_rows[qi[q_rows] == qi[va].max()])
        q_tr, q_va = _split_val(q_rows, args.seed)
        pq = {"recalibrate": "global", **base}  # its best variant (per stratum: too few rows of one quarter)
        add(name, f"per-quarter {last}, recalibrate {pq['recalibrate']}",
            _fit(name, pq, X[:, :2], y, w, q_tr, q_va, te, args.seed, g), len(q_rows))
    if args.gpboost == "none":
        stderr("  --gpboost none: no peer rows")
    elif gpboost_available():
        lab = np.concatenate([tr, va])
        ww = w if args.gpboost == "weighted" else None
        trend = args.gpboost_fixed == "trend"
        r = gpboost_space_time(X[lab], y[lab], X[te], None if ww is None else ww[lab], None if ww is None else ww[te],
                               trend=trend)
        kind = "space-time" + (" weighted" if ww is not None else "") + (", fixed effects 1 + t" if trend else "")
        add(GPBOOST, kind, r, len(lab))
        stderr(f"    parameters {r['cov_pars']}")
    else:
        stderr("  GPBoost not installed (pip install gpboost): no peer row")
    return rows


def interp_task(cfg: RunConfig, models, sets, args, smoke: bool) -> list[dict]:
    prep = prepare(cfg)
    X, y, w, g, t = prep.X, prep.y, prep.weights, prep.strata, prep.t
    qi = quarter_index(t)
    rng = np.random.default_rng(args.seed)
    test_mask = np.zeros(len(y), dtype=bool)
    for q in np.unique(qi):
        rows_q = np.flatnonzero(qi == q)
        test_mask[rng.choice(rows_q, int(round(0.2 * len(rows_q))), replace=False)] = True
    te = np.flatnonzero(test_mask)
    (pool,) = _pool([np.flatnonzero(~test_mask)], args.subsample, args.seed)
    stderr(f"interp: {len(pool)} labelled rows over {len(np.unique(qi))} quarters, {len(te)} held out (20 % per "
           "quarter)")
    rows = []
    for name in models:
        base = {**tiny(name, smoke), **sets.get(name, {})}
        st = {"space_time": "separable", **base}
        tr, va = _split_val(pool, args.seed)
        r = _fit(name, st, X, y, w, tr, va, te, args.seed, g)
        kind = f"space-time {st['space_time']}"
        rows.append(score("interp", "all", name, kind, r["mean"], r["var_y"], y[te], g[te], r["fit_seconds"],
                          len(pool)))
        per_mean, per_var, fit_total = np.full(len(te), np.nan), np.full(len(te), np.nan), 0.0
        for q in np.unique(qi):
            sel = qi[te] == q
            idx = te[sel]
            rows.append(score("interp", quarter_label(q), name, kind, r["mean"][sel], r["var_y"][sel], y[idx], g[idx],
                              r["fit_seconds"], len(pool)))
            q_pool = pool[qi[pool] == q]
            if len(q_pool) < 20:
                stderr(f"  {name} per-quarter {quarter_label(q)}: {len(q_pool)} rows, too few to fit; skipped")
                continue
            q_tr, q_va = _split_val(q_pool, args.seed)
            rq = _fit(name, base, X[:, :2], y, w, q_tr, q_va, idx, args.seed, g)
            per_mean[sel], per_var[sel], fit_total = rq["mean"], rq["var_y"], fit_total + rq["fit_seconds"]
            rows.append(score("interp", quarter_label(q), name, "per-quarter", rq["mean"], rq["var_y"], y[idx], g[idx],
                              rq["fit_seconds"], len(q_pool)))
        ok = np.isfinite(per_mean)
        rows.append(score("interp", "all" if ok.all() else "all fitted quarters", name, "per-quarter", per_mean[ok],
                          per_var[ok], y[te][ok], g[te][ok], fit_total, len(pool)))
        st_nll = next(x["nll"] for x in rows if x["model"] == name and x["test"] == "all" and x["kind"] == kind)
        stderr(f"  {name}: test NLL space-time {st_nll:.4f}, per-quarter {rows[-1]['nll']:.4f} (fits "
               f"{r['fit_seconds']:.0f} s vs {fit_total:.0f} s)")
    return rows


# ---------------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------------


def markdown(df: pd.DataFrame) -> str:
    out = []
    fc = df[df.task == "forecast"]
    if len(fc):
        cols = ["test", "model", "kind", "n train", "test NLL", "CRPS", "95 % coverage", "metro", "non-metro", "fit s"]
        lines = ["### Forecast", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in fc.itertuples(index=False):
            lines.append(f"| {r.test} | {r.model} | {r.kind} | {r.n_train} | {r.nll:.4f} | {r.crps:.4f} | "
                         f"{r.coverage_cell} | {r.metro} | {r.non_metro} | {r.fit_s:.1f} |")
        out.append("\n".join(lines))
    it = df[df.task == "interp"]
    if len(it):
        lines = ["### Interpolation in time (20 % of every quarter held out)", "",
                 "| quarter | model | n test | NLL space-time | NLL per-quarter | CRPS space-time | CRPS per-quarter | "
                 "space-time wins |", "|---|---|---|---|---|---|---|---|"]
        for (model, test), part in it.groupby(["model", "test"], sort=False):
            st = part[part.kind.str.startswith("space-time")]
            pq = part[part.kind == "per-quarter"]
            if not len(st):
                continue
            s = st.iloc[0]
            p_nll, p_crps = (f"{pq.iloc[0][k]:.4f}" if len(pq) else "-" for k in ("nll", "crps"))
            win = "-" if not len(pq) else ("yes" if s.nll < pq.iloc[0].nll and s.crps < pq.iloc[0].crps else "no")
            lines.append(f"| {test} | {model} | {s.n_test} | {s.nll:.4f} | {p_nll} | {s.crps:.4f} | {p_crps} | {win} |")
        cov = it[it.test.str.startswith("all")]
        lines += ["", "| model | kind | test | n train | test NLL | CRPS | 95 % coverage | metro | non-metro | fit s |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in cov.itertuples(index=False):
            lines.append(f"| {r.model} | {r.kind} | {r.test} | {r.n_train} | {r.nll:.4f} | {r.crps:.4f} | "
                         f"{r.coverage_cell} | {r.metro} | {r.non_metro} | {r.fit_s:.1f} |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=MODELS, help=f"comma-separated gpcore model names (default {MODELS})")
    ap.add_argument("--tasks", default="forecast,interp", help="forecast, interp or both (default)")
    ap.add_argument("--seed", type=int, default=0, help="split, subsample and model seed")
    ap.add_argument("--subsample", type=int, default=0, help="at most this many labelled training rows (seeded)")
    ap.add_argument("--gpboost-fixed", choices=("intercept", "trend"), default="intercept",
                    help="GPBoost's fixed effects: an intercept (default, its users' usual) or an intercept and t")
    ap.add_argument("--gpboost", choices=("unweighted", "weighted", "none"), default="unweighted",
                    help="GPBoost's space-time GP in the forecast task: unweighted (default), weighted, or none")
    add_race_args(ap, smoke="tiny synthetic space-time data, tiny models")
    args = ap.parse_args(argv)
    tasks = [s for s in args.tasks.split(",") if s]
    if bad := [s for s in tasks if s not in ("forecast", "interp")]:
        raise SystemExit(f"--tasks {','.join(bad)}: choose forecast and/or interp")
    models, sets = start(args.models, args.set)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            csv = smoke_csv(Path(tmp) / "st.csv")
            base = RunConfig(data=str(csv), y="download_mbps", transform="log10", weight="tests",
                             strata="column:metro", time_input=True, grid_kind="none", seed=args.seed)
            period = "2023Q3:2023Q4"  # train on 2022Q3-2023Q2
        else:
            base, period = pr_config(seed=args.seed), TEST_PERIOD
        if "forecast" in tasks:
            cfg = RunConfig(**{**base.to_dict(), "x": None, "split": "forecast", "test_period": period})
            rows += forecast_task(cfg, models, sets, args, args.smoke)
        if "interp" in tasks:
            rows += interp_task(base, models, sets, args, args.smoke)
    df = pd.DataFrame(rows)
    header = (f"Puerto Rico{' (smoke: synthetic)' if args.smoke else ''}, log10 download Mbps, seed {args.seed}"
              f"{f', labelled rows subsampled to {args.subsample}' if args.subsample else ''}; coverage ± two "
              f"binomial SEs (✗ outside); torch {torch.get_num_threads()} thread(s)")
    report(header, markdown(df), df, args.out)
    return 0 if np.isfinite(df["nll"]).all() else 1


if __name__ == "__main__":
    sys.exit(main())
