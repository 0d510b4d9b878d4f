"""The feature form of a model's posterior: what each model's ``_feature_form()`` returns.

Every model writes its posterior over the latent function as ``f(x) = mu0 + psi(x)^T w + g(x)`` with
``w ~ N(m, F F^T)`` and an independent residual ``g ~ GP(0, k - psi psi^T)`` (absent for degenerate kernels).
These dataclasses describe that form in the models' own terms; :mod:`gpcore.posterior` builds the joint
operations (covariances, areas, joint samples) on top of them. Derivation per model: docs/decide.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from gpcore.models.inputs import as_2d_float

#: rows per chunk when computing features
CHUNK = 4096


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
    ``white(xs)`` (``(b,)``, optional) is a latent variance of each place that is independent between distinct
    places (DBK's joint calibration, docs/decide.md): ``Cov`` adds it where two places coincide.
    ``note`` says what the model's form is, for docs and the dashboard.
    """

    features: Callable[[torch.Tensor], torch.Tensor]
    mean: torch.Tensor
    factor: torch.Tensor
    mu0: float
    residual: Residual | None = None
    note: str = ""
    white: Callable[[torch.Tensor], torch.Tensor] | None = None

    @torch.no_grad()
    def white_s(self, Xs: torch.Tensor) -> torch.Tensor:
        """``white`` of scaled inputs (``(n,)`` float64; zeros without one), in chunks."""
        if self.white is None or Xs.shape[0] == 0:
            return torch.zeros(Xs.shape[0], dtype=torch.float64)
        return torch.cat([self.white(Xs[i : i + CHUNK]).double() for i in range(0, Xs.shape[0], CHUNK)])

    def features_s(self, Xs: torch.Tensor) -> torch.Tensor:
        """``psi`` (``n x p``, float64) of scaled inputs, in chunks of :data:`CHUNK` rows."""
        if Xs.shape[0] == 0:
            return torch.zeros(0, self.mean.shape[0], dtype=torch.float64)
        return torch.cat([self.features(Xs[i : i + CHUNK]).double() for i in range(0, Xs.shape[0], CHUNK)])

    def latent_s(self, Xs: torch.Tensor) -> torch.Tensor:
        """The residual's latent inputs ``a(x)`` (float64), in chunks."""
        return torch.cat([self.residual.latent(Xs[i : i + CHUNK]).double() for i in range(0, Xs.shape[0], CHUNK)])

    @torch.no_grad()
    def cov_s(self, X1s: torch.Tensor, X2s: torch.Tensor) -> torch.Tensor:
        """``Cov[f(X1), f(X2)] = Psi1 F F^T Psi2^T + k(A1, A2) - Psi1 Psi2^T`` (standardised units, float64)."""
        P1, P2 = self.features_s(X1s), self.features_s(X2s)
        F = self.factor.double()
        C = (P1 @ F) @ (P2 @ F).T
        if self.residual is not None:
            C = C + self.residual.kernel(self.latent_s(X1s), self.latent_s(X2s)).double() - P1 @ P2.T
        if self.white is not None:  # the same place on both sides
            same = (X1s[:, None, :] == X2s[None, :, :]).all(-1)
            C = C + same * self.white_s(X1s)[:, None]
        return C


class JointPosteriorAPI:
    """``model.posterior_cov(X1, X2)``: the public joint-posterior covariance of every model (mixed into
    :class:`~gpcore.models.base.GPModel`). Feature models answer from their :class:`FeatureForm`; the Vecchia family
    overrides :meth:`_posterior_cov_s` with its joint Vecchia posterior (:mod:`gpcore.models.vecchia_joint`). The
    decision layer's operations on many places (areas, samples, suggestions) are in :mod:`gpcore.posterior`."""

    def posterior_cov(self, X1, X2=None) -> np.ndarray:
        """Joint posterior covariance ``Cov[f(X1), f(X2)]`` of the latent function (``n1 x n2``, target units squared).

        Parameters
        ----------
        X1 : ``n1 x d`` places; X2 : ``n2 x d`` places (default ``X1``: the ``n1 x n1`` covariance matrix).

        Dense, for small sets (``n1 n2`` entries). Its diagonal is ``predict(X).var_f`` for feature models; for
        ``vecchia`` / ``dbk-nn`` it is the joint Vecchia posterior's (docs/decide.md), which conditions on nearby
        new places too and equals the exact GP's when every place conditions on all its predecessors.
        """
        self._check_fitted()
        X1s = self.scale_x(as_2d_float(X1, "X1", d=self.d_))
        X2s = X1s if X2 is None else self.scale_x(as_2d_float(X2, "X2", d=self.d_))
        self.module_.eval()
        with torch.no_grad():
            C = self._posterior_cov_s(X1s, X2s)
        return C.cpu().numpy() * float(self.y_std_) ** 2

    def _posterior_cov_s(self, X1s: torch.Tensor, X2s: torch.Tensor) -> torch.Tensor:
        return self._feature_form().cov_s(X1s, X2s)
