"""The joint posterior of pairs of places, each pair conditioned on one shared set of training responses.

For a ``vecchia`` model and pairs of places ``(x1_i, x2_i)`` (a change map: the same place at two times), the pair's
posterior is the exact GP's given the responses of ``U_i = N(x1_i) u N(x2_i)``, the union of both places' prediction
neighbours (``pred_neighbors``, default ``3m/2`` each, in the model's space-time metric):

    [f(x1), f(x2)] | y_U  ~  N(mu + K_xU C^{-1} (y_U - mu_U),  K_xx - K_xU C^{-1} K_Ux),   C = K_UU + S,

with ``S`` the training noise (``tau^2 + s2 / w`` in a weighted fit), the covariance times ``cv_calibration``'s latent
scale as every other latent variance of the model. It is one ``|U|``-square Cholesky per pair, batched.

``dbk-nn`` with its features: ``f = a phi(x)^T w + r(x)`` with the weights' posterior ``w ~ N(w_hat, F F^T)`` (from
all rows) independent of the residual GP ``r`` given the hyperparameters (docs/decide.md, "Joint posterior of vecchia
and dbk-nn"). The residual is conditioned as above on ``e = y - mu0 - a Phi w_hat``, and the weights' uncertainty
enters through ``q(x) = a phi(x) - K_xU C^{-1} a Phi_U``: mean ``+ a phi(x) w_hat``, covariance
``+ (q F)(q F)^T``, as in the model's marginal predictions. Without the features (dropped by the feature check) it
is the ``vecchia`` case.

Why not the joint Vecchia factor (:mod:`gpcore.models.vecchia_joint`): there the second place of a pair conditions on
the first place's latent value and its own training neighbours, which is the conditional of no data set; the change's
variance it implies comes out wider than the exact posterior's (docs/benchmarks/spacetime.md). A conditional on a
subset of the data is an exact posterior: with the true hyperparameters its ``P(f(x2) > f(x1))`` is calibrated for any
``U`` chosen from the inputs alone, and at ``pred_neighbors >= n`` it is the exact GP's. Formula, cost and limits:
docs/methods/spacetime.md, "The change posterior".
"""

from __future__ import annotations

import numpy as np
import torch

from gpcore.models import spacetime as st
from gpcore.models import vecchia_cv
from gpcore.models.linalg import psd_safe_cholesky


def supports(model) -> bool:
    """Whether ``model`` has this pair posterior: a fitted Vecchia GP (``vecchia``, ``dbk-nn`` with or without its
    features)."""
    from gpcore.models.vecchia import VecchiaGP

    return isinstance(model, VecchiaGP) and getattr(model, "module_", None) is not None


