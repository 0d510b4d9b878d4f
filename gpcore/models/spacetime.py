"""Space-time covariances of the Vecchia family (``vecchia``, ``dbk-nn``) for inputs ``(lon, lat, t)``, ``t`` in
decimal years (:func:`gpcore.data.temporal.decimal_year`); equations, parameterisation and limits in
docs/methods/spacetime.md.

With ``h2 = sum_j (x_j - x'_j)^2 / ell_j^2`` over the space columns (ARD) and ``u = |t - t'| / ell_t`` (time has
its own lengthscale, never mixed into the spatial distance), the setting ``space_time`` picks

* ``"separable"``: ``C = o^2 rho(h2) rho_t(u^2)``, ``rho`` the model's ``kernel``, ``rho_t`` Matérn-1/2
  (exponential, the AR(1) correlation of a continuous-time process) or Matérn-3/2 (``time_kernel``);
* ``"gneiting"`` (Gneiting 2002, JASA 97:590-600, eq. 14 with ``a = 1`` absorbed into ``ell_t``):
  ``C = o^2 psi(u^2)^{-delta} rho(h2 / psi(u^2))``, ``psi(s) = (s^alpha + 1)^beta``, ``delta = d_space / 2``;
  ``alpha`` in ``(0, 1]`` is fixed (``gneiting_alpha``, default 1), ``beta = sigmoid(raw_beta)`` in ``(0, 1)`` is
  learned (``beta -> 0``: the spatial kernel at every lag, no decay in time; larger: faster decay in time and a
  longer spatial range across lags).

``"none"`` (default) leaves the spatial model untouched: no extra parameters or buffers, the same code path.

Ordering and neighbours (maxmin, ``m`` nearest predecessors, prediction and joint neighbours) use the unchanged
:mod:`gpcore.models.neighbors` functions on the inputs divided column-wise by the *initial* lengthscales
``(ell_s0, .., ell_s0, ell_t0)`` (:func:`metric_coords`), stored in the buffer ``st_ell0`` so that prediction,
conditioning and loading see the same metric. ``ell_t0 = time_lengthscale_init`` years in scaled units;
``ell_s0 = lengthscale_init``, or with 0 the median over time slices (distinct ``t`` with more than ``m`` rows) of
the spatial model's neighbourhood radius of the slice (:func:`spatial_radius`): one slice gives exactly the
spatial model's initial value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from gpcore.errors import InputError
from gpcore.models.config import BaseConfig, setting
from gpcore.models.kernels import group_kernel as group_kernel_s
from gpcore.models.kernels import scaled_sqdist, stationary, stationary_sqdist
from gpcore.models.linalg import inv_softplus
from gpcore.models.neighbors import coord_order, maxmin_order, ordered_neighbors

SPACE_TIME = ("none", "separable", "gneiting")
TIME_KERNELS = ("matern12", "matern32")

__all__ = ["SPACE_TIME", "TIME_KERNELS", "SpaceTimeConfig", "add_params", "cross_kernel", "gneiting_psi",
           "group_kernel", "init_hypers", "metric_coords", "order_coords", "prior_mean", "spacetime_sqdist",
           "spatial_radius", "time_correlation",
           "time_lengthscale_years"]


@dataclass(frozen=True)
class SpaceTimeConfig(BaseConfig):
    """The space-time settings of the Vecchia family (docs/methods/spacetime.md)."""

    space_time: str = setting("none", help="covariance over (space, t): 'none' (space only, t if given is one more "
                                           "scaled input), 'separable' (kernel x time kernel) or 'gneiting' "
                                           "(non-separable, Gneiting 2002)", choices=SPACE_TIME)
    time_column: int = setting(-1, help="space-time: input column of t in decimal years (-1 = the last)", min=-1)
    time_kernel: str = setting("matern12", help="separable space-time: time correlation (matern12 = exponential, "
                                                "AR(1)-like)", choices=TIME_KERNELS)
    time_lengthscale_init: float = setting(1.0, help="space-time: initial time lengthscale in years (also scales t "
                                                     "in the ordering and neighbour metric)", min=0.0,
                                           min_inclusive=False)
    gneiting_alpha: float = setting(1.0, help="Gneiting: fixed alpha in (0, 1] of psi(s) = (s^alpha + 1)^beta",
                                    min=0.0, max=1.0, min_inclusive=False)
    gneiting_beta_init: float = setting(0.5, help="Gneiting: initial space-time interaction beta (learned in (0, 1))",
                                        min=0.0, max=0.999, min_inclusive=False)
    time_trend: bool = setting(True, help="space-time: a linear trend in t in the prior mean, mu0 + b t, b learned "
                                          "with mu0 (a forecast follows it instead of reverting to the average)")


# --------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def add_params(mod: nn.Module, d: int, cfg) -> None:
    """Give a Vecchia module its space-time attributes and parameters (nothing but ``space_time`` for ``"none"``):
    spatial ARD lengthscales over the ``d - 1`` space columns (``raw_ell``), ``raw_ell_t``, Gneiting's ``raw_beta``
    and the buffer ``st_ell0`` = the initial ``(ell_s0, ell_t0)`` of the ordering metric."""
    mod.space_time = getattr(cfg, "space_time", "none")
    if mod.space_time == "none":
        return
    if d < 2:
        raise InputError(f"space_time={mod.space_time!r} needs at least one space column besides t; got d = {d}")
    if not -1 <= cfg.time_column < d:
        raise InputError(f"time_column={cfg.time_column} is not an input column (d = {d}; -1 = the last)")
    mod.t_col = cfg.time_column % d
    mod.space_cols = [j for j in range(d) if j != mod.t_col]
    mod.time_kernel = cfg.time_kernel
    mod.gneiting_alpha = float(cfg.gneiting_alpha)
    mod.beta_init = float(cfg.gneiting_beta_init)
    mod.raw_ell = nn.Parameter(torch.full((d - 1 if cfg.ard else 1,), inv_softplus(cfg.lengthscale_init or 0.3)))
    mod.raw_ell_t = nn.Parameter(torch.tensor(inv_softplus(1.0)))
    if mod.space_time == "gneiting":
        mod.raw_beta = nn.Parameter(torch.tensor(_logit(mod.beta_init)))
    mod.register_buffer("st_ell0", torch.ones(2, dtype=torch.float64))
    if getattr(cfg, "time_trend", False):
        mod.trend = nn.Parameter(torch.zeros(()), requires_grad=getattr(cfg, "learn_mean", True))


def prior_mean(mod: nn.Module, X: torch.Tensor) -> torch.Tensor:
    """The prior mean at scaled inputs ``X`` (``... x d``), float64: ``mu0``, plus ``b t`` (``t`` the scaled time
    column) for a space-time module with ``time_trend``; shape ``()`` without a trend, else ``X.shape[:-1]``. The
    same as :func:`mean_design` ``@ (mu0[, b])`` where the mean is learned."""
    mu0 = mod.mu0.double()
    trend = getattr(mod, "trend", None)
    return mu0 if trend is None else mu0 + trend.double() * X[..., mod.t_col].double()


def mean_design(mod, X: torch.Tensor) -> torch.Tensor:
    """The prior mean's design ``H(x)`` at scaled inputs ``X`` (``... x d`` -> ``... x p``, float64): ``(1)``, with a
    time trend ``(1, t)``; ``p = 0`` when the mean is not learned (``learn_mean=False``)."""
    one = torch.ones(X.shape[:-1] + (1,), dtype=torch.float64, device=X.device)
    if not mod.mu0.requires_grad:
        return one[..., :0]
    if getattr(mod, "trend", None) is None:
        return one
    return torch.cat([one, X[..., mod.t_col : mod.t_col + 1].double()], dim=-1)


def set_mean(mod, beta: np.ndarray) -> None:
    """Set ``mu0`` (and the trend) to ``beta`` (:func:`mean_design`'s columns)."""
    with torch.no_grad():
        if len(beta) > 0:
            mod.mu0.fill_(float(beta[0]))
        if len(beta) > 1:
            mod.trend.fill_(float(beta[1]))


def time_lengthscale(mod: nn.Module) -> torch.Tensor:
    """``ell_t`` in the scaled units of the time column (years: ``ell_t * x_span[t] / 2``)."""
    return nn.functional.softplus(mod.raw_ell_t)


def time_lengthscale_years(model) -> float:
    """A fitted space-time model's learned time lengthscale in years (the caller's units of the time column)."""
    mod = model.module_
    return float(time_lengthscale(mod).detach()) * float(model.x_span_[mod.t_col]) / 2.0


def beta(mod: nn.Module) -> torch.Tensor:
    """Gneiting's space-time interaction ``beta = sigmoid(raw_beta)`` in ``(0, 1)``."""
    return torch.sigmoid(mod.raw_beta)


def init_hypers(mod: nn.Module) -> bool:
    """Set the space-time module's lengthscales (and ``beta``) to their initial values; False (nothing done) for a
    spatial module, whose initial lengthscale the Vecchia model sets itself."""
    if mod.space_time == "none":
        return False
    ell_s0, ell_t0 = (float(v) for v in mod.st_ell0.detach().cpu())
    with torch.no_grad():
        mod.raw_ell.fill_(inv_softplus(ell_s0))
        mod.raw_ell_t.fill_(inv_softplus(ell_t0))
        if mod.space_time == "gneiting":
            mod.raw_beta.fill_(_logit(mod.beta_init))
    return True


# --------------------------------------------------------------------------------------------
# Kernels on squared-distance pieces
# --------------------------------------------------------------------------------------------


def gneiting_psi(u2: torch.Tensor, alpha: float, beta: torch.Tensor | float) -> torch.Tensor:
    """``psi(u^2) = ((u^2)^alpha + 1)^beta`` (``u^2 >= 0``; finite gradients at ``u = 0`` for ``alpha < 1`` too)."""
    if alpha == 1.0:
        s = u2
    else:
        pos = u2 > 0
        s = torch.where(pos, torch.where(pos, u2, torch.ones_like(u2)).pow(alpha), torch.zeros_like(u2))
    return (s + 1.0).pow(beta)


def time_correlation(name: str, u2: torch.Tensor) -> torch.Tensor:
    """Matérn-1/2 ``exp(-u)`` or Matérn-3/2 ``(1 + sqrt3 u) exp(-sqrt3 u)`` of the scaled squared lag ``u2``: exactly 1
    at ``u = 0`` (no clamp, so one quarter gives the spatial kernel bit for bit), zero gradient there."""
    pos = u2 > 0
    return _lag_correlation(name, torch.where(pos, torch.where(pos, u2, torch.ones_like(u2)).sqrt(),
                                              torch.zeros_like(u2)))


def _lag_correlation(name: str, u: torch.Tensor) -> torch.Tensor:
    """:func:`time_correlation` of the scaled lag ``u = |t - t'| / ell_t`` itself."""
    if name == "matern12":
        return torch.exp(-u)
    if name == "matern32":
        s = math.sqrt(3.0) * u
        return (1.0 + s) * torch.exp(-s)
    raise ValueError(f"unknown time_kernel {name!r}; allowed: {TIME_KERNELS}")


def spacetime_sqdist(kind: str, kernel: str, d2: torch.Tensor, u2: torch.Tensor, outputscale, *,
                     time_kernel: str = "matern12", alpha: float = 1.0, beta=0.5, n_space: int = 2) -> torch.Tensor:
    """The space-time covariance from the scaled squared spatial distance ``d2`` and the scaled squared time lag
    ``u2`` (same shape): separable ``o^2 rho(d2) rho_t(u2)`` or Gneiting ``o^2 psi^{-n_space/2} rho(d2 / psi)``."""
    if kind == "separable":
        return stationary_sqdist(kernel, d2, outputscale) * time_correlation(time_kernel, u2)
    if kind == "gneiting":
        psi = gneiting_psi(u2, alpha, beta)
        return outputscale * psi.pow(-0.5 * n_space) * stationary_sqdist(kernel, d2 / psi, 1.0)
    raise ValueError(f"unknown space_time {kind!r}; allowed: {SPACE_TIME[1:]}")


def _module_sqdist(mod: nn.Module, d2: torch.Tensor, u2: torch.Tensor, outputscale: torch.Tensor) -> torch.Tensor:
    b = beta(mod).to(d2.dtype) if mod.space_time == "gneiting" else 0.0
    return spacetime_sqdist(mod.space_time, mod.kernel_name, d2, u2, outputscale, time_kernel=mod.time_kernel,
                            alpha=mod.gneiting_alpha, beta=b, n_space=len(mod.space_cols))


def group_kernel(mod: nn.Module, Xg: torch.Tensor) -> torch.Tensor:
    """Noise-free space-time covariance of each group (``Xg``: ``b x k x d`` -> ``b x k x k``, float64), the
    space-time kernel of :func:`gpcore.models.vecchia.group_covariance`, which adds the noise. Without a graph
    (predictions, the joint factor) a separable kernel is computed in place (:func:`_separable_in_place`)."""
    if mod.space_time == "separable" and not torch.is_grad_enabled():
        return _separable_in_place(mod, Xg)
    A = Xg[..., mod.space_cols].double() / mod.lengthscale.double()
    d2 = torch.zeros(A.shape[:-1] + A.shape[-2:-1], dtype=torch.float64, device=A.device)
    for j in range(A.shape[-1]):  # direct differences, as the spatial group covariance
        d2 = d2 + (A[..., :, j, None] - A[..., None, :, j]).pow(2)
    T = Xg[..., mod.t_col].double() / time_lengthscale(mod).double()
    u2 = (T[..., :, None] - T[..., None, :]).pow(2)
    return _module_sqdist(mod, d2, u2, mod.outputscale.double())


def _separable_in_place(mod: nn.Module, Xg: torch.Tensor) -> torch.Tensor:
    """:func:`group_kernel` of a separable module without autograd: the spatial kernel's fused group kernel (in
    place without a graph) times the time correlation of ``u = |t - t'| / ell_t`` (no square and root); equal to the
    autograd form to rounding."""
    k = group_kernel_s(mod.kernel_name, Xg[..., mod.space_cols], mod.lengthscale, mod.outputscale)
    T = Xg[..., mod.t_col].double() / time_lengthscale(mod).double()
    return k.mul_(_lag_correlation(mod.time_kernel, (T[..., :, None] - T[..., None, :]).abs_()))


def cross_kernel(mod: nn.Module, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """The module's prior covariance ``k(x1, x2)`` (``n1 x n2``): the spatial kernel for ``"none"``, else the
    space-time one."""
    if mod.space_time == "none":
        return stationary(mod.kernel_name, x1, x2, mod.lengthscale, mod.outputscale)
    d2 = scaled_sqdist(x1[:, mod.space_cols], x2[:, mod.space_cols], mod.lengthscale)
    ell_t = time_lengthscale(mod)
    u2 = (x1[:, mod.t_col, None] / ell_t - x2[None, :, mod.t_col] / ell_t).pow(2)
    return _module_sqdist(mod, d2, u2, mod.outputscale)


# --------------------------------------------------------------------------------------------
# The ordering and neighbour metric
# --------------------------------------------------------------------------------------------


def metric_coords(mod: nn.Module, X) -> np.ndarray:
    """Float64 numpy coordinates for orderings and neighbour searches: the scaled inputs for a spatial module,
    divided column-wise by ``(ell_s0, .., ell_t0)`` (the buffer ``st_ell0``) for a space-time one."""
    Xn = X.detach().double().cpu().numpy() if isinstance(X, torch.Tensor) else np.asarray(X, dtype=np.float64)
    if mod.space_time == "none":
        return Xn
    ell_s0, ell_t0 = (float(v) for v in mod.st_ell0.detach().cpu())
    scale = np.full(Xn.shape[1], ell_s0)
    scale[mod.t_col] = ell_t0
    return Xn / scale


def spatial_radius(Xsp: np.ndarray, neighbors: int, ordering: str = "maxmin") -> float | None:
    """The spatial Vecchia model's automatic initial lengthscale of the rows ``Xsp`` (scaled space columns): the
    median distance to the ``m``-th nearest predecessor over the second half of the ordering (None when there are
    too few rows), computed as :meth:`gpcore.models.vecchia.VecchiaGP._init_from_neighbours` does."""
    n = Xsp.shape[0]
    m = min(neighbors, max(n - 1, 0))
    if not n > m > 0:
        return None
    perm = maxmin_order(Xsp) if ordering == "maxmin" else coord_order(Xsp)
    Xo = torch.as_tensor(Xsp[perm])
    nbr = torch.as_tensor(ordered_neighbors(Xsp[perm], m))
    h = max(n // 2, m)
    r = (Xo[h:] - Xo[nbr[h:, -1]]).norm(dim=-1).median()
    return max(float(r), 1e-3)


def order_coords(model, mod: nn.Module, Xs: torch.Tensor) -> np.ndarray:
    """At fit time: set the metric's initial lengthscales ``st_ell0`` of a space-time module from the scaled
    training inputs ``Xs`` and the config, and return :func:`metric_coords` of ``Xs`` (the scaled inputs for a
    spatial module)."""
    if mod.space_time == "none":
        return metric_coords(mod, Xs)
    cfg = model.config
    Xn = Xs.detach().double().cpu().numpy()
    ell_t0 = cfg.time_lengthscale_init * 2.0 / float(model.x_span_[mod.t_col])
    ell_s0 = cfg.lengthscale_init
    if ell_s0 == 0:
        t = Xn[:, mod.t_col]
        _, inv, counts = np.unique(t, return_inverse=True, return_counts=True)
        inv = inv.ravel()
        slices = [np.flatnonzero(inv == k) for k in np.flatnonzero(counts > cfg.neighbors)]
        if not slices:  # no time slice with m neighbours (e.g. continuous t): all rows as one
            slices = [np.arange(Xn.shape[0])]
        radii = [spatial_radius(Xn[idx][:, mod.space_cols], cfg.neighbors, cfg.ordering) for idx in slices]
        radii = [r for r in radii if r is not None]
        ell_s0 = float(np.median(radii)) if radii else 0.3
    with torch.no_grad():
        mod.st_ell0.copy_(torch.tensor([ell_s0, ell_t0], dtype=mod.st_ell0.dtype))
    return metric_coords(mod, Xs)
