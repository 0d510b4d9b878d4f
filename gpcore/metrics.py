"""Evaluation metrics (docs/metrics.md §7): small pure functions of ``(mean, var_y, y)``.

All take 1-D arrays of equal length, in the units the caller reports in (e.g. log10 Mbps);
``var_y`` is the predictive variance of an observation (latent variance + noise). The predictive is Gaussian,
``N(mean, var_y)``, unless a ``shape`` (:class:`~gpcore.models.noise_shape.NoiseShape`) and the latent variance
``var_f`` are passed: then it is that shape's two-component mixture around ``mean`` (docs/metrics.md, "Scores of a
skewed predictive"), with each row's Gaussian noise variance ``(var_y - var_f) / shape.noise_factor()``.

>>> import numpy as np
>>> round(nll(np.zeros(1), np.ones(1), np.zeros(1)), 6)
0.918939
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy.special import ndtr, ndtri

Z95 = 1.959963984540054
CALIBRATION_LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)


def _arrays(*arrs):
    out = [np.asarray(a, dtype=np.float64).reshape(-1) for a in arrs]
    n = out[0].shape[0]
    if any(a.shape[0] != n for a in out):
        raise ValueError(f"metric inputs must have equal length, got {[a.shape[0] for a in out]}")
    return out


def _shaped(mean, var_y, y, shape, var_f):
    """``(r, var_f, s)`` of a shaped predictive: residuals, latent variances and Gaussian noise variances."""
    if var_f is None:
        raise ValueError("a noise shape needs the latent variance var_f")
    mean, var_y, y, var_f = _arrays(mean, var_y, y, var_f)
    return y - mean, var_f, shape.noise_of(var_y, var_f)


def interval(mean, var_y, level: float = 0.95, *, shape=None, var_f=None) -> tuple[np.ndarray, np.ndarray]:
    """Per-row ends of the central ``level`` interval: ``mean ± z sd``, or the ``shape``'s mixture quantiles."""
    z = z_value(level)  # checks the level
    if shape is None:
        mean, var_y = _arrays(mean, var_y)
        half = z * np.sqrt(var_y)
        return mean - half, mean + half
    if var_f is None:
        raise ValueError("a noise shape needs the latent variance var_f")
    mean, var_y, var_f = _arrays(mean, var_y, var_f)
    lo, hi = shape.interval(level, var_f, shape.noise_of(var_y, var_f))
    return mean + lo, mean + hi


def log_density(mean, var_y, y, *, shape=None, var_f=None) -> np.ndarray:
    """Per-row log predictive density of ``y`` (Gaussian, or of the ``shape``'s mixture); :func:`nll` is minus its
    mean."""
    if shape is not None:
        r, vf, s = _shaped(mean, var_y, y, shape, var_f)
        return shape.logpdf(r, vf, s)
    mean, var_y, y = _arrays(mean, var_y, y)
    return -0.5 * np.log(2 * np.pi * var_y) - (y - mean) ** 2 / (2 * var_y)


def mae(mean, y) -> float:
    mean, y = _arrays(mean, y)
    return float(np.mean(np.abs(y - mean)))


def rmse(mean, y) -> float:
    mean, y = _arrays(mean, y)
    return float(np.sqrt(np.mean((y - mean) ** 2)))


def rmspe(mean, y) -> float:
    """Root mean squared prediction error, the name Heaton et al. (2019) use for :func:`rmse`."""
    return rmse(mean, y)


def nll(mean, var_y, y, *, shape=None, var_f=None) -> float:
    """Mean negative log predictive density (Gaussian, or of the ``shape``'s mixture)."""
    return float(-np.mean(log_density(mean, var_y, y, shape=shape, var_f=var_f)))


def crps(mean, var_y, y, *, shape=None, var_f=None) -> float:
    """Mean closed-form CRPS: Gaussian ``sd [z (2 Phi(z) - 1) + 2 phi(z) - 1/sqrt(pi)]``, or the ``shape``'s
    mixture's (:meth:`~gpcore.models.noise_shape.NoiseShape.crps`)."""
    if shape is not None:
        r, vf, s = _shaped(mean, var_y, y, shape, var_f)
        return float(np.mean(shape.crps(r, vf, s)))
    mean, var_y, y = _arrays(mean, var_y, y)
    sd = np.sqrt(var_y)
    z = (y - mean) / sd
    pdf = np.exp(-0.5 * z**2) / math.sqrt(2 * math.pi)
    return float(np.mean(sd * (z * (2 * ndtr(z) - 1) + 2 * pdf - 1 / math.sqrt(math.pi))))


