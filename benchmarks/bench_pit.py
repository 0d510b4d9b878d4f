"""A candidate, not the default: recalibrating the whole predictive distribution of ``vecchia`` / ``dbk-nn`` on
their cross-validated rows (the probability integral transform made uniform, Kuleshov et al. 2018), against the run
default (the skewed shape stretched to 95 %, then a noise scale per tests count; docs/calibration.md).

On the seeded 8:1:1 split of ``bench_weights.py`` (each model weighted, with what a random-split run gives it), the
held-out rows of the model's own cross-validation give residuals ``r``, unscaled latent variances ``v`` and noise
variances ``s``; on them the maximum-likelihood shape is fitted (:func:`gpcore.models.noise_shape.fit`), and its
PIT values ``u = F(r)`` define a map ``R``: piecewise linear through :data:`KNOTS` quantiles of ``u``, so that
``R(F)`` is uniform on those rows. The recalibrated predictive has CDF ``R(F(y))``, density ``R'(F(y)) f(y)`` and
central intervals ``F^-1(R^-1((1 -+ level) / 2))``; ``per bin`` fits one map per tests-count bin (a bin with fewer
than 200 held-out rows takes the global map). Each variant is scored on the test rows at 50 / 80 / 90 / 95 % (and
95 % per tests-count bin) and by NLL.

    python benchmarks/bench_pit.py --data sample:puerto_rico --quarter 2023 --models dbk-nn
    python benchmarks/bench_pit.py --data sample:missouri_2020Q4 --models dbk-nn

``--smoke`` runs it on a small synthetic set in seconds (CI).
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
import pandas as pd
from bench_weights import _fit

from gpcore import metrics as M
from gpcore.models import noise_shape as ns
from gpcore.models import vecchia_cv as vc
from gpcore.run.config import RunConfig
from gpcore.run.pipeline import prepare

#: probabilities at which the map R passes through the held-out PITs' quantiles
KNOTS = np.array([0.0, 0.005, 0.0125, 0.025, 0.05, 0.1, 0.175, 0.25, 0.375, 0.5, 0.625, 0.75, 0.825, 0.9, 0.95,
                  0.975, 0.9875, 0.995, 1.0])
LEVELS = (0.5, 0.8, 0.9, 0.95)


class PitMap:
    """``R``: piecewise linear from ``xs`` (quantiles of held-out PIT values, 0 and 1 at the ends) to :data:`KNOTS`."""

    def __init__(self, pit: np.ndarray):
        xs = np.quantile(pit, KNOTS)
        xs[0], xs[-1] = 0.0, 1.0
        self.xs = np.maximum.accumulate(xs + np.arange(xs.size) * 1e-12)  # strictly increasing
        self.slope = np.diff(KNOTS) / np.diff(self.xs)

    def __call__(self, u):
        return np.interp(u, self.xs, KNOTS)

    def inverse(self, p):
        return np.interp(p, KNOTS, self.xs)

    def log_slope(self, u):
        i = np.clip(np.searchsorted(self.xs, u, side="right") - 1, 0, self.slope.size - 1)
        return np.log(self.slope[i])


def _scores(u: np.ndarray, nll: float, bins: np.ndarray) -> dict:
    """Coverage at :data:`LEVELS` from the (recalibrated) PIT values ``u``, and per tests-count bin at 95 %."""
    inside = {lv: np.abs(u - 0.5) <= lv / 2 for lv in LEVELS}
    out = {"nll": nll, **{f"cov{int(100 * lv)}": float(inside[lv].mean()) for lv in LEVELS}}
    for k, (label, _, _) in enumerate(M.WEIGHT_BINS):
        sel = bins == k
        out[f"cov95 {label}"] = float(inside[0.95][sel].mean()) if sel.any() else float("nan")
    return out


def run_pit(cfg: RunConfig, models, settings, log=print) -> pd.DataFrame:
    prep = prepare(cfg)
    te = prep.test_idx
    w_te, y_te = prep.weights[te], prep.y[te]
    bins_te = vc.count_bins(w_te)
    log(f"{cfg.data} {cfg.quarter or ''}: train/val/test {len(prep.train_idx)}/{len(prep.val_idx)}/{len(te)}")
    rows = []
    for name in models:
        model, secs = _fit(name, prep, settings.get(name, {}), True, cfg)
        rec = model.train_info_.get("cv_calibration")
        shaped = vc.recorded_shape(model.train_info_)
        if shaped is None:
            log(f"  {name}: no cross-validated shape (not a vecchia / dbk-nn run default): skipped")
            continue
        default = model.predict(prep.X[te], weights=w_te)  # the run default, as the model predicts
        u_def = default.cdf(y_te)
        nll_def = M.nll(default.mean, default.var_y, y_te, shape=default.shape, var_f=default.var_f)
        model.train_info_.pop("cv_calibration")  # unscaled: the held-out rows and the test rows as fitted
        try:
            folds = vc.fold_ids(model, model.config.cv_calibration, model.config.cv_block_km, model.config.seed)
            r, v, s = vc.cv_residuals(model, folds)
            plain = model.predict(prep.X[te], weights=w_te)
            s_te = np.broadcast_to(model.observation_noise(w_te, len(te)), (len(te),))
            w_cv = model.module_.w_train.double().cpu().numpy()
        finally:
            model.train_info_["cv_calibration"] = rec
        ok = np.isfinite(r)
        r, v, s, w_cv = r[ok], v[ok], s[ok], w_cv[ok]
        ml, _ = ns.fit(r, v, s, (vc.MIN_SCALE, vc.MAX_SCALE))
        rt = y_te - plain.mean
        u_cv, u_te = ml.cdf(r, ml.latent_scale * v, s), ml.cdf(rt, ml.latent_scale * plain.var_f, s_te)
        logf_te = ml.logpdf(rt, ml.latent_scale * plain.var_f, s_te)
        rows.append({"model": name, "variant": "run default (stretched, count scales)", "fit_s": secs,
                     **_scores(u_def, nll_def, bins_te)})
        rows.append({"model": name, "variant": "maximum-likelihood shape", "fit_s": secs,
                     **_scores(u_te, -float(logf_te.mean()), bins_te)})
        R = PitMap(u_cv)
        rows.append({"model": name, "variant": "PIT map, global", "fit_s": secs,
                     **_scores(R(u_te), -float(np.mean(logf_te + R.log_slope(u_te))), bins_te)})
        bins_cv = vc.count_bins(w_cv)
        u_bin, logf_bin = np.empty_like(u_te), logf_te.copy()
        for k in range(len(M.WEIGHT_BINS)):
            Rk = PitMap(u_cv[bins_cv == k]) if np.sum(bins_cv == k) >= vc.MIN_BIN_ROWS else R
            sel = bins_te == k
            u_bin[sel], logf_bin[sel] = Rk(u_te[sel]), logf_te[sel] + Rk.log_slope(u_te[sel])
        rows.append({"model": name, "variant": "PIT map per tests-count bin", "fit_s": secs,
                     **_scores(u_bin, -float(logf_bin.mean()), bins_te)})
        log(f"  {name}: {secs:.0f} s; {ok.sum()} held-out rows")
    return pd.DataFrame(rows)


def markdown(df: pd.DataFrame) -> str:
    covs = [c for c in df.columns if c.startswith("cov")]
    cols = ["model", "variant", "nll", *covs]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in df.iterrows():
        vals = [row["model"], row["variant"], f"{row['nll']:.4f}", *(f"{100 * row[c]:.1f}" for c in covs)]
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data")
    p.add_argument("--quarter")
    p.add_argument("--y", default="download_mbps")
    p.add_argument("--transform", default="log10")
    p.add_argument("--weight", default="tests")
    p.add_argument("--models", default="dbk-nn")
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args(argv)
    models = [m for m in a.models.split(",") if m]
    settings: dict[str, dict] = {}
    if a.smoke:
        a.data, models = "sample:synthetic", ["vecchia"]
        settings = {"vecchia": {"epochs": 2}}
    if not a.data:
        p.error("--data is required (or --smoke)")
    cfg = RunConfig(data=a.data, y=a.y, transform=a.transform, quarter=a.quarter, weight=a.weight,
                    model=models[0], grid_kind="none")
    df = run_pit(cfg, models, settings, log=lambda m: print(m, file=sys.stderr))
    print(markdown(df))
    return 0 if len(df) and not math.isnan(df["nll"].iloc[0]) else 1


if __name__ == "__main__":
    sys.exit(main())
