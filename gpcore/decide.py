"""Decisions from the joint posterior: exceedance maps, areal posteriors, plausible maps, where to measure next.

Everything builds on the joint posterior (:func:`gpcore.posterior.joint_posterior`; docs/decide.md): the feature
form of most models, the joint Vecchia prediction of ``vecchia`` and ``dbk-nn``.

* :func:`exceedance` — ``P(f(x) < t)`` and ``P(y(x) < t)`` per place; a threshold in original units goes
  through the (monotone) target transform: ``P(Y < t) = P(f < forward(t))``.
* :func:`area_posteriors` — per area the posterior of the weighted mean of f over its places: mean, sd,
  interval, ``P(area mean < t)``, exact in model space (log10 target: the *geometric* mean of speeds);
  optionally the arithmetic mean in original units by joint samples.
* :func:`plausible_maps` — seeded joint samples over a grid.
* :func:`suggest` — greedy batch of ``k`` sites among candidates that most reduce the weighted mean posterior
  variance of f over a target set (rank-one update per pick, optional spacing). Engines: ``"features"`` (the
  feature form; a residual enters through ``D`` random pathwise features, Monte-Carlo error ~``1/sqrt(D)``),
  ``"dense"`` (the ``n_T x n_C`` covariance; exact, small sets; ``"auto"`` takes it with a residual and
  ``n_T n_C <= DENSE_MAX``), ``"vecchia"`` (the Vecchia family, always: ``D`` Monte-Carlo columns of the joint
  factor plus the exact low-rank part).

Cost (``n_C`` candidates, ``n_T`` targets, ``p`` features, ``k`` picks): features ``O((n_T + n_C) p^2 + k (n_C p +
p^2))``; dense ``O(n_T n_C (p + kernel) + k (n_T + n_C) k)``; areas ``O(n p q)`` plus ``O(n_a^2)`` per area with a
residual; Vecchia family ``O(n (m_t + m_p)^3)`` once per set of places, then ``O(n m_p)`` per sample or area.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np
import pandas as pd
import torch

from gpcore.errors import DataError, InputError
from gpcore.posterior import CHUNK, JointPosterior, VecchiaJointPosterior, _rff_eval, joint_posterior, rff_frequencies

#: the dense suggestion engine's largest target x candidate matrix
DENSE_MAX = 4_000_000
#: random pathwise features standing in for a residual in the features engine
RESIDUAL_FEATURES = 256
#: undecided cells: P(below) strictly inside this band
UNDECIDED = (0.2, 0.8)
EARTH_KM = 6371.0088

_Z = NormalDist()


def _phi(z: np.ndarray) -> np.ndarray:
    """Standard normal CDF, elementwise."""
    from scipy.special import ndtr

    return ndtr(z)


def joint_caveat(model) -> str | None:
    """A note for models trained on a predictive per-point objective (dPPGP, PPGP), else ``None``: the correlations
    their ``q(w)`` implies between places are barely constrained, unless DBK's joint calibration fitted them on
    validation blocks (docs/decide.md). Exact-posterior, ELBO and Vecchia-family models get no note."""
    obj = getattr(getattr(model, "config", None), "objective", None)
    if obj not in ("dppgp", "ppgp"):
        return None
    cal = getattr(model, "train_info_", {}).get("joint_calibration")
    if obj == "dppgp" and cal and cal.get("rho", 1.0) < 1.0:
        return (f"{model.registry_name} is trained on a predictive per-point objective ({obj}); its joint "
                f"correlations were calibrated on validation blocks: {cal['rho']:.2f} of each place's latent variance "
                "is shared with other places, the rest is its own (docs/decide.md)")
    return (f"{model.registry_name} is trained on a predictive per-point objective ({obj}): its weight posterior "
            "fits the marginals, and the joint correlations it implies (areal sds, sample patterns, suggestions) "
            "are only weakly constrained; compare with dbk-mml or svgp before acting on joint quantities")


def _posterior(model_or_post) -> JointPosterior | VecchiaJointPosterior:
    if isinstance(model_or_post, (JointPosterior, VecchiaJointPosterior)):
        return model_or_post
    return joint_posterior(model_or_post)


# ---------------------------------------------------------------- thresholds and exceedance


def model_threshold(threshold: float, units: str = "model", transform="identity") -> float:
    """A threshold in model space: ``transform.forward(t)`` for ``units="original"``.

    Raises :class:`InputError` for a threshold the transform cannot take (``t <= 0`` under a log).
    """
    from gpcore.data.transforms import get_transform

    if units not in ("model", "original"):
        raise InputError(f"units={units!r} is not allowed; use 'model' or 'original'")
    t = float(threshold)
    if not math.isfinite(t):
        raise InputError(f"threshold {threshold!r} must be a finite number")
    if units == "model":
        return t
    tr = get_transform(transform)
    if tr.needs_positive and t <= 0:
        raise InputError(f"threshold {t} in original units must be > 0 for the {tr.name} target transform")
    return float(tr.forward(t))


@dataclass
class Exceedance:
    """Per-place probabilities that f (latent) and y (a new measurement) are below ``threshold``."""

    p_f: np.ndarray
    p_y: np.ndarray
    threshold_model: float
    direction: str = "below"
    mean: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sd_f: np.ndarray = field(default_factory=lambda: np.zeros(0))


def exceedance(model, X, threshold: float, *, units: str = "model", transform="identity",
               direction: str = "below", pred=None) -> Exceedance:
    """``P(f(x) < t)`` and ``P(y(x) < t)`` (or ``>`` with ``direction="above"``) at each row of ``X``.

    Marginals only (``O(n p^2)``, the model's prediction; with ``pred`` — a :class:`~gpcore.Prediction`
    at ``X`` computed before, e.g. from a run's stored grid by :func:`grid_prediction` — ``O(n)``);
    ``units="original"`` maps ``t`` through the target transform first (the transforms are increasing,
    so the event is the same).
    """
    if direction not in ("below", "above"):
        raise InputError(f"direction={direction!r} is not allowed; use 'below' or 'above'")
    t = model_threshold(threshold, units, transform)
    pred = model.predict(X) if pred is None else pred
    sd_f = np.sqrt(np.maximum(pred.var_f, 1e-300))
    p_f = _phi((t - pred.mean) / sd_f)
    p_y = pred.cdf(t)  # a new measurement: Gaussian, or the model's skewed noise (Prediction.shape)
    if direction == "above":
        p_f, p_y = 1.0 - p_f, 1.0 - p_y
    return Exceedance(p_f, p_y, t, direction, pred.mean, sd_f)


def grid_prediction(grid, noise_variance: float, var_scale: float = 1.0, shape=None):
    """The :class:`~gpcore.Prediction` stored in a run's ``grid.parquet`` (``mean_t``, ``sd_t`` = predictive sd
    in model space): ``var_f = sd_t^2 / var_scale - noise``, the noise times ``shape.noise_factor()`` for a model
    with a noise ``shape`` (:meth:`~gpcore.models.base.GPModel.noise_shape`). Nothing is recomputed. ``var_scale``:
    a recalibrated model's scale of ``var_y`` on the grid (``model.variance_scale(n)``; it leaves ``var_f``
    alone)."""
    from gpcore.models import Prediction

    mean = np.asarray(grid["mean_t"], dtype=float)
    var_y = np.asarray(grid["sd_t"], dtype=float) ** 2
    noise = float(noise_variance) * (1.0 if shape is None else shape.noise_factor())
    return Prediction(mean=mean, var_f=np.maximum(var_y / var_scale - noise, 0.0), var_y=var_y, shape=shape)


# ---------------------------------------------------------------- areas


def bundled_counties(state: str | None = None):
    """The bundled county polygons (columns FIPS, NAME, ...), optionally of one state (``"PR"``)."""
    from gpcore.data import _bundled

    c = _bundled.counties()
    if state:
        c = c[c["STUSPS"] == str(state).upper()]
        if c.empty:
            known = ", ".join(sorted(set(_bundled.counties()["STUSPS"])))
            raise DataError(f"no bundled counties for state {state!r}; bundled states: {known}")
    return c.reset_index(drop=True)


def assign_areas(lon, lat, polygons, name_column: str | None = None) -> np.ndarray:
    """The area name of each point (object array; ``None`` outside every polygon; boundary counts inside).

    ``polygons`` is a GeoDataFrame (EPSG:4326) or anything :func:`gpcore.data.regions.read_polygons`
    reads; ``name_column`` names the areas (default: ``NAME``, ``name``, else the row number).
    """
    import geopandas as gpd

    from gpcore.data.regions import read_polygons

    gdf = polygons if isinstance(polygons, gpd.GeoDataFrame) else read_polygons(polygons)
    gdf = gdf.to_crs(4326) if gdf.crs is not None else gdf.set_crs(4326)
    if name_column is None:
        name_column = next((c for c in ("NAME", "name", "Name") if c in gdf.columns), None)
    elif name_column not in gdf.columns:
        raise DataError(f"the polygon layer has no column '{name_column}'; columns: {', '.join(map(str, gdf.columns))}")
    names = gdf[name_column].astype(str).to_numpy() if name_column else np.array([f"area {i}" for i in range(len(gdf))])
    pts = gpd.GeoDataFrame(geometry=gpd.points_from_xy(np.asarray(lon, float), np.asarray(lat, float)), crs=4326)
    hit = gpd.sjoin(pts, gdf[["geometry"]], how="left", predicate="intersects")
    hit = hit[~hit.index.duplicated(keep="first")]
    idx = hit["index_right"].to_numpy()
    out = np.full(len(pts), None, dtype=object)
    ok = ~pd.isna(idx)
    out[ok] = names[idx[ok].astype(np.int64)]
    return out


def cell_areas_km2(cells) -> np.ndarray:
    """Area of each polygon of a GeoDataFrame in km^2 (in its UTM zone), for ``weights="area"``."""
    g = cells.geometry if cells.crs is not None else cells.set_crs(4326).geometry
    return g.to_crs(g.estimate_utm_crs()).area.to_numpy() / 1e6


def area_posteriors(model, X, labels, *, weights=None, threshold: float | None = None, units: str = "model",
                    transform="identity", level: float = 0.95, samples: int = 0, seed: int = 0,
                    measurements=None, num_features: int = 256) -> pd.DataFrame:
    """Posterior of the weighted mean of f over the places of each area, one row per area.

    Parameters
    ----------
    X : ``n x d`` places (grid cell centres or measurement locations); ``labels``: ``(n,)`` area of each
        place (``None``/NaN: in no area).
    weights : ``(n,)`` non-negative weights (cell area, population, tests); ``None`` = uniform. They are
        normalised within each area.
    threshold, units, transform : ``P(area mean < t)`` with ``t`` in model or original units.
    samples : joint samples for the arithmetic mean in original units (0 = skip; the ``samples`` column
        records the count). measurements : optional ``(m,)`` area labels of measurements to count.

    Columns: ``area, cells, measurements, mean_t, sd_t, lower_t, upper_t, p_below`` (model space, exact),
    ``mean, lower, upper`` (the model-space numbers through the inverse transform: for a log10 target the
    geometric mean and its interval) and with ``samples > 0``: ``mean_arith, lower_arith, upper_arith,
    p_below_arith, samples``.
    """
    from gpcore.data.transforms import get_transform

    jp = _posterior(model)
    tr = get_transform(transform)
    labels = np.asarray(labels, dtype=object)
    n = labels.shape[0]
    w_all = np.ones(n) if weights is None else np.asarray(weights, dtype=float)
    if w_all.shape != (n,):
        raise InputError(f"weights must have one value per place ({n}); got shape {w_all.shape}")
    bad = ~np.isfinite(w_all) | (w_all < 0)
    if bad.any():
        rows = np.flatnonzero(bad)[:8]
        raise InputError(f"weights must be finite and >= 0; rows {', '.join(map(str, rows))} are not")
    inside = np.array([lab is not None and not (isinstance(lab, float) and math.isnan(lab)) for lab in labels])
    names = sorted({str(v) for v in labels[inside]})
    lab_str = np.array([str(v) for v in labels], dtype=object)
    groups, counts, empty = [], [], []
    for name in names:
        idx = np.flatnonzero(inside & (lab_str == name))
        w = w_all[idx]
        tot = w.sum()
        counts.append(idx.size)
        if tot <= 0:
            empty.append(name)
            w = np.full(idx.size, 1.0 / idx.size)
        else:
            w = w / tot
        groups.append((idx, w))
    mean, var = jp.linear(X, groups)
    sd = np.sqrt(var)
    z = _Z.inv_cdf(0.5 + level / 2.0)
    out = pd.DataFrame({"area": names, "cells": counts})
    if measurements is not None:
        m = pd.Series(np.asarray(measurements, dtype=object)).dropna().astype(str).value_counts()
        out["measurements"] = [int(m.get(a, 0)) for a in names]
    out["mean_t"], out["sd_t"] = mean, sd
    out["lower_t"], out["upper_t"] = mean - z * sd, mean + z * sd
    out["mean"], out["lower"], out["upper"] = tr.inverse(mean), tr.inverse(mean - z * sd), tr.inverse(mean + z * sd)
    if threshold is not None:
        t = model_threshold(threshold, units, tr)
        out["p_below"] = _phi((t - mean) / np.maximum(sd, 1e-300))
    if samples:
        S = jp.sample(X, int(samples), seed=seed, num_features=num_features)  # s x n (model space)
        V = tr.inverse(S)
        A = np.stack([V[:, idx] @ w for idx, w in groups], 1)  # s x areas
        out["mean_arith"] = A.mean(0)
        out["lower_arith"] = np.quantile(A, 0.5 - level / 2.0, axis=0)
        out["upper_arith"] = np.quantile(A, 0.5 + level / 2.0, axis=0)
        if threshold is not None:
            t_orig = float(tr.inverse(model_threshold(threshold, units, tr)))
            out["p_below_arith"] = (A < t_orig).mean(0)
        out["samples"] = int(samples)
    if empty:
        out.attrs["zero_weight_areas"] = empty
    return out


# ---------------------------------------------------------------- plausible maps


def plausible_maps(model, X, n: int = 4, seed: int = 0, num_features: int = 512) -> np.ndarray:
    """``n`` joint posterior samples of f over the places ``X`` (``n x len(X)``, model space), seeded."""
    return _posterior(model).sample(X, n, seed=seed, num_features=num_features)


# ---------------------------------------------------------------- where to measure next


@dataclass
class Suggestion:
    """Greedy picks: ``index`` into the candidates, ``reduction`` of the weighted mean variance of f over
    the targets per pick (caller units squared), the target-mean variance before/after, and the latent
    variance after all picks at the targets and candidates (``var_after_targets``, ``var_after_candidates``)."""

    index: np.ndarray
    reduction: np.ndarray
    mean_var_before: float
    mean_var_after: float
    var_after_targets: np.ndarray
    var_after_candidates: np.ndarray
    engine: str
    weight_cov: torch.Tensor | None = None  # features engine: the weights' covariance after the picks


def haversine_km(lon1, lat1, lon2, lat2) -> np.ndarray:
    """Great-circle distance in km (broadcasting)."""
    p1, p2 = np.radians(lat1), np.radians(lat2)
    dl = np.radians(np.asarray(lon2) - np.asarray(lon1))
    a = np.sin((p2 - p1) / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dl / 2) ** 2
    return 2 * EARTH_KM * np.arcsin(np.sqrt(np.clip(a, 0.0, 1.0)))


def suggest(model, candidates, targets=None, k: int = 10, *, target_weights=None, min_km: float = 0.0,
            engine: str = "auto", residual_features: int = RESIDUAL_FEATURES, seed: int = 0,
            noise: float | None = None, pred=None, target_pred=None) -> Suggestion:
    """Greedily pick ``k`` of ``candidates`` (``n_C x d``, lon/lat for ``min_km``) that most reduce the
    weighted mean posterior variance of f over ``targets`` (default: the candidates).

    A measurement at ``c`` is ``y = f(c) + eps`` with the model's noise (or ``noise``, caller units^2). Its
    reduction is ``sum_t w_t Cov(f_t, f_c)^2 / (Var f_c + s2)``; after each pick the posterior is
    conditioned on it (a rank-one update). ``min_km`` excludes candidates closer than that to a pick.
    ``pred`` / ``target_pred``: the model's marginal predictions at the candidates / targets when already known
    (a run's stored grid marginals, :func:`grid_prediction`); the Vecchia engine takes their ``var_f`` instead of
    predicting every place again (the other engines get the marginals from their features).
    """
    jp = _posterior(model)
    from gpcore.models import as_2d_float

    Xc = as_2d_float(candidates, "candidates", d=jp.model.d_)
    Xt = Xc if targets is None else as_2d_float(targets, "targets", d=jp.model.d_)
    n_c, n_t = Xc.shape[0], Xt.shape[0]
    if not 1 <= int(k) <= n_c:
        raise InputError(f"k={k} must be between 1 and the number of candidates ({n_c})")
    if n_t == 0:
        raise InputError("the target set is empty; choose another target (the whole region, a stratum, ...)")
    wt = np.full(n_t, 1.0 / n_t) if target_weights is None else np.asarray(target_weights, float)
    if wt.shape != (n_t,) or (wt < 0).any() or wt.sum() <= 0:
        raise InputError(f"target_weights must be {n_t} non-negative numbers with a positive sum")
    wt = wt / wt.sum()
    if engine not in ("auto", "features", "dense"):
        raise InputError(f"engine={engine!r} is not allowed; use auto, features or dense")
    if engine == "auto":
        engine = "dense" if jp.has_residual and n_t * n_c <= DENSE_MAX else "features"
    if isinstance(jp, VecchiaJointPosterior):
        engine = "vecchia"  # the joint Vecchia factor: Monte-Carlo columns plus the exact low-rank part
    if engine == "dense" and n_t * n_c > DENSE_MAX:
        raise InputError(f"the dense engine needs n_targets x n_candidates <= {DENSE_MAX:,} "
                         f"(got {n_t:,} x {n_c:,}); use engine='features' or fewer places")
    s2 = jp.noise_s if noise is None else float(noise) / jp.scale**2
    if min_km and Xc.shape[1] != 2:
        raise InputError("min_km needs (lon, lat) candidates")
    Xcs = jp.model.scale_x(Xc)
    Xts = Xcs if targets is None else jp.model.scale_x(Xt)  # the same tensor: features computed once
    run = {"dense": _greedy_dense, "features": _greedy_features, "vecchia": _greedy_vecchia}[engine]
    known = {}
    if engine == "vecchia":  # marginal variances already known: standardised units, as predict_scaled gives them
        known["v_c"] = None if pred is None else _known_var(pred, n_c, jp.scale, "pred", "candidates")
        known["v_t"] = known["v_c"] if targets is None else (
            None if target_pred is None else _known_var(target_pred, n_t, jp.scale, "target_pred", "targets"))
    res = run(jp, Xcs, Xts, torch.as_tensor(wt), int(k), s2, Xc, float(min_km), residual_features, seed, **known)
    sc2 = jp.scale**2
    res.reduction = res.reduction * sc2
    res.mean_var_before *= sc2
    res.mean_var_after *= sc2
    res.var_after_targets = res.var_after_targets * sc2
    res.var_after_candidates = res.var_after_candidates * sc2
    return res


def _known_var(pred, n: int, scale: float, name: str, what: str) -> torch.Tensor:
    """``pred.var_f`` (caller units^2) of ``n`` places in standardised units, checked."""
    v = np.asarray(getattr(pred, "var_f", None), dtype=float)
    if v.shape != (n,) or not np.isfinite(v).all() or (v < 0).any():
        raise InputError(f"{name}: var_f must be {n} finite non-negative numbers, one per place of the {what}")
    return torch.as_tensor(v / scale**2, dtype=torch.float64)


def _spacing_mask(Xc: np.ndarray, pick: int, min_km: float) -> np.ndarray:
    return haversine_km(Xc[pick, 0], Xc[pick, 1], Xc[:, 0], Xc[:, 1]) < min_km


def _residual_features(jp: JointPosterior, D: int, seed: int):
    """``xi(x)`` (``n x D``): pathwise residual draws with one random feature each, scaled by ``1/sqrt(D)``,
    so that ``xi xi'^T`` is an unbiased estimate of the residual covariance ``k - psi psi'^T``."""
    res = jp.form.residual
    gen = torch.Generator().manual_seed(int(seed) + 7919)
    q = res.cond.shape[1]
    Om = rff_frequencies(res.base, res.lengthscale, q, 1, gen, D)  # D x 1 x q
    ph = torch.rand(D, 1, generator=gen, dtype=torch.float64) * (2.0 * math.pi)
    th = torch.full((D, 1), math.sqrt(2.0 * res.outputscale / D), dtype=torch.float64)
    J = res.cond.double()
    eps = torch.randn(J.shape[0], D, generator=gen, dtype=torch.float64) / math.sqrt(D)
    R = _rff_eval(J, Om, ph, th) + math.sqrt(max(float(res.nu), 0.0)) * eps
    if res.project is not None:
        R = res.project(R)
    Cj = torch.linalg.solve_triangular(res.chol.double(), R, upper=False)  # p x D

    def xi(Xs: torch.Tensor, Psi: torch.Tensor) -> torch.Tensor:
        A = jp.latent_s(Xs)
        return _rff_eval(A, Om, ph, th) - Psi @ Cj

    return xi


def _marginal_var(jp: JointPosterior, Xs: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """Latent variance ``||F^T psi||^2 + (k(x, x) - ||psi||^2)_+`` from already computed features."""
    v = (P @ jp.factor).pow(2).sum(1) + jp.form.white_s(Xs)
    if jp.has_residual:
        v = v + (float(jp.form.residual.outputscale) - P.pow(2).sum(1)).clamp_min(0.0)
    return v


def _greedy_features(jp, Xcs, Xts, wt, k, s2, Xc, min_km, D, seed) -> Suggestion:
    same = Xts is Xcs
    Pc = jp.features_s(Xcs)
    Pt = Pc if same else jp.features_s(Xts)
    # exact marginal variances from the same features (the engine then tracks only their decrease)
    v_c = _marginal_var(jp, Xcs, Pc)
    v_t = v_c if same else _marginal_var(jp, Xts, Pt)
    S = jp.factor @ jp.factor.T
    if jp.has_residual:
        xi = _residual_features(jp, D, seed)
        Pc = torch.cat([Pc, xi(Xcs, Pc)], 1)
        Pt = Pc if same else torch.cat([Pt, xi(Xts, Pt)], 1)
        S = torch.block_diag(S, torch.eye(D, dtype=torch.float64))
    # a place's independent latent variance (white) tells nothing about other places: noise for the picks
    s2 = s2 + jp.form.white_s(Xcs)
    res = _greedy_lowrank(Pc, Pt, S, v_c, v_t, same, wt, k, s2, Xc, min_km, "features")
    res.weight_cov = None if jp.has_residual else res.weight_cov  # only a pure weight covariance is kept
    return res


def _greedy_vecchia(jp, Xcs, Xts, wt, k, s2, Xc, min_km, D, seed, v_c=None, v_t=None) -> Suggestion:
    """Vecchia family: ``Cov ~= G G^T`` with ``G`` from the joint Vecchia factor over candidates and targets together
    (``D`` Monte-Carlo columns, the low-rank part exactly); marginal variances from the model's predictions (``v_c``,
    ``v_t`` when already known, standardised units)."""
    same = Xts is Xcs
    G = jp.lowrank_s(Xcs if same else torch.cat([Xcs, Xts]), D, seed)
    Pc, Pt = G[: Xcs.shape[0]], (G if same else G[Xcs.shape[0]:])
    with torch.no_grad():
        v_c = jp.model.predict_scaled(Xcs)[1].double() if v_c is None else v_c
        v_t = v_c if same else (jp.model.predict_scaled(Xts)[1].double() if v_t is None else v_t)
    eye = torch.eye(G.shape[1], dtype=torch.float64)
    return dataclasses.replace(_greedy_lowrank(Pc, Pt, eye, v_c, v_t, same, wt, k, s2, Xc, min_km, "vecchia"),
                               weight_cov=None)


def _greedy_lowrank(Pc, Pt, S, v_c, v_t, same, wt, k, s2, Xc, min_km, engine) -> Suggestion:
    """Greedy picks for ``Cov = P S P^T`` (candidates ``Pc``, targets ``Pt``), rank-one updates of ``S``."""
    G = Pt.T @ (Pt * wt[:, None])
    U = Pc @ S
    den = (U * Pc).sum(1) + s2
    num = ((U @ G) * U).sum(1)
    allowed = torch.ones(Pc.shape[0], dtype=torch.bool)
    picks, reds = [], []
    dec_c = torch.zeros_like(v_c)
    dec_t = torch.zeros_like(v_t)
    for _ in range(k):
        score = torch.where(allowed, num / den, torch.tensor(-math.inf, dtype=torch.float64))
        c = int(torch.argmax(score))
        if not math.isfinite(float(score[c])):
            break
        eta = float(den[c])
        reds.append(float(num[c]) / eta)
        s = U[c].clone()  # S psi_c (S symmetric)
        Gs = G @ s
        SGs = S @ Gs
        u = Pc @ s
        z = Pc @ SGs
        sGs = float(s @ Gs)
        num = num - 2.0 * u * z / eta + u * u * sGs / eta**2
        den = den - u * u / eta
        U = U - u[:, None] * s[None, :] / eta
        S = S - torch.outer(s, s) / eta
        dec_c += u * u / eta
        dec_t = dec_c if same else dec_t + (Pt @ s) ** 2 / eta
        picks.append(c)
        allowed[c] = False
        if min_km > 0:
            allowed &= ~torch.as_tensor(_spacing_mask(Xc, c, min_km))
    var_t = (v_t - dec_t).clamp_min(0.0)
    return Suggestion(np.asarray(picks, dtype=np.int64), np.asarray(reds), float(wt @ v_t), float(wt @ var_t),
                      var_t.numpy(), (v_c - dec_c).clamp_min(0.0).numpy(), engine, S)


def _greedy_dense(jp, Xcs, Xts, wt, k, s2, Xc, min_km, D, seed) -> Suggestion:
    C = torch.cat([jp.cov_s(Xts[i : i + CHUNK], Xcs) for i in range(0, Xts.shape[0], CHUNK)])  # n_T x n_C
    v_c = jp.marginals_s(Xcs)[1]
    v_t = jp.marginals_s(Xts)[1]
    v_t0 = v_t.clone()
    UC = []
    allowed = torch.ones(Xcs.shape[0], dtype=torch.bool)
    picks, reds = [], []
    for _ in range(k):
        num = (C * C * wt[:, None]).sum(0)
        score = torch.where(allowed, num / (v_c + s2), torch.tensor(-math.inf, dtype=torch.float64))
        c = int(torch.argmax(score))
        if not math.isfinite(float(score[c])):
            break
        eta = float(v_c[c] + s2)
        reds.append(float(num[c]) / eta)
        col_c = jp.cov_s(Xcs, Xcs[c : c + 1])[:, 0]
        for u in UC:
            col_c = col_c - u * u[c]
        u_c = col_c / math.sqrt(eta)
        u_t = C[:, c] / math.sqrt(eta)
        C = C - torch.outer(u_t, u_c)
        v_c = v_c - u_c * u_c
        v_t = v_t - u_t * u_t
        UC.append(u_c)
        picks.append(c)
        allowed[c] = False
        if min_km > 0:
            allowed &= ~torch.as_tensor(_spacing_mask(Xc, c, min_km))
    return Suggestion(np.asarray(picks, dtype=np.int64), np.asarray(reds), float(wt @ v_t0),
                      float(wt @ v_t.clamp_min(0.0)), v_t.clamp_min(0.0).numpy(), v_c.clamp_min(0.0).numpy(), "dense")


def undecided_mask(p_below: np.ndarray, band: tuple[float, float] = UNDECIDED) -> np.ndarray:
    """Places whose exceedance is undecided: ``band[0] < P < band[1]``."""
    p = np.asarray(p_below, float)
    return (p > band[0]) & (p < band[1])
