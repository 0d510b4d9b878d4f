"""Why a model's 95 % intervals miss on held-out spatial blocks: the shape of its standardised test errors.

For each ``--data`` set and ``--seeds`` split seed (``--split block`` by default: whole 10 km squares held out, as in
``bench_race.py``), the ``--model`` (default ``dbk-nn``, the app's default; its defaults, ``--set`` to change them) is
fitted on the training rows and stopped on the validation rows, which then join its posterior, exactly as
``bench_race.py`` does. On the test rows, with ``z = (y - mean) / sd`` (``sd`` for each row's own ``tests`` count):

* ``E[z^2]`` (1 when the predictive variance is right on average), skewness ``E[z^3]`` and kurtosis ``E[z^4]``;
* coverage of the central 50 / 80 / 90 / 95 / 99 % Gaussian intervals, and the two 2.5 % tails of the 95 % one
  (below / above), each against its Gaussian share;
* 95 % coverage in four bins of the latent share ``var_f / var_y`` (how much of a row's predictive variance is the
  model's uncertainty about f rather than measurement noise);
* ``c``: the scale of ``var_f`` that maximises the likelihood of the *validation* rows (predicted from the training
  rows alone, before they join), and the test coverage with ``var_f`` scaled by it — whether the validation blocks
  could have told the model its latent variance was off.

Other shapes of the noise, each scored by test NLL and the central 95 % interval of its own predictive distribution
(the latent f stays the model's Gaussian; experiments, not gpcore features):

* **mixture**: the noise of a row with Gaussian noise variance ``v`` is ``N(0, c1 v)`` with probability ``1 - pi``
  and a slow component ``N(-delta sqrt(v), c2 v)`` with probability ``pi``; ``(pi, delta, c1, c2)`` by maximum
  likelihood on the validation rows before they join (the test rows play no part);
* **Student-t** (``--nu``, default 4): the model refitted with each training row's weight times its E-step scale
  ``lambda_i = (nu + 1) / (nu + E[(y_i - f_i)^2] / v_i)`` (one EM step of t noise from the Gaussian fit; the
  validation rows join with their own ``lambda``), scored (a) with t noise of scale ``v`` and (b) as a Gaussian with
  the refitted noise ("robust fit").

Method and findings: docs/benchmarks/race.md ("Why held-out blocks are over-covered", "Other shapes of the noise").

    python benchmarks/bench_tails.py --data pr,mo --seeds 0,1,2
    python benchmarks/bench_tails.py --smoke          # the bundled synthetic sample, tiny model (CI)
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from _harness import add_race_args, report, smoke_settings, start, stderr
from bench_race import race_configs
from scipy.optimize import minimize, minimize_scalar
from scipy.stats import gamma, norm

from gpcore import make_model
from gpcore import metrics as M
from gpcore.run.pipeline import prepare

LEVELS = (0.5, 0.8, 0.9, 0.95, 0.99)


def latent_scale(pred, y) -> float:
    """The factor ``c`` of ``var_f`` maximising ``sum log N(y; mean, c var_f + (var_y - var_f))``."""
    noise = pred.var_y - pred.var_f

    def nll(log_c):
        v = np.exp(log_c) * pred.var_f + noise
        return float(np.mean(np.log(v) + (y - pred.mean) ** 2 / v))

    return float(np.exp(minimize_scalar(nll, bounds=(-3.0, 3.0), method="bounded").x))


def _mixture(theta, pred):
    """``pi``, the two components' means and sds of the mixture predictive (``theta``: logit pi, log delta, log c1,
    log c2)."""
    pi = 1.0 / (1.0 + np.exp(-theta[0]))
    delta, c1, c2 = np.exp(theta[1:4])
    noise = pred.var_y - pred.var_f
    return (pi, (pred.mean, np.sqrt(pred.var_f + c1 * noise)),
            (pred.mean - delta * np.sqrt(noise), np.sqrt(pred.var_f + c2 * noise)))


def mixture_logpdf(theta, pred, y) -> np.ndarray:
    pi, (m1, s1), (m2, s2) = _mixture(theta, pred)
    return np.logaddexp(np.log1p(-pi) + norm.logpdf(y, m1, s1), np.log(pi) + norm.logpdf(y, m2, s2))


def mixture_cdf(theta, pred, y) -> np.ndarray:
    pi, (m1, s1), (m2, s2) = _mixture(theta, pred)
    return (1.0 - pi) * norm.cdf(y, m1, s1) + pi * norm.cdf(y, m2, s2)


def fit_mixture(pred, y) -> np.ndarray:
    """``theta`` of the two-component noise maximising the rows' likelihood (Nelder-Mead from pi = 0.12)."""
    res = minimize(lambda th: -mixture_logpdf(th, pred, y).mean(), np.array([-2.0, 0.0, 0.0, 1.0]),
                   method="Nelder-Mead", options={"maxiter": 4000, "xatol": 1e-6, "fatol": 1e-10})
    return res.x


