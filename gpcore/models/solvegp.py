"""SOLVE-GP — sparse orthogonal variational inference for GPs (docs/methods/solvegp.md §6).

The prior ``f ~ GP(mu0, k)`` is split into two independent GPs (6.1): the part spanned by the
standard inducing points ``Z`` (``M`` of them, ``u = f(Z)``) and the orthogonal residual
``f_perp ~ GP(0, c)`` with ``c(x, x') = k(x, x') - k(x, Z) K_uu^{-1} k(Z, x')`` (erratum O2: the
last argument is ``x'``). A second set of **orthogonal inducing points** ``O`` (``M2`` of them)
carries ``v_perp = f_perp(O) ~ N(0, C_vv)``, ``C_vv = K_vv - K_vu K_uu^{-1} K_uv``. The variational
family is ``q(u) q(v_perp) p_perp(f_perp | v_perp)`` with ``q(u) = N(m_u, L_u L_u^T)`` and
``q(v_perp) = N(m_v, L_v L_v^T)`` (lower-triangular factors with ``exp``-positive diagonals).

* Training: the mini-batch ELBO (6.3) in gpcore's per-point form (1.4)
  ``loss = -(1/b) sum_B E[log N(y_i; f_i, sigma2)] + (KL_u + KL_v) / N``, with the marginals
  ``N(mu(x), s2(x))`` computed by the paper's Algorithm 1 (Cholesky-based). ``chol(K_uu)`` and
  ``chol(C_vv)`` (and the Schur complement ``C_vv`` itself) are formed in float64 with jitter
  retries; ``KL_v`` uses the dimension ``M2`` (erratum O1).
* ``whiten=True`` parameterises ``u' = L_u0^{-1} u`` and ``v' = L_v0^{-1} v_perp`` (Appendix F): the
  algorithm runs with ``m -> L0 m``, ``S -> L0 S L0^T`` and both KLs are to ``N(0, I)``.
* Initialisation (6.8): ``q`` equals the prior (``m = 0``, ``L_u = chol(K_uu)``, ``L_v = chol(C_vv)``, or
  ``L = I`` whitened); ``Z`` and ``O`` come from a seeded torch k-means with ``M + M2`` centres split at
  random (erratum O3).
* Prediction (6.5, eqs. 37–38) uses only cached buffers (``K_uu^{-1} m_u``, ``C_vv^{-1} m_v``, the
  factors ``L_u0``, ``L_u0^{-1} K_uv``, ``L_v0`` and ``L_u^T L_u0^{-T}``, ``L_v^T L_v0^{-T}``): per test point
  ``O(M^2 + M2^2 + M M2)``, independent of ``N``; the training set is not stored.

Feature form (joint posterior, :mod:`gpcore.posterior`), from eq. (38): with ``b(x) = L_u0^{-1} k_u(x)`` and
``d(x) = L_v0^{-1} c_v(x)`` the features are ``psi = [b; d]`` (the whitened Nyström features of ``Z ∪ O``:
``L_J = [[L_u0, 0], [A^T, L_v0]]`` factors ``K_JJ`` plus jitter), the weights
``N([L_u0^{-1} m_u; L_v0^{-1} m_v], blockdiag(L_u0^{-1} L_u, L_v0^{-1} L_v) (...)^T)`` and the residual
``k - psi^T psi' = c(x, x') - c_xO C_vv^{-1} c_Ox'`` (correlated; conditioning set ``J = Z ∪ O``).

Test/diagnostic building blocks (all on scaled tensors): :meth:`SolveGP.marginals` (Algorithm 1),
:meth:`SolveGP.marginals_dense` (eqs. 33–34 by dense solves), :meth:`SolveGP.elbo` (full-data sum form),
:meth:`SolveGP.kl_terms`, :meth:`SolveGP.collapsed_bound` (eq. 9), :meth:`SolveGP.optimal_qv`
(eqs. 28–29), :meth:`SolveGP.optimal_bound` (eq. 30), :meth:`SolveGP.titsias_bound`,
:meth:`SolveGP.joint_q` (the structured SVGP of 6.6), :meth:`SolveGP.residual_kernel` (``c``),
:meth:`SolveGP.prior_factors` and :meth:`SolveGP.set_q`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from gpcore.models.base import GPModel
from gpcore.models.config import BaseConfig, setting
from gpcore.models.features import FeatureForm, Residual
from gpcore.models.hyper import SoftplusHyperparameters
from gpcore.models.inducing import kmeans
from gpcore.models.kernels import KERNEL_NAMES, stationary
from gpcore.models.linalg import (
    gaussian_nll,
    inv_softplus,
    kl_gauss_chol,
    kl_std_normal,
    psd_safe_cholesky,
    tril_factor,
)
from gpcore.models.registry import register
from gpcore.models.solvegp_bounds import SolveGPBounds, _tri


@dataclass(frozen=True)
class SolveGPConfig(BaseConfig):
    """SOLVE-GP settings.

    Paper settings (6.9, regression benchmarks): Matérn-3/2 with one shared lengthscale,
    ``M = M2 = 1024``, Adam lr 0.01, 100 epochs, batch 1024, q initialised to the prior, no whitening.
    gpcore defaults scale ``M = M2`` down to 192 for a 2-core CPU (see :class:`SolveGP`).
    """

    num_inducing: int = setting(192, help="M: standard inducing points Z (paper: 1024)", min=1, max=8192,
                                main=True)
    num_orthogonal: int = setting(192, help="M2: orthogonal inducing points O (paper: 1024)", min=1, max=8192,
                                  main=True)
    kernel: str = setting("matern32", help="stationary base kernel (paper: Matérn-3/2)", choices=KERNEL_NAMES,
                          main=True)
    ard: bool = setting(False, help="one lengthscale per input dimension (paper: one shared lengthscale)")
    whiten: bool = setting(False, help="whitened parameterisation of q(u), q(v) (Appendix F; paper: off)",
                           main=True)
    lengthscale_init: float = setting(0.5, help="initial lengthscale (inputs live in [-1, 1])", min=0.0,
                                      min_inclusive=False)
    outputscale_init: float = setting(1.0, help="initial outputscale", min=0.0, min_inclusive=False)
    noise_init: float = setting(1.0, help="initial noise variance (standardised units; GPflow default)",
                                min=0.0, min_inclusive=False)
    noise_floor: float = setting(1e-6, help="lower bound of the noise variance", min=0.0)
    learn_mean: bool = setting(False, help="learn a constant prior mean (paper: zero mean, standardised y)")
    learn_inducing: bool = setting(True, help="optimise the inducing inputs Z and O")
    jitter: float = setting(1e-6, help="relative jitter (x outputscale) on K_uu and C_vv before Cholesky",
                            min=0.0)
    kmeans_iters: int = setting(10, help="Lloyd iterations of the inducing-point k-means", min=0)
    kmeans_max_points: int = setting(50000, help="k-means uses a random subset of at most this many points",
                                     min=1)
    epochs: int = setting(100, help="maximum number of passes over the training data (paper: 100)", min=1,
                          main=True)
    batch_size: int = setting(1024, help="mini-batch size (paper: 1024)", min=1, main=True)
    lr: float = setting(0.01, help="Adam learning rate (paper: 0.01)", min=0.0, min_inclusive=False,
                        main=True)


# --------------------------------------------------------------------------------------------
# module
# --------------------------------------------------------------------------------------------


class SolveGPModule(SoftplusHyperparameters, nn.Module):
    """All SOLVE-GP parameters and prediction caches (``M = len(Z)``, ``M2 = len(O)``)."""

    def __init__(self, d: int, cfg: SolveGPConfig, Z: torch.Tensor, O: torch.Tensor):
        super().__init__()
        M, M2 = Z.shape[0], O.shape[0]
        self.kernel_name = cfg.kernel
        self.noise_floor = cfg.noise_floor
        self.jitter = cfg.jitter
        self.whiten = cfg.whiten
        self.Z = nn.Parameter(Z.clone(), requires_grad=cfg.learn_inducing)
        self.O = nn.Parameter(O.clone(), requires_grad=cfg.learn_inducing)
        self.raw_ell = nn.Parameter(torch.full((d if cfg.ard else 1,), inv_softplus(cfg.lengthscale_init)))
        self.raw_outputscale = nn.Parameter(torch.tensor(inv_softplus(cfg.outputscale_init)))
        self.raw_noise = nn.Parameter(torch.tensor(inv_softplus(max(cfg.noise_init - cfg.noise_floor, 1e-8))))
        self.mu0 = nn.Parameter(torch.zeros(()), requires_grad=cfg.learn_mean)
        # q(u) = N(m_u, L_u L_u^T), q(v_perp) = N(m_v, L_v L_v^T); L = tril(off, -1) + diag(exp(log_diag))
        self.m_u = nn.Parameter(torch.zeros(M))
        self.Lu_off = nn.Parameter(torch.zeros(M, M))
        self.Lu_logdiag = nn.Parameter(torch.zeros(M))
        self.m_v = nn.Parameter(torch.zeros(M2))
        self.Lv_off = nn.Parameter(torch.zeros(M2, M2))
        self.Lv_logdiag = nn.Parameter(torch.zeros(M2))
        # prediction caches (6.5), filled by SolveGP._finalize
        self.register_buffer("cache_Lu0", torch.zeros(M, M))  # chol(K_uu)
        self.register_buffer("cache_A", torch.zeros(M, M2))  # L_u0^{-1} K_uv
        self.register_buffer("cache_Lv0", torch.zeros(M2, M2))  # chol(C_vv)
        self.register_buffer("cache_au", torch.zeros(M))  # K_uu^{-1} m_u
        self.register_buffer("cache_av", torch.zeros(M2))  # C_vv^{-1} m_v
        self.register_buffer("cache_Pu", torch.zeros(M, M))  # L_u^T L_u0^{-T}
        self.register_buffer("cache_Pv", torch.zeros(M2, M2))  # L_v^T L_v0^{-T}

    def K(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        """Prior kernel ``k(x1, x2)`` (``n1 x n2``) in the dtype of ``x1``."""
        dt = x1.dtype
        return stationary(self.kernel_name, x1, x2.to(dt), self.lengthscale.to(dt), self.outputscale.to(dt))

    def L_u(self) -> torch.Tensor:
        return tril_factor(self.Lu_off, self.Lu_logdiag)

    def L_v(self) -> torch.Tensor:
        return tril_factor(self.Lv_off, self.Lv_logdiag)


# --------------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------------


@register("solvegp", description="SOLVE-GP: SVGP plus orthogonal inducing points (Shi, Titsias, Mnih)")
class SolveGP(SolveGPBounds, GPModel):
    """SOLVE-GP regression (docs/methods/solvegp.md §6).

    Defaults and the paper settings they scale
    ------------------------------------------
    * Paper (6.9): Matérn-3/2, one shared lengthscale, ``M = M2 = 1024``, Adam lr 0.01, 100 epochs,
      batch 1024, learned noise, q initialised to the prior, unwhitened.
    * gpcore default: the same with ``M = M2 = 192``, chosen by the cost per epoch on the 2-D use case
      (docs/benchmarks/settings.md, "solvegp").
    * Not stated by the paper for the regression runs, chosen here: noise initialised to 1.0
      (standardised units; the GPflow default — the Snelson runs used 0.1, which on noisy data gives
      a long transient while the noise grows), lengthscale 0.5 on the ``[-1, 1]`` box, outputscale 1,
      zero prior mean, early stopping on validation NLL (patience 20), AdamW with weight decay 0.

    Notes
    -----
    Per step with batch ``b``: ``O(b Mbar^2 + Mbar^3 + M M2^2 + M2 M^2)``, ``Mbar = max(M, M2)``;
    memory ``O(b Mbar + Mbar^2)``. Prediction ``O(M^2 + M2^2 + M M2)`` per point from cached buffers.
    The jitter retries of the two Cholesky factorisations read the factorisation status (two
    host-device synchronisations per step on GPUs); nothing else in ``_loss`` synchronises.
    """

    Config = SolveGPConfig
    needs_finalize = True  # finalize only refreshes the parameter-derived caches; it never reads the data

    # ------------------------------------------------------------------ construction
    def _build(self, d: int, Xs: torch.Tensor | None, ys: torch.Tensor | None) -> SolveGPModule:
        cfg = self.config
        M, M2 = cfg.num_inducing, cfg.num_orthogonal
        if Xs is None:  # loading: every tensor is overwritten by the saved state
            return SolveGPModule(d, cfg, torch.zeros(M, d), torch.zeros(M2, d))
        gen = torch.Generator().manual_seed(cfg.seed)
        C = kmeans(Xs.detach(), M + M2, cfg.kmeans_iters, gen, max_points=cfg.kmeans_max_points)
        perm = torch.randperm(M + M2, generator=gen).to(C.device)
        Z, O = C[perm[:M]], C[perm[M:]]
        mod = SolveGPModule(d, cfg, Z.cpu(), O.cpu()).to(device=Xs.device, dtype=Xs.dtype)
        self.module_ = mod
        self.init_q_to_prior()
        return mod

    @torch.no_grad()
    def init_q_to_prior(self) -> None:
        """Set ``q(u) = p(u)`` and ``q(v_perp) = p_perp(v_perp)`` (6.8) at the current hyperparameters."""
        mod = self.module_
        mod.m_u.zero_()
        mod.m_v.zero_()
        if self.config.whiten:
            for p in (mod.Lu_off, mod.Lu_logdiag, mod.Lv_off, mod.Lv_logdiag):
                p.zero_()
        else:
            pr = self.prior_factors()
            self._set_factor(mod.Lu_off, mod.Lu_logdiag, pr["L_u0"])
            self._set_factor(mod.Lv_off, mod.Lv_logdiag, pr["L_v0"])

    @staticmethod
    def _set_factor(off: nn.Parameter, logdiag: nn.Parameter, L: torch.Tensor) -> None:
        off.copy_(torch.tril(L, -1).to(off.dtype))
        logdiag.copy_(torch.log(L.diagonal()).to(logdiag.dtype))

    @torch.no_grad()
    def set_q(self, m_u=None, L_u=None, m_v=None, L_v=None) -> None:
        """Set variational parameters by hand (in the model's own, possibly whitened, parameterisation).

        ``L_u``, ``L_v`` must be lower triangular with a positive diagonal (``M x M``, ``M2 x M2``).
        """
        mod = self.module_
        if m_u is not None:
            mod.m_u.copy_(torch.as_tensor(m_u).to(mod.m_u))
        if m_v is not None:
            mod.m_v.copy_(torch.as_tensor(m_v).to(mod.m_v))
        if L_u is not None:
            self._set_factor(mod.Lu_off, mod.Lu_logdiag, torch.as_tensor(L_u).to(mod.Lu_off))
        if L_v is not None:
            self._set_factor(mod.Lv_off, mod.Lv_logdiag, torch.as_tensor(L_v).to(mod.Lv_off))

    # ------------------------------------------------------------------ prior quantities
    def prior_factors(self) -> dict[str, torch.Tensor]:
        """Prior factors in float64 (differentiable).

        Returns
        -------
        dict with ``L_u0 = chol(K_uu)`` (``M x M``), ``A = L_u0^{-1} K_uv`` (``M x M2``),
        ``C_vv = K_vv - A^T A`` (``M2 x M2``), ``L_v0 = chol(C_vv)`` (``M2 x M2``). The relative jitter
        ``config.jitter * outputscale`` is added to ``K_uu`` and ``C_vv`` (and grown on failure).
        """
        mod = self.module_
        Z, O = mod.Z.double(), mod.O.double()
        os_ = mod.outputscale.double()
        Kuu = mod.K(Z, Z)
        Kuv = mod.K(Z, O)
        Kvv = mod.K(O, O)
        jit = mod.jitter * os_
        Kuu = Kuu + jit * torch.eye(Z.shape[0], dtype=Kuu.dtype, device=Kuu.device)
        L_u0 = psd_safe_cholesky(Kuu)
        A = _tri(L_u0, Kuv)
        Cvv = Kvv - A.T @ A
        Cvv = 0.5 * (Cvv + Cvv.T) + jit * torch.eye(O.shape[0], dtype=Kvv.dtype, device=Kvv.device)
        L_v0 = psd_safe_cholesky(Cvv)
        return {"L_u0": L_u0, "A": A, "C_vv": Cvv, "L_v0": L_v0}

    def residual_kernel(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        """``c(x1, x2) = k(x1, x2) - k(x1, Z) K_uu^{-1} k(Z, x2)`` (``n1 x n2``, float64; erratum O2)."""
        mod = self.module_
        L_u0 = self.prior_factors()["L_u0"]
        x1, x2 = x1.double(), x2.double()
        B1 = _tri(L_u0, mod.K(mod.Z.double(), x1))
        B2 = _tri(L_u0, mod.K(mod.Z.double(), x2))
        return mod.K(x1, x2) - B1.T @ B2

    def q_unwhitened(self, pr: dict | None = None) -> tuple[torch.Tensor, ...]:
        """``(m_u, L_u, m_v, L_v)`` of ``q(u)`` and ``q(v_perp)`` in the unwhitened space (float64).

        With ``whiten=True`` this applies the Appendix-F map ``m -> L0 m``, ``L -> L0 L``.
        """
        mod = self.module_
        m_u, L_u, m_v, L_v = mod.m_u.double(), mod.L_u().double(), mod.m_v.double(), mod.L_v().double()
        if self.config.whiten:
            pr = self.prior_factors() if pr is None else pr
            m_u, L_u = pr["L_u0"] @ m_u, pr["L_u0"] @ L_u
            m_v, L_v = pr["L_v0"] @ m_v, pr["L_v0"] @ L_v
        return m_u, L_u, m_v, L_v

    def kl_terms(self, pr: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(KL[q(u) || p(u)], KL[q(v_perp) || p_perp(v_perp)])`` in float64; ``KL_v`` has dimension M2."""
        mod = self.module_
        if self.config.whiten:
            klu = kl_std_normal(mod.m_u.double(), mod.L_u().double(), mod.Lu_logdiag.double())
            klv = kl_std_normal(mod.m_v.double(), mod.L_v().double(), mod.Lv_logdiag.double())
            return klu, klv
        pr = self.prior_factors() if pr is None else pr
        klu = kl_gauss_chol(mod.m_u.double(), mod.L_u().double(), pr["L_u0"])
        klv = kl_gauss_chol(mod.m_v.double(), mod.L_v().double(), pr["L_v0"])
        return klu, klv

    # ------------------------------------------------------------------ Algorithm 1
    def _alg1(self, x: torch.Tensor, pr: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Marginals ``(mu, s2)`` of ``q(f(x))`` by the paper's Algorithm 1, in ``x.dtype``.

        ``B = L_u0 \\ K_uf``, ``C_vf = K_vf - A^T B``, ``D = L_v0 \\ C_vf``; unwhitened ``E = L_u0^T \\ B``,
        ``F = L_u^T E``, ``G = L_v0^T \\ D``, ``H = L_v^T G``, ``mu = E^T m_u + G^T m_v``; whitened
        (Appendix F) ``F = L_u^T B``, ``H = L_v^T D``, ``mu = B^T m_u + D^T m_v``;
        ``s2 = diag(K_ff) - colsum(B∘B) - colsum(D∘D) + colsum(F∘F) + colsum(H∘H)``.
        The first three terms (the variance of f given u and v_perp, >= 0) are clamped at 0
        against round-off.
        """
        mod = self.module_
        dt = x.dtype
        L_u0, A, L_v0 = pr["L_u0"].to(dt), pr["A"].to(dt), pr["L_v0"].to(dt)
        B = _tri(L_u0, mod.K(mod.Z.to(dt), x))
        Cvf = mod.K(mod.O.to(dt), x) - A.T @ B
        D = _tri(L_v0, Cvf)
        m_u, m_v = mod.m_u.to(dt), mod.m_v.to(dt)
        L_u, L_v = mod.L_u().to(dt), mod.L_v().to(dt)
        if self.config.whiten:
            mu = B.T @ m_u + D.T @ m_v
            F = L_u.T @ B
            H = L_v.T @ D
        else:
            E = _tri(L_u0, B, transpose=True)
            G = _tri(L_v0, D, transpose=True)
            mu = E.T @ m_u + G.T @ m_v
            F = L_u.T @ E
            H = L_v.T @ G
        cond = (mod.outputscale.to(dt) - B.pow(2).sum(0) - D.pow(2).sum(0)).clamp_min(0.0)
        s2 = cond + F.pow(2).sum(0) + H.pow(2).sum(0)
        return mod.mu0.to(dt) + mu, s2

    def marginals(self, Xs: torch.Tensor, chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mu(X), s2(X))`` of ``q(f)`` at ``Xs`` (``n x d`` -> two ``(n,)``) by Algorithm 1 (with grad)."""
        pr = self.prior_factors()
        bs = chunk or self.config.predict_batch_size
        outs = [self._alg1(Xs[i : i + bs], pr) for i in range(0, Xs.shape[0], bs)]
        return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])

    # ------------------------------------------------------------------ objectives
    def _expected_loglik(self, y, mu, s2, noise=None):
        """``E_q[log N(y | f, noise)]``; ``noise`` defaults to sigma^2 (per point for weighted fits)."""
        noise = (self.module_.noise if noise is None else noise).to(mu.dtype)
        return -gaussian_nll(y, mu, noise) - s2 / (2.0 * noise)

    def _loss(self, xb: torch.Tensor, yb: torch.Tensor, n: int, wb: torch.Tensor | None = None) -> torch.Tensor:
        """``-(1/b) sum_B E_q[log p(y_i | f_i)] + (KL_u + KL_v) / n`` (per-point ELBO, 1.4)."""
        pr = self.prior_factors()
        mu, s2 = self._alg1(xb, pr)
        data = -self._expected_loglik(yb, mu, s2, self.likelihood.variance(wb, self.module_.noise)).mean()
        klu, klv = self.kl_terms(pr)
        return data + ((klu + klv) / n).to(data.dtype)

    def elbo(self, Xs: torch.Tensor, ys: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        """Full-data SOLVE-GP ELBO, sum form (eq. 8): ``sum_n E[log p(y_n|f_n)] - KL_u - KL_v`` (float64)."""
        pr = self.prior_factors()
        bs = chunk or self.config.predict_batch_size
        total = torch.zeros((), dtype=torch.float64, device=Xs.device)
        for i in range(0, Xs.shape[0], bs):
            mu, s2 = self._alg1(Xs[i : i + bs], pr)
            total = total + self._expected_loglik(ys[i : i + bs], mu, s2).double().sum()
        klu, klv = self.kl_terms(pr)
        return total - klu - klv

    def joint_q(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The implied Gaussian ``q(u, v)`` over ``Z ∪ O`` with ``v = f(O)`` (6.6; float64).

        Returns
        -------
        mean ``(M + M2,)`` = ``[m_u ; m_v + K_vu K_uu^{-1} m_u]`` and covariance ``(M + M2) x (M + M2)``
        ``[[S_u, S_u K_uu^{-1} K_uv], [K_vu K_uu^{-1} S_u, S_v + K_vu K_uu^{-1} S_u K_uu^{-1} K_uv]]``.
        """
        pr = self.prior_factors()
        m_u, L_u, m_v, L_v = self.q_unwhitened(pr)
        S_u, S_v = L_u @ L_u.T, L_v @ L_v.T
        T = _tri(pr["L_u0"], pr["A"], transpose=True)  # K_uu^{-1} K_uv  (M x M2)
        mean = torch.cat([m_u, m_v + T.T @ m_u])
        top = torch.cat([S_u, S_u @ T], 1)
        bottom = torch.cat([T.T @ S_u, S_v + T.T @ S_u @ T], 1)
        return mean, torch.cat([top, bottom], 0)

    # ------------------------------------------------------------------ prediction (6.5)
    @torch.no_grad()
    def _finalize(self, Xs: torch.Tensor | None = None, ys: torch.Tensor | None = None, ws=None) -> None:
        """Refresh the prediction caches from the current parameters (the data are not used)."""
        mod = self.module_
        pr = self.prior_factors()
        m_u, L_u, m_v, L_v = self.q_unwhitened(pr)
        L_u0, L_v0 = pr["L_u0"], pr["L_v0"]
        caches = {
            "cache_Lu0": L_u0,
            "cache_A": pr["A"],
            "cache_Lv0": L_v0,
            "cache_au": torch.cholesky_solve(m_u[:, None], L_u0)[:, 0],
            "cache_av": torch.cholesky_solve(m_v[:, None], L_v0)[:, 0],
            "cache_Pu": _tri(L_u0, L_u).T,
            "cache_Pv": _tri(L_v0, L_v).T,
        }
        for name, value in caches.items():
            getattr(mod, name).copy_(value)

    def _predict_f(self, xb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Eqs. (37)–(38) from the caches: ``O(M^2 + M2^2 + M M2)`` per point, no training data."""
        mod = self.module_
        dt = xb.dtype
        Kux = mod.K(mod.Z.to(dt), xb)
        b = _tri(mod.cache_Lu0.to(dt), Kux)  # L_u0^{-1} k_u*
        cvx = mod.K(mod.O.to(dt), xb) - mod.cache_A.to(dt).T @ b  # c(O, x*)
        dd = _tri(mod.cache_Lv0.to(dt), cvx)  # L_v0^{-1} c_v*
        mean = mod.mu0.to(dt) + Kux.T @ mod.cache_au.to(dt) + cvx.T @ mod.cache_av.to(dt)
        cond = (mod.outputscale.to(dt) - b.pow(2).sum(0) - dd.pow(2).sum(0)).clamp_min(0.0)
        var = cond + (mod.cache_Pu.to(dt) @ b).pow(2).sum(0) + (mod.cache_Pv.to(dt) @ dd).pow(2).sum(0)
        return mean, var

    def _feature_form(self):
        mod = self.module_
        pr = self.prior_factors()
        m_u, L_u, m_v, L_v = self.q_unwhitened(pr)
        L_u0, A, L_v0 = pr["L_u0"], pr["A"], pr["L_v0"]
        M, M2 = L_u0.shape[0], L_v0.shape[0]
        Z, O = mod.Z.detach().double(), mod.O.detach().double()

        def features(xs):
            x = xs.double()
            b = _tri(L_u0, mod.K(Z, x))
            d = _tri(L_v0, mod.K(O, x) - A.T @ b)
            return torch.cat([b, d], 0).T

        L_J = torch.zeros(M + M2, M + M2, dtype=torch.float64, device=L_u0.device)
        L_J[:M, :M], L_J[M:, :M], L_J[M:, M:] = L_u0, A.T, L_v0
        F = torch.zeros_like(L_J)
        F[:M, :M], F[M:, M:] = _tri(L_u0, L_u), _tri(L_v0, L_v)
        os_ = float(mod.outputscale)
        res = Residual(
            latent=lambda xs: xs.double(),
            kernel=lambda a1, a2: mod.K(a1.double(), a2.double()),
            base=mod.kernel_name,
            lengthscale=mod.lengthscale.detach().double(),
            outputscale=os_,
            cond=torch.cat([Z, O]),
            chol=L_J,
            nu=mod.jitter * os_,
        )
        mean = torch.cat([_tri(L_u0, m_u[:, None])[:, 0], _tri(L_v0, m_v[:, None])[:, 0]])
        return FeatureForm(features=features, mean=mean.detach(), factor=F.detach(), mu0=float(mod.mu0),
                           residual=res, note="Nystrom features of Z and O plus the correlated residual")

    # ------------------------------------------------------------------ kernel / noise
    def _kernel_s(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        return self.module_.K(x1, x2)

    def _kernel_diag_s(self, xb: torch.Tensor) -> torch.Tensor:
        return self.module_.outputscale.to(xb.dtype).expand(xb.shape[0])

    # ------------------------------------------------------------------ reporting
    @property
    def lengthscale(self):
        """Learned lengthscale(s) in the model's scaled input units ([-1, 1] box)."""
        return self.module_.lengthscale.detach().cpu().numpy()

    @property
    def inducing_points(self):
        """``(Z, O)`` in scaled input units (numpy ``M x d`` and ``M2 x d``)."""
        mod = self.module_
        return mod.Z.detach().cpu().numpy(), mod.O.detach().cpu().numpy()

