"""Exact GP by dense Cholesky (docs/methods/common.md §1.2) — the oracle every other model is tested against.

Kernel ``outputscale * rho(||(x - x') / ell||)`` with ``rho`` RBF or Matérn-1/2, 3/2, 5/2, ARD or
shared lengthscale, constant mean, Gaussian noise; all learned by maximising the exact log
marginal likelihood (full batch). Cost O(n^3) time and O(n^2) memory: n up to a few thousand.

Feature form (joint posterior, :mod:`gpcore.posterior`): the dense posterior ``k(x, x') - k_xX (K + s2 I)^{-1} k_Xx'``
written as ``F = 0`` and a residual with conditioning set ``J = X`` (the training inputs), ``nu = s2``,
``L_J = chol(K + s2 I)`` and features ``psi(x) = L_J^{-1} k(X, x)`` (mean weights ``L_J^T alpha``); each
place costs ``O(n^2)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from gpcore.errors import InputError
from gpcore.models.base import GPModel
from gpcore.models.config import BaseConfig, setting
from gpcore.models.features import FeatureForm, Residual
from gpcore.models.hyper import SoftplusHyperparameters
from gpcore.models.kernels import KERNEL_NAMES, stationary
from gpcore.models.linalg import LOG_2PI, inv_softplus, psd_safe_cholesky
from gpcore.models.registry import register


@dataclass(frozen=True)
class ExactConfig(BaseConfig):
    kernel: str = setting("rbf", help="base kernel", choices=KERNEL_NAMES, main=True)
    ard: bool = setting(True, help="one lengthscale per input dimension")
    lengthscale_init: float = setting(0.5, help="initial lengthscale (inputs live in [-1, 1])", min=0.0,
                                      min_inclusive=False)
    outputscale_init: float = setting(1.0, help="initial outputscale", min=0.0, min_inclusive=False)
    noise_init: float = setting(0.1, help="initial noise variance (standardised units)", min=0.0,
                                min_inclusive=False)
    noise_floor: float = setting(1e-6, help="lower bound of the noise variance", min=0.0)
    learn_mean: bool = setting(True, help="learn a constant prior mean")
    max_n: int = setting(10000, help="refuse larger training sets (O(n^2) memory)", min=2)
    epochs: int = setting(150, help="full-batch optimisation steps", min=1, main=True)
    lr: float = setting(0.05, help="Adam learning rate", min=0.0, min_inclusive=False, main=True)


class ExactModule(SoftplusHyperparameters, nn.Module):
    def __init__(self, d: int, cfg: ExactConfig, n: int):
        super().__init__()
        self.kernel_name = cfg.kernel
        self.noise_floor = cfg.noise_floor
        self.raw_ell = nn.Parameter(torch.full((d if cfg.ard else 1,), inv_softplus(cfg.lengthscale_init)))
        self.raw_outputscale = nn.Parameter(torch.tensor(inv_softplus(cfg.outputscale_init)))
        self.raw_noise = nn.Parameter(torch.tensor(inv_softplus(max(cfg.noise_init - cfg.noise_floor, 1e-8))))
        self.mu0 = nn.Parameter(torch.zeros(()), requires_grad=cfg.learn_mean)
        self.register_buffer("X_train", torch.zeros(n, d))
        self.register_buffer("alpha", torch.zeros(n))
        self.register_buffer("L", torch.zeros(n, n))

    def K(self, x1, x2):
        return stationary(self.kernel_name, x1, x2, self.lengthscale, self.outputscale)


@register("exact", description="Exact GP (dense Cholesky): the reference for small n")
class ExactGP(GPModel):
    """Exact GP regression with a learned stationary kernel (the test oracle)."""

    Config = ExactConfig
    unused_settings = ("batch_size",)  # always full batch
    needs_finalize = True

    @property
    def full_batch(self) -> bool:
        return True

    def _build(self, d, Xs, ys):
        n = 0 if Xs is None else Xs.shape[0]
        if n > self.config.max_n:
            raise InputError(
                f"the exact GP needs O(n^2) memory and refuses n = {n} > max_n = {self.config.max_n}; "
                "use a scalable model (dbk, svgp, ...) or raise max_n"
            )
        return ExactModule(d, self.config, n)

    def log_marginal_likelihood(self, Xs, ys, ws=None) -> torch.Tensor:
        """``log N(y; mu0, K + sigma2 I)`` by Cholesky (float64 factorisation); ``ws``: the rows' weights."""
        mod = self.module_
        n = Xs.shape[0]
        K = mod.K(Xs, Xs).double()
        # sigma^2 I, or diag(tau^2 + sigma^2 / w) for a weighted fit (a (n,) row times I is that diagonal)
        K = K + self.likelihood.variance(ws, mod.noise.double()) * torch.eye(n, dtype=torch.float64, device=Xs.device)
        L = psd_safe_cholesky(K)
        r = (ys.double() - mod.mu0.double()).unsqueeze(-1)
        v = torch.linalg.solve_triangular(L, r, upper=False)
        return -0.5 * n * LOG_2PI - torch.log(L.diagonal()).sum() - 0.5 * v.pow(2).sum()

    def _loss(self, xb, yb, n, wb=None):
        return -self.log_marginal_likelihood(xb, yb, wb) / xb.shape[0]

    def _finalize(self, Xs, ys, ws=None):
        mod = self.module_
        n = Xs.shape[0]
        eye = torch.eye(n, dtype=torch.float64, device=Xs.device)
        K = mod.K(Xs, Xs).double() + self.likelihood.variance(ws, mod.noise.double()) * eye
        L = psd_safe_cholesky(K)
        alpha = torch.cholesky_solve((ys.double() - mod.mu0.double()).unsqueeze(-1), L).squeeze(-1)
        for name, value in (("X_train", Xs), ("alpha", alpha), ("L", L)):
            mod.register_buffer(name, value.to(dtype=mod.raw_noise.dtype).clone())

    def _predict_f(self, xb):
        mod = self.module_
        Ksx = mod.K(xb, mod.X_train)
        mean = mod.mu0 + Ksx @ mod.alpha
        v = torch.linalg.solve_triangular(mod.L, Ksx.T, upper=False)
        var = mod.outputscale - v.pow(2).sum(0)
        return mean, var

    def _feature_form(self):
        mod = self.module_
        X = mod.X_train.double()
        s2 = float(mod.noise)
        K = mod.K(X, X).double() + s2 * torch.eye(X.shape[0], dtype=torch.float64, device=X.device)
        L = psd_safe_cholesky(K)
        mean = L.T @ mod.alpha.double()  # psi^T L^T alpha = k_xX alpha
        kern = lambda a1, a2: stationary(  # noqa: E731
            mod.kernel_name, a1.double(), a2.double(), mod.lengthscale.double(), mod.outputscale.double()
        )
        res = Residual(latent=lambda xs: xs.double(), kernel=kern, base=mod.kernel_name,
                       lengthscale=mod.lengthscale.detach().double(), outputscale=float(mod.outputscale),
                       cond=X, chol=L, nu=s2)
        return FeatureForm(
            features=lambda xs: torch.linalg.solve_triangular(L, kern(X, xs), upper=False).T,
            mean=mean,
            factor=torch.zeros(X.shape[0], 0, dtype=torch.float64, device=X.device),
            mu0=float(mod.mu0),
            residual=res,
            note="dense posterior: prior downdated by the training data",
        )

    def _kernel_s(self, x1, x2):
        return self.module_.K(x1, x2)

    def _kernel_diag_s(self, xb):
        return self.module_.outputscale.expand(xb.shape[0])

    @property
    def lengthscale(self):
        """Learned lengthscale(s) in the model's scaled input units ([-1, 1] box)."""
        return self.module_.lengthscale.detach().cpu().numpy()
