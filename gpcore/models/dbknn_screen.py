"""dbk-nn's feature screen: do the DBK features help at the residual fit's covariance shape? (docs/methods/dbknn.md,
"The screen before the hybrid fit").

After the feature check's residual-only fit, the hybrid likelihood is restricted to the family

    Sigma_r = c Sigma_r0,   f = mu0 + a phi^T w + r,

``Sigma_r0`` the fitted residual-plus-noise covariance (its lengthscales, the ratio of outputscale to noise and nugget,
``mu0`` fixed) and ``(a, c)`` free. The Vecchia approximation scales with ``c`` exactly (``B`` is unchanged, ``Dv``
is multiplied by ``c``), so with ``U0 = Dv0^{-1/2} B Phi``, ``u0 = Dv0^{-1/2} B (y - mu0)``, ``S0 = U0^T U0 = V diag(l)
V^T``, ``h = (V^T U0^T u0)^2`` and ``t = a^2 / c``, one pass over the rows gives the whole family in closed form:

    log p(y | a, c) = -n/2 log 2 pi - 1/2 (sum log Dv0 + n log c) - 1/2 sum_k log(1 + t l_k)
                      - 1/(2c) (|u0|^2 - t sum_k h_k / (1 + t l_k)),

whose maximum over ``c`` for a given ``t`` is ``c(t) = q(t) / n``, ``q(t)`` the bracket: a one-dimensional search over
``t`` (``t = 0``: the residual fit itself). The screen puts the best ``(a, c)`` into the model and scores it on the
validation rows. The full hybrid (every residual hyperparameter free) is fitted, from there, only when ``a > 0`` and
that validation NLL is below the residual fit's by more than ``screen_se`` paired standard errors of the per-row
differences (:func:`screen_passes`); otherwise the features showed no gain at the fitted shape that the validation
rows can see, and are dropped without it. (With ``a = 0`` the screen's point is the residual GP rescaled by ``c``: a
validation gain there is the scale's, not the features'.)
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from gpcore.models import training
from gpcore.models.linalg import inv_softplus
from gpcore.models.terms import every_term


def screen_sums(model, ws=None) -> tuple[np.ndarray, np.ndarray, float, float, int]:
    """``(l, h, |u0|^2, sum log Dv0, n)`` of the module docstring at the model's current residual hyperparameters
    (one pass over the training rows, no graph; the features must be on, at any scale ``a > 0``)."""
    mod = model.module_
    with torch.no_grad(), every_term(model):  # one pass over every row, also above likelihood_points (unbiased)
        a0 = float(mod.fscale)
        S, c, uu, ld = model._stats(model._phi_train(), ws)
        S0, g0 = S / a0**2, c / a0
        lam, V = torch.linalg.eigh(S0)
        h = (V.T @ g0).pow(2)
    return lam.clamp_min(0.0).cpu().numpy(), h.cpu().numpy(), float(uu), float(ld), int(mod.X_train.shape[0])


def profile_loglik(t: float, lam, h, uu: float, ld: float, n: int) -> tuple[float, float]:
    """``(log p(y | t, c(t)), c(t))``: the restricted hybrid log-likelihood at ``t = a^2 / c``, maximised over ``c``."""
    d = 1.0 + t * lam
    q = max(uu - t * float((h / d).sum()), 1e-300)
    c = q / n
    return -0.5 * n * math.log(2 * math.pi) - 0.5 * (ld + n * math.log(c)) - 0.5 * float(np.log(d).sum()) - 0.5 * n, c


def best_scale(lam, h, uu: float, ld: float, n: int) -> tuple[float, float, float]:
    """``(a, c, log p)`` maximising the restricted log-likelihood: ``t = 0`` against a bounded search of ``log t``."""
    from scipy.optimize import minimize_scalar

    f = lambda s: -profile_loglik(math.exp(s), lam, h, uu, ld, n)[0]  # noqa: E731
    lo, hi = -25.0, 15.0
    grid = np.linspace(lo, hi, 41)
    k = int(np.argmin([f(s) for s in grid]))
    r = minimize_scalar(f, bounds=(grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]), method="bounded",
                        options={"xatol": 1e-6})
    t = math.exp(float(r.x))
    ll, c = profile_loglik(t, lam, h, uu, ld, n)
    ll0, c0 = profile_loglik(0.0, lam, h, uu, ld, n)
    if ll - ll0 <= 1e-9 * n:  # no gain beyond rounding: the features get a = 0 exactly (the screen then skips)
        return 0.0, c0, ll0
    return math.sqrt(t * c), c, ll


def apply_scale(model, a: float, c: float) -> None:
    """Set the features' scale to ``a`` and multiply the residual's outputscale, noise and nugget by ``c``."""
    mod = model.module_
    with torch.no_grad():
        mod.raw_fscale.fill_(inv_softplus(a) if a > 0 else -1e4)
        mod.raw_outputscale.fill_(inv_softplus(float(mod.outputscale) * c))
        mod.raw_noise.fill_(inv_softplus(max(float(mod.noise) * c - mod.noise_floor, 1e-12)))
        if hasattr(mod, "raw_nugget"):
            mod.raw_nugget.fill_(inv_softplus(max(float(model._nugget_s()) * c, 1e-12)))


def screen_features(model, Xs, ys, Xv, yv, ws=None, wv=None) -> dict:
    """Fit ``(a, c)`` (module docstring), leave the model there and return ``a``, ``c``, the restricted
    log-likelihood per row against the residual fit's (``t = 0``), the validation NLL there and the residual fit's
    (features off), the paired standard error of their per-row difference (``gain_se``) and the seconds."""
    t0 = time.perf_counter()
    lam, h, uu, ld, n = screen_sums(model, ws)
    a, c, ll = best_scale(lam, h, uu, ld, n)
    mod = model.module_
    mod.features_on = False  # the residual fit's own validation rows, for the paired comparison
    try:
        val0, _, rows0 = training.validation_metrics(model, Xs, ys, Xv, yv, ws, wv, rows=True)
    finally:  # an interrupted pass leaves the model as the caller had it
        mod.features_on = True
    apply_scale(model, a, c)  # phi does not depend on (a, c): the cached features stay valid
    val, _, rows = training.validation_metrics(model, Xs, ys, Xv, yv, ws, wv, rows=True)
    ll0 = profile_loglik(0.0, lam, h, uu, ld, n)[0]
    return {"a": a, "c": c, "loglik_gain_per_row": (ll - ll0) / n, "val_nll": val, "residual_val_nll": val0,
            "gain_se": training.paired_se(rows, rows0), "seconds": time.perf_counter() - t0}


def screen_passes(screen: dict, se: float) -> bool:
    """Whether the screen calls for the full hybrid fit: features at ``a > 0`` whose validation gain over the residual
    fit exceeds ``se`` paired standard errors (and 0)."""
    gain = screen["residual_val_nll"] - screen["val_nll"]
    return screen["a"] > 0 and gain > max(se * screen["gain_se"], 0.0)
