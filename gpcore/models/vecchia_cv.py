"""The cross-validated scale of the Vecchia family's latent variance (setting ``cv_calibration``; docs/calibration.md,
"The latent scale from cross-validation").

After training (and after the validation rows join the conditioning set), every conditioning row is predicted from
the others in ``FOLDS`` folds: folds of rows (``"rows"``), or of whole ``cv_block_km`` squares (``"blocks"``; the
inputs' first two columns are lon, lat), so that the folds hold out what the run's test split holds out. With the
residual ``r_i``, latent variance ``v_i`` and noise variance ``s_i`` of each row, the row's interval
``mean ± z sqrt(c v_i + s_i)`` (``z = z_0.975``) covers it once ``c >= c_i = (r_i^2 / z^2 - s_i) / v_i``, and the
scale ``c`` is the split-conformal quantile of the ``c_i``: the ``ceil((n + 1) 0.95)``-th smallest, clipped to
``[MIN_SCALE, MAX_SCALE]``. The model then multiplies every latent variance and covariance by ``c`` (marginal
``var_f``, the joint posterior's conditional variances ``d`` and low-rank factor ``F``), so that ``var_y = c var_f +
noise``; means are unchanged. Hyperparameters, the neighbour sets and the noise are as fitted.

With ``noise_shape="two_component"`` the same held-out rows fit, by maximum likelihood, the latent scale ``c`` together
with a two-component noise (:mod:`gpcore.models.noise_shape`): a skewed predictive for new observations. That shape
is then stretched by the split-conformal ``k`` that makes its central 95 % intervals cover the held-out rows
(:func:`~gpcore.models.noise_shape.conformal_stretch`; the likelihood's own intervals cover them 95.7-96.7 % on
Ookla's blocks), and the latent posterior is scaled by the stretched ``k^2 c`` as above. Recorded under
``"noise_shape"`` (and the likelihood's shape and ``k``). In a weighted fit each tests-count bin of
:data:`gpcore.metrics.WEIGHT_BINS` then gets its own scale of the noise variance, the smallest that makes the bin's
held-out rows covered at 95 % (:func:`count_scales`: Mondrian split conformal; docs/calibration.md, "A noise scale per
tests count"; recorded under ``"count_scales"``): one shape in units of the noise SD over-covered single measurements
and under-covered tiles of many (docs/benchmarks/weights.md).

For ``dbk-nn`` with its features on, the held-out rows still shaped the feature weights' posterior (only the
residual GP's neighbours leave them out): a refit per fold would cost ``FOLDS`` fits.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from gpcore.metrics import WEIGHT_BINS
from gpcore.models import spacetime as st
from gpcore.models.neighbors import NearestIndex

__all__ = ["FOLDS", "KINDS", "MIN_BIN_ROWS", "SHAPES", "applied", "calibrate", "conformal_scale", "count_bins",
           "count_scales", "cv_residuals", "fold_ids", "latent_scale", "noise_multiplier", "recorded_count_scales",
           "recorded_shape"]

FOLDS = 10
KINDS = ("none", "rows", "blocks")
SHAPES = ("gaussian", "two_component")
LEVEL = 0.95
#: fewest held-out rows of a tests-count bin that get their own noise scale (a smaller bin keeps 1)
MIN_BIN_ROWS = 200
MIN_SCALE, MAX_SCALE = 0.05, 20.0
Z = 1.959963984540054  # the standard normal's 0.975 quantile


class _SubsetIndex:
    """The nearest-neighbour index of the rows ``keep`` of ``coords``; ``query`` answers in indices of all rows."""

    def __init__(self, coords: np.ndarray, keep: np.ndarray, device):
        self.index = NearestIndex(coords[keep], device)
        self.keep = torch.as_tensor(keep, device=self.index.device)

    def query(self, Q: np.ndarray, k: int) -> torch.Tensor:
        return self.keep[self.index.query(Q, k)]


def applied(train_info: dict | None) -> dict | None:
    """The record of :func:`calibrate` in ``train_info`` (a model's ``train_info_`` or a run manifest's
    ``"train_info"``) when it scales the latent variance: a numeric scale fitted on held-out rows. ``None`` without a
    calibration, or when every row was in one fold (nothing held out: scale 1). The one check behind the model's
    variances, a run's metrics before calibration, the app's notes and the benchmarks' logs."""
    cv = train_info.get("cv_calibration") if isinstance(train_info, dict) else None
    if not isinstance(cv, dict) or not cv.get("rows"):
        return None
    scale = cv.get("scale")
    return cv if isinstance(scale, (int, float)) and not isinstance(scale, bool) and math.isfinite(scale) else None


def latent_scale(model) -> float:
    """The fitted scale of the latent variance (1 when the model was not calibrated)."""
    cv = applied(getattr(model, "train_info_", None))
    return 1.0 if cv is None else float(cv["scale"])


def recorded_shape(train_info: dict | None):
    """The :class:`~gpcore.models.noise_shape.NoiseShape` a calibration recorded in ``train_info`` (a model's or a
    run manifest's), or ``None`` (Gaussian noise)."""
    from gpcore.models.noise_shape import NoiseShape

    cv = applied(train_info)
    return None if cv is None else NoiseShape.from_dict(cv.get("noise_shape"))


