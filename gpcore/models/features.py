"""The feature form of a model's posterior: what each model's ``_feature_form()`` returns.

Every model writes its posterior over the latent function as ``f(x) = mu0 + psi(x)^T w + g(x)`` with
``w ~ N(m, F F^T)`` and an independent residual ``g ~ GP(0, k - psi psi^T)`` (absent for degenerate kernels).
These dataclasses describe that form in the models' own terms; :mod:`gpcore.posterior` builds the joint
operations (covariances, areas, joint samples) on top of them. Derivation per model: docs/decide.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Residual:
    """The part of the prior outside the features: ``g ~ GP(0, k(a, a') - psi^T psi')`` (see module doc).

    Attributes
    ----------
    latent : ``x (b x d, scaled) -> a(x) (b x q)``, the base kernel's inputs (identity, or a backbone).
    kernel : ``(a1, a2) -> k`` (``n1 x n2``, float64), the prior kernel on latent inputs.
    base : ``"rbf" | "matern12" | "matern32" | "matern52"`` and ``lengthscale`` (``(q,)`` or ``(1,)``),
        ``outputscale`` (scalar): the stationary base kernel, for random features.
    cond : ``J`` in latent coordinates (``|J| x q``); ``chol``: ``L_J`` (``p x p``, lower, float64);
        ``nu``: the variance added to ``K_JJ`` (jitter or the noise); ``project``: ``T^T`` as a
        function ``(|J| x s) -> (p x s)``, ``None`` for the identity.
    """

    latent: Callable[[torch.Tensor], torch.Tensor]
    kernel: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    base: str
    lengthscale: torch.Tensor
    outputscale: float
    cond: torch.Tensor
    chol: torch.Tensor
    nu: float
    project: Callable[[torch.Tensor], torch.Tensor] | None = None


@dataclass
class FeatureForm:
    """``f = mu0 + psi^T w + g``, ``w ~ N(mean, factor factor^T)``, ``g`` the :class:`Residual` (or none).

    ``features(xs)`` maps scaled inputs (``b x d``) to ``psi`` (``b x p``, float64); ``factor`` is
    ``p x q`` (``q = 0`` when the weights are not random, as for the exact GP); standardised units.
    ``note`` says what the model's form is, for docs and the dashboard.
    """

    features: Callable[[torch.Tensor], torch.Tensor]
    mean: torch.Tensor
    factor: torch.Tensor
    mu0: float
    residual: Residual | None = None
    note: str = ""
