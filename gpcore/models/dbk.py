"""DBK — deep basis kernel GP (docs/methods/dbk.md §2).

``k(x, x') = phi(x)^T phi(x')`` with ``phi = expansion(backbone(x))`` in ``R^r``:

* ``basis="silu"`` (DBK-SiLU): ``phi(x) = s ⊙ SiLU(W g(x) + c)``, ``s_j = ±1/sqrt(r)`` at init.
* ``basis="rbf"`` (DBK-RBF): ``phi(x) = L_Z^{-1} kt_Z(g(x))``, inducing points ``Z`` in latent space,
  ARD RBF ``kt``, ``K_ZZ = L_Z L_Z^T`` (Cholesky-whitened).

Objectives:

* ``objective="mml"``: exact low-rank log marginal likelihood (eq. 11), full batch, O(n r^2);
  above ``mml_chunk`` points the chunked two-pass scheme of 2.3 keeps memory O(b r + r^2).
  Prediction by the weight posterior ``N(Lambda^{-1} Phi^T yc, sigma2 Lambda^{-1})`` (eq. 10).
* ``objective="dppgp"``: mini-batch predictive NLL + ``alpha`` trace term + ``beta/n`` KL with
  ``q(w) = N(m, L L^T)`` (2.6); prediction ``N(mu0 + m^T phi, ||L^T phi||^2 + sigma2)`` (2.7).

Feature form (joint posterior, :mod:`gpcore.posterior`): ``f(x) = mu0 + phi(x)^T w`` with ``w ~ N(m, F F^T)``,
``(m, F)`` = :meth:`DBK.posterior_q` (the exact posterior of eq. 10 for MML, ``q(w)`` for dPPGP). The kernel
``phi^T phi'`` is degenerate, so nothing lies outside the features: no residual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from gpcore.comm import batch_max, local_grad_scale, reduce_stats_
from gpcore.models import recalibration
from gpcore.models.backbone import ResNetBackbone, linear_act
from gpcore.models.base import GPModel
from gpcore.models.config import BaseConfig, setting
from gpcore.models.features import FeatureForm
from gpcore.models.hyper import SoftplusHyperparameters
from gpcore.models.inputs import as_2d_float
from gpcore.models.kernels import stationary
from gpcore.models.linalg import (
    LOG_2PI,
    gaussian_nll,
    inv_softplus,
    kl_std_normal,
    psd_safe_cholesky,
    triangular_row_sqnorm,
    tril_factor,
)
from gpcore.models.registry import register, register_alias
from gpcore.models.validation import upper_factor, validation_into_posterior


@dataclass(frozen=True)
class DBKConfig(BaseConfig):
    basis: str = setting("silu", help="expansion layer: 'silu' (DBK-SiLU) or 'rbf' (DBK-RBF)",
                         choices=("silu", "rbf"), main=True)
    objective: str = setting("dppgp", help="'dppgp' (mini-batch, recommended) or 'mml' (exact, full batch)",
                             choices=("dppgp", "mml"), main=True)
    rank: int = setting(128, help="number of basis functions r", min=1, max=8192, main=True)
    hidden: int = setting(64, help="backbone width h", min=1, max=4096, main=True)
    blocks: int = setting(2, help="residual blocks in the backbone", min=0, max=16)
    alpha: float = setting(0.01, help="weight of the dPPGP trace regulariser", min=0.0, main=True)
    beta: float = setting(0.01, help="weight of the dPPGP KL term (scaled by 1/n)", min=0.0, main=True)
    detach_kb: bool = setting(False, help="stop the gradient through the in-batch max feature norm")
    noise_init: float = setting(1e-2, help="initial noise variance (standardised units)", min=0.0,
                                min_inclusive=False)
    noise_floor: float = setting(1e-6, help="lower bound of the noise variance", min=0.0)
    weight_decay: float = setting(1e-2, help="AdamW weight decay on the backbone only", min=0.0)
    patience: int = setting(20, help="epochs without validation-NLL improvement before stopping", min=1)
    mml_chunk: int = setting(65536, help="above this many points exact MML uses the two-pass chunked gradient",
                             min=1)
    jitter: float = setting(1e-6, help="relative jitter added to K_ZZ before its Cholesky (DBK-RBF)", min=0.0)
    joint_calibration: bool = setting(True, help="dPPGP: fit how much of q(w)'s correlation between places is real "
                                      "on blocks of validation rows (areas, samples, suggestions)")
    joint_block: float = setting(0.1, help="side of the joint calibration's blocks in scaled inputs ([-1, 1] box)",
                                 min=0.0, min_inclusive=False)
    condition_on_validation: bool = setting(False, help="after training and calibration, update q(w) with the "
                                            "validation rows (Bayes' rule; off: it hurts dPPGP, docs/calibration.md)")


class DBKModule(SoftplusHyperparameters, nn.Module):
    def __init__(self, d: int, cfg: DBKConfig):
        super().__init__()
        r, h = cfg.rank, cfg.hidden
        self.basis = cfg.basis
        self.jitter = cfg.jitter
        self.noise_floor = cfg.noise_floor
        self.backbone = ResNetBackbone(d, h, cfg.blocks)
        if cfg.basis == "silu":
            self.expand = nn.Linear(h, r)
            sign = torch.randint(0, 2, (r,)).float() * 2.0 - 1.0
            self.scale = nn.Parameter(sign / math.sqrt(r))
        else:
            self.Z = nn.Parameter(torch.rand(r, h) * 2.0 - 1.0)
            self.raw_ell = nn.Parameter(torch.full((h,), inv_softplus(math.sqrt(h))))
            self.raw_outputscale = nn.Parameter(torch.tensor(inv_softplus(1.0)))
        self.raw_noise = nn.Parameter(torch.tensor(inv_softplus(max(cfg.noise_init - cfg.noise_floor, 1e-8))))
        self.mu0 = nn.Parameter(torch.zeros(()))
        # q(w) = N(m, L L^T), L = tril(A, -1) + diag(exp(rho))
        self.m = nn.Parameter(torch.zeros(r))
        self.A = nn.Parameter(torch.randn(r, r) / r)
        self.rho = nn.Parameter(torch.full((r,), -0.5 * math.log(r)))
        # exact-posterior cache (objective="mml"): mean wbar and a factor U with U U^T = sigma2 Lambda^{-1}
        self.register_buffer("post_m", torch.zeros(r))
        self.register_buffer("post_U", torch.zeros(r, r))

    def latent(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    def chol_zz(self) -> torch.Tensor:
        Kzz = stationary("rbf", self.Z, self.Z, self.lengthscale, self.outputscale)
        eye = torch.eye(Kzz.shape[0], dtype=Kzz.dtype, device=Kzz.device)
        Kzz = Kzz + self.jitter * self.outputscale * eye
        return psd_safe_cholesky(Kzz, upcast=True)

    def features(self, x: torch.Tensor, Lz: torch.Tensor | None = None, scaled: bool = True) -> torch.Tensor:
        """``phi(x)``: ``b x d`` -> ``b x r``; ``scaled=False`` leaves out DBK-SiLU's signed scale ``s``."""
        a = self.backbone(x)
        if self.basis == "silu":
            h = linear_act(a, self.expand, "silu")
            return self.scale * h if scaled else h
        Lz = self.chol_zz() if Lz is None else Lz
        Kza = stationary("rbf", self.Z, a, self.lengthscale, self.outputscale)  # r x b
        return torch.linalg.solve_triangular(Lz, Kza, upper=False).transpose(-1, -2)

    def q_factor(self) -> torch.Tensor:
        return tril_factor(self.A, self.rho)