def warped_scores(mean, var, y, to_model, from_model, log_slope, level: float = 0.95, quantiles: int = 2000) -> dict:
    """NLL, CRPS and coverage in the units of ``y`` of a Gaussian predictive ``N(mean, var)`` that lives in a
    *model space* ``v = to_model(y)`` (docs/metrics.md §7.2, "Scores through a transform").

    ``to_model`` / ``from_model`` are an increasing map and its inverse (arrays elementwise), ``log_slope(y)`` is
    ``log d to_model / dy``. The NLL adds that Jacobian, ``-log N(to_model(y); mean, var) - log_slope(y)``; the
    CRPS integrates the quantile (pinball) loss over ``quantiles`` midpoint levels of the predictive quantiles
    ``from_model(mean + sd Phi^-1(a))``; the central ``level`` interval maps through ``from_model`` unchanged, so
    its coverage is the model space's. With the identity map all three equal :func:`nll`, :func:`crps` and
    :func:`coverage` (the CRPS to the quadrature's error, about 1e-5 of the sd at 2000 levels)."""
    mean, var, y = _arrays(mean, var, y)
    v = np.asarray(to_model(y), dtype=np.float64)
    sd = np.sqrt(var)
    out_nll = nll(mean, var, v) - float(np.mean(log_slope(y)))  # the Gaussian NLL in v, less the Jacobian
    a = (np.arange(quantiles) + 0.5) / quantiles
    total = 0.0
    for lo in range(0, y.shape[0], 4096):  # 4096 x quantiles at a time
        sl = slice(lo, lo + 4096)
        q = np.asarray(from_model(mean[sl, None] + sd[sl, None] * ndtri(a)[None, :]), dtype=np.float64)
        total += float(np.sum(2 * np.mean(((y[sl, None] < q) - a[None, :]) * (q - y[sl, None]), axis=1)))
    return {"nll": out_nll, "crps": total / y.shape[0], "coverage": coverage(mean, var, v, level)}


