"""Every labelled row in the posterior, for the weight-space models (DBK, SVGP, PPGP): after training, the
validation rows update the weight posterior ``q(w)`` by Bayes' rule (docs/calibration.md, "Validation rows in
the posterior").

The validation rows first stop training and fit any recalibration or joint calibration; then, with
``f(x) = mu0 + phi(x)^T w + g(x)`` and ``q(w) = N(m, F F^T)``, each validation target is an observation

    y_v = mu0 + phi_v^T w + e_v,     e_v ~ N(0, D_v),   D_v = noise_v + (var_f(x_v) - |phi_v^T F|^2),

where ``noise_v`` is the row's noise variance (``tau^2 + s2 / w_v`` in a weighted fit) and the bracket is the part
of the latent variance outside the weights (SVGP's Nyström residual; zero for DBK), treated as independent between
rows. With ``G = Phi_v F`` and ``M = I + G^T D^{-1} G`` the conjugate update is

    m' = m + F M^{-1} G^T D^{-1} (y_v - E[y_v]),      F' F'^T = F M^{-1} F^T,

the posterior of ``w`` given the training rows (as ``q`` summarises them) and the validation rows. For DBK's exact
objective (``mml``) ``q`` is the exact posterior given the training rows, so the update equals that posterior
given training and validation rows (a test checks it). Hyperparameters and features do not change (no refit: a
refit on training + validation rows that stops on the same validation rows leaks).
"""

from __future__ import annotations

import torch

__all__ = ["condition_weights", "update_weights", "validation_into_posterior"]

_CHUNK = 4096


@torch.no_grad()
def condition_weights(model, Xs: torch.Tensor, ys: torch.Tensor,
                      ws: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m', S')`` of the weight posterior after the rows ``(Xs, ys)`` (scaled inputs, standardised targets;
    ``ws`` their weights in a weighted fit), float64, from ``model._weight_posterior()`` =
    ``(features, m, F)``."""
    features, m, F = model._weight_posterior()
    m, F = m.detach().double(), F.detach().double()
    Phi = torch.cat([features(Xs[i : i + _CHUNK]).double() for i in range(0, Xs.shape[0], _CHUNK)])
    mean, var_f = model.predict_scaled(Xs)
    G = Phi @ F  # n x q
    outside = (var_f.double() - G.pow(2).sum(1)).clamp_min(0.0)  # latent variance outside the weights
    noise = model.likelihood.variance(ws, model.module_.noise.double())
    D = outside + noise
    q = F.shape[1]
    GD = G / D[:, None]
    M = torch.eye(q, dtype=torch.float64, device=G.device) + GD.T @ G
    LM = torch.linalg.cholesky(M)
    r = ys.double() - mean.double()
    m_new = m + F @ torch.cholesky_solve((GD.T @ r).unsqueeze(-1), LM).squeeze(-1)
    FL = torch.linalg.solve_triangular(LM, F.T, upper=False).T  # F L_M^{-T}
    S_new = FL @ FL.T
    return m_new, 0.5 * (S_new + S_new.T)


def upper_factor(S: torch.Tensor) -> torch.Tensor:
    """Upper triangular ``U`` with ``U U^T = S`` (the reversed-order Cholesky factor)."""
    P = torch.flip(torch.eye(S.shape[0], dtype=S.dtype, device=S.device), [0])
    return P @ torch.linalg.cholesky(P @ S @ P) @ P


def validation_into_posterior(model, X_val, y_val, val_weights=None) -> None:
    """After training and calibration: with the model's ``condition_on_validation`` setting, put the validation rows
    into its weight posterior (:func:`update_weights`)."""
    if (not model.config.condition_on_validation or X_val is None or not len(X_val)
            or model.train_info_.get("cancelled")):
        return
    update_weights(model, X_val, y_val, val_weights)
    model.train_info_["validation_in_posterior"] = len(X_val)


def update_weights(model, X, y, weights=None) -> None:
    """Bayes' rule on the fitted ``model``'s weight posterior with the rows ``(X, y)`` (caller units; ``weights`` in a
    weighted fit): :func:`condition_weights`, then ``model._set_weight_posterior``."""
    from gpcore.models.inputs import as_1d_float, as_2d_float, as_weights

    X = as_2d_float(X, "X", d=model.d_)
    y = as_1d_float(y, X.shape[0], "y")
    ws = model._to_tensor(as_weights(weights, X.shape[0], "weights")) if model.weighted else None
    model._set_weight_posterior(*condition_weights(model, model.scale_x(X), model.scale_y(y), ws))