def mml_from_stats(A, c_raw, s1, yy, sy, n: int, mu0, s2):
    """DBK log marginal likelihood (eq. 11) from sufficient statistics.

    ``A = Phi^T Phi`` (r x r), ``c_raw = Phi^T y``, ``s1 = Phi^T 1``, ``yy = y^T y``, ``sy = 1^T y``.
    """
    r = A.shape[-1]
    c = c_raw - mu0 * s1
    yc2 = yy - 2.0 * mu0 * sy + n * mu0 * mu0
    eye = torch.eye(r, dtype=A.dtype, device=A.device)
    L = torch.linalg.cholesky(A + s2 * eye)
    v = torch.linalg.solve_triangular(L, c.unsqueeze(-1), upper=False).squeeze(-1)
    return (
        -0.5 * n * LOG_2PI
        - 0.5 * (n - r) * torch.log(s2)
        - torch.log(L.diagonal()).sum()
        - yc2 / (2.0 * s2)
        + v.pow(2).sum() / (2.0 * s2)
    )


def weighted_stats(phi: torch.Tensor, y: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Sufficient statistics of the DBK marginal likelihood with per-point noise ``d`` (float64).

    ``(Phi^T D^-1 Phi, Phi^T D^-1 y, Phi^T D^-1 1, y^T D^-1 y, 1^T D^-1 y, 1^T D^-1 1, sum log d)``;
    each is a sum over rows, so chunks and ranks add up. Differentiable in ``phi`` and ``d``.
    """
    phi, y, d = phi.double(), y.double(), d.double()
    pw = phi / d[:, None]
    return pw.T @ phi, pw.T @ y, pw.sum(0), (y * y / d).sum(), (y / d).sum(), (1.0 / d).sum(), torch.log(d).sum()


def mml_from_weighted_stats(A, c_raw, s1, yy, sy, s0, logdet, n: int, mu0):
    """DBK ``log p(y)`` with diagonal noise ``D`` (:func:`weighted_stats`): ``y ~ N(mu0, Phi Phi^T + D)``.

    ``-n/2 log 2pi - 1/2 sum log d - 1/2 log|I + A| - 1/2 yc^T D^-1 yc + 1/2 c^T (I + A)^-1 c`` with
    ``A = Phi^T D^-1 Phi`` and ``c = Phi^T D^-1 yc`` (Woodbury and the determinant lemma). With
    ``D = s2 I`` it is :func:`mml_from_stats`.
    """
    r = A.shape[-1]
    c = c_raw - mu0 * s1
    yc2 = yy - 2.0 * mu0 * sy + mu0 * mu0 * s0
    eye = torch.eye(r, dtype=A.dtype, device=A.device)
    L = torch.linalg.cholesky(eye + A)
    v = torch.linalg.solve_triangular(L, c.unsqueeze(-1), upper=False).squeeze(-1)
    return -0.5 * n * LOG_2PI - 0.5 * logdet - torch.log(L.diagonal()).sum() - 0.5 * yc2 + 0.5 * v.pow(2).sum()


@register("dbk", description="Deep basis kernel GP (DBK-SiLU / DBK-RBF; dPPGP or exact MML)")
class DBK(GPModel):
    """Deep basis kernel GP (docs/methods/dbk.md §2)."""

    Config = DBKConfig
    #: exact MML trains distributed: two_pass_step all-reduces its r x r statistics (gpcore.distributed)
    distributed_full_batch = True

    @property
    def full_batch(self) -> bool:
        return self.config.objective == "mml"

    @property
    def needs_finalize(self) -> bool:  # type: ignore[override]
        return self.config.objective == "mml"

    def _build(self, d, Xs, ys) -> DBKModule:
        return DBKModule(d, self.config)

    # ------------------------------------------------------------------ features
    def _features_chunked(self, Xs: torch.Tensor, chunk: int, scaled: bool = True):
        mod = self.module_
        Lz = mod.chol_zz() if mod.basis == "rbf" else None
        for i in range(0, Xs.shape[0], chunk):
            yield i, mod.features(Xs[i : i + chunk], Lz, scaled)

    # ------------------------------------------------------------------ objectives
    def log_marginal_likelihood(self, Xs: torch.Tensor, ys: torch.Tensor,
                                ws: torch.Tensor | None = None) -> torch.Tensor:
        """Exact DBK ``log p(y)`` (eq. 11) on scaled data, single pass, differentiable.

        Weighted fits (``ws``: the rows' weights): the diagonal noise ``tau^2 + sigma^2 / w_i``
        (:func:`mml_from_weighted_stats`)."""
        mod = self.module_
        Phi = mod.features(Xs).double()
        yd = ys.double()
        if ws is not None:
            stats = weighted_stats(Phi, yd, self.likelihood.variance(ws, mod.noise))
            return mml_from_weighted_stats(*stats, Xs.shape[0], mod.mu0.double())
        return mml_from_stats(
            Phi.T @ Phi, Phi.T @ yd, Phi.sum(0), yd @ yd, yd.sum(), Xs.shape[0], mod.mu0.double(), mod.noise.double()
        )

    def dppgp_terms(self, xb: torch.Tensor, yb: torch.Tensor, n: int,
                    wb: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The three dPPGP loss terms on a batch (§2.6): ``data``, ``trace``, ``kl`` (unweighted)."""
        mod = self.module_
        phi = mod.features(xb)
        L = mod.q_factor()
        s2 = self.likelihood.variance(wb, mod.noise)  # sigma^2, or per point tau^2 + sigma^2 / w_i (weighted fits)
        mu = mod.mu0 + phi @ mod.m
        s2y = triangular_row_sqnorm(phi, L) + s2
        data = gaussian_nll(yb, mu, s2y).mean()
        norms = phi.pow(2).sum(-1)
        kb = batch_max(norms)  # max over the global batch under distributed training
        if self.config.detach_kb:
            kb = kb.detach()
        trace = ((kb - norms) / (2.0 * s2)).mean()
        kl = kl_std_normal(mod.m, L, mod.rho)
        return {"data": data, "trace": trace, "kl": kl}

    def _loss(self, xb, yb, n, wb=None):
        if self.config.objective == "mml":
            return -self.log_marginal_likelihood(xb, yb, wb) / xb.shape[0]
        t = self.dppgp_terms(xb, yb, n, wb)
        return t["data"] + self.config.alpha * t["trace"] + (self.config.beta / n) * t["kl"]

    def _step(self, xb, yb, n, wb=None):
        if self.config.objective == "mml" and (xb.shape[0] > self.config.mml_chunk or local_grad_scale() != 1.0):
            return self.two_pass_step(xb, yb, self.config.mml_chunk, wb)
        return super()._step(xb, yb, n, wb)

    def two_pass_step(self, Xs: torch.Tensor, ys: torch.Tensor, chunk: int,
                      ws: torch.Tensor | None = None) -> torch.Tensor:
        """Exact MML gradient in two chunked passes (docs/methods/dbk.md §2.3); memory O(chunk r + r^2).

        Pass 1 accumulates ``A = Phi^T Phi``, ``Phi^T y``, ``Phi^T 1`` without a graph and
        back-propagates ``-log p / n`` through the r x r statistics; pass 2 recomputes each
        chunk's features with a graph and pushes the statistics' adjoints into the network.
        """
        if ws is not None:
            return self._two_pass_weighted(Xs, ys, chunk, ws)
        mod = self.module_
        n = Xs.shape[0]
        r = self.config.rank
        dev = Xs.device
        with torch.no_grad():
            A = torch.zeros(r, r, dtype=torch.float64, device=dev)
            c = torch.zeros(r, dtype=torch.float64, device=dev)
            s1 = torch.zeros(r, dtype=torch.float64, device=dev)
            for i, phi in self._features_chunked(Xs, chunk):
                phi = phi.double()
                yc = ys[i : i + chunk].double()
                A += phi.T @ phi
                c += phi.T @ yc
                s1 += phi.sum(0)
            yd = ys.double()
            yy, sy = yd @ yd, yd.sum()
            n_all = reduce_stats_(A, c, s1, yy, sy, count=n)  # sums over ranks when distributed
        A.requires_grad_(True)
        c.requires_grad_(True)
        s1.requires_grad_(True)
        loss = -mml_from_stats(A, c, s1, yy, sy, n_all, mod.mu0.double(), mod.noise.double()) / n_all
        loss.backward()
        G = (A.grad + A.grad.T).to(Xs.dtype)
        gc = c.grad.to(Xs.dtype)
        gs = s1.grad.to(Xs.dtype)
        share = local_grad_scale()  # W on a rank's shard: the trainer averages gradients over ranks
        for i in range(0, n, chunk):
            # fresh graph per chunk (including K_ZZ's Cholesky for DBK-RBF) so memory stays bounded
            phi = mod.features(Xs[i : i + chunk])
            grad_phi = phi.detach() @ G + ys[i : i + chunk, None] * gc + gs
            if share != 1.0:
                grad_phi = grad_phi * share
            (phi * grad_phi).sum().backward()
        return loss.detach()

    def _two_pass_weighted(self, Xs: torch.Tensor, ys: torch.Tensor, chunk: int, ws: torch.Tensor) -> torch.Tensor:
        """:meth:`two_pass_step` with per-point noise: pass 1 sums :func:`weighted_stats` without a graph
        and back-propagates ``-log p / n`` to them; pass 2 recomputes each chunk's statistics with a
        graph (features and noise) and back-propagates their inner product with those adjoints."""
        mod = self.module_
        n = Xs.shape[0]
        with torch.no_grad():
            lik = self.likelihood
            parts = [weighted_stats(phi, ys[i : i + chunk], lik.variance(ws, mod.noise, slice(i, i + chunk)))
                     for i, phi in self._features_chunked(Xs, chunk)]
            stats = [torch.stack([p[k] for p in parts]).sum(0) for k in range(7)]
            n_all = reduce_stats_(*stats, count=n)
        for t in stats:
            t.requires_grad_(True)
        loss = -mml_from_weighted_stats(*stats, n_all, mod.mu0.double()) / n_all
        loss.backward()
        adj = [t.grad for t in stats]
        share = local_grad_scale()
        for i in range(0, n, chunk):
            phi = mod.features(Xs[i : i + chunk])
            st = weighted_stats(phi, ys[i : i + chunk], self.likelihood.variance(ws, mod.noise, slice(i, i + chunk)))
            surrogate = sum((a * g).sum() for a, g in zip(st, adj, strict=True))
            (surrogate * share).backward()
        return loss.detach()

    # ------------------------------------------------------------------ posterior
    def _finalize(self, Xs, ys, ws=None):
        """Exact weight posterior (eq. 10), chunked: cache ``wbar`` and ``U = sqrt(s2) L_Lambda^{-T}``."""
        mod = self.module_
        r = self.config.rank
        A = torch.zeros(r, r, dtype=torch.float64, device=Xs.device)
        c = torch.zeros(r, dtype=torch.float64, device=Xs.device)
        mu0 = mod.mu0.double()
        if ws is not None:  # diagonal noise D: q(w) = N((I + Phi^T D^-1 Phi)^-1 Phi^T D^-1 yc, (I + ...)^-1)
            chunk = self.config.predict_batch_size
            for i, phi in self._features_chunked(Xs, chunk):
                pw = phi.double() / self.likelihood.variance(ws, mod.noise.double(), slice(i, i + chunk))[:, None]
                A += pw.T @ phi.double()
                c += pw.T @ (ys[i : i + phi.shape[0]].double() - mu0)
            reduce_stats_(A, c)
            eye = torch.eye(r, dtype=torch.float64, device=Xs.device)
            LL = torch.linalg.cholesky(eye + A)
            mod.post_m.copy_(torch.cholesky_solve(c.unsqueeze(-1), LL).squeeze(-1).to(mod.post_m.dtype))
            mod.post_U.copy_(torch.linalg.solve_triangular(LL, eye, upper=False).T.to(mod.post_U.dtype))
            return
        for i, phi in self._features_chunked(Xs, self.config.predict_batch_size):
            phi = phi.double()
            A += phi.T @ phi
            c += phi.T @ (ys[i : i + phi.shape[0]].double() - mu0)
        reduce_stats_(A, c)  # sums over ranks when each holds a shard of the training set
        s2 = mod.noise.double()
        Lam = A + s2 * torch.eye(r, dtype=torch.float64, device=Xs.device)
        LL = torch.linalg.cholesky(Lam)
        wbar = torch.cholesky_solve(c.unsqueeze(-1), LL).squeeze(-1)
        eye = torch.eye(r, dtype=torch.float64, device=Xs.device)
        Linv_T = torch.linalg.solve_triangular(LL, eye, upper=False).T
        mod.post_m.copy_(wbar.to(mod.post_m.dtype))
        mod.post_U.copy_((torch.sqrt(s2) * Linv_T).to(mod.post_U.dtype))

    def posterior_q(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(m, F)`` with ``q(w) = N(m, F F^T)`` used for prediction.

        ``F`` is triangular: lower for dPPGP (``L``), upper for the exact posterior
        (``sqrt(s2) L_Lambda^{-T}``); see :attr:`posterior_lower`.
        """
        mod = self.module_
        if self.config.objective == "mml":
            return mod.post_m, mod.post_U
        return mod.m, mod.q_factor()

    @property
    def posterior_lower(self) -> bool:
        return self.config.objective != "mml"

    #: rows per inner block of prediction: keeps the b x r feature block in cache (measured fastest
    #: on a 2-core EPYC at h = 256, r = 512; the caller's predict batch only bounds memory)
    _PREDICT_BLOCK = 2048

    def _predict_f(self, xb):
        mod = self.module_
        m, F = self.posterior_q()
        lower = self.posterior_lower
        if mod.basis == "silu":
            # phi = s * silu(.): fold the signed scale into the posterior instead of scaling b x r features
            m, F = mod.scale * m, mod.scale[:, None] * F  # diag(s) F keeps F's triangle
        mean = torch.empty(xb.shape[0], dtype=xb.dtype, device=xb.device)
        var = torch.empty_like(mean)
        for i, phi in self._features_chunked(xb, self._PREDICT_BLOCK, scaled=False):
            mean[i : i + phi.shape[0]] = phi @ m
            var[i : i + phi.shape[0]] = triangular_row_sqnorm(phi, F, lower=lower)
        return mod.mu0 + mean, var

    def _kernel_s(self, x1, x2):
        mod = self.module_
        return mod.features(x1) @ mod.features(x2).T

    def _kernel_diag_s(self, xb):
        return self.module_.features(xb).pow(2).sum(-1)

    def _feature_slicer(self, Xs, batch_size):
        Phi = torch.cat([phi for _, phi in self._features_chunked(Xs, batch_size)])

        def inner(xr):
            return Phi @ self.module_.features(xr)[0]

        return inner

    def _feature_form(self):
        feats, m, F = self._weight_posterior()
        F = F.detach().double()
        rho = getattr(self, "joint_rho_", 1.0)
        white = None
        if rho < 1.0:  # the calibrated joint: (1 - rho) of each place's variance independent between places
            white = lambda xs: (1.0 - rho) * (feats(xs).double() @ F).pow(2).sum(-1)  # noqa: E731
        return FeatureForm(
            features=lambda xs: feats(xs).double(),
            mean=m.detach().double(),
            factor=F * math.sqrt(rho),
            mu0=float(self.module_.mu0.detach()),
            note="degenerate kernel phi^T phi': the weight posterior is the whole posterior"
            + (f" (joint calibration rho = {rho:.2f})" if rho < 1.0 else ""),
            white=white,
        )

    # ------------------------------------------------------------------ joint calibration (dPPGP)
    def fit(self, X, y, X_val=None, y_val=None, callback=None, *, weights=None, val_weights=None, **kw):
        """:meth:`GPModel.fit`, then (dPPGP, ``joint_calibration``) the joint calibration on the validation rows, then
        (``condition_on_validation``) the validation rows into ``q(w)`` (:mod:`gpcore.models.validation`)."""
        super().fit(X, y, X_val, y_val, callback, weights=weights, val_weights=val_weights, **kw)
        self.joint_rho_ = 1.0
        if (self.config.objective == "dppgp" and self.config.joint_calibration and X_val is not None
                and len(X_val) and not self.train_info_.get("cancelled")):
            self._calibrate_joint(X_val, y_val, val_weights)
        validation_into_posterior(self, X_val, y_val, val_weights)
        return self

    def _weight_posterior(self):
        mod = self.module_
        m, F = self.posterior_q()
        Lz = mod.chol_zz() if mod.basis == "rbf" else None
        return (lambda xs: mod.features(xs, Lz)), m, F

    @torch.no_grad()
    def _set_weight_posterior(self, m: torch.Tensor, S: torch.Tensor) -> None:
        mod = self.module_
        if self.config.objective == "mml":  # post_U is upper triangular
            mod.post_m.copy_(m.to(mod.post_m))
            mod.post_U.copy_(upper_factor(S).to(mod.post_U))
            return
        L = torch.linalg.cholesky(S)
        mod.m.copy_(m.to(mod.m))
        mod.A.copy_(torch.tril(L, -1).to(mod.A))
        mod.rho.copy_(torch.log(L.diagonal()).to(mod.rho))

    def _calibrate_joint(self, X_val, y_val, val_weights=None) -> None:
        """dPPGP fits ``q(w)`` through per-point likelihoods, which leave the correlations it implies between places
        free (they come out near 1 over a whole map). Keep its marginals, but let only ``rho`` of each place's
        latent variance be correlated through ``q`` and the rest independent, with ``rho`` fitted by the likelihood
        of the validation rows' block-mean residuals (:func:`gpcore.models.recalibration.joint_mixing`; blocks of
        side ``joint_block`` in scaled inputs with >= 2 rows; fewer than 10 blocks: ``rho = 1``)."""
        from gpcore.models.inputs import as_1d_float

        Xv = as_2d_float(X_val, "X_val", d=self.d_)
        yv = as_1d_float(y_val, Xv.shape[0], "y_val")
        Xs = self.scale_x(Xv)
        cells = np.floor((Xs.detach().cpu().numpy() + 1.0) / self.config.joint_block).astype(np.int64)
        _, inv, counts = np.unique(cells, axis=0, return_inverse=True, return_counts=True)
        inv = inv.ravel()
        order = np.argsort(inv, kind="stable")
        groups = [g for g in np.split(order, np.cumsum(counts)[:-1]) if g.size >= 2]
        info = {"rho": 1.0, "blocks": len(groups)}
        if len(groups) >= 10:
            pred = self.predict(Xv, weights=val_weights)
            m, F = self.posterior_q()
            with torch.no_grad():
                P = torch.cat([phi for _, phi in self._features_chunked(Xs, 4096)]).double() @ F.detach().double()
            sc2 = self.y_std_**2
            vj, vi, vn, r = (np.empty(len(groups)) for _ in range(4))
            for k, g in enumerate(groups):
                a = 1.0 / g.size
                vj[k] = float((P[torch.as_tensor(g)].sum(0) * a).pow(2).sum()) * sc2
                vi[k] = pred.var_f[g].sum() * a * a
                vn[k] = (pred.var_y[g] - pred.var_f[g]).sum() * a * a
                r[k] = (yv[g] - pred.mean[g]).mean()
            info["rho"] = self.joint_rho_ = recalibration.joint_mixing(r, vj, vi, vn)
        self.train_info_["joint_calibration"] = info

    def _extra_state(self) -> dict:
        return {**super()._extra_state(), "joint_rho": float(getattr(self, "joint_rho_", 1.0))}

    def _set_extra_state(self, state: dict) -> None:
        super()._set_extra_state(state)
        self.joint_rho_ = float(state.get("joint_rho", 1.0))

    @torch.no_grad()
    def features(self, X) -> torch.Tensor:
        """``phi(X)`` for caller inputs (``n x r`` tensor, standardised-target units)."""
        return self.module_.features(self.scale_x(as_2d_float(X, "X", d=self.d_)))


register_alias("dbk-silu", "dbk", "DBK-SiLU with the dPPGP objective", basis="silu", objective="dppgp")
# The paper's mobile-internet setting is DBK-RBF with alpha = 0.1, beta = 0.01 (h = 256, r = 1024, batch
# 1024 on ~400k points); on ~20k points and 2 CPU cores: h = 64, r = 128, batch 256 (more steps per epoch).
register_alias("dbk-rbf", "dbk", "DBK-RBF with the dPPGP objective (paper's spatial setting, CPU-scaled)",
               basis="rbf", objective="dppgp", alpha=0.1, beta=0.01, batch_size=256)
register_alias("dbk-mml", "dbk", "DBK-SiLU trained exactly by marginal likelihood", basis="silu", objective="mml")
