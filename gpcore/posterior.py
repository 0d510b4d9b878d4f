"""The joint posterior of every model in one *feature form*, and the joint operations built on it.

Every gpcore model writes its posterior over the latent function as

    f(x) = mu0 + psi(x)^T w + g(x),      w ~ N(m, F F^T),      g ~ GP(0, k(x, x') - psi(x)^T psi(x'))

with ``w`` and ``g`` independent (standardised target units, scaled inputs):

* ``psi(x) in R^p`` — the model's features (``p = r`` basis functions or inducing points);
* ``N(m, F F^T)`` — the Gaussian posterior (or variational ``q``) over their weights;
* ``g`` — what remains outside the features: the **residual** of the prior kernel ``k`` after the
  features, ``k - psi psi^T``. It is *absent* for degenerate kernels (DBK, SoftKI: ``k = psi psi^T``)
  and *correlated* between nearby places for the Nyström family (SVGP, PPGP, SV-DKL, PP-DKL, SOLVE-GP);
  it is never treated as independent noise here. The exact GP and CaGP are the special case
  ``F = 0`` with ``psi(x) = L_J^{-1} T^T k(J, x)`` (their whole posterior is a downdated prior).

Each model's ``_feature_form()`` (in its own file, derived from its posterior on its docs/methods/ page)
returns a :class:`~gpcore.models.features.FeatureForm`; the residual is described by a
:class:`~gpcore.models.features.Residual`: the prior kernel on the base kernel's inputs ``a(x)``, and the
*conditioning set* ``J`` (inducing points, or the training inputs), the map ``T^T`` (identity, or CaGP's
actions ``S^T``) and the Cholesky factor ``L_J`` with ``L_J L_J^T = T^T (K_JJ + nu I) T`` such that
``psi(x) = L_J^{-1} T^T k(J, x)``. Then ``g(x) = h(x) - psi(x)^T L_J^{-1} T^T (h(J) + sqrt(nu) eps)`` for a
prior draw ``h ~ GP(0, k)`` has exactly the covariance ``k - psi psi^T``: this is pathwise conditioning
(Wilson et al. 2020), and with ``h`` drawn
as random Fourier features of the base kernel — fresh frequencies for every sample, so the sample covariance
is unbiased for ``k`` itself — a joint sample over ``n`` places costs ``O(n (p + D))``.

Operations (:class:`JointPosterior`; caller units in and out, float64):

* :meth:`JointPosterior.cov` — ``Sigma(X1, X2) = Psi1 F F^T Psi2^T + k(A1, A2) - Psi1 Psi2^T`` (small sets);
* :meth:`JointPosterior.marginals` — the same diagonal, consistent with ``model.predict``;
* :meth:`JointPosterior.linear` — mean and variance of weighted sums ``sum_i w_i f(x_i)`` for many
  (sparse) weight vectors at once: ``w^T m`` and ``||F^T Psi^T w||^2 + w^T K w - ||Psi^T w||^2`` with the
  residual part in ``O(n_a^2)`` kernel evaluations per area of ``n_a`` places (never ``n x n``);
* :meth:`JointPosterior.sample` — seeded joint samples over any number of places.

Cost growth (``n`` places, ``p`` features, ``D`` random features, ``s`` samples): features ``O(n p)``
per model-specific feature cost (DBK: the network, ``O(h^2 + h p)`` per place; SVGP ``O(p^2)``; exact GP
``O(n_train^2)``); marginals ``O(n p q)`` with ``q <= p`` the factor's columns; an area's variance
``O(n_a p q)`` plus ``O(n_a^2)`` for a residual; ``s`` joint samples ``O(s n (p + D))`` (``D`` only with a
residual).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from gpcore.errors import InputError
from gpcore.models import as_2d_float
from gpcore.models.features import CHUNK, FeatureForm, Residual

#: random Fourier features per residual sample (the sample covariance is unbiased for any D)
DEFAULT_RFF = 512


# --------------------------------------------------------------------------------------------
# random Fourier features of a stationary base kernel
# --------------------------------------------------------------------------------------------

_NU = {"matern12": 0.5, "matern32": 1.5, "matern52": 2.5}


def rff_frequencies(base: str, lengthscale: torch.Tensor, q: int, D: int, gen: torch.Generator, n: int = 1):
    """``n x D x q`` frequencies of the spectral density of ``base`` (RBF: Gaussian; Matérn-nu: Student-t
    with 2 nu degrees of freedom), divided by the lengthscales."""
    z = torch.randn(n, D, q, generator=gen, dtype=torch.float64)
    if base in _NU:
        nu = _NU[base]
        u = 2.0 * _gamma(nu, n * D, gen).reshape(n, D, 1)  # chi-square with 2 nu dof
        z = z * torch.sqrt(2.0 * nu / u)
    elif base != "rbf":
        raise InputError(f"random features are not available for the base kernel {base!r}")
    return z / lengthscale.double().reshape(1, 1, -1)


def _gamma(shape: float, n: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` draws of Gamma(shape, 1) from ``gen`` (Marsaglia–Tsang; shape < 1 by the boost ``U^(1/a)``)."""
    boost = shape < 1.0
    a = shape + 1.0 if boost else shape
    d = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    out = torch.empty(n, dtype=torch.float64)
    filled = 0
    while filled < n:
        m = 2 * (n - filled) + 8
        x = torch.randn(m, generator=gen, dtype=torch.float64)
        u = torch.rand(m, generator=gen, dtype=torch.float64)
        v = (1.0 + c * x) ** 3
        ok = (v > 0) & (torch.log(u.clamp_min(1e-300)) < 0.5 * x * x + d - d * v + d * torch.log(v.clamp_min(1e-300)))
        acc = (d * v)[ok][: n - filled]
        out[filled : filled + acc.shape[0]] = acc
        filled += acc.shape[0]
    if boost:
        out = out * torch.rand(n, generator=gen, dtype=torch.float64) ** (1.0 / shape)
    return out