def _union(N1: torch.Tensor, N2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's training indices ``N1 u N2`` (``b x 2k``, sorted) and which entries are not repeats."""
    U, _ = torch.sort(torch.cat([N1, N2], dim=1), dim=1)
    first = torch.ones_like(U, dtype=torch.bool)
    first[:, 1:] = U[:, 1:] != U[:, :-1]
    return U, first


def _fixed(model) -> tuple:
    """What every chunk of pairs shares: the training residuals ``e`` the places condition on, the low-rank part
    (``dbk-nn``'s features; None for the Vecchia GP) and the latent scale."""
    return model._joint_residuals(), model._joint_lowrank(), vecchia_cv.latent_scale(model)


def pair_neighbors(model, X1, X2) -> tuple[torch.Tensor, torch.Tensor]:
    """Both places' prediction neighbours (``n x k`` training indices each) of pairs at places in the caller's units.
    They depend on the places alone (the model's fixed search metric), not on the hyperparameters: draws of the
    hyperparameters share them (:func:`gpcore.run.change.change_posterior`)."""
    from gpcore.models.inputs import as_2d_float

    model._check_fitted()
    return tuple(model._prediction_neighbors(model.scale_x(as_2d_float(X, name, d=model.d_)))
                 for X, name in ((X1, "X1"), (X2, "X2")))


@torch.no_grad()
def pair_moments_s(model, X1s: torch.Tensor, X2s: torch.Tensor, fixed: tuple | None = None,
                   neighbors: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Means (``b x 2``) and covariances (``b x 2 x 2``) of ``[f(x1_i), f(x2_i)]`` at scaled places (``b x d`` each),
    in the model's scaled target units, float64 (module docstring). ``fixed``: :func:`_fixed` of the model when the
    caller holds it for many chunks (``None``: computed here); ``neighbors``: the places' :func:`pair_neighbors` rows
    when the caller has them (``None``: searched here)."""
    from gpcore.models.vecchia import group_covariance

    mod = model.module_
    e_train, lowrank, scale = _fixed(model) if fixed is None else fixed
    N1, N2 = neighbors or (model._prediction_neighbors(X1s), model._prediction_neighbors(X2s))
    U, valid = _union(N1, N2)
    b, k = U.shape
    x = torch.stack([X1s, X2s], dim=1).double()  # b x 2 x d
    Xg = torch.cat([mod.X_train[U].double(), x], dim=1)
    noise_t = model._group_noise(U)
    noise_t = mod.noise.double().expand(U.shape) if noise_t is None else noise_t.double()
    noise = torch.cat([noise_t, torch.zeros(b, 2, dtype=torch.float64, device=U.device)], dim=1)
    valid = torch.cat([valid, torch.ones(b, 2, dtype=torch.bool, device=U.device)], dim=1)
    G = group_covariance(mod, Xg, valid, noise)  # [K_UU + S, K_Ux; K_xU, K_xx]
    L = psd_safe_cholesky(G[:, :k, :k])
    e = torch.where(valid[:, :k], e_train[U], 0.0)
    v = torch.linalg.solve_triangular(L, e.unsqueeze(-1), upper=False)  # b x k x 1
    W = torch.linalg.solve_triangular(L, G[:, :k, k:], upper=False)  # L^{-1} K_Ux: b x k x 2
    Wt = W.transpose(-1, -2)
    mean = st.prior_mean(mod, x) + (Wt @ v).squeeze(-1)  # mu0 (a scalar) or mu0 + b t (b x 2)
    # no Cholesky of the pair's own 2 x 2 block: the same place twice gives a zero change variance, not a jitter
    cov = (G[:, k:, k:] - Wt @ W) * scale
    if lowrank is not None:  # dbk-nn's features: f = a phi(x)^T w + r(x), w ~ N(w_hat, F F^T) independent of r
        aPhi_T, aphi, w_hat, F = lowrank  # F calibrated by the latent scale already
        Bt = torch.linalg.solve_triangular(L.transpose(-1, -2), W, upper=True).transpose(-1, -2)  # K_xU C^{-1}
        ap = aphi(torch.stack([X1s, X2s], dim=1).reshape(2 * b, -1)).reshape(b, 2, -1).double()  # model's dtype in
        q = ap - Bt @ aPhi_T.double()[U]  # b x 2 x r (padding rows of U carry zero weight)
        mean = mean + ap @ w_hat.double()  # the residuals e already hold a Phi w_hat
        qF = q @ F.double()
        cov = cov + qF @ qF.transpose(-1, -2)
    return mean, cov


def pair_moments(model, X1, X2, chunk: int | None = None,
                 neighbors: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`pair_moments_s` at places ``X1``, ``X2`` in the caller's units (``n x d`` each; row ``i`` of both is
    pair ``i``): means ``n x 2`` and covariances ``n x 2 x 2`` in the caller's target units, ``chunk`` pairs per
    batched Cholesky (default the config's ``prediction_chunk``: 128 on the CPU, where 36,785 pairs take 6.1 s against
    13 s in chunks of 2,048 on one thread). ``neighbors``: :func:`pair_neighbors` of ``X1, X2`` when the caller has
    them (the same for every draw of the hyperparameters)."""
    from gpcore.models.inputs import as_2d_float

    model._check_fitted()
    X1 = as_2d_float(X1, "X1", d=model.d_)
    X2 = as_2d_float(X2, "X2", d=model.d_)
    if X1.shape != X2.shape:
        raise ValueError(f"X1 and X2 must pair up row by row, got {X1.shape} and {X2.shape}")
    n = X1.shape[0]
    if neighbors is not None and not len(neighbors[0]) == len(neighbors[1]) == n:
        raise ValueError(f"neighbors must have a row per pair ({n}), got {len(neighbors[0])} and {len(neighbors[1])}")
    chunk = chunk or model.config.prediction_chunk(model.module_.X_train.device.type)
    mean, cov = np.empty((n, 2)), np.empty((n, 2, 2))
    model.module_.eval()
    fixed = _fixed(model)
    for i in range(0, n, chunk):
        nb = None if neighbors is None else (neighbors[0][i : i + chunk], neighbors[1][i : i + chunk])
        m, c = pair_moments_s(model, model.scale_x(X1[i : i + chunk]), model.scale_x(X2[i : i + chunk]), fixed, nb)
        mean[i : i + chunk], cov[i : i + chunk] = m.cpu().numpy(), c.cpu().numpy()
    return mean * model.y_std_ + model.y_mean_, cov * float(model.y_std_) ** 2
