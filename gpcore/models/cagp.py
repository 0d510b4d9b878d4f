"""CaGP — computation-aware Gaussian process (docs/methods/cagp.md §5, errata C1–C5).

CaGP conditions the GP prior ``GP(mu0, k)`` on ``i << n`` linear projections ``S^T y`` of the data
("actions", the columns of ``S in R^{n x i}``). With ``Kh = K_XX + sigma2 I`` and
``A = S^T Kh S = L_c L_c^T`` (Cholesky, float64) the computation-aware posterior is (5.1, 5.2)::

    v~       = A^{-1} S^T (y - mu0)                      projected representer weights (i,)
    mu_i(x)  = mu0 + K(x, X) S v~
    K_i(x,x') = K(x,x') - K(x,X) S A^{-1} S^T K(X,x')     >= exact posterior covariance
    predictive y:  N(mu_i(x), K_i(x,x) + sigma2)

Training minimises the CaGP ELBO loss (5.3, closed form eq. 11) divided by n (C3) jointly over the
kernel hyperparameters and the actions:

* ``actions="opt"`` (CaGP-Opt, recommended): block-sparse learned actions (5.4.1). The training
  points are ordered (``ordering="spatial"``, the default: a kd-tree order so that each action is
  spatially local, the design option of 5.4; or ``"random"``, the reference implementation's
  shuffled order) and cut into ``i`` consecutive blocks;
  the ``n mod i`` remainder points are kept by giving the first ``n mod i`` blocks one extra point
  (C2). Action ``j`` is non-zero only on block ``j``; entries start as ``N(0, 1) / sqrt(k_j)``.
  ``S^T S`` is diagonal and ``log det(S^T S) = sum_j log ||s_j||^2`` (C4).
* ``actions="cg"`` (CaGP-CG): the actions are the first ``i`` residuals of conjugate gradients on
  ``Kh v = y - mu0`` at the current hyperparameters (not learned, no gradient through them),
  orthonormalised (same span, Lemma S4). The posterior mean then equals the CG iterate after ``i``
  iterations. Cost O(n^2 i) per step: small n or a GPU.

``K S`` is never formed from an ``n x n`` matrix (5.5): the kernel is evaluated in row tiles of at
most ``tile_size`` entries held in reused buffers, each tile is contracted with the actions at once
(blockwise for block-sparse ``S``: ``K(., X) S = sum_j K(., X_j) s_j``), and the backward pass
recomputes the tiles with closed-form kernel derivatives (:class:`_KernelActions`). At the training
inputs only the upper block triangle of the symmetric ``K`` is evaluated
(:class:`_SymBlockKernelActions`), and the ``K S`` computed by :meth:`CaGP._finalize` for validation
is reused by the next training step, so an epoch costs one backward and one forward pass, each over
half of ``K``. Memory is O(n i + tile_size); the work is O(n^2) kernel evaluations
per epoch (C1: "linear time" only with i-way parallel hardware).

Prediction inherently needs the training inputs and the actions (5.5): both are stored as buffers
together with the cached float64 factor ``L_c`` and ``v~``; a test point costs n kernel
evaluations plus O(i^2).

Feature form (joint posterior, :mod:`gpcore.posterior`): ``K_i`` is the prior downdated by the projected
data, i.e. ``F = 0`` and a residual with features ``psi(x) = L_c^{-1} S^T K(X, x)`` (``i`` of them), mean
weights ``L_c^T v~``, conditioning set ``J = X`` (the actions' layout), ``T^T = S^T`` and ``nu = sigma2``.
Supported: the joint covariance, exceedance, areas (``O(n_a^2)`` kernel values per area) and pathwise
joint samples (each place costs ``n`` kernel evaluations, as prediction does); suggestions work
through the dense engine of :mod:`gpcore.decide` (small candidate and target sets).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from gpcore.errors import InputError
from gpcore.models.base import GPModel
from gpcore.models.cagp_autograd import CAGP_KERNELS, CaGPKernel
from gpcore.models.cagp_linalg import (
    BlockActions,
    CaGPPosterior,
    DenseActions,
    block_layout,
    cagp_parts,
    cg_actions,
    elbo_loss,
    init_block_values,
    projected_nll,
)
from gpcore.models.config import BaseConfig, setting
from gpcore.models.features import FeatureForm, Residual
from gpcore.models.hyper import SoftplusHyperparameters
from gpcore.models.kernels import stationary
from gpcore.models.linalg import inv_softplus
from gpcore.models.registry import register, register_alias

# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaGPConfig(BaseConfig):
    actions: str = setting(
        "opt",
        help="'opt' (learned block-sparse, CaGP-Opt) or 'cg' (CG residuals, CaGP-CG)",
        choices=("opt", "cg"),
        main=True,
    )
    num_actions: int = setting(256, help="number of actions i (capped at n)", min=1, max=8192, main=True)
    ordering: str = setting(
        "spatial",
        help="assignment of training points to action blocks: 'spatial' "
        "(kd-tree order, local actions) or 'random' (the reference implementation)",
        choices=("spatial", "random"),
        main=True,
    )
    loss: str = setting(
        "elbo",
        help="'elbo' (CaGP ELBO, recommended) or 'projected_nll' (negative control)",
        choices=("elbo", "projected_nll"),
    )
    kernel: str = setting("matern32", help="stationary base kernel", choices=CAGP_KERNELS, main=True)
    ard: bool = setting(True, help="one lengthscale per input dimension")
    lengthscale_init: float = setting(
        0.3, help="initial lengthscale (inputs live in [-1, 1])", min=0.0, min_inclusive=False
    )
    outputscale_init: float = setting(1.0, help="initial outputscale", min=0.0, min_inclusive=False)
    noise_init: float = setting(
        0.5, help="initial noise variance (standardised units)", min=0.0, min_inclusive=False
    )
    noise_floor: float = setting(1e-4, help="lower bound of the noise variance", min=0.0)
    learn_mean: bool = setting(False, help="learn a constant prior mean (the paper uses mu0 = 0)")
    cg_tol: float = setting(1e-4, help="relative residual tolerance of CG (actions='cg')", min=0.0)
    tile_size: int = setting(1 << 20, help="kernel entries per tile when computing K S (memory bound)", min=1)
    cpu_threads: int = setting(
        1,
        help="CPU threads for the O(n^2) kernel tiles (0 = PyTorch default); the many "
        "small tile operations run faster on one thread when cores are shared",
        min=0,
    )
    epochs: int = setting(60, help="full-batch optimisation steps", min=1, main=True)
    lr: float = setting(0.1, help="Adam learning rate", min=0.0, min_inclusive=False, main=True)
    patience: int = setting(20, help="epochs without validation-NLL improvement before stopping", min=1)


class CaGPModule(SoftplusHyperparameters, nn.Module):
    """Parameters (kernel, noise, mean, actions) and prediction caches of a CaGP model.

    Buffers: ``X_train`` (training inputs; block layout for ``actions="opt"``), ``index`` / ``mask``
    (block assignment, ``"opt"``), ``S`` (dense CG actions, ``"cg"``), and the float64 caches
    ``Lc`` (``i x i``) and ``vt`` (``(i,)``).
    """

    _float64_buffers = ("Lc", "vt")

    def __init__(self, d: int, cfg: CaGPConfig, Xs: torch.Tensor | None):
        super().__init__()
        self.mode = cfg.actions
        self.noise_floor = cfg.noise_floor
        self.kernel = CaGPKernel(
            d, cfg.kernel, cfg.ard, cfg.lengthscale_init, cfg.outputscale_init, cfg.tile_size, cfg.cpu_threads
        )
        self.raw_noise = nn.Parameter(torch.tensor(inv_softplus(max(cfg.noise_init - cfg.noise_floor, 1e-8))))
        self.mu0 = nn.Parameter(torch.zeros(()), requires_grad=cfg.learn_mean)
        gen = torch.Generator().manual_seed(cfg.seed)
        n = 0 if Xs is None else Xs.shape[0]  # loading (Xs None): the loader restores the shapes
        if self.mode == "opt":
            if Xs is None:
                index = torch.zeros(0, 0, dtype=torch.long)
                mask = torch.zeros(0, 0, dtype=torch.bool)
                values = torch.zeros(0, 0)
                X_train = torch.zeros(0, d)
            else:
                index, mask = block_layout(Xs, min(cfg.num_actions, n), cfg.ordering, gen)
                values = init_block_values(mask.cpu(), gen).to(Xs.device)
                X_train = Xs[index.reshape(-1)]
            self.s_raw = nn.Parameter(values.float())
            self.register_buffer("index", index)
            self.register_buffer("mask", mask)
        else:
            X_train = torch.zeros(0, d) if Xs is None else Xs.detach().clone()
            self.register_buffer("S", torch.zeros(n, 0))
        self.register_buffer("X_train", X_train.detach().clone())
        self.register_buffer("Lc", torch.zeros(0, 0, dtype=torch.float64))
        self.register_buffer("vt", torch.zeros(0, dtype=torch.float64))

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        for name in self._float64_buffers:  # the small factors stay float64 under .to(dtype)
            buf = self._buffers.get(name)
            if buf is not None and buf.dtype != torch.float64:
                self._buffers[name] = buf.double()
        return self

    def actions(self, Xs: torch.Tensor | None = None):
        """The current actions over ``Xs`` (default: the stored training inputs)."""
        if self.mode == "opt":
            if Xs is None:
                return BlockActions(self.s_raw * self.mask, self.index, self.mask, self.X_train)
            return BlockActions.from_data(Xs, self.s_raw, self.index, self.mask)
        return DenseActions(self.S, self.X_train if Xs is None else Xs)


@register("cagp", description="Computation-aware GP (CaGP-Opt: learned block-sparse actions, ELBO)")
class CaGP(GPModel):
    """Computation-aware GP (docs/methods/cagp.md §5): CaGP-Opt (default) or CaGP-CG, trained on the CaGP ELBO / n.

    Defaults, scaled from the paper (5.6) to a 2-core CPU and n ~ 20,000 spatial points:

    ================  =========================================  ==========================================
    setting           paper (CaGP-Opt)                           gpcore default
    ================  =========================================  ==========================================
    num_actions i     512                                        256 (k = n / i ~ 80 points per block)
    optimiser, lr     Adam, lr in {1, 0.1, 0.01}, LinearLR       AdamW without decay, lr 0.1, constant
                      (end factor 0.1)                           (the trainer has no schedule hook)
    epochs            1000 (200 on Power), best epoch chosen     60, early stopping (patience 20) on a
                      on the test set                            validation split (C5)
    kernel            Matérn-3/2 ARD + outputscale, mu0 = 0      same (``rbf`` / ``matern52`` optional)
    noise             learned (GPyTorch init ~0.69)              learned, init 0.5, floor 1e-4
    blocks            truncate n to i (n // i), random order     keep the remainder (C2); kd-tree order
                                                                 (``ordering="spatial"``); ``"random"``
                                                                 is the reference implementation's
    ================  =========================================  ==========================================

    Cost (5.5, C1): one epoch is one full-batch step, i.e. the backward pass over the upper block
    triangle of ``K`` (the forward ``K S`` is reused from the previous validation pass) plus one
    no-grad forward for the prediction caches and the validation predictions. The cost per epoch, the
    block ordering and the initial noise were chosen by measurement: docs/benchmarks/settings.md
    ("cagp").
    """

    Config = CaGPConfig
    needs_finalize = True

    @property
    def full_batch(self) -> bool:
        return True

    def _build(self, d, Xs, ys) -> CaGPModule:
        return CaGPModule(d, self.config, Xs)

    # ------------------------------------------------------------------ pieces exposed for tests
    def actions(self, Xs: torch.Tensor | None = None, S: torch.Tensor | None = None):
        """The model's actions, or dense ``S`` (``n x i``) on ``Xs`` when given."""
        if S is not None:
            return DenseActions(S, Xs)
        return self.module_.actions(Xs)

    def posterior(self, Xs: torch.Tensor, ys: torch.Tensor, S: torch.Tensor | None = None) -> CaGPPosterior:
        """Computation-aware posterior on scaled data for the model's actions or a dense ``S``."""
        mod = self.module_
        return CaGPPosterior.fit(mod.kernel, self.actions(Xs, S), ys, mod.mu0, mod.noise)

    def elbo(self, Xs: torch.Tensor, ys: torch.Tensor, S: torch.Tensor | None = None) -> torch.Tensor:
        """CaGP ELBO loss ``l_ELBO`` (sum over the n points, eq. 11) on scaled data."""
        mod = self.module_
        return elbo_loss(mod.kernel, self.actions(Xs, S), ys, mod.mu0, mod.noise)

    def projected_nll(
        self, Xs: torch.Tensor, ys: torch.Tensor, S: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Projected-data NLL (eq. 9) on scaled data."""
        mod = self.module_
        return projected_nll(mod.kernel, self.actions(Xs, S), ys, mod.mu0, mod.noise)

    def refresh_cg_actions(self, Xs: torch.Tensor, ys: torch.Tensor, ws: torch.Tensor | None = None) -> None:
        """Recompute the CaGP-CG actions at the current hyperparameters (``actions="cg"``; ``ws``: row weights)."""
        mod = self.module_
        S = cg_actions(
            mod.kernel,
            Xs,
            ys - mod.mu0.detach(),
            self.likelihood.variance(ws, mod.noise.detach()),
            min(self.config.num_actions, Xs.shape[0]),
            self.config.cg_tol,
        )
        mod.register_buffer("S", S.to(mod.X_train.dtype))

    # ------------------------------------------------------------------ training
    def _state_key(self, Xs: torch.Tensor) -> tuple:
        """Identifies (data, parameter values) without a device sync: tensor identities and the
        in-place version counters that every optimizer step and state-dict load bumps."""
        ts = [Xs, *self.module_.parameters()]
        return tuple((t.data_ptr(), t._version, tuple(t.shape), t.dtype) for t in ts)

    def _loss(self, xb, yb, n, wb=None):
        if xb.shape[0] != self.n_train_:
            raise InputError(
                f"CaGP is trained full-batch: the loss needs all {self.n_train_} training points, "
                f"got {xb.shape[0]}"
            )
        mod = self.module_
        # _finalize (run for validation after the previous step) already computed K S at exactly these
        # parameters: reuse it instead of a second O(n^2) forward pass (the backward still recomputes)
        cache = getattr(self, "_cache", None)
        hit = cache is not None and cache[0] == self._state_key(xb)
        self._cache = None
        if self.config.actions == "cg" and not hit:
            self.refresh_cg_actions(xb, yb, wb)
        acts = mod.actions(xb)
        fn = elbo_loss if self.config.loss == "elbo" else projected_nll
        s2 = self.likelihood.variance(wb, mod.noise)  # sigma^2, or per point tau^2 + sigma^2 / w_i (weighted fits)
        parts = cagp_parts(mod.kernel, acts, yb, mod.mu0, s2, cached_KS=cache[1] if hit else None)
        loss = fn(mod.kernel, acts, yb, mod.mu0, s2, parts=parts)
        return (loss / n).to(xb.dtype)

    def _finalize(self, Xs, ys, ws=None):
        mod = self.module_
        if self.config.actions == "cg":
            self.refresh_cg_actions(Xs, ys, ws)
        p = cagp_parts(mod.kernel, mod.actions(Xs), ys, mod.mu0, self.likelihood.variance(ws, mod.noise))
        mod.register_buffer("Lc", p.Lc.detach().clone())
        mod.register_buffer("vt", p.vt.detach().clone())
        self._cache = (self._state_key(Xs), p.KS.detach())

    # ------------------------------------------------------------------ prediction
    def _predict_f(self, xb):
        mod = self.module_
        post = CaGPPosterior(mod.kernel, mod.actions(), mod.Lc, mod.vt, mod.mu0.double())
        mean, var = post.mean_var(xb)
        return mean.to(xb.dtype), var.clamp_min(0.0).to(xb.dtype)

    def _feature_form(self):
        mod = self.module_
        acts = mod.actions()
        Lc, vt = mod.Lc.double(), mod.vt.double()
        kern = mod.kernel

        def features(xs):
            KS = acts.kernel_times(kern, xs.to(acts.X.dtype)).double()
            return torch.linalg.solve_triangular(Lc, KS.T, upper=False).T

        res = Residual(
            latent=lambda xs: xs.double(),
            kernel=lambda a1, a2: stationary(kern.name, a1.double(), a2.double(), kern.lengthscale.double(),
                                             kern.outputscale.double()),
            base=kern.name,
            lengthscale=kern.lengthscale.detach().double(),
            outputscale=float(kern.outputscale),
            cond=acts.X.detach().double(),
            chol=Lc,
            nu=float(mod.noise),
            project=lambda v: acts.t_rows(v.to(torch.float64)),
        )
        return FeatureForm(features=features, mean=Lc.T @ vt, factor=torch.zeros(Lc.shape[0], 0, dtype=torch.float64),
                           mu0=float(mod.mu0), residual=res, note="prior downdated by i projections of the data")

    def _kernel_s(self, x1, x2):
        return self.module_.kernel(x1, x2)

    def _kernel_diag_s(self, xb):
        return self.module_.kernel.diag(xb)

    @property
    def lengthscale(self) -> np.ndarray:
        """Learned lengthscale(s) in the model's scaled input units ([-1, 1] box)."""
        return self.module_.kernel.lengthscale.detach().cpu().numpy()


register_alias("cagp-opt", "cagp", "CaGP-Opt: learned block-sparse actions (ELBO)", actions="opt")
register_alias(
    "cagp-cg", "cagp", "CaGP-CG: conjugate-gradient residual actions (ELBO; O(n^2 i) per step)", actions="cg"
)
