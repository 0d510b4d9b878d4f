"""Issue 13's bar: gpcore's models against GPBoost's Vecchia GP on four data sets, in one process, on one split.

For each data set the project's own data path (:func:`gpcore.run.pipeline.prepare` on a :class:`RunConfig`) gives the
seeded random 8:1:1 split (``--split block``: whole ``--block-km`` squares); each ``--models`` model
(default vecchia,dbk-nn,dbk-rbf; a name the registry does not have is skipped with a message) is fitted on the
training rows with early stopping on the validation rows, and GPBoost's Vecchia GP (Matérn-3/2, 30 neighbours,
package defaults, a constant fixed effect; ``pip install gpboost``, never a gpcore dependency) as its users fit it:
on every labelled row the gpcore models were given, training and validation rows together. All are scored on the
same test rows. One row per (data set, model): test NLL, its differences to GPBoost's unweighted and weighted
fits (negative = better than that GPBoost), CRPS, 95 % coverage overall and per stratum with ``✗`` when it is more than
two binomial standard errors (:func:`gpcore.metrics.coverage_se`) from 95 %, fit seconds. Metrics are in the
transformed units the models train in (log10).

Data sets (``--data``, comma-separated):

* ``pr``: Puerto Rico 2023 (bundled sample), log10 download Mbps, weights ``tests``, strata county metro /
  non-metro (``unknown``: tiles outside the municipio polygons).
* ``mo``: Missouri 2020Q4 (bundled sample), the same; ``unknown`` = tiles outside Missouri (the box reaches
  into KS, IA, IL, AR, OK, NE).
* ``california``: California housing 1990 block groups, log10 median_house_value, strata inland / coastal
  (``ocean_proximity`` INLAND or not), no weights.
* ``turkey``: Ookla mobile Turkey box 2025Q4 (``tile_x``/``tile_y``), log10 download Mbps (avg_d_kbps / 1000),
  weights ``tests``, no strata: the files have no boundaries for it, and the box crosses national borders.

California and Turkey are read from ``$UA_SHARED_DATA`` (else ``../shared/data`` beside the repository); a
missing file skips that data set with a message.

Weights: a gpcore model with ``supports_weights`` is fitted with the ``tests`` weights and scored on each test
row with its own count (``weights`` column ``tests``); one without (``vecchia``) is fitted unweighted (``-``).
GPBoost is fitted twice on a weighted data set (``--gpboost both``, default): unweighted (the issue's reference)
and with its own ``weights`` argument (error variance of row i divided by ``tests[i]``, no nugget floor; each
test row scored with its own count: latent variance + Error_var / tests); ``--gpboost unweighted`` or
``weighted`` fits one of them.
``--recalibrate group`` (or ``global``) adds, per gpcore model, a row after gpcore's split-conformal variance
recalibration on the validation rows (what a dashboard run does by default); GPBoost is never recalibrated.

    python benchmarks/bench_race.py                                   # all four data sets, the issue's models
    python benchmarks/bench_race.py --data pr,mo --models vecchia,dbk-rbf --subsample 5000 --out race.md
    python benchmarks/bench_race.py --split block --recalibrate group --set vecchia.epochs=50
    python benchmarks/bench_race.py --smoke                           # tiny synthetic data, seconds (CI)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from _harness import (
    add_race_args,
    feature_check_text,
    fit_predict,
    report,
    shared_data,
    smoke_settings,
    start,
    stderr,
)
from _peers import gpboost_available, gpboost_vecchia

from gpcore import metrics as M
from gpcore.run.config import RunConfig
from gpcore.run.pipeline import prepare

RACE_MODELS = "vecchia,dbk-nn,dbk-rbf"
DATASETS = ("pr", "mo", "california", "turkey")
CALIFORNIA_FILE = "california_housing_1990_blockgroups.csv"
TURKEY_FILE = "ookla_mobile_turkey_bbox_2025Q4.parquet"
GPBOOST = "GPBoost vecchia"


def dataset_config(key: str, tmp: Path) -> RunConfig | None:
    """The RunConfig of data set ``key`` (split settings are applied by the caller); None when its file is absent."""
    ookla = {"y": "download_mbps", "transform": "log10", "weight": "tests", "grid_kind": "none"}
    if key == "pr":
        return RunConfig(data="sample:puerto_rico", quarter="2023", strata="county_metro", **ookla)
    if key == "mo":
        return RunConfig(data="sample:missouri_2020Q4", strata="county_metro", **ookla)
    if key == "california":
        src = shared_data(CALIFORNIA_FILE)
        if not src.is_file():
            return None
        from bench_weights import make_california

        csv = make_california(src, tmp / "california_coast.csv")
        return RunConfig(data=str(csv), y="median_house_value", x=("longitude", "latitude"), transform="log10",
                         strata="column:coast", grid_kind="none")
    if key == "turkey":
        src = shared_data(TURKEY_FILE)
        if not src.is_file():
            return None
        # the reader derives download_mbps = avg_d_kbps / 1000 from Ookla's columns
        return RunConfig(data=str(src), x=("tile_x", "tile_y"), **ookla)
    raise SystemExit(f"--data {key!r}: unknown data set; choose from {', '.join(DATASETS)}")


def race_configs(data: str, smoke: bool, tmp: Path) -> list[tuple[str, RunConfig]]:
    """``(key, RunConfig)`` of the comma-separated ``data`` sets whose files exist (a missing one is skipped with a
    message); ``smoke``: the bundled synthetic sample instead."""
    if smoke:
        return [("synthetic", RunConfig(data="sample:synthetic", y="download_mbps", transform="log10",
                                        weight="tests", strata="county_metro", grid_kind="none"))]
    configs = []
    for key in [k for k in data.split(",") if k]:
        cfg = dataset_config(key, tmp)
        if cfg is None:
            print(f"{key}: data file not found under {shared_data('')}: skipping (set UA_SHARED_DATA)")
            continue
        configs.append((key, cfg))
    return configs


def coverage_cell(mean, var_y, y) -> tuple[str, bool]:
    """``"94.8 ± 0.9"`` (coverage and two binomial SEs, in %), with ``✗`` when outside; and whether inside."""
    cov, two_se = M.coverage(mean, var_y, y), 2 * M.coverage_se(len(y))
    ok = abs(cov - 0.95) <= two_se
    return f"{100 * cov:.1f} ± {100 * two_se:.1f}{'' if ok else ' ✗'}", ok


def score(data: str, model: str, weights: str, mean, var_y, y, strata, fit_s: float, n_train: int) -> dict:
    cov, ok = coverage_cell(mean, var_y, y)
    per, all_ok = [], ok
    if strata is not None:
        for label in sorted(set(strata.tolist())):
            sel = strata == label
            cell, good = coverage_cell(mean[sel], var_y[sel], y[sel])
            per.append(f"{label} {cell}")
            all_ok &= good
    return {"data": data, "model": model, "weights": weights, "n_train": n_train, "nll": M.nll(mean, var_y, y),
            "crps": M.crps(mean, var_y, y), "coverage": M.coverage(mean, var_y, y), "coverage_cell": cov,
            "strata_coverage": "; ".join(per) or "-", "all_within_2se": all_ok, "fit_s": fit_s}


def race_dataset(key: str, cfg: RunConfig, models, sets, args, smoke: bool = False) -> list[dict]:
    prep = prepare(cfg)
    tr, va, te = prep.train_idx, prep.val_idx, prep.test_idx
    if args.subsample and args.subsample < len(tr):
        tr = np.sort(np.random.default_rng(cfg.seed).choice(tr, args.subsample, replace=False))
    X, y, w, g = prep.X, prep.y, prep.weights, prep.strata
    g_te = g[te] if g is not None else None
    stderr(f"{key}: {prep.source_label}, train/val/test {len(tr)}/{len(va)}/{len(te)} ({cfg.split} split, "
           f"seed {cfg.seed}), weights {cfg.weight or 'none'}, strata {cfg.strata or 'none'}")
    rows = []
    wkw = {} if w is None else {"weights": w[tr], "val_weights": w[va], "test_weights": w[te]}
    for name in models:
        settings = {**(smoke_settings(name) if smoke else {}), **sets.get(name, {})}
        r = fit_predict(name, settings, X[tr], y[tr], X[va], y[va], X[te], seed=cfg.seed, **wkw)
        wlabel = cfg.weight if r["weighted"] else "-"
        rows.append(score(key, name, wlabel, r["mean"], r["var_y"], y[te], g_te, r["fit_seconds"], len(tr)))
        stderr(f"  {name}: fit {r['fit_seconds']:.1f} s ({r['epochs']} epochs), weights {wlabel}, "
               f"test NLL {rows[-1]['nll']:.4f}" + feature_check_text(r["model"]))
        if args.recalibrate != "none":
            model = r["model"]
            kind = args.recalibrate if g is not None else "global"
            if "conditioned_on" in model.train_info_:  # vecchia, dbk-nn: recalibrate before the validation rows join
                r = fit_predict(name, {**settings, "recalibrate": kind}, X[tr], y[tr], X[va], y[va], X[te],
                                seed=cfg.seed, val_groups=g[va] if g is not None else None, test_groups=g_te, **wkw)
                model, p = r["model"], r
            else:
                model.recalibrate(X[va], y[va], val_weights=w[va] if r["weighted"] else None,
                                  val_groups=g[va] if g is not None else None, kind=kind)
                pred = model.predict(X[te], weights=w[te] if r["weighted"] else None, groups=g_te)
                p = {"mean": pred.mean, "var_y": pred.var_y}
            rows.append(score(key, f"{name} +recal {model.recal_['kind']}", wlabel, p["mean"], p["var_y"], y[te], g_te,
                              r["fit_seconds"], len(tr)))
    if args.gpboost == "none":
        stderr("  --gpboost none: no peer rows (compare with a run that has them)")
    elif gpboost_available():
        variants = [] if (args.gpboost == "weighted" and w is not None) else [("-", None)]
        variants += [(cfg.weight, w)] if args.gpboost != "unweighted" and w is not None else []
        for wlabel, ww in variants:
            lab = np.concatenate([tr, va])  # every labelled row (the gpcore models see both too)
            r = gpboost_vecchia(X[lab], y[lab], X[te], weights=None if ww is None else ww[lab],
                                weights_pred=None if ww is None else ww[te])
            rows.append(score(key, GPBOOST, wlabel, r["mean"], r["var_y"], y[te], g_te, r["fit_seconds"], len(lab)))
            stderr(f"  {GPBOOST} (weights {wlabel}): fit {r['fit_seconds']:.1f} s, test NLL {rows[-1]['nll']:.4f}, "
                   f"parameters {r['cov_pars']}")
    else:
        stderr("  GPBoost not installed (pip install gpboost): no peer row")
    ref = [r["nll"] for r in rows if r["model"] == GPBOOST and r["weights"] == "-"]
    ref_w = [r["nll"] for r in rows if r["model"] == GPBOOST and r["weights"] != "-"]
    for r in rows:
        r["dnll"] = r["nll"] - ref[0] if ref else float("nan")
        r["dnll_w"] = r["nll"] - ref_w[0] if ref_w else float("nan")
    return rows


def markdown(df: pd.DataFrame) -> str:
    cols = ["data", "model", "weights", "n train", "test NLL", "ΔNLL vs GPBoost", "ΔNLL vs GPBoost weighted", "CRPS",
            "95 % coverage", "coverage per stratum", "fit s"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        d, dw = ("-" if np.isnan(v) else f"{v:+.4f}" for v in (r.dnll, r.dnll_w))
        lines.append(f"| {r.data} | {r.model} | {r.weights} | {r.n_train} | {r.nll:.4f} | {d} | {dw} | "
                     f"{r.crps:.4f} | {r.coverage_cell} | {r.strata_coverage} | {r.fit_s:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=",".join(DATASETS), help=f"comma-separated, from {', '.join(DATASETS)}")
    ap.add_argument("--models", default=RACE_MODELS, help=f"comma-separated gpcore model names (default {RACE_MODELS})")
    ap.add_argument("--split", choices=("random", "block"), default="random")
    ap.add_argument("--block-km", type=float, default=10.0, help="block size of --split block")
    ap.add_argument("--seed", type=int, default=0, help="split, subsample and model seed")
    ap.add_argument("--subsample", type=int, default=0, help="at most this many training rows (seeded); quick runs")
    ap.add_argument("--recalibrate", choices=("none", "global", "group"), default="none",
                    help="also report each gpcore model after variance recalibration on the validation rows")
    ap.add_argument("--gpboost", choices=("both", "unweighted", "weighted", "none"), default="both",
                    help="GPBoost fits on a weighted data set: unweighted, with its weights argument, both, or none "
                         "(variants of gpcore models; GPBoost's numbers do not change between runs)")
    add_race_args(ap)
    args = ap.parse_args(argv)
    models, sets = start(args.models, args.set)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            args.subsample = args.subsample or 600
            args.recalibrate = "group" if args.recalibrate == "none" else args.recalibrate
        for key, cfg in race_configs(args.data, args.smoke, Path(tmp)):
            cfg = dataclasses.replace(cfg, split=args.split, block_km=args.block_km, seed=args.seed)
            rows += race_dataset(key, cfg, models, sets, args, smoke=args.smoke)
    if not rows:
        print("nothing to run")
        return 0
    df = pd.DataFrame(rows)
    md = markdown(df)
    header = (f"split {args.split}{f' ({args.block_km:g} km blocks)' if args.split == 'block' else ''}, seed "
              f"{args.seed}{f', training rows subsampled to {args.subsample}' if args.subsample else ''}; "
              f"same labelled rows for every tool: GPBoost fits training + validation rows ('n train' counts "
              f"both), gpcore models train on the training rows and stop on the validation rows (vecchia and dbk-nn "
              f"then condition on both); same test rows; coverage ± two binomial SEs (✗ outside); GPBoost with "
              f"weights: its error variance divided by the row's count; torch {torch.get_num_threads()} thread(s)")
    report(header, md, df, args.out)
    return 0 if np.isfinite(df["nll"]).all() else 1


if __name__ == "__main__":
    sys.exit(main())
