"""Sparse-variational GPs with whitened inducing points: SVGP, PPGP, SV-DKL, PP-DKL (docs/methods/svgp.md §3).

The basis is ``phi(x) = L_Z^{-1} kt_Z(a(x))`` with ``K_ZZ = L_Z L_Z^T`` (lower Cholesky, 1.3) and

* ``kernel="rbf"``: ``a(x) = x`` — SVGP on the raw inputs ("SV-RBF"); the base kernel ``kt`` is an ARD
  RBF, or an ARD Matérn-3/2 / 5/2 (``base_kernel``), on ``[-1, 1]^d``.
* ``kernel="deep"``: ``a(x) = g(x)``, the ResNet backbone of :mod:`gpcore.models.backbone`; ``kt`` is
  the ARD base kernel on ``R^h`` with ``Z in R^{r x h}`` (SV-DKL / PP-DKL; the DBK-RBF basis).

``q(w) = N(m, L L^T)`` over the whitened inducing values ``w = L_Z^{-1} u`` with prior ``N(0, I_r)``,
``L = tril(A, -1) + diag(exp(rho))`` as in DBK (2.2). Per input:

``mu_f = mu0 + m^T phi``, ``s2f = ||L^T phi||^2``, ``corr = kt(a, a) - ||phi||^2 >= 0`` and the corrected
latent variance ``s2f_corr = s2f + corr`` (DBK eq. 4), which is what prediction returns.

Objectives (per-point form of 1.4, minimised over mini-batches):

* ``objective="elbo"`` (SVGP, 3.1): ``mean_B[-log N(y; mu_f, s2) + s2f_corr / (2 s2)] + KL / n``;
  in expectation over batches this is ``-ELBO / n``.
* ``objective="ppgp"`` (PPGP, 3.2): ``mean_B[-log N(y; mu_f, s2f_corr + s2)] + (beta / n) KL``.

Feature form (joint posterior, :mod:`gpcore.posterior`): ``f(x) = mu0 + phi(x)^T w + g(x)`` with
``w ~ N(m, L L^T)`` and the Nyström residual ``g ~ GP(0, kt(a, a') - phi^T phi')`` independent of ``w``
(``q(f) = int p(f | u) q(u) du``: given ``u`` the prior's conditional covariance is that residual, which
is correlated between nearby places). Its conditioning set is ``Z`` in latent space with
``L_J = L_Z`` and ``nu = jitter * sigma_k^2``; marginally it gives ``s2f_corr`` above.

Numerics (1.5): ``K_ZZ + jitter * sigma_k^2 I`` is factorised in float64 with the jitter-retry loop,
and the ``r x b`` kernel block and its triangular solve are done in float64 too (at the default
initialisation the lengthscale exceeds the inducing-point spacing, so ``K_ZZ`` has a condition number
near ``1 / jitter``, which float32 cannot solve accurately); everything after ``phi`` runs in the
working dtype. The float64 test helpers :meth:`SVGP.elbo`, :meth:`SVGP.titsias_bound`,
:meth:`SVGP.optimal_q` and :meth:`SVGP.set_q` expose the pieces the section-9.3 tests need.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from gpcore.models.backbone import ResNetBackbone
from gpcore.models.base import GPModel
from gpcore.models.config import BaseConfig, setting
from gpcore.models.dbk import mml_from_stats
from gpcore.models.features import FeatureForm, Residual
from gpcore.models.hyper import SoftplusHyperparameters
from gpcore.models.inducing import kmeans
from gpcore.models.inputs import as_2d_float
from gpcore.models.kernels import stationary
from gpcore.models.linalg import (
    gaussian_nll,
    inv_softplus,
    kl_std_normal,
    psd_safe_cholesky,
    triangular_row_sqnorm,
    tril_factor,
)
from gpcore.models.registry import register, register_alias
from gpcore.models.validation import validation_into_posterior

#: at most this many (unique) training inputs are used by the k-means initialisation
KMEANS_MAX_POINTS = 20000


@dataclass(frozen=True)
class SVGPConfig(BaseConfig):
    """Settings of the sparse-variational family.

    Paper settings (DBK main paper, 2.11 / 3.3): 1024 inducing points for the spatial comparison
    (r = 128 on UCI), AdamW lr 1e-3 with weight decay 1e-2 on the backbone only, 400 epochs of batch
    1024, noise initialised to 1e-2 (floor 1e-6), ``sigma_k^2 = 1``, lengthscales ``sqrt(d)``
    (SV-RBF) or ``sqrt(h)`` (SV-DKL), inducing points ``Uniform([-1, 1])``, backbone width 64
    (UCI) or 256 (spatial), PP-DKL ``beta`` tuned over {0, 0.01, 0.1, 1}.

    Defaults here (2-core CPU, ~20k spatial points, a fit in a few minutes): 256 inducing points
    for ``kernel="rbf"`` (the ``sv-dkl`` / ``pp-dkl`` presets use 128, the UCI r, and h = 64),
    lr 1e-2 for the raw-input kernel (its few parameters move 10x faster than at the paper's lr 1e-3,
    so that 200 epochs of ~20 steps suffice; the deep presets keep 1e-3), 200 epochs with patience
    20, noise initialised to 0.1: Adam moves a raw parameter by about lr per step, and going from
    1e-2 to a typical standardised noise level takes ~2000 steps at lr 1e-3 -- negligible in the
    paper's 400 epochs of ~400 steps, most of a CPU-scaled fit of ~20 steps per epoch.
    Inducing points start at k-means centres of the (unique) training inputs for ``kernel="rbf"``:
    spatial data are clustered (cities) inside a state's bounding box, so a uniform box wastes many
    of the 4x fewer inducing points over empty land, where SVGP is also known to be overconfident
    (3.1). The deep presets keep the paper's ``Uniform([-1, 1]^h)`` latent initialisation.
    ``beta = 1`` is the weight GPyTorch's ``PredictiveLogLikelihood`` (the PPGP reference code)
    uses by default and makes PPGP and SVGP differ only in their data term.
    """

    objective: str = setting("elbo", help="'elbo' (SVGP, Hensman) or 'ppgp' (predictive NLL, Jankowiak)",
                             choices=("elbo", "ppgp"), main=True)
    kernel: str = setting("rbf", help="'rbf': base kernel on the inputs (SV-RBF); 'deep': on a ResNet "
                          "backbone's features (SV-DKL / PP-DKL)", choices=("rbf", "deep"), main=True)
    base_kernel: str = setting("rbf", help="ARD base kernel kt", choices=("rbf", "matern32", "matern52"))
    num_inducing: int = setting(256, help="number of inducing points r", min=1, max=8192, main=True)
    inducing_init: str = setting("kmeans", help="initial inducing points: k-means centres or a random "
                                 "subset of the training inputs a(x), or Uniform([-1, 1]) per dimension",
                                 choices=("kmeans", "random", "uniform"))
    learn_inducing: bool = setting(True, help="optimise the inducing points Z")
    hidden: int = setting(64, help="backbone width h (kernel='deep')", min=1, max=4096)
    blocks: int = setting(2, help="residual blocks in the backbone (kernel='deep')", min=0, max=16)
    beta: float = setting(1.0, help="weight of the PPGP KL term (scaled by 1/n); objective='ppgp' only",
                          min=0.0, main=True)
    noise_init: float = setting(0.1, help="initial noise variance (standardised units)", min=0.0,
                                min_inclusive=False)
    noise_floor: float = setting(1e-6, help="lower bound of the noise variance", min=0.0)
    outputscale_init: float = setting(1.0, help="initial kernel variance sigma_k^2", min=0.0,
                                      min_inclusive=False)
    jitter: float = setting(1e-6, help="relative jitter added to K_ZZ before its Cholesky", min=0.0)
    lr: float = setting(1e-2, help="AdamW learning rate", min=0.0, min_inclusive=False, main=True)
    weight_decay: float = setting(1e-2, help="AdamW weight decay on the backbone only", min=0.0)
    condition_on_validation: bool = setting(False, help="after training and any recalibration, update q(w) with the "
                                            "validation rows (Bayes' rule; off: no gain measured, docs/calibration.md)")


class SVGPModule(SoftplusHyperparameters, nn.Module):
    """Parameters of a whitened sparse-variational GP (``r`` inducing points in ``R^p``).

    ``p = d`` for ``kernel="rbf"`` and ``p = h`` for ``kernel="deep"``.
    """

    def __init__(self, d: int, cfg: SVGPConfig):
        super().__init__()
        r = cfg.num_inducing
        self.deep = cfg.kernel == "deep"
        self.base = cfg.base_kernel
        self.jitter = cfg.jitter
        self.noise_floor = cfg.noise_floor
        p = cfg.hidden if self.deep else d
        if self.deep:
            self.backbone = ResNetBackbone(d, cfg.hidden, cfg.blocks)
        self.Z = nn.Parameter(torch.rand(r, p) * 2.0 - 1.0, requires_grad=cfg.learn_inducing)
        self.raw_ell = nn.Parameter(torch.full((p,), inv_softplus(math.sqrt(p))))
        self.raw_outputscale = nn.Parameter(torch.tensor(inv_softplus(cfg.outputscale_init)))
        self.raw_noise = nn.Parameter(torch.tensor(inv_softplus(max(cfg.noise_init - cfg.noise_floor, 1e-8))))
        self.mu0 = nn.Parameter(torch.zeros(()))
        # q(w) = N(m, L L^T), L = tril(A, -1) + diag(exp(rho)); init as DBK 2.2
        self.m = nn.Parameter(torch.zeros(r))
        self.A = nn.Parameter(torch.randn(r, r) / r)
        self.rho = nn.Parameter(torch.full((r,), -0.5 * math.log(r)))

    # ------------------------------------------------------------------ kernel pieces
    def latent(self, x: torch.Tensor) -> torch.Tensor:
        """``a(x)``: ``b x d`` -> ``b x p`` (identity for ``kernel="rbf"``)."""
        return self.backbone(x) if self.deep else x

    def kt(self, a1: torch.Tensor, a2: torch.Tensor) -> torch.Tensor:
        """Base kernel ``kt(a1, a2)`` on latent inputs (``n1 x p``, ``n2 x p`` -> ``n1 x n2``)."""
        ell, os_ = self.lengthscale.to(a1.dtype), self.outputscale.to(a1.dtype)
        return stationary(self.base, a1, a2, ell, os_)

    def chol_zz(self) -> torch.Tensor:
        """Float64 lower Cholesky factor ``L_Z`` of ``K_ZZ + jitter * sigma_k^2 I`` (``r x r``)."""
        Z = self.Z.double()
        Kzz = self.kt(Z, Z)
        eye = torch.eye(Z.shape[0], dtype=Z.dtype, device=Z.device)
        Kzz = Kzz + self.jitter * self.outputscale.double() * eye
        return psd_safe_cholesky(Kzz)

    def features64(self, x: torch.Tensor, Lz: torch.Tensor | None = None):
        """Whitened features and Nyström gap, in float64.

        Parameters
        ----------
        x : ``b x d`` scaled inputs.
        Lz : optional float64 ``L_Z`` (``r x r``) from :meth:`chol_zz`, to share one factor.

        Returns
        -------
        phi : ``b x r``, ``phi(x) = L_Z^{-1} kt_Z(a(x))``.
        corr : ``(b,)``, ``kt(a, a) - ||phi||^2`` clamped at 0.
        """
        a = self.latent(x).double()
        Lz = self.chol_zz() if Lz is None else Lz
        Kza = self.kt(self.Z.double(), a)  # r x b
        phi = torch.linalg.solve_triangular(Lz, Kza, upper=False).transpose(-1, -2)
        corr = (self.outputscale.double() - phi.pow(2).sum(-1)).clamp_min(0.0)
        return phi, corr

    def q_factor(self) -> torch.Tensor:
        return tril_factor(self.A, self.rho)


@register("svgp", description="Sparse variational GP (whitened inducing points; ELBO; RBF or deep kernel)",
          objective="elbo", kernel="rbf")
class SVGP(GPModel):
    """Whitened sparse-variational GP regression: SVGP / PPGP / SV-DKL / PP-DKL (docs/methods/svgp.md §3).

    See :class:`SVGPConfig` for the paper settings and the CPU-scaled defaults.
    """

    Config = SVGPConfig

    # ------------------------------------------------------------------ build
    def _build(self, d, Xs, ys) -> SVGPModule:
        mod = SVGPModule(d, self.config)
        if Xs is not None and self.config.inducing_init != "uniform":
            with torch.no_grad():
                mod.Z.copy_(self._init_inducing(mod, Xs))
        return mod

    def _init_inducing(self, mod: SVGPModule, Xs: torch.Tensor) -> torch.Tensor:
        """Inducing points from the training inputs' latent images ``a(X)`` (k-means or random subset).

        Duplicate inputs (repeated tiles) are removed first so no two inducing points coincide; with
        fewer unique inputs than ``r`` all of them are used and the rest are ``Uniform([-1, 1])``.
        """
        cfg = self.config
        r = cfg.num_inducing
        gen = torch.Generator().manual_seed(cfg.seed + 1)
        mod = mod.to(dtype=Xs.dtype, device=Xs.device)
        lat = torch.cat([mod.latent(Xs[i : i + 8192]) for i in range(0, Xs.shape[0], 8192)])
        A = torch.unique(lat, dim=0)
        if A.shape[0] > KMEANS_MAX_POINTS:
            A = A[torch.randperm(A.shape[0], generator=gen)[:KMEANS_MAX_POINTS].to(A.device)]
        if A.shape[0] <= r:
            extra = torch.rand(r - A.shape[0], A.shape[1], generator=gen).to(A) * 2.0 - 1.0
            return torch.cat([A, extra])
        if cfg.inducing_init == "random":
            return A[torch.randperm(A.shape[0], generator=gen)[:r].to(A.device)]
        return kmeans(A, r, iters=25, generator=gen, max_points=KMEANS_MAX_POINTS)

    # ------------------------------------------------------------------ per-batch quantities
    def terms(self, xb: torch.Tensor, Lz: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Shared quantities of docs/methods/svgp.md §3 at scaled inputs ``xb`` (``b x d``), all ``(b,)``.

        ``mean = mu0 + m^T phi``, ``s2f = ||L^T phi||^2`` (uncorrected), ``corr = kt(a, a) - ||phi||^2``,
        ``s2f_corr = s2f + corr``; plus ``phi`` (``b x r``). Working dtype.
        """
        mod = self.module_
        phi64, corr64 = mod.features64(xb, Lz)
        phi, corr = phi64.to(xb.dtype), corr64.to(xb.dtype)
        s2f = triangular_row_sqnorm(phi, mod.q_factor())  # blocked: skips L's zero upper triangle
        return {"phi": phi, "mean": mod.mu0 + phi @ mod.m, "s2f": s2f, "corr": corr, "s2f_corr": s2f + corr}

    def kl(self) -> torch.Tensor:
        """``KL(N(m, L L^T) || N(0, I_r))``."""
        mod = self.module_
        return kl_std_normal(mod.m, mod.q_factor(), mod.rho)

    def _loss(self, xb, yb, n, wb=None):
        mod = self.module_
        t = self.terms(xb)
        s2 = self.likelihood.variance(wb, mod.noise)  # sigma^2, or per point tau^2 + sigma^2 / w_i (weighted fits)
        if self.config.objective == "elbo":
            data = gaussian_nll(yb, t["mean"], s2) + t["s2f_corr"] / (2.0 * s2)
            weight = 1.0
        else:
            data = gaussian_nll(yb, t["mean"], t["s2f_corr"] + s2)
            weight = self.config.beta
        return data.mean() + (weight / n) * self.kl()

    # ------------------------------------------------------------------ float64 oracles for tests
    def _stats64(self, Xs: torch.Tensor, ys: torch.Tensor, chunk: int = 8192):
        """Chunked float64 sums over the data: ``Phi^T Phi``, ``Phi^T y``, ``Phi^T 1``, ``sum corr``."""
        mod = self.module_
        Lz = mod.chol_zz()
        r = self.config.num_inducing
        dev = Xs.device
        A = torch.zeros(r, r, dtype=torch.float64, device=dev)
        c = torch.zeros(r, dtype=torch.float64, device=dev)
        s1 = torch.zeros(r, dtype=torch.float64, device=dev)
        tr = torch.zeros((), dtype=torch.float64, device=dev)
        for i in range(0, Xs.shape[0], chunk):
            phi, corr = mod.features64(Xs[i : i + chunk], Lz)
            A = A + phi.T @ phi
            c = c + phi.T @ ys[i : i + chunk].double()
            s1 = s1 + phi.sum(0)
            tr = tr + corr.sum()
        return A, c, s1, tr

    def elbo(self, Xs: torch.Tensor, ys: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
        """Full-data SVGP ELBO in sum form, float64, for the current ``(m, L)``, ``Z`` and hyperparameters.

        ``sum_i [log N(y_i; mu_f(x_i), s2) - s2f_corr(x_i) / (2 s2)] - KL(q || N(0, I))`` on scaled data
        (``Xs``: ``n x d``, ``ys``: ``(n,)``).
        """
        mod = self.module_
        Lz = mod.chol_zz()
        s2 = mod.noise.double()
        m, L, mu0 = mod.m.double(), mod.q_factor().double(), mod.mu0.double()
        total = torch.zeros((), dtype=torch.float64, device=Xs.device)
        for i in range(0, Xs.shape[0], chunk):
            phi, corr = mod.features64(Xs[i : i + chunk], Lz)
            mu = mu0 + phi @ m
            s2f = (phi @ L).pow(2).sum(-1) + corr
            total = total - (gaussian_nll(ys[i : i + chunk].double(), mu, s2) + s2f / (2.0 * s2)).sum()
        return total - kl_std_normal(m, L, mod.rho.double())

    def titsias_bound(self, Xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        """Collapsed SGPR bound (3.1), float64: ``log N(y; mu0, Q_ff + s2 I) - tr(K_ff - Q_ff) / (2 s2)``.

        ``Q_ff = Phi Phi^T`` with the whitened features, so the first term is the DTC evidence in the
        ``O(n r^2)`` form of DBK eq. 11.
        """
        mod = self.module_
        A, c, s1, tr = self._stats64(Xs, ys)
        yd = ys.double()
        s2 = mod.noise.double()
        dtc = mml_from_stats(A, c, s1, yd @ yd, yd.sum(), Xs.shape[0], mod.mu0.double(), s2)
        return dtc - tr / (2.0 * s2)

    @torch.no_grad()
    def optimal_q(self, Xs: torch.Tensor, ys: torch.Tensor,
                  ws: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(m, L)`` maximising the ELBO for fixed ``Z`` and hyperparameters, float64.

        The whitened optimum is the Bayesian-linear-model posterior of ``w``:
        ``m = Lambda^{-1} Phi^T (y - mu0)``, ``L L^T = s2 Lambda^{-1}``, ``Lambda = Phi^T Phi + s2 I_r``
        (the whitened form of the Titsias ``q(u)`` in 3.1). Returns ``m`` (``(r,)``) and lower ``L``
        (``r x r``). Weighted fits (``ws`` = the rows' weights): with ``D = diag(tau^2 + s2 / w)``,
        ``m = (I + Phi^T D^-1 Phi)^{-1} Phi^T D^-1 (y - mu0)``, ``L L^T = (I + Phi^T D^-1 Phi)^{-1}``.
        """
        mod = self.module_
        if ws is not None:
            phi, _ = mod.features64(Xs, mod.chol_zz())
            pw = phi / self.likelihood.variance(ws, mod.noise.double())[:, None]
            eye = torch.eye(phi.shape[1], dtype=torch.float64, device=phi.device)
            LL = torch.linalg.cholesky(eye + pw.T @ phi)
            m = torch.cholesky_solve((pw.T @ (ys.double() - mod.mu0.double())).unsqueeze(-1), LL).squeeze(-1)
            S = torch.cholesky_inverse(LL)
            return m, torch.linalg.cholesky(0.5 * (S + S.T))
        A, c, s1, _ = self._stats64(Xs, ys)
        s2 = mod.noise.double()
        eye = torch.eye(A.shape[0], dtype=torch.float64, device=A.device)
        LL = torch.linalg.cholesky(A + s2 * eye)
        m = torch.cholesky_solve((c - mod.mu0.double() * s1).unsqueeze(-1), LL).squeeze(-1)
        S = s2 * torch.cholesky_inverse(LL)
        return m, torch.linalg.cholesky(0.5 * (S + S.T))

    @torch.no_grad()
    def set_q(self, m: torch.Tensor, L: torch.Tensor) -> None:
        """Set ``q(w) = N(m, L L^T)`` (``L`` lower triangular with a positive diagonal)."""
        mod = self.module_
        mod.m.copy_(m.to(mod.m))
        mod.A.copy_(torch.tril(L, -1).to(mod.A))
        mod.rho.copy_(torch.log(L.diagonal()).to(mod.rho))

    def fit(self, X, y, X_val=None, y_val=None, callback=None, *, weights=None, val_weights=None, **kw):
        """:meth:`GPModel.fit`, then (``condition_on_validation``) the validation rows into ``q(w)``
        (:mod:`gpcore.models.validation`)."""
        super().fit(X, y, X_val, y_val, callback, weights=weights, val_weights=val_weights, **kw)
        validation_into_posterior(self, X_val, y_val, val_weights)
        return self

    def _weight_posterior(self):
        mod = self.module_
        Lz = mod.chol_zz()
        return (lambda xs: mod.features64(xs, Lz)[0]), mod.m, mod.q_factor()

    def _set_weight_posterior(self, m: torch.Tensor, S: torch.Tensor) -> None:
        self.set_q(m, torch.linalg.cholesky(S))

    # ------------------------------------------------------------------ prediction and kernel
    def _predict_f(self, xb):
        t = self.terms(xb)
        return t["mean"], t["s2f_corr"]

    def _kernel_s(self, x1, x2):
        mod = self.module_
        return mod.kt(mod.latent(x1), mod.latent(x2))

    def _kernel_diag_s(self, xb):
        return self.module_.outputscale.expand(xb.shape[0]).to(xb.dtype)

    def _feature_slicer(self, Xs, batch_size):
        mod = self.module_
        lat = torch.cat([mod.latent(Xs[i : i + batch_size]) for i in range(0, Xs.shape[0], batch_size)])

        def inner(xr):
            return mod.kt(lat, mod.latent(xr))[:, 0]

        return inner

    # ------------------------------------------------------------------ inspection
    @property
    def lengthscale(self):
        """Learned ARD lengthscales of ``kt`` (scaled input units for ``kernel="rbf"``, else latent units)."""
        self._check_fitted()
        return self.module_.lengthscale.detach().double().cpu().numpy()

    @property
    def inducing_points(self):
        """Inducing points ``Z`` (``r x d``) in the caller's input units (``kernel="rbf"`` only)."""
        self._check_fitted()
        if self.config.kernel == "deep":
            raise AttributeError("kernel='deep' has its inducing points in the backbone's latent space R^h")
        Z = self.module_.Z.detach().double().cpu().numpy()
        return (Z + 1.0) / 2.0 * self.x_span_ + self.x_lo_

    def _feature_form(self):
        mod = self.module_
        Lz = mod.chol_zz()
        os_ = float(mod.outputscale)
        res = Residual(
            latent=lambda xs: mod.latent(xs).double(),
            kernel=lambda a1, a2: mod.kt(a1.double(), a2.double()),
            base=mod.base,
            lengthscale=mod.lengthscale.detach().double(),
            outputscale=os_,
            cond=mod.Z.detach().double(),
            chol=Lz,
            nu=mod.jitter * os_,
        )
        return FeatureForm(
            features=lambda xs: mod.features64(xs, Lz)[0],
            mean=mod.m.detach().double(),
            factor=mod.q_factor().detach().double(),
            mu0=float(mod.mu0),
            residual=res,
            note="whitened inducing features plus the correlated Nystrom residual",
        )

    @torch.no_grad()
    def features(self, X) -> torch.Tensor:
        """Whitened features ``phi(X)`` (``n x r`` tensor) for caller inputs."""
        self._check_fitted()
        phi, _ = self.module_.features64(self.scale_x(as_2d_float(X, "X", d=self.d_)))
        return phi.to(self.dtype)


register_alias("ppgp", "svgp", "Parametric predictive GP (PPGP loss) with inducing points on the inputs",
               objective="ppgp", kernel="rbf")
_DEEP = {"kernel": "deep", "num_inducing": 128, "lr": 1e-3, "inducing_init": "uniform"}
register_alias("sv-dkl", "svgp", "SV-DKL: SVGP (ELBO) on ResNet backbone features", objective="elbo", **_DEEP)
register_alias("pp-dkl", "svgp", "PP-DKL: PPGP loss on ResNet backbone features", objective="ppgp", **_DEEP)