# --------------------------------------------------------------------------------------------
# the joint posterior
# --------------------------------------------------------------------------------------------


class JointPosterior:
    """Joint operations on a fitted model's posterior, in the caller's units (see module doc).

    ``JointPosterior(model)`` asks the model for its :class:`FeatureForm`; models without one raise
    :class:`~gpcore.errors.InputError` naming what they support.
    """

    def __init__(self, model):
        model._check_fitted()
        self.model = model
        with torch.no_grad():
            model.module_.eval()
            self.form: FeatureForm = model._feature_form()
        self.scale = float(model.y_std_)
        self.shift = float(model.y_mean_)
        self.mean_w = self.form.mean.double()
        self.factor = self.form.factor.double()

    # ---------------------------------------------------------------- basic pieces
    @property
    def p(self) -> int:
        return int(self.mean_w.shape[0])

    @property
    def has_residual(self) -> bool:
        return self.form.residual is not None

    @property
    def noise_s(self) -> float:
        """Observation-noise variance in standardised units (a weighted fit: one measurement, tau^2 + sigma^2)."""
        return float((self.model._noise_s() + self.model._nugget_s()).detach())

    def _xs(self, X, what: str = "X") -> torch.Tensor:
        return self.model.scale_x(as_2d_float(X, what, d=self.model.d_))

    @torch.no_grad()
    def features_s(self, Xs: torch.Tensor) -> torch.Tensor:
        """``psi`` (``n x p``, float64) for scaled inputs, in chunks."""
        self.model.module_.eval()
        return self.form.features_s(Xs)

    @torch.no_grad()
    def latent_s(self, Xs: torch.Tensor) -> torch.Tensor:
        return self.form.latent_s(Xs)

    def features(self, X) -> torch.Tensor:
        """``psi(X)`` for caller inputs (``n x p``, float64, standardised units)."""
        return self.features_s(self._xs(X))

    # ---------------------------------------------------------------- covariance and marginals
    def cov_s(self, X1s: torch.Tensor, X2s: torch.Tensor) -> torch.Tensor:
        """Posterior covariance of f in standardised units (``n1 x n2``, float64)."""
        return self.form.cov_s(X1s, X2s)

    def cov(self, X1, X2=None) -> np.ndarray:
        """Joint posterior covariance ``Cov[f(X1), f(X2)]`` (``n1 x n2``) in target units squared.

        Dense: for small sets (the cost is ``n1 n2`` kernel evaluations plus ``O((n1 + n2) p^2)``).
        """
        X1s = self._xs(X1, "X1")
        X2s = X1s if X2 is None else self._xs(X2, "X2")
        return self.cov_s(X1s, X2s).cpu().numpy() * self.scale**2

    @torch.no_grad()
    def marginals_s(self, Xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, var_f)`` of f at scaled inputs, standardised units (float64)."""
        means, vars_ = [], []
        res = self.form.residual
        for i in range(0, Xs.shape[0], CHUNK):
            xb = Xs[i : i + CHUNK]
            P = self.form.features(xb).double()
            means.append(self.form.mu0 + P @ self.mean_w)
            v = (P @ self.factor).pow(2).sum(-1) + self.form.white_s(xb)
            if res is not None:
                a = res.latent(xb).double()
                v = v + (_kernel_diag(res, a) - P.pow(2).sum(-1)).clamp_min(0.0)
            vars_.append(v)
        if not means:
            z = torch.zeros(0, dtype=torch.float64)
            return z, z
        return torch.cat(means), torch.cat(vars_)

    def marginals(self, X) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and latent variance of f at ``X`` in caller units (as ``model.predict``)."""
        m, v = self.marginals_s(self._xs(X))
        return m.cpu().numpy() * self.scale + self.shift, v.cpu().numpy() * self.scale**2

    # ---------------------------------------------------------------- linear functionals (areas)
    @torch.no_grad()
    def linear(self, X, groups: list[tuple[np.ndarray, np.ndarray]], block: int = 2048):
        """Mean and variance of ``sum_i w_i f(x_i)`` for each group ``(index array, weight array)``.

        ``X`` (``n x d``) holds every place once; a group lists positions in ``X`` and their weights.
        Exact: ``w^T m`` and ``w^T Sigma w = ||F^T Psi_a^T w||^2 + w^T K_aa w - ||Psi_a^T w||^2`` with the
        residual's ``K_aa`` evaluated block by block (``O(n_a^2)`` kernel values per group, memory
        ``block^2``); without a residual ``O(n_a p q)``. Returns ``(mean, var)`` arrays in caller units.
        """
        Xs = self._xs(X)
        res = self.form.residual
        means = np.zeros(len(groups))
        var = np.zeros(len(groups))
        for g, (idx, w) in enumerate(groups):
            idx = np.asarray(idx, dtype=np.int64)
            wt = torch.as_tensor(np.asarray(w, dtype=np.float64))
            if idx.size == 0:
                means[g] = var[g] = np.nan
                continue
            Xa = Xs[torch.as_tensor(idx)]  # one group's places at a time: memory O(n_a p)
            v = self.features_s(Xa).T @ wt
            means[g] = float(self.form.mu0 * wt.sum() + v @ self.mean_w)
            s = float((self.factor.T @ v).pow(2).sum()) + float(self.form.white_s(Xa) @ wt.pow(2))
            if res is not None:
                A = self.latent_s(Xa)
                quad = 0.0
                for i in range(0, idx.size, block):
                    for j in range(i, idx.size, block):
                        Kb = res.kernel(A[i : i + block], A[j : j + block]).double()
                        t = float(wt[i : i + block] @ Kb @ wt[j : j + block])
                        quad += t if i == j else 2.0 * t
                s += quad - float(v @ v)
            var[g] = max(s, 0.0)
        sw = np.array([float(np.sum(w)) for _, w in groups])
        return means * self.scale + self.shift * sw, var * self.scale**2

    # ---------------------------------------------------------------- joint samples
    @torch.no_grad()
    def sample_s(self, Xs: torch.Tensor, n_samples: int, seed: int = 0, num_features: int = DEFAULT_RFF):
        """``n_samples x n`` joint samples of f (standardised units) by pathwise conditioning (module doc)."""
        gen = torch.Generator().manual_seed(int(seed))
        res = self.form.residual
        q = self.factor.shape[1]
        xi = torch.randn(n_samples, q, generator=gen, dtype=torch.float64)
        C = self.mean_w[:, None] + self.factor @ xi.T  # p x s
        if res is not None:
            D = int(num_features)
            qd = res.cond.shape[1]
            Om = rff_frequencies(res.base, res.lengthscale, qd, D, gen, n_samples)
            ph = torch.rand(n_samples, D, generator=gen, dtype=torch.float64) * (2.0 * math.pi)
            th = torch.randn(n_samples, D, generator=gen, dtype=torch.float64) * math.sqrt(2.0 * res.outputscale / D)
            J = res.cond.double()
            eps = torch.randn(J.shape[0], n_samples, generator=gen, dtype=torch.float64)
            R = _rff_eval(J, Om, ph, th) + math.sqrt(max(float(res.nu), 0.0)) * eps  # |J| x s
            if res.project is not None:
                R = res.project(R)
            C = C - torch.linalg.solve_triangular(res.chol.double(), R, upper=False)
        out = torch.empty(n_samples, Xs.shape[0], dtype=torch.float64)
        for i in range(0, Xs.shape[0], CHUNK):
            xb = Xs[i : i + CHUNK]
            block = self.form.mu0 + self.form.features(xb).double() @ C  # b x s
            if self.form.white is not None:  # independent between places: a fresh normal per place and sample
                z = torch.randn(xb.shape[0], n_samples, generator=gen, dtype=torch.float64)
                block = block + self.form.white_s(xb).sqrt()[:, None] * z
            if res is not None:
                block = block + _rff_eval(res.latent(xb).double(), Om, ph, th)
            out[:, i : i + CHUNK] = block.T
        return out

    def sample(self, X, n_samples: int = 4, seed: int = 0, num_features: int = DEFAULT_RFF) -> np.ndarray:
        """``n_samples x n`` joint posterior samples of f at ``X`` in caller units; the same seed gives
        the same samples. With a residual, each sample draws its own ``num_features`` random features."""
        if n_samples < 0:
            raise InputError(f"n_samples must be >= 0, got {n_samples}")
        S = self.sample_s(self._xs(X), int(n_samples), seed, num_features)
        return S.cpu().numpy() * self.scale + self.shift


