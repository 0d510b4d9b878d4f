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
``"noise_shape"`` (and the likelihood's shape and ``k``).

For ``dbk-nn`` with its features on, the held-out rows still shaped the feature weights' posterior (only the
residual GP's neighbours leave them out): a refit per fold would cost ``FOLDS`` fits.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from gpcore.models import spacetime as st
from gpcore.models.neighbors import NearestIndex

__all__ = ["FOLDS", "KINDS", "SHAPES", "applied", "calibrate", "conformal_scale", "cv_residuals", "fold_ids",
           "latent_scale", "recorded_shape"]

FOLDS = 10
KINDS = ("none", "rows", "blocks")
SHAPES = ("gaussian", "two_component")
LEVEL = 0.95
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
    cfg = model.config
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
        shape = noise_shape.NoiseShape(float(np.clip(shape.latent_scale, MIN_SCALE, MAX_SCALE)), shape.c1, shape.c2,
                                       shape.pi, shape.offset)
        lo, hi = shape.interval(LEVEL, shape.latent_scale * v[ok], s[ok])
        info.update(scale=shape.latent_scale, noise_shape=shape.to_dict(), likelihood_shape=ml.to_dict(),
                    stretch=k, cv_loglik=loglik, coverage_after=float(np.mean((r[ok] >= lo) & (r[ok] <= hi))))
    if cfg.cv_calibration == "blocks":
        info["block_km"] = float(cfg.cv_block_km)
    model.train_info_["cv_calibration"] = info
    model.forget_joint()  # a joint posterior built before carries the old scale
    return info