def z_value(level: float) -> float:
    """Half-width multiplier of the central Gaussian interval at ``level`` (1.959964 at 0.95)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return float(ndtri(0.5 + level / 2))


def coverage(mean, var_y, y, level: float = 0.95, *, shape=None, var_f=None) -> float:
    """Fraction of ``y`` inside the central ``level`` interval (``mean ± z sd`` for a Gaussian)."""
    return float(np.mean(inside(mean, var_y, y, level, shape=shape, var_f=var_f)))


def inside(mean, var_y, y, level: float = 0.95, *, shape=None, var_f=None) -> np.ndarray:
    """Per row: is ``y`` inside its central ``level`` interval (:func:`interval`)?"""
    lo, hi = interval(mean, var_y, level, shape=shape, var_f=var_f)
    (y,) = _arrays(y)
    return (y >= lo) & (y <= hi)


def interval_score(mean, var_y, y, level: float = 0.95, *, shape=None, var_f=None) -> float:
    """Mean interval score of the central ``level`` interval ``[l, u] = mean ± z sd`` (Gneiting & Raftery 2007,
    eq. 43; Heaton et al. 2019's INT): ``(u - l) + (2 / a) (l - y) 1[y < l] + (2 / a) (y - u) 1[y > u]``,
    ``a = 1 - level``. Lower is better; in the target's units."""
    a = 1.0 - level
    lo, hi = interval(mean, var_y, level, shape=shape, var_f=var_f)
    (y,) = _arrays(y)
    return float(np.mean((hi - lo) + (2 / a) * np.maximum(lo - y, 0.0) + (2 / a) * np.maximum(y - hi, 0.0)))


def heaton_scores(mean, var_y, y, level: float = 0.95) -> dict[str, float]:
    """The scores of Heaton et al. (2019)'s comparison: MAE, RMSPE, CRPS, interval score and coverage of the
    central ``level`` interval (their INT and CVG use 95 %)."""
    return {
        "mae": mae(mean, y),
        "rmspe": rmspe(mean, y),
        "crps": crps(mean, var_y, y),
        "interval_score": interval_score(mean, var_y, y, level),
        "coverage": coverage(mean, var_y, y, level),
    }


def interval_width(var_y, level: float = 0.95, *, shape=None, var_f=None) -> np.ndarray:
    """Per-point width of the central ``level`` interval, ``2 z sd`` (3.919928 sd at 95 %) for a Gaussian."""
    (var_y,) = _arrays(var_y)
    lo, hi = interval(np.zeros_like(var_y), var_y, level, shape=shape, var_f=var_f)
    return hi - lo


def width_summary(var_y, level: float = 0.95, *, shape=None, var_f=None) -> dict[str, float]:
    """Mean, median and quartiles of the interval widths (the violin plots' distribution)."""
    w = interval_width(var_y, level, shape=shape, var_f=var_f)
    q = np.quantile(w, [0.05, 0.25, 0.5, 0.75, 0.95])
    return {"mean": float(w.mean()), "p05": q[0], "p25": q[1], "median": q[2], "p75": q[3], "p95": q[4]}


def calibration_curve(mean, var_y, y, levels=CALIBRATION_LEVELS, *, shape=None, var_f=None) -> pd.DataFrame:
    """Observed coverage against nominal level (a calibrated model lies on the diagonal)."""
    kw = {"shape": shape, "var_f": var_f}
    return pd.DataFrame({"nominal": list(levels), "observed": [coverage(mean, var_y, y, lv, **kw) for lv in levels]})


def evaluate(mean, var_y, y, level: float = 0.95, *, shape=None, var_f=None) -> dict[str, float]:
    """All scalar metrics for one set of predictions (MAE and RMSE of ``mean``, the posterior mean of f)."""
    kw = {"shape": shape, "var_f": var_f}
    lo, hi = interval(mean, var_y, level, **kw)  # once: a mixture's ends take a bisection
    w = hi - lo
    yy = _arrays(y)[0]
    return {
        "n": int(yy.size),
        "mae": mae(mean, y),
        "rmse": rmse(mean, y),
        "nll": nll(mean, var_y, y, **kw),
        "crps": crps(mean, var_y, y, **kw),
        "coverage": float(np.mean((yy >= lo) & (yy <= hi))),
        "pi_width_mean": float(w.mean()),
        "pi_width_median": float(np.median(w)),
    }


def evaluate_groups(mean, var_y, y, groups=None, level: float = 0.95, all_label: str = "all", *, shape=None,
                    var_f=None) -> pd.DataFrame:
    """Metrics overall and per group (e.g. urban / rural) as a tidy DataFrame, one row per group."""
    mean, var_y, y = _arrays(mean, var_y, y)
    vf = None if var_f is None else _arrays(var_f)[0]
    rows = [{"group": all_label, **evaluate(mean, var_y, y, level, shape=shape, var_f=vf)}]
    if groups is not None:
        g = np.asarray(groups).astype(str).reshape(-1)
        if g.shape[0] != y.shape[0]:
            raise ValueError(f"groups has {g.shape[0]} labels but there are {y.shape[0]} targets")
        for label in sorted(np.unique(g)):
            sel = g == label
            rows.append({"group": label, **evaluate(mean[sel], var_y[sel], y[sel], level, shape=shape,
                                                    var_f=None if vf is None else vf[sel])})
    return pd.DataFrame(rows)


#: bins of a per-row measurement count (Ookla ``tests``): ``(label, lo, hi)`` with ``lo < w <= hi``
WEIGHT_BINS = (("1", 0.0, 1.0), ("2-4", 1.0, 4.0), ("5-16", 4.0, 16.0), (">16", 16.0, math.inf))


def weight_bins(weights, name: str = "weight") -> np.ndarray:
    """Label each row by its measurement-count bin: ``'<name> 1'``, ``'<name> 2-4'``, ``'<name> 5-16'``,
    ``'<name> >16'`` (a weight ``w`` falls in the bin with ``lo < w <= hi``; 0 < w <= 1 is ``1``)."""
    (w,) = _arrays(weights)
    out = np.empty(w.shape[0], dtype=object)
    for label, lo, hi in WEIGHT_BINS:
        out[(w > lo) & (w <= hi)] = f"{name} {label}"
    out[w <= 0] = f"{name} 0"
    return out


def evaluate_weight_bins(mean, var_y, y, weights, name: str = "weight", level: float = 0.95, *, shape=None,
                         var_f=None) -> pd.DataFrame:
    """Metrics per measurement-count bin (:func:`weight_bins`), one row per non-empty bin, in bin order."""
    mean, var_y, y, w = _arrays(mean, var_y, y, weights)
    vf = None if var_f is None else _arrays(var_f)[0]
    labels = weight_bins(w, name)
    rows = []
    for label in [f"{name} {b[0]}" for b in WEIGHT_BINS]:
        sel = labels == label
        if sel.any():
            rows.append({"group": label, **evaluate(mean[sel], var_y[sel], y[sel], level, shape=shape,
                                                    var_f=None if vf is None else vf[sel])})
    return pd.DataFrame(rows)


def coverage_se(n: int, level: float = 0.95) -> float:
    """Binomial standard error of an observed coverage over ``n`` points at nominal ``level``."""
    return math.sqrt(level * (1.0 - level) / max(int(n), 1))


def coverage_band(mean, var_y, y, groups=None, level: float = 0.95, *, shape=None, var_f=None) -> dict[str, float]:
    """Observed coverage of the central ``level`` interval with two standard errors (docs/metrics.md, "Coverage and
    its band"): ``coverage``, ``two_se`` (binomial: rows independent) and ``two_se_groups`` (NaN without ``groups``):
    cluster-robust by group, e.g. the held-out block of a block split, whose rows share their errors, so the
    split's coverage scatters more than the binomial band allows. It is the one-bin :func:`reliability` of the
    constant forecast ``level``.

    >>> b = coverage_band([0.0, 0.0, 0.0, 0.0], [1.0] * 4, [0.0, 0.5, 1.0, 3.0], groups=[0, 0, 1, 1])
    >>> round(b["coverage"], 2), round(b["two_se"], 4), round(b["two_se_groups"], 4)
    (0.75, 0.2179, 0.4528)
    """
    mean, var_y, y = _arrays(mean, var_y, y)
    if not y.size:
        return {"coverage": math.nan, "two_se": math.nan, "two_se_groups": math.nan}
    covered = inside(mean, var_y, y, level, shape=shape, var_f=var_f)
    row = reliability(np.full(y.size, level), covered, bins=1, groups=groups).iloc[0]
    return {"coverage": float(row["observed"]), "two_se": 2 * float(row["se"]),
            "two_se_groups": 2 * float(row["se_groups"]) if groups is not None else math.nan}


def reliability(p, event, bins: int = 10, groups=None, by: str = "width") -> pd.DataFrame:
    """Reliability of forecast probabilities ``p`` of binary ``event`` (0/1 or bool) in ``bins`` equal-width bins of
    ``[0, 1]`` (the last one closed), one row per non-empty bin: ``lo``, ``hi``, ``n``, ``p_mean`` (mean forecast),
    ``observed`` (frequency of the event), ``se`` and ``z = (observed - p_mean) / se``.

    ``by="count"`` makes the bins equal-count groups of the forecasts instead, the "deciles of risk" of the
    Hosmer–Lemeshow test (``bins=10``): the forecasts sorted (ties in input order), the one of rank ``r`` (from 0) in
    group ``floor(r * bins / n)``, so the groups' sizes differ by at most one; ``lo`` and ``hi`` are then the
    smallest and largest forecast of the group.

    ``se = sqrt(sum_i p_i (1 - p_i)) / n`` is the standard error of the observed frequency if the forecasts are
    calibrated and the events independent, so ``|z| <= 2`` is "within two binomial SEs". With ``groups`` (one label
    per forecast, e.g. the independent draw a row belongs to) also ``se_groups = sqrt(sum_g r_g^2) / n``, ``r_g`` the
    sum of ``event - p`` over the bin's rows of group ``g``, and ``z_groups``: the cluster-robust SE, which stays
    right when events within a group are correlated (rows of one random field) but groups are independent.

    >>> reliability([0.05, 0.05, 0.95, 0.95], [0, 0, 1, 1], bins=2)[["lo", "n", "observed"]].values.tolist()
    [[0.0, 2.0, 0.0], [0.5, 2.0, 1.0]]
    """
    p, e = _arrays(p, event)
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    if by not in ("width", "count"):
        raise ValueError(f"by must be 'width' or 'count', got {by!r}")
    if bad := int(np.sum(~((p >= 0) & (p <= 1)))):
        raise ValueError(f"probabilities must lie in [0, 1]; {bad} of {p.size} do not (NaN or outside)")
    g = None
    if groups is not None:
        g = np.asarray(groups).reshape(-1)
        if g.shape[0] != p.shape[0]:
            raise ValueError(f"groups has {g.shape[0]} labels but there are {p.shape[0]} probabilities")
        g = np.unique(g, return_inverse=True)[1].reshape(-1)

    def z_of(obs, pm, se):
        return (obs - pm) / se if se > 0 else (0.0 if obs == pm else math.copysign(math.inf, obs - pm))

    if by == "width":
        k = np.minimum((p * bins).astype(int), bins - 1)
    else:  # ranks, integer arithmetic: the groups never depend on rounding
        k = np.empty(p.size, dtype=np.int64)
        k[np.argsort(p, kind="stable")] = np.arange(p.size, dtype=np.int64) * bins // max(p.size, 1)
    rows = []
    for b in range(bins):
        sel = k == b
        n = int(sel.sum())
        if not n:
            continue
        pm, obs = float(p[sel].mean()), float(e[sel].mean())
        se = math.sqrt(float(np.sum(p[sel] * (1.0 - p[sel])))) / n
        lo, hi = (b / bins, (b + 1) / bins) if by == "width" else (float(p[sel].min()), float(p[sel].max()))
        row = {"lo": lo, "hi": hi, "n": n, "p_mean": pm, "observed": obs, "se": se,
               "z": z_of(obs, pm, se)}
        if g is not None:
            r = np.bincount(g[sel], weights=e[sel] - p[sel])
            row["se_groups"] = math.sqrt(float(np.sum(r**2))) / n
            row["z_groups"] = z_of(obs, pm, row["se_groups"])
        rows.append(row)
    cols = ["lo", "hi", "n", "p_mean", "observed", "se", "z"] + (["se_groups", "z_groups"] if g is not None else [])
    return pd.DataFrame(rows, columns=cols)
