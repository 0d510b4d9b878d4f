"""Vecchia (nearest-neighbour) GP: the exact GP's likelihood factorised over ordered neighbour sets.

Model: ``y = mu0 + f(x) + eps`` with ``f ~ GP(0, outputscale * rho(||(x - x') / ell||))`` (RBF or
Matérn-1/2 (default), 3/2, 5/2; ARD lengthscales on the scaled ``[-1, 1]`` inputs, as
:mod:`gpcore.models.exact`) and ``eps ~ N(0, s2)``. With the training points in an order
``x_1, ..., x_n`` and ``N(i)`` the ``m`` nearest (Euclidean, scaled inputs) among ``x_1 .. x_{i-1}``,
the Vecchia (1988) approximation of the joint density of the noisy targets is

    log p(y) ~= sum_i log N(y_i; mu_i, v_i),
    mu_i = mu0 + k_iN (K_NN + s2 I)^{-1} (y_N - mu0),   v_i = k_ii + s2 - k_iN (K_NN + s2 I)^{-1} k_Ni,

(the "response" Vecchia approximation of GPBoost / GpGp). With ``m >= n - 1`` every point conditions
on all its predecessors and the sum is the exact log marginal likelihood. Each term comes from
one ``(m+1) x (m+1)`` Cholesky of the joint covariance of ``[y_N, y_i]``: with ``L = chol(C)`` and
``v = L^{-1}(z - mu0)``, ``log N(y_i; mu_i, v_i) = -0.5 log 2 pi - log L_mm - 0.5 v_m^2``. Points with
fewer than ``m`` predecessors are padded with identity rows that contribute nothing. All of it runs
batched in float64 (``chunk_size`` points per batched Cholesky), on the model's device.

Ordering (``ordering``): ``maxmin`` (default), the exact max-min distance ordering (Guinness 2018), or ``coord``
(the first scaled coordinate, as spNNGP / GPBoost); neighbour sets are the exact ``m`` nearest predecessors
(:mod:`gpcore.models.neighbors`; docs/methods/vecchia.md, "Ordering and neighbours"). Both are computed once per
fit on the scaled inputs (they do not follow the learned ARD lengthscales). Space-time inputs (lon, lat, t), whose
prior mean may carry a time trend: docs/methods/spacetime.md (``space_time``, ``time_trend``).

Training: hyperparameters (lengthscales, outputscale, noise, constant mean) by the config's ``optimizer`` (L-BFGS, one
strong-Wolfe iteration per epoch, or AdamW) on the Vecchia likelihood (above ``likelihood_points`` rows a seeded subset
of its terms, scaled: :mod:`gpcore.models.terms`; :mod:`gpcore.models.training`, stopped once the validation NLL gains
under ``min_improvement`` in ``patience`` iterations), backward chunk by chunk (``_step``: memory of one chunk); the
lengthscales start at the neighbourhood radius (``lengthscale_init=0``). Under ``torchrun ... --distributed`` every rank
holds all ordered points and computes a contiguous share of the chunks; loss and gradients are summed over ranks at
every closure evaluation (docs/scaling.md, "Vecchia and dbk-nn").

Prediction: each new point conditions on its ``pred_neighbors`` (default ``3m/2``) nearest training points:
``mean = mu0 + k_xN (K_NN + s2 I)^{-1} (y_N - mu0)``, ``var_f = k_xx - k_xN (K_NN + s2 I)^{-1} k_Nx``,
``var_y = var_f + s2`` (exact GP prediction when ``pred_neighbors >= n``).

Calibration (``cv_calibration``, off unless a run picks it by its split): every latent variance and covariance times
the cross-validated scale of :mod:`gpcore.models.vecchia_cv` (docs/calibration.md).

Joint posterior: no feature form; the joint posterior of many new places is the response-first joint Vecchia
prediction of :mod:`gpcore.models.vecchia_joint` (new places after the training points, in ``joint_ordering``, each
conditioned on its ``pred_neighbors`` (default ``m``) nearest training points and its ``joint_neighbors`` nearest
earlier new places): ``posterior_cov``, areal sums, joint samples and suggestions (:mod:`gpcore.posterior`,
docs/decide.md).

Saved state: hyperparameters, ordered training inputs and targets (scaled), ordering and neighbour sets, as tensors
(safetensors); the prediction neighbour index is rebuilt on first use.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from torch import nn

from gpcore.errors import ConfigError, InputError
from gpcore.models import spacetime as st
from gpcore.models import vecchia_cv
from gpcore.models.base import GPModel
from gpcore.models.hyper import SoftplusHyperparameters
from gpcore.models.inputs import as_1d_float, as_2d_float, as_weights
from gpcore.models.kernels import group_kernel
from gpcore.models.linalg import LOG_2PI, VecchiaRow, inv_softplus, psd_safe_cholesky
from gpcore.models.neighbors import NearestIndex, coord_order, maxmin_order, ordered_neighbors
from gpcore.models.registry import register
from gpcore.models.terms import current_terms, subsampled
from gpcore.models.vecchia_config import VecchiaConfig


class VecchiaModule(SoftplusHyperparameters, nn.Module):
    def __init__(self, d: int, cfg: VecchiaConfig, n: int):
        super().__init__()
        self.kernel_name = cfg.kernel
        self.noise_floor = cfg.noise_floor
        self.raw_ell = nn.Parameter(torch.full((d if cfg.ard else 1,), inv_softplus(cfg.lengthscale_init or 0.3)))
        st.add_params(self, d, cfg)  # space_time: the time lengthscale, Gneiting's beta, the metric (spacetime.py)
        self.raw_outputscale = nn.Parameter(torch.tensor(inv_softplus(cfg.outputscale_init or 1.0)))  # 0: set in
        self.raw_noise = nn.Parameter(torch.tensor(inv_softplus(max((cfg.noise_init or 0.1) - cfg.noise_floor, 1e-8))))
        self.mu0 = nn.Parameter(torch.zeros(()), requires_grad=cfg.learn_mean)  # ... VecchiaGP._init_from_neighbours
        m = min(cfg.neighbors, max(n - 1, 0))
        # ordered training data, the ordering permutation and the training neighbour sets
        self.register_buffer("X_train", torch.zeros(n, d))
        self.register_buffer("y_train", torch.zeros(n))
        self.register_buffer("order", torch.zeros(n, dtype=torch.long))
        self.register_buffer("nbr", torch.full((n, m), -1, dtype=torch.long))
        # per-observation weights of the ordered training points (weighted fits; ones otherwise)
        self.register_buffer("w_train", torch.ones(n))

    def K(self, x1, x2):
        return st.cross_kernel(self, x1, x2)  # the stationary kernel, or space-time (spacetime.py)


def _conditional_terms(mod: VecchiaModule, Xg: torch.Tensor, zg: torch.Tensor, valid: torch.Tensor,
                       noise: torch.Tensor | None = None):
    """Batched ``(m+1) x (m+1)`` conditionals in float64: the last entry of each group given the rest.

    ``Xg``: ``b x (m+1) x d`` inputs (last = the point), ``zg``: ``b x (m+1)`` centred targets,
    ``valid``: ``b x (m+1)`` mask (invalid entries become identity rows that contribute nothing).
    ``noise``: the noise variance of each entry (``b x (m+1)``, weighted fits: ``tau^2 + s2 / w``);
    ``None`` = the model's ``s2`` for every entry.
    ``C`` is the noisy covariance of the group; returns ``(L, v)`` with ``L = chol(C)``, ``v = L^{-1} z``.
    """
    L = psd_safe_cholesky(group_covariance(mod, Xg, valid, noise))
    v = torch.linalg.solve_triangular(L, zg.double().unsqueeze(-1), upper=False).squeeze(-1)
    return L, v


def group_covariance(mod: VecchiaModule, Xg: torch.Tensor, valid: torch.Tensor,
                     noise: torch.Tensor | None = None) -> torch.Tensor:
    """Noisy covariance of each group (``b x k x k``, float64; padding entries become identity rows; ``valid=None``:
    none)."""
    s2 = mod.noise.double() if noise is None else noise.double()
    if mod.space_time != "none":  # docs/methods/spacetime.md (autograd)
        C = st.group_kernel(mod, Xg)
    else:
        C = group_kernel(mod.kernel_name, Xg, mod.lengthscale, mod.outputscale)  # fused, closed-form backward
    C.diagonal(dim1=-2, dim2=-1).add_(s2)
    if valid is None:  # no padding in these groups
        return C
    eye = torch.eye(C.shape[-1], dtype=torch.float64, device=Xg.device)
    both = valid.unsqueeze(-1) & valid.unsqueeze(-2)
    return torch.where(both, C, eye)


def vecchia_rows(mod: VecchiaModule, Xg: torch.Tensor, valid: torch.Tensor,
                 noise: torch.Tensor | None = None) -> torch.Tensor:
    """The Vecchia row ``ell`` of every group (:class:`~gpcore.models.linalg.VecchiaRow`), differentiable."""
    return VecchiaRow.apply(group_covariance(mod, Xg, valid, noise))


@register("vecchia", description="Vecchia nearest-neighbour GP (maxmin ordering, m = 30, Matérn-1/2)")
class VecchiaGP(GPModel):
    """Vecchia nearest-neighbour GP: exact-GP likelihood over ordered neighbour sets, batched Cholesky."""

    Config = VecchiaConfig
    unused_settings = ("batch_size",)  # always full batch
    #: calibrated as fitted; per-stratum scales over-cover (docs/benchmarks/race.md) and the validation rows serve
    #: better in the posterior (condition_on_validation), so a run does not recalibrate unless asked to
    run_recalibration: ClassVar[str] = "none"
    #: finalize stores the ordered training weights (their noise enters every prediction's neighbour set)
    needs_finalize = True
    #: trains under torchrun: every rank all the rows, its share of the chunks (_step; docs/scaling.md)
    distributed_full_batch = distributed_own_share = True
    uncertainty_note: ClassVar[str] = ("The Vecchia GP is a stationary GP conditioned on nearby data: intervals return "
                                       "to the prior far from measurements but do not adapt to input-dependent noise.")

    @property
    def full_batch(self) -> bool:
        return True

    # ---------------------------------------------------------------- fit-time structure
    def _make_module(self, d: int, n: int) -> VecchiaModule:
        return VecchiaModule(d, self.config, n)

    def _build(self, d, Xs, ys):
        n = 0 if Xs is None else Xs.shape[0]
        mod = self._make_module(d, n)
        self._tree = self._joint_cache = self._pad_end = None
        if Xs is None:
            return mod
        Xn = st.order_coords(self, mod, Xs)  # the scaled inputs (space-time: / the initial lengthscales)
        perm = maxmin_order(Xn) if self.config.ordering == "maxmin" else coord_order(Xn)
        nbr = ordered_neighbors(Xn[perm], mod.nbr.shape[1], device=Xs.device)
        mod.order, mod.nbr = torch.as_tensor(perm, device=Xs.device), torch.as_tensor(nbr, device=Xs.device)
        mod.X_train = Xs.detach()[mod.order].clone()
        mod.y_train = ys.detach()[mod.order].clone()
        self._init_from_neighbours(mod)
        return mod

    def _init_from_neighbours(self, mod: VecchiaModule) -> None:
        """The initial hyperparameters from the ordered neighbour sets, each where its setting is 0 (auto), over the
        second half of the ordering (its rows have dense predecessors; docs/methods/vecchia.md, "Initial values"):
        the lengthscale is the median distance to the m-th nearest predecessor (space-time: spacetime.py's), the noise
        the semivariance ``mean (y_i - y_nearest(i))^2 / 2`` clamped to 5-90 % of the target variance ``v``, the
        outputscale ``v`` less that noise. Why not fixed values: docs/benchmarks/settings.md ("the automatic initial
        lengthscale") and docs/benchmarks/speed.md ("initial variances from the neighbours"). A space-time model keeps
        1 and 0.1 (its nearest predecessor is often the same tile in another quarter; docs/benchmarks/spacetime.md,
        "the forecast after the semivariance start")."""
        cfg, (n, m) = self.config, mod.nbr.shape
        spatial = not st.init_hypers(mod)  # space-time: the initial lengthscales of the ordering metric
        h = max(n // 2, m)
        with torch.no_grad():
            if spatial:  # the setting's value, or with 0 the radius (0.3 with too few rows)
                r = cfg.lengthscale_init or (0.3 if not n > m > 0 else float(
                    (mod.X_train[h:].double() - mod.X_train[mod.nbr[h:, -1]].double()).norm(dim=-1).median()))
                mod.raw_ell.fill_(inv_softplus(max(r, 1e-3) if cfg.lengthscale_init == 0 else r))
            if not (n > m > 0 and spatial):
                return  # too few rows, or space-time: the variances keep the settings' values (1, 0.1 when auto)
            y = mod.y_train.double()
            v = float(y.var())
            semi = 0.5 * float((y[h:] - y[mod.nbr[h:, 0]]).pow(2).mean())  # the nearest predecessor's semivariance
            noise = cfg.noise_init or min(max(semi, 0.05 * v), 0.9 * v)
            if cfg.noise_init == 0:
                mod.raw_noise.fill_(inv_softplus(max(noise - cfg.noise_floor, 1e-8)))
            if cfg.outputscale_init == 0:
                mod.raw_outputscale.fill_(inv_softplus(max(v - noise, 0.1 * v)))

    def vecchia_terms(self, start: int = 0, stop: int | None = None, ws: torch.Tensor | None = None) -> torch.Tensor:
        """Per-point log conditionals ``log N(y_i; mu_i, v_i)`` (float64, standardised units, with a graph) of the
        ordered training points ``start .. stop`` (``ws``: the weights, caller order, while training; else stored)."""
        stop = self.module_.X_train.shape[0] if stop is None else stop
        return self._terms_at(torch.arange(start, stop, device=self.module_.X_train.device), start, ws)

    def _terms_at(self, idx: torch.Tensor, first: int, ws: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`vecchia_terms` of the ordered rows ``idx`` (ascending, the first ``first``)."""
        ell, _, z = self._chunk_rows(idx, first, ws)
        u = (ell * z).sum(-1)  # (z_i - A z_N) / sqrt(D)
        return -0.5 * LOG_2PI + torch.log(ell[:, -1]) - 0.5 * u.pow(2)

    def _chunk_rows(self, idx: torch.Tensor, first: int, ws: torch.Tensor | None = None):
        """``(ell, Gc, z)`` of ordered rows ``idx`` (as :meth:`_chunk_groups`): the differentiable Vecchia rows (zero
        at padding entries), the groups' clamped indices and centred targets."""
        valid, Gc, Xg, z = self._chunk_groups(idx, first)
        return vecchia_rows(self.module_, Xg, valid, self._group_noise(Gc, ws)), Gc, z

    def _chunk_groups(self, idx: torch.Tensor, first: int):
        """``(valid, Gc, Xg, z)`` of the groups of ordered rows ``idx`` (ascending, from ``first``): padding mask (None
        past the last padded row: no ``where``), clamped indices, inputs, centred targets (zero at padding)."""
        mod = self.module_
        G = torch.cat([mod.nbr[idx], idx[:, None]], dim=1)  # b x (m+1), last = the point
        if getattr(self, "_pad_end", None) is None:  # found once per neighbour set
            pad = (mod.nbr < 0).any(1).nonzero()
            self._pad_end = int(pad.max()) + 1 if pad.numel() else 0
        valid = None if first >= self._pad_end else G >= 0
        Gc = G if valid is None else G.clamp_min(0)
        Xg = mod.X_train[Gc]
        z = mod.y_train.double()[Gc] - st.prior_mean(mod, Xg)
        z = z if valid is None else torch.where(valid, z, torch.zeros((), dtype=torch.float64, device=G.device))
        return valid, Gc, Xg, z

    def _ordered_weights(self, ws: torch.Tensor | None = None) -> torch.Tensor | None:
        """Weights of the ordered training points: the training step's (``ws``, caller order) while
        training, the stored ones after :meth:`finalize`; None for an unweighted model."""
        if not self.weighted:
            return None
        return ws[self.module_.order] if ws is not None else self.module_.w_train

    def _group_noise(self, Gc: torch.Tensor, ws: torch.Tensor | None = None) -> torch.Tensor | None:
        """Noise variance ``tau^2 + s2 / w`` of training points ``Gc`` (any shape; None when unweighted)."""
        w = self._ordered_weights(ws)
        return None if w is None else self._nugget_s().double() + self.module_.noise.double() / w.double()[Gc]

    def _finalize(self, Xs, ys, ws=None):
        mod = self.module_
        if ws is not None:
            mod.w_train.copy_(ws[mod.order].to(mod.w_train.dtype))

    def log_likelihood(self, ws: torch.Tensor | None = None) -> torch.Tensor:
        """Vecchia log-likelihood of the (scaled) training targets, float64, summed over chunks (``ws``: the
        training rows' weights, caller order; default the stored ones). While fitting above ``likelihood_points``
        rows: the subset's terms times ``n / k`` (:mod:`gpcore.models.terms`)."""
        t = current_terms(self)
        dev = self.module_.X_train.device
        chunks = t.chunks(self.config.chunk_size, dev, own=False)
        total = sum((self._terms_at(idx, first, ws).sum() for idx, first in chunks),
                    torch.zeros((), dtype=torch.float64, device=dev))
        return t.weigh(total)

    def _check_train_batch(self, xb):
        if xb.shape[0] != self.module_.X_train.shape[0]:
            raise InputError("vecchia trains full-batch on the training set it was built with")

    def _loss(self, xb, yb, n, wb=None):
        self._check_train_batch(xb)
        return (-self.log_likelihood(wb) / n).to(self.module_.raw_noise.dtype)

    def _step(self, xb, yb, n, wb=None):
        """One backward pass chunk by chunk (memory of one chunk), gradients accumulated. In a distributed step
        only this rank's chunks (:func:`gpcore.comm.own_chunks`): loss and gradient are its shares, which the
        trainer sums over ranks (docs/scaling.md). Above ``likelihood_points`` rows the fitting subset's terms."""
        self._check_train_batch(xb)
        total = torch.zeros((), dtype=torch.float64, device=xb.device)
        t = current_terms(self)
        for idx, first in t.chunks(self.config.chunk_size, xb.device):
            loss = t.weigh(-self._terms_at(idx, first, wb).sum() / n)
            loss.backward()
            total += loss.detach()
        return total

    def _train(self, Xs, ys, Xv, yv, callback, ws, wv):  # above likelihood_points rows: a subset of the terms
        with subsampled(self, self.module_.X_train.shape[0]):
            return self._fit_hyperparameters(Xs, ys, Xv, yv, callback, ws, wv)

    def _fit_hyperparameters(self, Xs, ys, Xv, yv, callback, ws, wv):  # dbk-nn: its stages
        return super()._train(Xs, ys, Xv, yv, callback, ws, wv)

    # ---------------------------------------------------------------- every labelled row in the posterior
    def fit(self, X, y, X_val=None, y_val=None, callback=None, *, weights=None, val_weights=None, **kw):
        """:meth:`GPModel.fit`, then (``condition_on_validation``) :meth:`condition_on` the validation rows: they
        stop training and pick the feature check and the recalibration first, then join the posterior; then the
        ``cv_calibration`` scale over every conditioning row (:func:`gpcore.models.vecchia_cv.calibrate`); not both."""
        cfg = self.config
        if cfg.noise_shape != "gaussian" and cfg.cv_calibration == "none":
            raise ConfigError(f"noise_shape={cfg.noise_shape!r} is fitted on the rows of cv_calibration: set "
                              "cv_calibration to 'rows' or 'blocks' (a run picks it by its split)")
        if cfg.cv_calibration != "none" and cfg.recalibrate != "none":
            raise ConfigError(f"cv_calibration={cfg.cv_calibration!r} and recalibrate={cfg.recalibrate!r} would both "
                              "rescale the intervals: set one of them to 'none'")
        super().fit(X, y, X_val, y_val, callback, weights=weights, val_weights=val_weights, **kw)
        cancelled = bool(self.train_info_.get("cancelled"))
        if cfg.condition_on_validation and X_val is not None and len(X_val) and not cancelled:
            self.condition_on(X_val, y_val, weights=val_weights)
        if cfg.cv_calibration != "none" and not cancelled:
            vecchia_cv.calibrate(self)
        return self

    def condition_on(self, X, y, weights=None):
        """Add labelled rows ``X`` (``n x d``), ``y`` to the posterior's conditioning set, hyperparameters unchanged.

        The rows join the ordered training set after its last point (maxmin order among themselves), each with its
        ``m`` nearest predecessors, so every later prediction (marginal or joint) conditions on them as on training
        rows; a weighted model needs their ``weights``. ``train_info_["conditioned_on"]`` counts the rows by kind.
        """
        self._check_fitted()
        X = as_2d_float(X, "X", d=self.d_)
        y = as_1d_float(y, X.shape[0], "y")
        if self.weighted and weights is None:
            raise InputError("this model was fitted with weights: pass the new rows' weights")
        if not self.weighted and weights is not None:
            raise InputError("this model was fitted without weights: drop the weights of the new rows")
        if X.shape[0] == 0:
            return self
        mod = self.module_
        Xs, ys = self.scale_x(X), self.scale_y(y)
        perm = torch.as_tensor(maxmin_order(st.metric_coords(mod, Xs)), device=mod.X_train.device)
        n0 = mod.X_train.shape[0]
        with torch.no_grad():
            X_all = torch.cat([mod.X_train, Xs[perm].to(mod.X_train.dtype)])
            m = max(min(self.config.neighbors, X_all.shape[0] - 1), mod.nbr.shape[1])  # m nearest, as in training
            nbr = ordered_neighbors(st.metric_coords(mod, X_all), m, start=n0, device=X_all.device)
            pad = torch.full((n0, m - mod.nbr.shape[1]), -1, dtype=mod.nbr.dtype, device=mod.nbr.device)
            mod.nbr = torch.cat([torch.cat([mod.nbr, pad], 1), torch.as_tensor(nbr, device=mod.nbr.device)])
            mod.X_train = X_all
            mod.y_train = torch.cat([mod.y_train, ys[perm].to(mod.y_train.dtype)])
            mod.order = torch.cat([mod.order, n0 + perm])
            w = torch.ones(X.shape[0]) if weights is None else torch.as_tensor(as_weights(weights, X.shape[0]))
            mod.w_train = torch.cat([mod.w_train, w.to(mod.w_train)[perm]])
        self._tree = self._joint_cache = self._pad_end = None
        with torch.no_grad():  # the refreshed posterior needs no graph (at 1 M rows one would fill a GPU)
            self._after_conditioning(n0)
        counts = self.train_info_.setdefault("conditioned_on", {"training": n0})
        counts["validation"] = counts.get("validation", 0) + X.shape[0]
        return self

    def recalibrate(self, X_val, y_val, **kw) -> dict:
        """:meth:`GPModel.recalibrate`, refused once the validation rows are in the posterior (they would score
        their own data): ``fit`` with the ``recalibrate`` setting recalibrates before they join it."""
        if self.train_info_.get("conditioned_on", {}).get("validation"):
            raise InputError("this model's posterior already conditions on its validation rows, which cannot then "
                             "recalibrate it: fit with recalibrate='global' or 'group' (done before they join), or "
                             "with condition_on_validation=False")
        return super().recalibrate(X_val, y_val, **kw)

    def _after_conditioning(self, n0: int) -> None:
        """Hook: refresh what depends on the conditioning set (dbk-nn: the posterior of its feature weights)."""

    # ---------------------------------------------------------------- prediction
    def _neighbor_tree(self) -> NearestIndex:
        """The nearest-neighbour index of the ordered training points (KD-tree or grid search by device), kept."""
        tree = getattr(self, "_tree", None)
        if tree is None:
            tree = NearestIndex(st.metric_coords(self.module_, self.module_.X_train), self.module_.X_train.device)
            self._tree = tree
        return tree

    def _prediction_neighbors(self, xb: torch.Tensor, joint: bool = False) -> torch.Tensor:
        """Indices (``b x k``, nearest first) of the ``pred_neighbors`` nearest ordered training points (0: ``3m/2``,
        for the joint posterior ``m``)."""
        m = self.config.neighbors
        k = min(self.config.pred_neighbors or (m if joint else m * 3 // 2), self.module_.X_train.shape[0])
        return self._neighbor_tree().query(st.metric_coords(self.module_, xb), k).to(xb.device)

    def _prediction_noise(self, N: torch.Tensor) -> torch.Tensor | None:
        """Noise of the groups ``[N, x]`` (None unweighted); the new point's own entry only sets the unused ``L_mm``."""
        noise = self._group_noise(N)
        return None if noise is None else torch.cat([noise, noise[:, :1]], dim=1)

    def _predict_f(self, xb):
        mod, idx = self.module_, self._prediction_neighbors(xb)
        k, means, vars_ = idx.shape[1], [], []
        cs = self.config.prediction_chunk(xb.device.type)
        for i in range(0, xb.shape[0], cs):
            N = idx[i : i + cs]
            x = xb[i : i + cs].double()
            XN = mod.X_train[N].double()
            z = mod.y_train.double()[N] - st.prior_mean(mod, XN)
            valid = torch.ones(N.shape[0], k + 1, dtype=torch.bool, device=xb.device)
            Xg = torch.cat([XN, x[:, None, :]], dim=1)
            zg = torch.cat([z, torch.zeros_like(z[:, :1])], dim=1)
            L, v = _conditional_terms(mod, Xg, zg, valid, self._prediction_noise(N))
            # last row of L: [l^T, L_mm] with l = L_NN^{-1} k_Nx and L_mm^2 = k_xx + s2 - |l|^2
            l_row = L[:, -1, :-1]
            means.append(st.prior_mean(mod, x) + (l_row * v[:, :-1]).sum(-1))
            vars_.append(mod.outputscale.double() - l_row.pow(2).sum(-1))
        dt = mod.raw_noise.dtype
        return torch.cat(means).to(dt), torch.cat(vars_).to(dt) * vecchia_cv.latent_scale(self)

    # ---------------------------------------------------------------- kernel, persistence
    def _kernel_s(self, x1, x2):
        return self.module_.K(x1, x2)

    def _kernel_diag_s(self, xb):
        return self.module_.outputscale.expand(xb.shape[0])

    def _feature_form(self):
        raise InputError(f"{type(self).__name__} has no feature form: its joint posterior is the joint Vecchia "
                         "prediction (gpcore.posterior.joint_posterior)")

    def prior_mean_at(self, X) -> np.ndarray:
        """The prior mean at ``X`` (``m x d``) in the caller's units: ``prior_mean``, plus ``b t`` for a space-time
        model with ``time_trend`` (docs/methods/spacetime.md)."""
        self._check_fitted()
        with torch.no_grad():
            mu = st.prior_mean(self.module_, self.scale_x(as_2d_float(X, "X", d=self.d_)))
            return self.y_mean_ + self.y_std_ * np.broadcast_to(mu.cpu().numpy(), (len(X),)).copy()

    # ---------------------------------------------------------------- joint posterior (vecchia_joint)
    def joint_s(self, Xs: torch.Tensor, m_pred: int | None = None):
        """The joint posterior of f at scaled places ``Xs`` (:class:`~gpcore.models.vecchia_joint.VecchiaJoint`); the
        last one is kept (keyed by the places' bytes and ``m_pred``): a new fit or :meth:`condition_on` drops it."""
        from gpcore.models.vecchia_joint import build_joint

        self._check_fitted()
        key, cached = self._joint_key(Xs, m_pred), getattr(self, "_joint_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        with torch.no_grad():
            self._joint_cache = (key, build_joint(self, Xs, group_covariance, m_pred))
        return self._joint_cache[1]

    def noise_multiplier(self, weights, m: int):
        """The noise scale of each row's tests-count bin from the cross-validation (1 without one)."""
        return vecchia_cv.noise_multiplier(getattr(self, "train_info_", None), weights, m)

    def noise_shape(self):
        """The two-component noise ``noise_shape="two_component"`` fitted with the latent scale (None: Gaussian)."""
        return vecchia_cv.recorded_shape(getattr(self, "train_info_", None))

    def forget_joint(self) -> None:
        """Drop the kept joint posterior (:meth:`joint_s`, :meth:`keep_joint`): the next joint operation builds it
        again. For timing a build, and after a change to what it depends on outside :meth:`fit` and
        :meth:`condition_on` (which drop it themselves), such as the latent scale of ``cv_calibration``."""
        self._joint_cache = None

    @staticmethod
    def _joint_key(Xs: torch.Tensor, m_pred: int | None) -> tuple:
        return tuple(Xs.shape), hash(Xs.detach().cpu().numpy().tobytes()), m_pred

    @torch.no_grad()
    def keep_joint(self, Xs: torch.Tensor, joint) -> None:
        """Keep ``joint`` (a run's stored grid factor, :mod:`gpcore.run.grid_joint`) as the joint posterior at scaled
        places ``Xs``, as :meth:`joint_s` keeps one it builds; a low-rank part is completed from the features."""
        self._check_fitted()
        if joint.n != Xs.shape[0]:
            raise ValueError(f"a joint posterior of {joint.n} places for {Xs.shape[0]} places")
        joint = joint if joint.F is not None else joint.with_lowrank(self._joint_lowrank(), Xs)
        self._joint_cache = (self._joint_key(Xs, None), joint)

    def _joint_residuals(self) -> torch.Tensor:
        """The residuals ``y - mu0`` the new places condition on (ordered; ``mu0 + b t`` with a time trend)."""
        return self.module_.y_train.double() - st.prior_mean(self.module_, self.module_.X_train)

    def _joint_lowrank(self):
        """``(a Phi_T, x -> a phi(x), w_hat, F)`` of a low-rank part (dbk-nn), None for the Vecchia GP."""
        return None

    def _posterior_cov_s(self, X1s, X2s):
        """The joint Vecchia covariance over the distinct places of ``X1`` and ``X2`` (one ordering for both)."""
        Z, inv = np.unique(torch.cat([X1s, X2s]).detach().double().cpu().numpy(), axis=0, return_inverse=True)
        C, inv = self.joint_s(torch.as_tensor(Z, dtype=X1s.dtype, device=X1s.device)).cov(), inv.ravel()
        return torch.as_tensor(C[np.ix_(inv[: X1s.shape[0]], inv[X1s.shape[0]:])])

    @property
    def lengthscale(self):
        """Learned lengthscale(s) in the model's scaled input units ([-1, 1] box)."""
        return self.module_.lengthscale.detach().cpu().numpy()