def _rff_eval(A: torch.Tensor, Om: torch.Tensor, ph: torch.Tensor, th: torch.Tensor) -> torch.Tensor:
    """``h_s(a) = sum_d th[s, d] cos(Om[s, d] . a + ph[s, d])`` for every sample ``s``: ``(n x s)``."""
    n, s = A.shape[0], Om.shape[0]
    out = torch.empty(n, s, dtype=torch.float64)
    if Om.shape[1] == 1:  # one feature per column (the suggestion engine's residual features)
        return torch.cos_(A @ Om[:, 0, :].T + ph[:, 0]) * th[:, 0]
    for j in range(s):
        out[:, j] = torch.cos_(torch.addmm(ph[j][None, :], A, Om[j].T)) @ th[j]
    return out


def _kernel_diag(res: Residual, a: torch.Tensor) -> torch.Tensor:
    """``k(a_i, a_i)``: stationary base kernels have the constant diagonal ``outputscale``."""
    return torch.full((a.shape[0],), float(res.outputscale), dtype=torch.float64)


class VecchiaJointPosterior:
    """The joint operations of :class:`JointPosterior` for the Vecchia family (``vecchia``, ``dbk-nn``): built on the
    joint Vecchia prediction (:mod:`gpcore.models.vecchia_joint`), whose sparse factor the model computes once per
    set of places and reuses (areas, samples and suggestions over one grid share it). Caller units, float64."""

    has_residual = False

    def __init__(self, model):
        model._check_fitted()
        self.model = model
        self.scale = float(model.y_std_)
        self.shift = float(model.y_mean_)

    @property
    def noise_s(self) -> float:
        """Observation-noise variance in standardised units (a weighted fit: one measurement, tau^2 + sigma^2)."""
        return float((self.model._noise_s() + self.model._nugget_s()).detach())

    def _xs(self, X, what: str = "X") -> torch.Tensor:
        return self.model.scale_x(as_2d_float(X, what, d=self.model.d_))

    def joint_s(self, Xs: torch.Tensor):
        """The :class:`~gpcore.models.vecchia_joint.VecchiaJoint` at scaled places (the model keeps the last one)."""
        return self.model.joint_s(Xs)

    def cov_s(self, X1s: torch.Tensor, X2s: torch.Tensor) -> torch.Tensor:
        return self.model._posterior_cov_s(X1s, X2s)

    def cov(self, X1, X2=None) -> np.ndarray:
        """Joint posterior covariance ``Cov[f(X1), f(X2)]`` in target units squared (``model.posterior_cov``)."""
        return self.model.posterior_cov(X1, X2)

    def marginals(self, X) -> tuple[np.ndarray, np.ndarray]:
        """The model's marginal predictions (mean, latent variance) in caller units, as ``model.predict``."""
        pred = self.model.predict(X)
        return pred.mean, pred.var_f

    def linear(self, X, groups: list[tuple[np.ndarray, np.ndarray]], block: int = 2048):
        """Mean and variance of ``sum_i w_i f(x_i)`` per group ``(index array, weight array)``: one transposed sparse
        triangular solve per group (all groups at once), ``O(n m_p)`` each."""
        import scipy.sparse as sp

        Xs = self._xs(X)
        n = Xs.shape[0]
        rows = np.concatenate([np.asarray(i, dtype=np.int64) for i, _ in groups]) if groups else np.zeros(0, int)
        cols = np.concatenate([np.full(len(i), g) for g, (i, _) in enumerate(groups)]) if groups else rows
        vals = np.concatenate([np.asarray(w, dtype=np.float64) for _, w in groups]) if groups else np.zeros(0)
        W = sp.csr_matrix((vals, (rows, cols)), shape=(n, len(groups)))
        mean, var = self.joint_s(Xs).linear(W)
        sw = np.asarray(W.sum(0)).ravel()
        empty = np.array([len(i) == 0 for i, _ in groups], dtype=bool)
        mean = mean * self.scale + self.shift * sw
        var = var * self.scale**2
        mean[empty] = var[empty] = np.nan
        return mean, var

    def sample(self, X, n_samples: int = 4, seed: int = 0, num_features: int = DEFAULT_RFF) -> np.ndarray:
        """``n_samples x n`` joint samples of f at ``X`` in caller units (one sparse solve per sample), seeded;
        ``num_features`` is not used (no random features)."""
        if n_samples < 0:
            raise InputError(f"n_samples must be >= 0, got {n_samples}")
        return self.joint_s(self._xs(X)).sample(int(n_samples), seed) * self.scale + self.shift

    def lowrank_s(self, Xs: torch.Tensor, D: int, seed: int = 0) -> torch.Tensor:
        """``G`` with ``E[G G^T] = Cov`` at scaled places, standardised units (suggestions' engine)."""
        return torch.as_tensor(self.joint_s(Xs).lowrank(D, seed))


def joint_posterior(model):
    """The joint posterior of a fitted model: :class:`JointPosterior` (feature form) or, for the Vecchia family,
    :class:`VecchiaJointPosterior`; both answer ``cov``, ``marginals``, ``linear`` and ``sample``."""
    if hasattr(model, "joint_s"):
        return VecchiaJointPosterior(model)
    return JointPosterior(model)


def joint_unavailable(model) -> str | None:
    """Why ``model`` has no joint posterior (the message :class:`JointPosterior` would raise), or None when it has
    one. For callers that show the joint sections only where they exist (the Decide page)."""
    if hasattr(model, "joint_s"):
        return None
    try:
        model._feature_form()
    except InputError as e:
        return str(e)
    return None