def count_bins(weights) -> np.ndarray:
    """Each row's tests-count bin, an index into :data:`gpcore.metrics.WEIGHT_BINS` (``w <= 1``, ``1 < w <= 4``,
    ``4 < w <= 16``, ``w > 16``)."""
    edges = [hi for _, _, hi in WEIGHT_BINS[:-1]]
    return np.searchsorted(edges, np.asarray(weights, dtype=float).reshape(-1), side="left")


def count_scales(shape, r, v, s, w, level: float = LEVEL) -> tuple[list[float], list[int]]:
    """The noise scale ``q_b`` of each tests-count bin (Mondrian split conformal, Vovk et al. 2005; docs/calibration.md,
    "A noise scale per tests count"): row ``i`` of bin ``b`` is inside the shape's central ``level`` interval once its
    noise variance is ``s_i`` times at least ``q_i`` (found by bisection in ``log q``), and ``q_b`` is the
    ``ceil((n_b + 1) level)``-th smallest ``q_i`` of the bin's ``n_b`` held-out rows, within ``[MIN_SCALE,
    MAX_SCALE]``; a bin with fewer than :data:`MIN_BIN_ROWS` rows keeps 1. ``v`` are unscaled latent variances (the
    shape's ``c`` applies). Returns the scales and the bins' row counts."""
    r, v, s, w = (np.asarray(a, dtype=float).reshape(-1) for a in (r, v, s, w))
    bins = count_bins(w)
    var_f = shape.latent_scale * v
    tail = (1.0 - level) / 2.0

    def inside(q):  # r is inside the central interval iff its CDF value is within the tails
        p = shape.cdf(r, var_f, s * q)
        return (p >= tail) & (p <= 1.0 - tail)

    lo_q, hi_q = np.full(r.size, math.log(MIN_SCALE)), np.full(r.size, math.log(MAX_SCALE))
    for _ in range(40):  # per row: the smallest q whose interval holds r (the interval widens with q)
        mid = 0.5 * (lo_q + hi_q)
        ins = inside(np.exp(mid))
        lo_q, hi_q = np.where(ins, lo_q, mid), np.where(ins, mid, hi_q)
    q = np.where(inside(MAX_SCALE), np.exp(hi_q), np.inf)
    scales, rows = [], []
    for k in range(len(WEIGHT_BINS)):
        qb = np.sort(q[bins == k])
        rows.append(int(qb.size))
        if qb.size < MIN_BIN_ROWS:
            scales.append(1.0)
            continue
        scales.append(float(np.clip(qb[min(math.ceil((qb.size + 1) * level), qb.size) - 1], MIN_SCALE, MAX_SCALE)))
    return scales, rows


def recorded_count_scales(train_info: dict | None) -> list[float] | None:
    """The noise scales per tests-count bin that :func:`calibrate` recorded (``"count_scales"``), one per bin of
    :data:`~gpcore.metrics.WEIGHT_BINS`; ``None`` without them or when the record is malformed (then nothing is
    scaled). The one reading behind the model's noise and the app's note."""
    cv = applied(train_info)
    rec = cv.get("count_scales") if cv is not None else None
    scales = rec.get("scales") if isinstance(rec, dict) else None
    if not isinstance(scales, list) or len(scales) != len(WEIGHT_BINS):
        return None
    ok = all(isinstance(q, (int, float)) and not isinstance(q, bool) and math.isfinite(q) and q > 0 for q in scales)
    return [float(q) for q in scales] if ok else None


def noise_multiplier(train_info: dict | None, weights, m: int) -> np.ndarray | float:
    """The factor of each of ``m`` rows' noise variance from :func:`count_scales` (:func:`recorded_count_scales`):
    its bin's scale (``weights=None``: one measurement); 1 without them."""
    rec = recorded_count_scales(train_info)
    if rec is None:
        return 1.0
    scales = np.asarray(rec, dtype=float)
    if weights is None:
        return float(scales[0])
    return scales[count_bins(np.broadcast_to(np.asarray(weights, dtype=float), (m,)))]


def caller_inputs(model) -> np.ndarray:
    """The conditioning rows' inputs (``mod.X_train``, ordered) in the caller's units."""
    Xs = model.module_.X_train.detach().double().cpu().numpy()
    return model.x_lo_ + (Xs + 1.0) * model.x_span_ / 2.0


def fold_ids(model, kind: str, block_km: float, seed: int) -> np.ndarray:
    """The fold (``0 .. FOLDS - 1``) of each ordered conditioning row: rows at random, or whole blocks at random."""
    n = model.module_.X_train.shape[0]
    rng = np.random.default_rng(seed)
    if kind == "rows":
        return rng.permutation(n) % FOLDS
    from gpcore.data.splits import block_ids

    X = caller_inputs(model)
    ids = block_ids(X[:, 0], X[:, 1], block_km)
    return (rng.permutation(int(ids.max()) + 1) % FOLDS)[ids]


