"""Issue 23's bar: is P(change > 0) of space-time ``vecchia`` / ``dbk-nn`` calibrated on a field with a known change?

World (one per seed): ``--places`` places uniform in Puerto Rico's box (lon -67.2..-65.6, lat 17.9..18.5) and the
four quarters 2022Q1-Q4 (t in decimal years, a quarter's middle: the inputs lon, lat, t that
:func:`gpcore.run.pipeline.prepare` builds with ``time_input=True``). The latent field is drawn exactly from the
space-time GP with the known hyperparameters :data:`TRUTH`: mean 1.3, sd 0.3, separable Matérn-1/2 in space
(isotropic, lengthscale 0.2 degrees) times exponential in time (lengthscale 0.5 years, ``--time-lengthscale``:
correlation 0.61 between adjacent quarters; the models start at 1 year, ``time_lengthscale_init``). Over places x
quarters that covariance is the Kronecker product ``Ks (x) Kt``, so ``F = mean + Ls Z Lt^T`` with the dense Cholesky
factors ``Ls`` (places x places) and ``Lt`` (4 x 4) and ``Z`` standard normal is an exact draw. Observations
``y = f + N(0, 0.15^2)``: a seeded 20 % of the places are held out (never observed); every other place is observed in
quarter q with probability :data:`OBSERVED` (60, 25, 45, 70 %: the second quarter sparse); a seeded 10 % of the
observed rows validates (``--validation``; the models restore the epoch with the best validation NLL, then condition
on the validation rows too).

Each ``--models`` model is fitted with its defaults and ``space_time="separable"`` (``--set`` overrides; the default
``time_trend`` learns a linear trend in the prior mean, which the truth does not have: its value is reported). Then
:func:`gpcore.run.change.change_posterior` (what the CLI and the app show: the joint change averaged over
``--hyper-draws`` draws of the hyperparameters' REML posterior) gives the change ``D(x) = f(x, t2) - f(x, t1)`` at the
held-out places for each ``--pairs`` pair of quarters: ``P(D > 0)`` against the true sign of the drawn field's
change, and its 95 % interval against the true change; for contrast the same at the fitted hyperparameters alone
(:func:`gpcore.run.change.change_moments`, ``P = Phi(E[D] / sd[D])``, interval ``E[D] +- 1.96 sd[D]``) and from two
independent marginals (``Var = v1 + v2``, ``v`` = the predictive latent variances of ``model.predict``). Two
references per world: the exact GP with the true prior (calibrated by construction: what chance alone does to the
bins) and the exact GP with each model's fitted kernel, noise and mean (``--no-dense`` skips it; the gap to the model
is the Vecchia approximation's, the gap to the truth the fitted hyperparameters'). Cells of all seeds are pooled
(calibration of a posterior holds on average over the prior, not per field). Reliability: ten equal-width bins of P
(:func:`gpcore.metrics.reliability`), per bin the observed share of true increases against the mean predicted P,
with the binomial SE of a calibrated forecast and the SE by seed (cluster-robust: cells of one field are correlated);
the bar is every bin within 2 SE. "Decile" read the other way, as ten equal-count groups of the forecasts (the
Hosmer-Lemeshow "deciles of risk", ``reliability(..., by="count")``), gets its own table and ``.deciles.csv``.
Ten bins each held to 2 SE fail a calibrated forecast about one time in three, so
the table also gives one test over all bins: the p-value of ``sum z^2`` against chi-squared with one degree per bin.
Last, where the truth lies in each model's hyperparameter posterior (:func:`laplace_z`: mean ``z^2`` over the worlds,
1 when the Laplace approximation the change averages over is as wide as the REML mode's scatter around the truth).

    OMP_NUM_THREADS=1 python benchmarks/bench_change.py --out change.md   # the run in docs (~8 min on one core)
    python benchmarks/bench_change.py --smoke                             # one tiny world, seconds (CI)
    python benchmarks/bench_change.py --pool a.reliability.csv b.reliability.csv   # runs on disjoint seeds, pooled
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from _harness import add_race_args, feature_check_text, report, stamp, start, stderr
from bench_spacetime import tiny
from scipy.linalg import solve_triangular

from gpcore import make_model
from gpcore import metrics as M
from gpcore.data.temporal import decimal_year
from gpcore.models.spacetime import time_lengthscale_years
from gpcore.run.change import HYPER_DRAWS, change_moments, change_posterior, p_increase

MODELS = "vecchia,dbk-nn"
QUARTERS = ("2022Q1", "2022Q2", "2022Q3", "2022Q4")
#: share of the not-held-out places observed in each quarter of QUARTERS
OBSERVED = (0.60, 0.25, 0.45, 0.70)
PAIRS = "2022Q1:2022Q2,2022Q1:2022Q4"
LON, LAT = (-67.2, -65.6), (17.9, 18.5)
HELD_OUT = 0.2
BINS = 10
ORACLE = "exact, true hyperparameters"
JOINT = "change_posterior (joint, hyperparameters averaged)"
PLUGIN = "change_moments (joint, fitted hyperparameters)"
DENSE = "exact, its fitted hyperparameters"


@dataclass(frozen=True)
class Truth:
    """The known space-time GP the field is drawn from (degrees, years, the field's units)."""

    mean: float = 1.3
    sd: float = 0.3
    ell_space: float = 0.2
    ell_time: float = 0.5
    noise_sd: float = 0.15

    def kernel(self, A, B) -> np.ndarray:
        """``sd^2 exp(-|x - x'| / ell_space) exp(-|t - t'| / ell_time)`` between rows (lon, lat, t) of A and B."""
        d = np.sqrt(((A[:, None, :2] - B[None, :, :2]) ** 2).sum(-1))
        return self.sd**2 * np.exp(-d / self.ell_space - np.abs(A[:, None, 2] - B[None, :, 2]) / self.ell_time)


TRUTH = Truth()


@dataclass
class World:
    places: np.ndarray  # P x 2 (lon, lat)
    t: np.ndarray  # (Q,) decimal years
    f: np.ndarray  # P x Q latent field
    held_out: np.ndarray  # indices of the never-observed places
    X: np.ndarray  # n x 3 observed (lon, lat, t)
    y: np.ndarray  # (n,)


def draw_world(seed: int, n_places: int, truth: Truth) -> World:
    """One exact draw of the field over ``n_places`` places x :data:`QUARTERS` and its noisy observations."""
    rng = np.random.default_rng(seed)
    P = np.column_stack([rng.uniform(*LON, n_places), rng.uniform(*LAT, n_places)])
    t = decimal_year(list(QUARTERS))
    at0 = np.column_stack([P, np.zeros(n_places)])
    Ks = truth.kernel(at0, at0)  # the spatial factor (time lag 0)
    Kt = np.exp(-np.abs(t[:, None] - t[None, :]) / truth.ell_time)
    Ls = np.linalg.cholesky(Ks + 1e-12 * truth.sd**2 * np.eye(n_places))
    f = truth.mean + Ls @ rng.standard_normal((n_places, len(t))) @ np.linalg.cholesky(Kt).T
    perm = rng.permutation(n_places)
    held = np.sort(perm[: int(round(HELD_OUT * n_places))])
    seen = np.sort(perm[len(held):])
    rows = [(i, q) for q, share in enumerate(OBSERVED) for i in seen[rng.random(len(seen)) < share]]
    i, q = np.array(rows).T
    X = np.column_stack([P[i], t[q]])
    y = f[i, q] + truth.noise_sd * rng.standard_normal(len(i))
    return World(P, t, f, held, X, y)


def learned(model) -> dict:
    """The fitted prior in the truth's units: sd, spatial lengthscales (degrees), time lengthscale (years), noise
    sd and the prior mean's trend per year (the truth has none; for dbk-nn the lengthscales are its residual GP's)."""
    x = np.array([[np.mean(LON), np.mean(LAT), 2022.125], [np.mean(LON), np.mean(LAT), 2023.125]])
    out = {"sd": float(np.sqrt(model.kernel_diag(x[:1])[0])), "noise_sd": float(np.sqrt(model.noise_variance))}
    if hasattr(model, "prior_mean_at"):
        out["trend"] = float(np.diff(model.prior_mean_at(x))[0])
    mod = model.module_
    if getattr(mod, "space_time", "none") != "none":
        span = np.asarray(model.x_span_, dtype=float)
        ell = mod.lengthscale.detach().double().cpu().numpy() * span[mod.space_cols] / 2
        out.update(ell_lon=float(ell[0]), ell_lat=float(ell[-1]), ell_t=time_lengthscale_years(model))
    return out


#: the truth's value of each REML hyperparameter, from a learned() row (log units; a variance is log sd^2)
_LOG_TRUTH = {"raw_ell[0]": ("ell_lon", "ell_space", 1), "raw_ell": ("ell_lon", "ell_space", 1),
              "raw_ell[1]": ("ell_lat", "ell_space", 1), "raw_ell_t": ("ell_t", "ell_time", 1),
              "raw_outputscale": ("sd", "sd", 2), "raw_noise": ("noise_sd", "noise_sd", 2)}


def laplace_z(model, truth: Truth) -> dict:
    """Where the truth lies in the model's hyperparameter posterior (the Laplace approximation at the REML mode that
    :func:`change_posterior` averaged over; kept on the model): ``z = (theta_mode - theta_true) / sd`` per
    hyperparameter, in its log units. Over many worlds ``E[z^2] = 1`` when the posterior is as wide as the mode's
    scatter around the truth. ``{}`` for a model without that posterior. The noise's theta is the log of the noise
    above its floor (``noise_floor``, 1e-6 of the standardised target's variance), compared here as the whole noise
    variance."""
    from gpcore.models import vecchia_hyper

    if not vecchia_hyper.supports(model):
        return {}
    post = vecchia_hyper.hyper_posterior(model)
    at_mode = learned(vecchia_hyper.at_theta(model, post.mode))
    sd = np.sqrt(np.diag(post.cov))
    out = {}
    for name, s in zip(post.names, sd, strict=True):
        if name in _LOG_TRUTH:
            key, attr, power = _LOG_TRUTH[name]
            out[f"z_{key}"] = float(power * math.log(at_mode[key] / getattr(truth, attr)) / s)
    return out


def dense_change(kernel, noise_var: float, prior_mean, X, y, places, t1: float, t2: float):
    """Exact GP posterior of ``f(x, t2) - f(x, t1)`` at ``places`` from all observed rows ``X, y`` (dense Cholesky,
    float64) for the prior ``GP(prior_mean, kernel)`` (callables of ``n x 3`` rows): mean, joint variance
    ``v1 + v2 - 2 c12`` and ``v1 + v2``."""
    Z1, Z2 = (np.column_stack([places, np.full(len(places), t)]) for t in (t1, t2))
    L = np.linalg.cholesky(kernel(X, X) + noise_var * np.eye(len(y)))
    alpha = solve_triangular(L.T, solve_triangular(L, y - prior_mean(X), lower=True), lower=False)
    A1, A2 = (solve_triangular(L, kernel(X, Z), lower=True) for Z in (Z1, Z2))
    k1, k2 = np.diag(kernel(Z1, Z1)), np.diag(kernel(Z2, Z2))
    k12 = np.diag(kernel(Z1, Z2))
    v1, v2 = k1 - (A1**2).sum(0), k2 - (A2**2).sum(0)
    c12 = k12 - (A1 * A2).sum(0)
    mean = prior_mean(Z2) - prior_mean(Z1) + (kernel(Z2, X) - kernel(Z1, X)) @ alpha
    return mean, np.maximum(v1 + v2 - 2 * c12, 0.0), v1 + v2


def frame(model: str, posterior: str, pair: str, seed: int, mean, var_joint, var_indep, true, p=None, lo=None,
          hi=None) -> pd.DataFrame:
    """One posterior's cells; ``p``, ``lo``, ``hi`` (P(D > 0) and the 95 % interval) default to the Gaussian's with
    ``mean`` and ``var_joint`` (a mixture over hyperparameter draws gives its own)."""
    sd = np.sqrt(var_joint)
    return pd.DataFrame({"model": model, "posterior": posterior, "pair": pair, "seed": seed, "mean": mean,
                         "var_joint": var_joint, "var_indep": var_indep, "true": true,
                         "p": p_increase(mean, var_joint) if p is None else p,
                         "lo": mean - M.Z95 * sd if lo is None else lo, "hi": mean + M.Z95 * sd if hi is None else hi})


def oracle_rows(world: World, truth: Truth, pairs, seed: int) -> list[pd.DataFrame]:
    """The exact posterior under the prior the field was drawn from: calibrated by construction (the reference for
    what chance alone does to the bins)."""
    P = world.places[world.held_out]
    out = []
    for a, b in pairs:
        m, vj, vi = dense_change(truth.kernel, truth.noise_sd**2, lambda A: np.full(len(A), truth.mean), world.X,
                                 world.y, P, world.t[a], world.t[b])
        out.append(frame("truth", ORACLE, pair_label(a, b), seed, m, vj, vi, true_change(world, a, b)))
    return out


def model_rows(model, world: World, pairs, seed: int, name: str, dense: bool,
               hyper_draws: int = HYPER_DRAWS) -> list[pd.DataFrame]:
    """Per held-out place and pair: :func:`change_posterior` (the default: joint, averaged over ``hyper_draws``
    draws of the hyperparameters), :func:`change_moments` (joint, the fitted hyperparameters) and two independent
    marginals of ``model``; with ``dense`` also the exact GP at the model's fitted prior (kernel, noise, mean)."""
    P = world.places[world.held_out]
    out = []
    for a, b in pairs:
        t1, t2 = world.t[a], world.t[b]
        mean, var = change_moments(model, P, t1, t2)
        v1, v2 = (model.predict(np.column_stack([P, np.full(len(P), t)])).var_f for t in (t1, t2))
        var_i = np.asarray(v1) + np.asarray(v2)
        truth = true_change(world, a, b)
        c = change_posterior(model, P, t1, t2, hyper_draws=hyper_draws, seed=seed)
        out.append(frame(name, JOINT, pair_label(a, b), seed, c.mean, c.sd**2, var_i, truth, c.p, c.lo, c.hi))
        out.append(frame(name, PLUGIN, pair_label(a, b), seed, mean, var, var_i, truth))
        if dense:
            m, vj, vi = dense_change(model.kernel, model.noise_variance, model.prior_mean_at, world.X, world.y, P, t1,
                                     t2)
            out.append(frame(name, DENSE, pair_label(a, b), seed, m, vj, vi, truth))
    return out


def pair_label(a: int, b: int) -> str:
    return f"{QUARTERS[a]}→{QUARTERS[b]}"


def true_change(world: World, a: int, b: int) -> np.ndarray:
    return world.f[world.held_out, b] - world.f[world.held_out, a]


# ---------------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------------


def summary(cells: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (model, post, pair), c in cells.groupby(["model", "posterior", "pair"], sort=False):
        up = (c["true"] > 0).to_numpy()
        row = {"model": model, "posterior": post, "pair": pair, "seeds": c["seed"].nunique(), "cells": len(c)}
        for kind in ("joint", "indep"):
            var = c[f"var_{kind}"].to_numpy()
            if kind == "joint":
                p, inside = c["p"].to_numpy(), ((c["lo"] <= c["true"]) & (c["true"] <= c["hi"])).to_numpy()
            else:
                p = p_increase(c["mean"].to_numpy(), var)
                inside = np.abs(c["true"] - c["mean"]) <= M.Z95 * np.sqrt(var)
            row.update(bin_stats(M.reliability(p, up, BINS, groups=c["seed"]), kind))
            if kind == "joint":  # the other reading of "deciles": ten equal-count groups of P (Hosmer-Lemeshow)
                row.update(bin_stats(M.reliability(p, up, BINS, groups=c["seed"], by="count"), "deciles"))
            # the coverage as a one-bin reliability of the constant forecast 0.95: binomial and by-seed SEs
            cov = M.reliability(np.full(len(c), 0.95), inside, bins=1, groups=c["seed"]).iloc[0]
            row.update({f"coverage_{kind}": cov["observed"],
                        f"coverage_z_{kind}": cov["z"], f"coverage_2se_seeds_{kind}": 2 * cov["se_groups"],
                        f"coverage_z_seeds_{kind}": cov["z_groups"],
                        f"brier_{kind}": float(np.mean((p - up) ** 2)), f"sd_{kind}": float(np.sqrt(var).mean())})
        row["coverage_2se"] = 2 * M.coverage_se(len(c))
        rows.append(row)
    return pd.DataFrame(rows)


def bin_stats(rel: pd.DataFrame, kind: str) -> dict:
    """A reliability table's verdicts, keyed ``..._{kind}``: bins within 2 SE (binomial; by seed), bins, the largest
    binomial ``|z|`` and the χ² test over the bins (binomial; by seed)."""
    return {f"bins_ok_{kind}": int((rel["z"].abs() <= 2).sum()), f"bins_{kind}": len(rel),
            f"bins_ok_seeds_{kind}": int((rel["z_groups"].abs() <= 2).sum()),
            f"max_abs_z_{kind}": float(rel["z"].abs().max()), f"chi2_p_{kind}": chi2_p(rel["z"]),
            f"chi2_p_seeds_{kind}": chi2_p(rel["z_groups"])}


def chi2_p(z: pd.Series) -> float:
    """The p-value of ``sum z^2`` over the bins against chi-squared with one degree per bin: one test of
    calibration over all bins (the bins hold disjoint cells, so their z are independent under calibration), where
    "every bin within 2 SE" fails a calibrated forecast one time in three with ten bins (1 - 0.954^10)."""
    from scipy.stats import chi2

    z = z.to_numpy(dtype=float)
    return float(chi2.sf(float(np.sum(z**2)), len(z))) if len(z) else float("nan")


def reliability_table(cells: pd.DataFrame, by: str = "width") -> pd.DataFrame:
    parts = []
    for (model, post, pair), c in cells.groupby(["model", "posterior", "pair"], sort=False):
        rel = M.reliability(c["p"].to_numpy(), c["true"] > 0, BINS, groups=c["seed"], by=by)
        parts.append(rel.assign(model=model, posterior=post, pair=pair))
    return pd.concat(parts, ignore_index=True)


POOL_COLUMNS = ("model", "posterior", "pair", "lo", "hi", "n", "observed", "p_mean", "se", "se_groups")


def pool_reliability(tables) -> pd.DataFrame:
    """The reliability of several runs' cells together, from their ``.reliability.csv`` tables (runs on disjoint
    seeds): per (model, posterior, change, bin) the counts, forecast sums and both variances add, as they would over
    the pooled cells (the binomial variance ``sum p (1 - p)``, the by-seed one ``sum_g r_g^2``: seeds are independent
    clusters)."""
    d = pd.concat(tables, ignore_index=True)
    d = d.assign(k=d["observed"] * d["n"], ps=d["p_mean"] * d["n"], v=(d["se"] * d["n"]) ** 2,
                 vg=(d["se_groups"] * d["n"]) ** 2)
    g = d.groupby(["model", "posterior", "pair", "lo", "hi"], sort=False)[["n", "k", "ps", "v", "vg"]].sum()
    g = g.reset_index()
    g["z"], g["z_groups"] = (g["k"] - g["ps"]) / np.sqrt(g["v"]), (g["k"] - g["ps"]) / np.sqrt(g["vg"])
    g["observed"], g["p_mean"] = g["k"] / g["n"], g["ps"] / g["n"]
    return g


def pooled_markdown(pooled: pd.DataFrame) -> str:
    lines = ["| model | posterior | change | cells | bins within 2 SE (by seed) | max abs z (bin) | χ² p (by seed) |",
             "|---|---|---|---|---|---|---|"]
    for (model, post, pair), h in pooled.groupby(["model", "posterior", "pair"], sort=False):
        worst, b = h.loc[h["z"].abs().idxmax()], bin_stats(h, "pooled")
        lines.append(f"| {model} | {post} | {pair} | {int(h['n'].sum())} | {b['bins_ok_pooled']}/{b['bins_pooled']} "
                     f"({b['bins_ok_seeds_pooled']}) | {b['max_abs_z_pooled']:.2f} (P {worst['lo']:.1f}-"
                     f"{worst['hi']:.1f}) | {b['chi2_p_pooled']:.3f} ({b['chi2_p_seeds_pooled']:.3f}) |")
    return "\n".join(lines)


def _mark(z: float) -> str:
    return "" if abs(z) <= 2 else " ✗"


def markdown(s: pd.DataFrame, rel: pd.DataFrame, dec: pd.DataFrame, hyp: pd.DataFrame, truth: Truth) -> str:
    lines = ["### P(change > 0) and the 95 % change interval at the held-out places", "",
             "| model | posterior | change | cells | joint: bins within 2 SE (by seed) | max abs z | χ² p (by seed) | "
             "95 % coverage | Brier | mean sd | independent: bins within 2 SE (by seed) | 95 % coverage | Brier | "
             "mean sd |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in s.itertuples(index=False):
        lines.append(
            f"| {r.model} | {r.posterior} | {r.pair} | {r.cells} | {r.bins_ok_joint}/{r.bins_joint} "
            f"({r.bins_ok_seeds_joint}) | {r.max_abs_z_joint:.2f} | {r.chi2_p_joint:.3f} "
            f"({r.chi2_p_seeds_joint:.3f}) | {100 * r.coverage_joint:.1f} ± "
            f"{100 * r.coverage_2se:.1f}{_mark(r.coverage_z_joint)} (± {100 * r.coverage_2se_seeds_joint:.1f}"
            f"{_mark(r.coverage_z_seeds_joint)}) | {r.brier_joint:.4f} | {r.sd_joint:.4f} | "
            f"{r.bins_ok_indep}/{r.bins_indep} ({r.bins_ok_seeds_indep}) | {100 * r.coverage_indep:.1f}"
            f"{_mark(r.coverage_z_indep)} ({_mark(r.coverage_z_seeds_indep).strip() or 'ok'}) | {r.brier_indep:.4f} | "
            f"{r.sd_indep:.4f} |")
    shown = rel[rel["posterior"] != DENSE]
    for pair, part in shown.groupby("pair", sort=False):
        cols = list(dict.fromkeys(zip(part["model"], part["posterior"], strict=True)))
        names = [m if post != PLUGIN else f"{m}, fitted hyperparameters" for m, post in cols]
        lines += ["", f"### Reliability of the joint P(change > 0), {pair}: observed share of true increases / mean "
                  "P (z; ✗ beyond 2 binomial SEs)", "",
                  "| P bin | " + " | ".join(names) + " |",
                  "|---|" + "---|" * len(cols)]
        for lo, b in part.groupby("lo"):
            cells = []
            for m, post in cols:
                r = b[(b["model"] == m) & (b["posterior"] == post)]
                cells.append("-" if not len(r) else
                             f"{r.observed.iloc[0]:.3f} / {r.p_mean.iloc[0]:.3f} ({r.z.iloc[0]:+.2f}"
                             f"{_mark(r.z.iloc[0])}; n {r.n.iloc[0]})")
            lines.append(f"| {lo:.1f}-{lo + 1 / BINS:.1f} | " + " | ".join(cells) + " |")
    lines += ["", "### The joint P(change > 0) in deciles: ten equal-count groups of P (Hosmer-Lemeshow)", "",
              "| model | posterior | change | deciles within 2 SE (by seed) | max abs z | χ² p (by seed) | "
              "each decile: P range, observed / mean P (z) |", "|---|---|---|---|---|---|---|"]
    for r in s.itertuples(index=False):
        d = dec[(dec["model"] == r.model) & (dec["posterior"] == r.posterior) & (dec["pair"] == r.pair)]
        each = "; ".join(f"{b.lo:.2f}-{b.hi:.2f}: {b.observed:.3f} / {b.p_mean:.3f} ({b.z:+.2f}{_mark(b.z)})"
                         for b in d.itertuples(index=False))
        lines.append(f"| {r.model} | {r.posterior} | {r.pair} | {r.bins_ok_deciles}/{r.bins_deciles} "
                     f"({r.bins_ok_seeds_deciles}) | {r.max_abs_z_deciles:.2f} | {r.chi2_p_deciles:.3f} "
                     f"({r.chi2_p_seeds_deciles:.3f}) | {each} |")
    if len(hyp):
        t = truth
        lines += ["", "### Learned hyperparameters (median over seeds; the truth in the first row)", "",
                  "| model | sd | lengthscale lon (deg) | lengthscale lat (deg) | time lengthscale (years) | "
                  "noise sd | trend per year (median abs) |", "|---|---|---|---|---|---|---|",
                  f"| truth | {t.sd:.3f} | {t.ell_space:.3f} | {t.ell_space:.3f} | {t.ell_time:.3f} | "
                  f"{t.noise_sd:.3f} | 0 |"]
        for model, h in hyp.groupby("model", sort=False):
            med = h.drop(columns=["model", "seed"]).median()
            med["trend"] = h["trend"].abs().median() if "trend" in h else np.nan
            lines.append(f"| {model} | " + " | ".join(f"{med.get(k, np.nan):.3f}" for k in
                                                     ("sd", "ell_lon", "ell_lat", "ell_t", "noise_sd", "trend")) + " |")
        zcols = [f"z_{k}" for k in ("sd", "ell_lon", "ell_lat", "ell_t", "noise_sd")]
        if any(c in hyp for c in zcols):
            lines += ["", "### The hyperparameters' posterior against the truth: mean z² over seeds (mean z)", "",
                      "z = (REML mode − truth) / the Laplace sd, in log units (`laplace_z`); mean z² = 1 when the "
                      "posterior the change averages over is as wide as the mode's scatter around the truth.", "",
                      "| model | worlds | sd | lengthscale lon | lengthscale lat | time lengthscale | noise sd |",
                      "|---|---|---|---|---|---|---|"]
            for model, h in hyp.groupby("model", sort=False):
                z = h[[c for c in zcols if c in h]].dropna()
                if len(z):
                    lines.append(f"| {model} | {len(z)} | " + " | ".join(
                        f"{(z[c] ** 2).mean():.2f} ({z[c].mean():+.2f})" if c in z else "-" for c in zcols) + " |")
    return "\n".join(lines)


def parse_pairs(text: str) -> list[tuple[int, int]]:
    out = []
    for item in filter(None, text.split(",")):
        a, _, b = item.partition(":")
        if a not in QUARTERS or b not in QUARTERS or a == b:
            raise SystemExit(f"--pairs {item!r}: write FROM:TO with two different quarters of {', '.join(QUARTERS)}")
        out.append((QUARTERS.index(a), QUARTERS.index(b)))
    return out


def main(argv=None) -> int:
    t_start = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=MODELS, help=f"comma-separated gpcore model names (default {MODELS})")
    ap.add_argument("--seeds", type=int, default=12, help="independent worlds (field, observations, model seed)")
    ap.add_argument("--seed", type=int, default=0, help="the first world's seed (the others follow)")
    ap.add_argument("--places", type=int, default=1000, help="places per world (20 %% held out)")
    ap.add_argument("--pairs", default=PAIRS, help=f"changes FROM:TO, comma-separated (default {PAIRS})")
    ap.add_argument("--time-lengthscale", type=float, default=TRUTH.ell_time,
                    help=f"the truth's time lengthscale in years (default {TRUTH.ell_time}; the models start at 1)")
    ap.add_argument("--validation", type=float, default=0.1,
                    help="share of the observed rows that validates (default 0.1; 0: none, the fit runs to the "
                         "optimizer's convergence)")
    ap.add_argument("--hyper-draws", type=int, default=HYPER_DRAWS,
                    help=f"hyperparameter draws of change_posterior (default {HYPER_DRAWS}, the CLI's and the app's)")
    ap.add_argument("--no-dense", action="store_true",
                    help="skip the dense exact GP at each model's fitted hyperparameters (O(n^3) per world)")
    ap.add_argument("--pool", nargs="+", metavar="CSV",
                    help="pool the .reliability.csv files of earlier runs on disjoint seeds into one table, and stop")
    ap.add_argument("--pool-as", metavar="NAME",
                    help="with --pool: pool every fitted model's rows under NAME (e.g. runs of vecchia and of dbk-nn "
                         "whose feature check dropped the features); the truth's rows stay apart")
    add_race_args(ap, smoke="one tiny world, tiny models")
    args = ap.parse_args(argv)
    if args.pool:
        tables = []
        for f in args.pool:
            try:
                t = pd.read_csv(f)
            except (OSError, ValueError) as e:
                print(f"error: --pool: {e}", file=sys.stderr)
                return 2
            if missing := sorted(set(POOL_COLUMNS) - set(t.columns)):
                print(f"error: --pool {f}: no column {', '.join(missing)}; pool the .reliability.csv tables that "
                      f"bench_change.py --out writes", file=sys.stderr)
                return 2
            tables.append(t)
        if args.pool_as:
            tables = [t.assign(model=t["model"].where(t["model"] == "truth", args.pool_as)) for t in tables]
        pooled = pool_reliability(tables)
        header = (f"Change calibration pooled over {len(tables)} runs ({', '.join(args.pool)})"
                  f"{f', every model as {args.pool_as!r}' if args.pool_as else ''}: bins within two "
                  f"binomial SEs (in brackets by seed), the largest |z| and its bin, the χ² test over the bins.")
        report(header, pooled_markdown(pooled), pooled, args.out)
        return 0
    if args.smoke:
        args.seeds, args.places = 1, 150
    pairs = parse_pairs(args.pairs)
    truth = replace(TRUTH, ell_time=args.time_lengthscale)
    models, sets = start(args.models, args.set)
    cells, hyp = [], []
    for k in range(args.seeds):
        seed = args.seed + k
        world = draw_world(seed, args.places, truth)
        cells += oracle_rows(world, truth, pairs, seed)
        n = len(world.y)
        perm = np.random.default_rng(seed + 10_000).permutation(n)
        n_val = int(round(args.validation * n))
        va, tr = np.sort(perm[:n_val]), np.sort(perm[n_val:])
        for name in models:
            settings = {"space_time": "separable", **tiny(name, args.smoke), **sets.get(name, {})}
            t0 = time.perf_counter()
            val = (world.X[va], world.y[va]) if n_val else ()
            model = make_model(name, seed=seed, **settings).fit(world.X[tr], world.y[tr], *val)
            fit_s = time.perf_counter() - t0
            cells += model_rows(model, world, pairs, seed, name, dense=not args.no_dense, hyper_draws=args.hyper_draws)
            hyp.append({"model": name, "seed": seed, **learned(model),
                        **(laplace_z(model, truth) if args.hyper_draws else {})})
            stderr(f"seed {seed} {name}: {len(tr)} + {len(va)} rows, fit {fit_s:.1f} s, change "
                   f"{time.perf_counter() - t0 - fit_s:.1f} s; learned "
                   f"{ {k: round(v, 3) for k, v in hyp[-1].items() if k not in ('model', 'seed')} }"
                   f"{feature_check_text(model)}")
    df = pd.concat(cells, ignore_index=True)
    s, rel = summary(df), reliability_table(df)
    n_obs = int(round(args.places * (1 - HELD_OUT) * np.mean(OBSERVED) * len(QUARTERS)))
    header = (f"Change calibration on a synthetic field{' (smoke)' if args.smoke else ''}: {args.seeds} world(s) "
              f"(seeds {args.seed}..{args.seed + args.seeds - 1}), {args.places} places x {len(QUARTERS)} quarters, "
              f"{HELD_OUT:.0%} of the places held out, about {n_obs} observed rows per world (quarters observed "
              f"{'/'.join(f'{o:.0%}' for o in OBSERVED)} of the other places), "
              f"{f'{args.validation:.0%} of them validating' if args.validation else 'no validation rows'}; field "
              f"drawn exactly from {truth}; "
              f"models with their defaults and space_time=separable"
              f"{'; ' + '; '.join(f'{m}: {v}' for m, v in sets.items()) if sets else ''}. Bins within 2 SE: of the "
              f"non-empty bins of P, those whose observed share of true increases is within two binomial SEs of "
              f"the mean P (in brackets: within two SEs by seed, the cluster-robust SE that allows for the "
              f"correlation of cells of one field); χ² p: one test of calibration over all bins, the p-value of "
              f"the sum of the bins' squared z against chi-squared with one degree per bin (by seed: with the "
              f"cluster-robust z); deciles: the same with ten equal-count groups of P instead of ten "
              f"equal-width bins; coverage ✗ when more than two binomial SEs from 95 % (in brackets "
              f"two SEs by seed and its verdict). Posteriors: "
              f"'{JOINT}' is the model's change posterior as the CLI and the app compute it ({args.hyper_draws} "
              f"draws); '{PLUGIN}' the same at the fitted hyperparameters alone; '{DENSE}' the exact GP with the "
              f"model's fitted kernel, noise and mean; '{ORACLE}' the exact GP with the prior the field was drawn "
              f"from (calibrated by construction).\n\n"
              f"{stamp(time.perf_counter() - t_start)}")
    dec = reliability_table(df, by="count")
    report(header, markdown(s, rel, dec, pd.DataFrame(hyp), truth), s, args.out)
    if args.out:
        rel.to_csv(Path(args.out).with_suffix(".reliability.csv"), index=False)
        dec.to_csv(Path(args.out).with_suffix(".deciles.csv"), index=False)
    ok = np.isfinite(df[["mean", "var_joint", "var_indep"]].to_numpy()).all()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