def t_noise_scores(pred, y, nu: float, nodes: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Log density and CDF of ``y`` under ``f ~ N(mean, var_f)`` plus t noise (``nu`` degrees, scale
    ``var_y - var_f``), the t as a scale mixture of Gaussians over ``nodes`` equal-probability quantiles of
    ``lambda ~ Gamma(nu / 2, rate nu / 2)`` (at 400 nodes the log density is within 0.005 of the exact t's out to
    seven scales, the CDF within 1e-4)."""
    lam = gamma.ppf((np.arange(nodes) + 0.5) / nodes, a=nu / 2, scale=2 / nu)
    V = pred.var_f[:, None] + (pred.var_y - pred.var_f)[:, None] / lam[None, :]
    z = (y - pred.mean)[:, None] / np.sqrt(V)
    logpdf = np.log((norm.pdf(z) / np.sqrt(V)).mean(1))
    return logpdf, norm.cdf(z).mean(1)


def t_scales(pred, y, nu: float) -> np.ndarray:
    """The E-step of t noise: ``lambda_i = (nu + 1) / (nu + E[(y_i - f_i)^2] / v_i)`` under the fitted posterior."""
    noise = pred.var_y - pred.var_f
    return (nu + 1.0) / (nu + ((y - pred.mean) ** 2 + pred.var_f) / noise)


def interval_cells(F) -> tuple[float, str]:
    """95 % coverage of the central interval from the predictive CDF at the targets, and its two tails (%)."""
    tails = f"{100 * np.mean(F < 0.025):.1f} / {100 * np.mean(F > 0.975):.1f}"
    return 100 * np.mean((F >= 0.025) & (F <= 0.975)), tails


def shape_row(key: str, seed: int, name: str, settings: dict, cfg, nu: float = 4.0) -> dict:
    prep = prepare(cfg)
    tr, va, te = prep.train_idx, prep.val_idx, prep.test_idx
    X, y, w = prep.X, prep.y, prep.weights

    def wt(idx):
        return None if w is None else w[idx]

    def fitted(w_tr, w_va):
        m = make_model(name, seed=seed, **{**settings, "condition_on_validation": False})
        return m.fit(X[tr], y[tr], X[va], y[va], weights=w_tr, val_weights=w_va)

    model = fitted(wt(tr), wt(va))
    p_va = model.predict(X[va], weights=wt(va))
    c = latent_scale(p_va, y[va])
    theta = fit_mixture(p_va, y[va])  # the noise's shape from the validation rows, before they join
    model.condition_on(X[va], y[va], weights=wt(va))  # what condition_on_validation does after the fit
    p = model.predict(X[te], weights=wt(te))
    z = (y[te] - p.mean) / np.sqrt(p.var_y)
    q95 = norm.ppf(0.975)
    row = {"data": key, "seed": seed, "model": name, "n test": len(te), "NLL": M.nll(p.mean, p.var_y, y[te]),
           "E[z^2]": np.mean(z**2), "skew": np.mean(z**3), "kurtosis": np.mean(z**4)}
    for level in LEVELS:
        row[f"cov {level:g}"] = 100 * np.mean(np.abs(z) <= norm.ppf(0.5 + level / 2))
    row["below (2.5)"], row["above (2.5)"] = 100 * np.mean(z < -q95), 100 * np.mean(z > q95)
    share = p.var_f / p.var_y
    for lo, hi in ((0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.01)):
        sel = (share >= lo) & (share < hi)
        row[f"cov95 latent {lo:g}-{min(hi, 1):g} (n)"] = (
            f"{100 * np.mean(np.abs(z[sel]) <= q95):.1f} ({sel.sum()})" if sel.any() else "-")
    row["val c"] = c
    v = c * p.var_f + (p.var_y - p.var_f)
    row["cov95 with c"] = 100 * np.mean(np.abs(y[te] - p.mean) <= q95 * np.sqrt(v))
    row["mixture pi / delta / c1 / c2"] = "{:.3f} / {:.2f} / {:.2f} / {:.2f}".format(
        1 / (1 + np.exp(-theta[0])), *np.exp(theta[1:4]))
    row["mixture NLL"] = -np.mean(mixture_logpdf(theta, p, y[te]))
    row["mixture cov95"], row["mixture below / above"] = interval_cells(mixture_cdf(theta, p, y[te]))
    # Student-t noise: one EM step from the Gaussian fit (each training row's weight times its E-step scale)
    # (an unweighted data set's refit is a weighted fit, with its nugget: weights lambda times ones)
    w1 = np.ones(len(y)) if w is None else w
    lam_tr = t_scales(model.predict(X[tr], weights=wt(tr)), y[tr], nu)
    robust = fitted(w1[tr] * lam_tr, w1[va])
    robust.condition_on(X[va], y[va], weights=w1[va] * t_scales(robust.predict(X[va], weights=w1[va]), y[va], nu))
    p_t = robust.predict(X[te], weights=w1[te])
    logpdf, F = t_noise_scores(p_t, y[te], nu)
    row[f"t{nu:g} NLL"] = -np.mean(logpdf)
    row[f"t{nu:g} cov95"], row[f"t{nu:g} below / above"] = interval_cells(F)
    z_t = (y[te] - p_t.mean) / np.sqrt(p_t.var_y)
    row["robust fit NLL"] = M.nll(p_t.mean, p_t.var_y, y[te])
    row["robust fit cov95"], row["robust fit below / above"] = interval_cells(norm.cdf(z_t))
    stderr(f"{key} seed {seed}: NLL {row['NLL']:.4f}, E[z^2] {row['E[z^2]']:.3f}, cov95 {row['cov 0.95']:.1f} "
           f"(below {row['below (2.5)']:.2f} / above {row['above (2.5)']:.2f}), val c {c:.3f}; mixture NLL "
           f"{row['mixture NLL']:.4f} cov95 {row['mixture cov95']:.1f}; t{nu:g} NLL {row[f't{nu:g} NLL']:.4f} cov95 "
           f"{row[f't{nu:g} cov95']:.1f}; robust fit NLL {row['robust fit NLL']:.4f} cov95 "
           f"{row['robust fit cov95']:.1f}")
    return row


def markdown(df: pd.DataFrame) -> str:
    """The table as markdown: numbers with four decimals, text as it is."""
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    for r in df.itertuples(index=False):
        lines.append("| " + " | ".join(f"{v:.4f}" if isinstance(v, float) else str(v) for v in r) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="pr,mo", help="comma-separated: pr, mo, california, turkey (as bench_race)")
    ap.add_argument("--model", default="dbk-nn", help="the gpcore model (default dbk-nn, the app's default)")
    ap.add_argument("--seeds", default="0", help="comma-separated split seeds")
    ap.add_argument("--split", choices=("random", "block"), default="block")
    ap.add_argument("--block-km", type=float, default=10.0)
    ap.add_argument("--nu", type=float, default=4.0, help="degrees of freedom of the Student-t noise rows")
    add_race_args(ap, example="dbk-nn.pred_neighbors=60")
    args = ap.parse_args(argv)
    names, sets = start(args.model, args.set)
    if not names:
        return 1
    name = names[0]
    settings = {**(smoke_settings(name) if args.smoke else {}), **sets.get(name, {})}
    seeds = [0] if args.smoke else [int(s) for s in args.seeds.split(",") if s]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for key, cfg in race_configs(args.data, args.smoke, Path(tmp)):
            for seed in seeds:
                cfg_s = dataclasses.replace(cfg, split=args.split, block_km=args.block_km, seed=seed)
                rows.append(shape_row(key, seed, name, settings, cfg_s, args.nu))
    df = pd.DataFrame(rows)
    blocks = f" ({args.block_km:g} km blocks)" if args.split == "block" else ""
    header = (f"split {args.split}{blocks}; model {name} with its defaults{f' and {settings}' if settings else ''}; "
              "test rows, z = (y - mean) / sd; coverage and tails in %, the Gaussian shares are 50/80/90/95/99 and "
              "2.5/2.5")
    report(header, markdown(df), df, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
