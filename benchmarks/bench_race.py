"""Issue 13's bar: gpcore's models against GPBoost's Vecchia GP on four data sets, in one process, on one split.

For each data set the project's own data path (:func:`gpcore.run.pipeline.prepare` on a :class:`RunConfig`) gives the
seeded random 8:1:1 split (``--split block``: whole ``--block-km`` squares); each ``--models`` model
(default vecchia,dbk-nn,dbk-rbf; a name the registry does not have is skipped with a message) is fitted on the
training rows with early stopping on the validation rows, with the settings a run of that split gives it
(``vecchia``, ``dbk-nn``: the latent scale cross-validated on folds like the split, :func:`_harness.run_defaults`),
and GPBoost's Vecchia GP (Matérn-3/2, 30 neighbours,
package defaults, a constant fixed effect; ``pip install gpboost``, never a gpcore dependency) as its users fit it:
on every labelled row the gpcore models were given, training and validation rows together. All are scored on the
same test rows. One row per (data set, model): test NLL, its differences to GPBoost's unweighted and weighted
fits (negative = better than that GPBoost), CRPS, 95 % coverage overall and per stratum with ``✗`` when it is more than
two binomial standard errors (:func:`gpcore.metrics.coverage_se`) from 95 % (on a block split, in brackets, two
cluster-robust SEs by held-out block: :func:`coverage_cell`), fit seconds. Metrics are in the transformed units the
models train in (log10).

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
``--boxcox LAMBDA`` adds, per gpcore model and per GPBoost fit, a row fitted on the Box-Cox scale ``z = (Mbps^LAMBDA
- 1) / LAMBDA`` of the original target instead of its log10, scored on the log10 scale like the others (NLL with the
Jacobian, CRPS by quadrature: :func:`gpcore.metrics.warped_scores`, with the predictive mass below y = 0 put at the
lowest training value; coverage is the same on either scale). ``--boxcox auto`` picks LAMBDA per data set from 0
(log10 itself), 0.1, ..., 0.5 by the validation rows alone: ``vecchia`` with its defaults fitted on the training
rows on each scale, its validation NLL on the log10 scale before those rows join the posterior; the test rows play
no part.

    python benchmarks/bench_race.py                                   # all four data sets, the issue's models
    python benchmarks/bench_race.py --data pr,mo --models vecchia,dbk-rbf --subsample 5000 --out race.md
    python benchmarks/bench_race.py --split block --recalibrate group --set vecchia.epochs=50
    python benchmarks/bench_race.py --data pr,mo --models vecchia --boxcox auto  # also on a Box-Cox scale
    python benchmarks/bench_race.py --smoke                           # tiny synthetic data, seconds (CI)
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
from _harness import (
    add_race_args,
    cv_text,
    feature_check_text,
    fit_predict,
    report,
    run_defaults,
    shared_data,
    smoke_settings,
    stamp,
    start,
    stderr,
)
from _peers import gpboost_available, gpboost_vecchia
from scipy.special import ndtr

from gpcore import metrics as M
from gpcore.data.splits import block_ids
from gpcore.models.noise_shape import of_rows
from gpcore.run.compare import band_text
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


def coverage_cell(mean, var_y, y, blocks=None, shape=None, var_f=None) -> tuple[str, bool]:
    """``"94.8 ± 0.9"`` (coverage and two binomial SEs, in %), with ``✗`` when outside; and whether inside (the
    binomial verdict, the bar's). With ``blocks`` (each row's test block of a block split) also two cluster-robust SEs
    by block, ``"(± 1.6 by block)"``: the rows of one held-out block share their errors, so a split's coverage
    scatters more than the binomial band allows (:func:`gpcore.metrics.coverage_band`)."""
    band = M.coverage_band(mean, var_y, y, groups=blocks, shape=shape, var_f=var_f)
    cov, two_se = band["coverage"], 2 * M.coverage_se(len(y))
    ok = abs(cov - 0.95) <= two_se
    text = band_text_pct(cov, two_se)
    if blocks is not None and len(y):
        text += f" ({band_text(cov, band['two_se_groups'])} by block)"
    return text, ok


def score(data: str, model: str, weights: str, mean, var_y, y, strata, fit_s: float, n_train: int,
          blocks=None, shape=None, var_f=None) -> dict:
    """One row of the race table; ``blocks`` (a block split's test blocks) adds the by-block bands
    (:func:`coverage_cell`); ``shape`` and ``var_f``: a skewed predictive (a run's ``vecchia`` / ``dbk-nn``), scored
    as such (:mod:`gpcore.metrics`)."""
    kw = {"shape": shape, "var_f": var_f}
    cov, ok = coverage_cell(mean, var_y, y, blocks, **kw)
    per, all_ok = [], ok
    if strata is not None:
        for label in sorted(set(strata.tolist())):
            sel = strata == label
            cell, good = coverage_cell(mean[sel], var_y[sel], y[sel], None if blocks is None else blocks[sel], shape,
                                       None if var_f is None else var_f[sel])
            per.append(f"{label} {cell}")
            all_ok &= good
    return {"data": data, "model": model, "weights": weights, "n_train": n_train, "nll": M.nll(mean, var_y, y, **kw),
            "crps": M.crps(mean, var_y, y, **kw), "coverage": M.coverage(mean, var_y, y, **kw), "coverage_cell": cov,
            "strata_coverage": "; ".join(per) or "-", "all_within_2se": all_ok, "fit_s": fit_s}


def boxcox_maps(lam: float, floor: float = -np.inf):
    """``(to_model, from_model, log_slope)`` of the Box-Cox scale ``z = (y^lam - 1) / lam`` of the original target
    ``y = 10^u``, as maps of the log10 value ``u`` (the scale every row is scored on).

    A Gaussian on the Box-Cox scale puts some mass below ``-1 / lam``, where ``y <= 0`` (no log10 value); ``from_model``
    sends it, and any quantile below ``floor``, to ``floor`` (the race: the lowest training value), without which
    the CRPS on the log10 scale would be infinite. The NLL (a density at the observed values) does not depend on it."""
    if lam <= 0:
        raise SystemExit(f"--boxcox {lam}: give a lambda > 0 (0 is the log scale the race already fits)")
    ln10 = np.log(10.0)
    return ((lambda u: (10 ** (lam * u) - 1) / lam),
            (lambda z: np.maximum(np.log10(np.maximum(lam * z + 1, 1e-300)) / lam, floor)),
            (lambda u: lam * u * ln10 + np.log(ln10)))


def score_boxcox(lam: float, floor: float, data: str, model: str, weights: str, mean, var_y, u, strata, fit_s,
                 n_train, blocks=None) -> dict:
    """:func:`score` of a Gaussian predictive on the Box-Cox scale against log10 values ``u``: coverage (overall,
    per stratum) on the Box-Cox scale, where it is the same; NLL and CRPS on the log10 scale (``floor``: see
    :func:`boxcox_maps`); ``below``: the mean predictive mass where ``y <= 0``."""
    to_model, from_model, log_slope = boxcox_maps(lam, floor)
    row = score(data, f"{model} boxcox {lam:g}", weights, mean, var_y, to_model(u), strata, fit_s, n_train, blocks)
    w = M.warped_scores(mean, var_y, u, to_model, from_model, log_slope)
    below = float(np.mean(ndtr((-1 / lam - np.asarray(mean)) / np.sqrt(var_y))))
    return {**row, "nll": w["nll"], "crps": w["crps"], "below": below}


BOXCOX_GRID = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)


def pick_boxcox(key: str, X, u, w, tr, va, seed: int, settings: dict) -> float:
    """``--boxcox auto``: the lambda of :data:`BOXCOX_GRID` whose ``vecchia`` fit (on the training rows, stopping on
    the validation rows, which do *not* join its posterior) has the lowest validation NLL on the log10 scale."""
    wkw = {} if w is None else {"weights": w[tr], "val_weights": w[va], "test_weights": w[va]}
    scores = {}
    for lam in BOXCOX_GRID:
        to_model, _, log_slope = boxcox_maps(lam) if lam else ((lambda v: v), None, (lambda v: np.zeros_like(v)))
        z = to_model(u)
        r = fit_predict("vecchia", {**settings, "condition_on_validation": False}, X[tr], z[tr], X[va], z[va], X[va],
                        seed=seed, **wkw)
        scores[lam] = M.nll(r["mean"], r["var_y"], z[va]) - float(np.mean(log_slope(u[va])))  # NLL, no CRPS needed
    best = min(scores, key=scores.get)
    stderr(f"  --boxcox auto on {key}: validation NLL (log10 scale) "
           + ", ".join(f"{lam:g}: {v:.4f}" for lam, v in scores.items()) + f"; lambda {best:g}")
    return best


def race_dataset(key: str, cfg: RunConfig, models, sets, args, smoke: bool = False) -> list[dict]:
    prep = prepare(cfg)
    tr, va, te = prep.train_idx, prep.val_idx, prep.test_idx
    if args.subsample and args.subsample < len(tr):
        tr = np.sort(np.random.default_rng(cfg.seed).choice(tr, args.subsample, replace=False))
    X, y, w, g = prep.X, prep.y, prep.weights, prep.strata
    g_te = g[te] if g is not None else None
    b_te = block_ids(X[te, 0], X[te, 1], cfg.block_km) if cfg.split == "block" else None  # the test rows' blocks
    if args.boxcox and cfg.transform != "log10":
        raise SystemExit(f"--boxcox: data set {key} is fitted on the {cfg.transform} scale, not log10")
    lam = args.boxcox
    if lam == "auto":
        lam = pick_boxcox(key, X, y, w, tr, va, cfg.seed, smoke_settings("vecchia") if smoke else {})
        if smoke and lam == 0:
            lam = 0.2  # the smoke data are Gaussian on the log scale: its rows still run, at 0.2
    lam = float(lam or 0)
    z = boxcox_maps(lam)[0](y) if lam else None
    floor = float(y[tr].min())  # where a Box-Cox predictive's mass below y = 0 goes (boxcox_maps)
    stderr(f"{key}: {prep.source_label}, train/val/test {len(tr)}/{len(va)}/{len(te)} ({cfg.split} split, "
           f"seed {cfg.seed}), weights {cfg.weight or 'none'}, strata {cfg.strata or 'none'}")
    rows = []
    keep = _test_rows_keeper(args, key, cfg, y[te], g_te, b_te)
    wkw = {} if w is None else {"weights": w[tr], "val_weights": w[va], "test_weights": w[te]}
    for name in models:
        extra = {**(smoke_settings(name) if smoke else {}), **sets.get(name, {})}
        settings = {**run_defaults(name, cfg), **extra}
        r = fit_predict(name, settings, X[tr], y[tr], X[va], y[va], X[te], seed=cfg.seed, **wkw)
        wlabel = cfg.weight if r["weighted"] else "-"
        shape = r["model"].noise_shape()
        rows.append(score(key, name, wlabel, r["mean"], r["var_y"], y[te], g_te, r["fit_seconds"], len(tr), b_te,
                          shape, r["var_f"]))
        keep(name, wlabel, r["mean"], r["var_y"], r["var_f"], shape)
        stderr(f"  {name}: fit {r['fit_seconds']:.1f} s ({r['epochs']} epochs), weights {wlabel}, "
               f"test NLL {rows[-1]['nll']:.4f}" + feature_check_text(r["model"]) + cv_text(r["model"]))
        if z is not None:
            bsets = {**settings, "noise_shape": "gaussian"} if "noise_shape" in settings else settings
            b = fit_predict(name, bsets, X[tr], z[tr], X[va], z[va], X[te], seed=cfg.seed, **wkw)  # a Gaussian there
            rows.append(score_boxcox(lam, floor, key, name, wlabel, b["mean"], b["var_y"], y[te], g_te,
                                     b["fit_seconds"], len(tr), b_te))
            stderr(f"  {name} on the Box-Cox scale: fit {b['fit_seconds']:.1f} s, test NLL (log10 scale) "
                   f"{rows[-1]['nll']:.4f}, predictive mass at y <= 0 {rows[-1]['below']:.2e}"
                   + feature_check_text(b["model"]))
        if args.recalibrate != "none":
            model = r["model"]
            kind = args.recalibrate if g is not None else "global"
            if "conditioned_on" in model.train_info_:  # vecchia, dbk-nn: recalibrate before the validation rows join
                rsets = {**run_defaults(name, cfg, kind), **extra, "recalibrate": kind}  # as a run: one calibration
                r = fit_predict(name, rsets, X[tr], y[tr], X[va], y[va], X[te],
                                seed=cfg.seed, val_groups=g[va] if g is not None else None, test_groups=g_te, **wkw)
                model, p = r["model"], r
            else:
                model.recalibrate(X[va], y[va], val_weights=w[va] if r["weighted"] else None,
                                  val_groups=g[va] if g is not None else None, kind=kind)
                pred = model.predict(X[te], weights=w[te] if r["weighted"] else None, groups=g_te)
                p = {"mean": pred.mean, "var_y": pred.var_y, "var_f": pred.var_f}
            rows.append(score(key, f"{name} +recal {model.recal_['kind']}", wlabel, p["mean"], p["var_y"], y[te], g_te,
                              r["fit_seconds"], len(tr), b_te, model.noise_shape(), p.get("var_f")))
    if args.gpboost == "none":
        stderr("  --gpboost none: no peer rows (compare with a run that has them)")
    elif gpboost_available():
        variants = [] if (args.gpboost == "weighted" and w is not None) else [("-", None)]
        variants += [(cfg.weight, w)] if args.gpboost != "unweighted" and w is not None else []
        for wlabel, ww in variants:
            lab = np.concatenate([tr, va])  # every labelled row (the gpcore models see both too)
            r = gpboost_vecchia(X[lab], y[lab], X[te], weights=None if ww is None else ww[lab],
                                weights_pred=None if ww is None else ww[te])
            rows.append(score(key, GPBOOST, wlabel, r["mean"], r["var_y"], y[te], g_te, r["fit_seconds"], len(lab),
                              b_te))
            keep(GPBOOST, wlabel, r["mean"], r["var_y"])
            stderr(f"  {GPBOOST} (weights {wlabel}): fit {r['fit_seconds']:.1f} s, test NLL {rows[-1]['nll']:.4f}, "
                   f"parameters {r['cov_pars']}")
            if z is not None:
                b = gpboost_vecchia(X[lab], z[lab], X[te], weights=None if ww is None else ww[lab],
                                    weights_pred=None if ww is None else ww[te])
                rows.append(score_boxcox(lam, floor, key, GPBOOST, wlabel, b["mean"], b["var_y"], y[te], g_te,
                                         b["fit_seconds"], len(lab), b_te))
                stderr(f"  {GPBOOST} on the Box-Cox scale (weights {wlabel}): test NLL (log10 scale) "
                       f"{rows[-1]['nll']:.4f}")
    else:
        stderr("  GPBoost not installed (pip install gpboost): no peer row")
    ref = [r["nll"] for r in rows if r["model"] == GPBOOST and r["weights"] == "-"]  # GPBoost on the log10 scale
    ref_w = [r["nll"] for r in rows if r["model"] == GPBOOST and r["weights"] != "-"]
    for r in rows:
        r["dnll"] = r["nll"] - ref[0] if ref else float("nan")
        r["dnll_w"] = r["nll"] - ref_w[0] if ref_w else float("nan")
    return rows


def _test_rows_keeper(args, key: str, cfg: RunConfig, y, strata, blocks):
    """``keep(model, weights, mean, var_y, var_f)``: with ``--tests-out DIR``, write one model's test predictions to
    ``DIR/<data>-<split>-seed<seed>-<model>-<weights or none>.parquet`` (``y``, ``mean``, ``var_y``, ``var_f``: the
    latent part, NaN for a peer; ``stratum``, ``block``) for :func:`pool`; else nothing."""
    if not getattr(args, "tests_out", None):
        return lambda *a: None
    out = Path(args.tests_out)
    out.mkdir(parents=True, exist_ok=True)

    def keep(model: str, weights: str, mean, var_y, var_f=None, shape=None) -> None:
        frame = pd.DataFrame({"y": y, "mean": mean, "var_y": var_y, "var_f": np.nan if var_f is None else var_f,
                              "stratum": strata.astype(str) if strata is not None else "all",
                              "block": blocks if blocks is not None else np.arange(len(y))})
        if shape is not None:  # the skewed predictive's shape (gpcore.models.noise_shape.of_rows reads it)
            frame = frame.assign(**shape.columns())
        name = f"{key}-{cfg.split}-seed{cfg.seed}-{model.replace(' ', '_')}-{'none' if weights == '-' else weights}"
        frame.to_parquet(out / f"{name}.parquet", index=False)

    return keep


def pool(paths, out: str | None = None, min_rows: int = 200) -> pd.DataFrame:
    """Coverage pooled over the test rows of several splits (``--tests-out`` files, one per data set, split seed,
    model and weights): per data set, split kind, model, weights and stratum, the NLL of all the rows (the mean over
    the splits' test rows), the pooled 95 % coverage with two
    binomial SEs and two SEs by held-out block (a block is one split's: blocks of different seeds are different
    clusters), how many splits, and of those where the stratum has at least ``min_rows`` test rows (the issue's
    bar judges those) how many were within two binomial SEs on their own; on the overall row also on how many splits
    the overall coverage and every such stratum were (the bar's letter on one split)."""
    frames = []
    for path in paths:
        stem = Path(path).stem
        data, split, seed, rest = stem.split("-", 3)
        model, weights = rest.rsplit("-", 1)
        f = pd.read_parquet(path)
        f["data"], f["split"], f["seed"], f["model"], f["weights"] = data, split, int(seed[4:]), model, weights
        shape = of_rows(f)  # one fit per file: one shape (None: Gaussian)
        kw = {"shape": shape, "var_f": f["var_f"].to_numpy(float) if shape is not None else None}
        f["logpdf"] = M.log_density(f["mean"], f["var_y"], f["y"], **kw)
        f["inside"] = M.inside(f["mean"], f["var_y"], f["y"], **kw)
        frames.append(f)
    if not frames:
        raise SystemExit("--pool: no files given")
    rows = []

    def band(q, groups=None) -> dict:  # coverage of the rows' own intervals, two binomial SEs and by group
        rel = M.reliability(np.full(len(q), 0.95), q["inside"].to_numpy(float), bins=1, groups=groups).iloc[0]
        return {"coverage": float(rel["observed"]), "two_se": 2 * float(rel["se"]),
                "two_se_groups": 2 * float(rel["se_groups"]) if groups is not None else float("nan")}

    def within(r) -> bool:  # one split's rows of one stratum within two binomial SEs of 95 %
        b = band(r)
        return abs(b["coverage"] - 0.95) <= b["two_se"]

    for keys, part in pd.concat(frames, ignore_index=True).groupby(["data", "split", "model", "weights"]):
        strata = [("all", part)] + [(s, q) for s, q in part.groupby("stratum")] * (part["stratum"].nunique() > 1)
        # the bar's letter on each split: overall and every stratum with >= min_rows test rows within two SEs
        whole = [within(r) and all(within(g) for _, g in r.groupby("stratum") if len(g) >= min_rows)
                 for _, r in part.groupby("seed")]
        for stratum, q in strata:
            groups = q["seed"].astype(str) + ":" + q["block"].astype(str)
            b = band(q, groups.to_numpy())
            alone = [within(r) for _, r in q.groupby("seed") if len(r) >= min_rows]
            rows.append({"data": keys[0], "split": keys[1], "model": keys[2], "weights": keys[3], "stratum": stratum,
                         "n": len(q), "splits": q["seed"].nunique(), "nll": -float(q["logpdf"].mean()),
                         "coverage": b["coverage"],
                         "two_se": b["two_se"], "two_se_blocks": b["two_se_groups"],
                         "within_binomial": abs(b["coverage"] - 0.95) <= b["two_se"],
                         "within_blocks": abs(b["coverage"] - 0.95) <= b["two_se_groups"],
                         "splits_judged": len(alone), "splits_within_binomial": int(np.sum(alone)),
                         "splits_every_stratum_within": int(np.sum(whole)) if stratum == "all" else None})
    df = pd.DataFrame(rows)
    lines = ["| data | split | model | weights | stratum | test rows (splits) | NLL | pooled coverage ± 2 binomial "
             f"SEs | ± 2 SEs by block | splits within 2 binomial SEs alone (of those with ≥ {min_rows} rows) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        lines.append(f"| {r.data} | {r.split} | {r.model} | {r.weights} | {r.stratum} | {r.n:,} ({r.splits}) | "
                     f"{r.nll:.4f} | "
                     f"{band_text_pct(r.coverage, r.two_se)} | {band_text_pct(r.coverage, r.two_se_blocks)} | "
                     + (f"{r.splits_within_binomial} of {r.splits_judged}" if r.splits_judged else "–")
                     + (f" (all strata too: {int(r.splits_every_stratum_within)} of {r.splits})" if r.stratum == "all"
                        else "") + " |")
    report("Coverage pooled over splits (bench_race.py --pool)", "\n".join(lines), df, out)
    return df


def band_text_pct(cov: float, two_se: float) -> str:
    """``"95.3 ± 0.4"`` in %, with ``✗`` when further than ``two_se`` from 95 %."""
    return f"{100 * cov:.1f} {band_text(cov, two_se)}"


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
    t_start = time.perf_counter()
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
    ap.add_argument("--boxcox", default="", metavar="LAMBDA",
                    help="also fit every model on the Box-Cox scale (y^LAMBDA - 1) / LAMBDA of the original target, "
                         "scored on the log10 scale (NLL with the Jacobian); 'auto': LAMBDA by the validation rows")
    ap.add_argument("--tests-out", metavar="DIR", help="also write each fit's test predictions here (for --pool)")
    ap.add_argument("--pool", nargs="+", metavar="FILE",
                    help="only pool --tests-out files of several splits: coverage per stratum over all their rows")
    add_race_args(ap)
    args = ap.parse_args(argv)
    if args.pool:
        pool(args.pool, args.out)
        return 0
    models, sets = start(args.models, args.set)
    if args.boxcox not in ("", "auto"):
        try:
            args.boxcox = float(args.boxcox)
        except ValueError:
            raise SystemExit(f"--boxcox {args.boxcox!r}: give a number > 0 or 'auto'") from None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            args.subsample = args.subsample or 600
            args.recalibrate = "group" if args.recalibrate == "none" else args.recalibrate
            args.boxcox = args.boxcox or "auto"
            args.tests_out = args.tests_out or str(Path(tmp) / "tests")  # and pool them, as --pool does
        for key, cfg in race_configs(args.data, args.smoke, Path(tmp)):
            cfg = dataclasses.replace(cfg, split=args.split, block_km=args.block_km, seed=args.seed)
            rows += race_dataset(key, cfg, models, sets, args, smoke=args.smoke)
        if args.smoke:
            pool(sorted(Path(args.tests_out).glob("*.parquet")))
    if not rows:
        print("nothing to run")
        return 0
    df = pd.DataFrame(rows)
    md = markdown(df)
    boxcox_note = ("; rows 'boxcox LAMBDA': fitted on (y^LAMBDA - 1) / LAMBDA of the original target"
                   f"{' (LAMBDA by the validation rows)' if args.boxcox == 'auto' else ''}, NLL and CRPS on the log10 "
                   "scale (its mass below y = 0 at the lowest training value)" if args.boxcox else "")
    by_block = (", in brackets ± two SEs by held-out block (cluster-robust: the rows of one block share their errors)"
                if args.split == "block" else "")
    header = (f"split {args.split}{f' ({args.block_km:g} km blocks)' if args.split == 'block' else ''}, seed "
              f"{args.seed}{f', training rows subsampled to {args.subsample}' if args.subsample else ''}; "
              f"same labelled rows for every tool: GPBoost fits training + validation rows ('n train' counts "
              f"both), gpcore models train on the training rows and stop on the validation rows (vecchia and dbk-nn "
              f"then condition on both); same test rows; coverage ± two binomial SEs (✗ outside){by_block}; GPBoost "
              f"with weights: its error variance divided by the row's count{boxcox_note}; torch "
              f"{torch.get_num_threads()} thread(s)\n\n{stamp(time.perf_counter() - t_start)}")
    report(header, md, df, args.out)
    return 0 if np.isfinite(df["nll"]).all() else 1


if __name__ == "__main__":
    sys.exit(main())