@torch.no_grad()
def cv_residuals(model, folds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(r, v, s)`` per ordered conditioning row, in caller units: the residual of its prediction from the rows of
    the other folds, its latent variance (times the model's scale if it has one: :func:`calibrate` removes it first)
    and its noise variance (its own weight)."""
    mod = model.module_
    X, n = caller_inputs(model), mod.X_train.shape[0]
    y = mod.y_train.double().cpu().numpy() * model.y_std_ + model.y_mean_
    w = mod.w_train.double().cpu().numpy() if model.weighted else None
    coords = st.metric_coords(mod, mod.X_train)
    r, v = np.full(n, np.nan), np.full(n, np.nan)
    saved = model._tree
    try:
        for k in range(FOLDS):
            out, keep = np.flatnonzero(folds == k), np.flatnonzero(folds != k)
            if out.size == 0 or keep.size == 0:
                continue
            model._tree = _SubsetIndex(coords, keep, mod.X_train.device)  # _prediction_neighbors queries it
            p = model.predict(X[out], weights=None if w is None else w[out])
            r[out], v[out] = y[out] - p.mean, p.var_f
    finally:
        model._tree = saved
    s = model.likelihood.observation_noise(w, n, model.y_std_**2, type(model).__name__)
    return r, v, np.broadcast_to(np.asarray(s, dtype=np.float64), (n,)).copy()


def conformal_scale(r: np.ndarray, v: np.ndarray, s: np.ndarray, level: float = LEVEL) -> float:
    """The smallest ``c`` whose intervals ``± z sqrt(c v + s)`` cover the split-conformal share of the rows (the
    ``ceil((n + 1) level)``-th smallest ``c_i``; ``inf`` when not reachable), unclipped."""
    ok = np.isfinite(r)
    r, v, s = r[ok], v[ok], s[ok]
    need = r * r / Z**2 - s
    with np.errstate(divide="ignore", invalid="ignore"):
        ci = np.where(need <= 0, 0.0, np.where(v > 0, need / v, np.inf))
    n = ci.size
    if n == 0:
        return 1.0
    return float(np.sort(ci)[min(math.ceil((n + 1) * level), n) - 1])


def calibrate(model) -> dict:
    """Fit the latent scale of a fitted model by its ``cv_calibration`` setting; recorded (and returned) in
    ``train_info_["cv_calibration"]``: the folds, the rows, the cross-validated coverage before and after, the
    scale (unclipped as ``raw_scale``). Rows all in one fold (one block) leave nothing to hold out: scale 1, 0 rows."""
    cfg, mod = model.config, model.module_
    model.train_info_.pop("cv_calibration", None)  # predict unscaled
    folds = fold_ids(model, cfg.cv_calibration, cfg.cv_block_km, cfg.seed)
    r, v, s = cv_residuals(model, folds)
    raw = conformal_scale(r, v, s)
    ok = np.isfinite(r)  # rows whose fold had other folds to predict from (all, unless every row is in one fold)
    c = float(np.clip(raw, MIN_SCALE, MAX_SCALE)) if ok.any() else 1.0

    def coverage(scale: float) -> float | None:
        return float(np.mean(np.abs(r[ok]) <= Z * np.sqrt(scale * v[ok] + s[ok]))) if ok.any() else None

    info = {"folds": cfg.cv_calibration, "k": FOLDS, "rows": int(ok.sum()), "coverage_before": coverage(1.0),
            "coverage_after": coverage(c), "scale": c, "raw_scale": raw if math.isfinite(raw) else None}
    if cfg.noise_shape == "two_component" and ok.sum() >= 10:
        from gpcore.models import noise_shape

        ml, loglik = noise_shape.fit(r[ok], v[ok], s[ok], (MIN_SCALE, MAX_SCALE))
        k = noise_shape.conformal_stretch(ml, r[ok], v[ok], s[ok], LEVEL)
        shape = ml.stretched(k)
        shape = replace(shape, latent_scale=float(np.clip(shape.latent_scale, MIN_SCALE, MAX_SCALE)))
        s_used = s[ok]
        if model.weighted:  # a noise scale per tests-count bin (Mondrian split conformal), on the shape's noise
            w = mod.w_train.double().cpu().numpy()[ok]
            scales, rows = count_scales(shape, r[ok], v[ok], s[ok], w)
            info["count_scales"] = {"bins": [b[0] for b in WEIGHT_BINS], "scales": scales, "rows": rows}
            s_used = s_used * np.asarray(scales)[count_bins(w)]
        lo, hi = shape.interval(LEVEL, shape.latent_scale * v[ok], s_used)
        info.update(scale=shape.latent_scale, noise_shape=shape.to_dict(), likelihood_shape=ml.to_dict(),
                    stretch=k, cv_loglik=loglik, coverage_after=float(np.mean((r[ok] >= lo) & (r[ok] <= hi))))
    if cfg.cv_calibration == "blocks":
        info["block_km"] = float(cfg.cv_block_km)
    model.train_info_["cv_calibration"] = info
    model.forget_joint()  # a joint posterior built before carries the old scale
    return info
