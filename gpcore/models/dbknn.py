"""dbk-nn — DBK features plus a nearest-neighbour (Vecchia) residual GP. A new model: no paper has it.

Model (scaled inputs, standardised targets):

    y = mu0 + a phi(x)^T w + r(x) + eps,   w ~ N(0, I_p),   r ~ GP(0, k_r),   eps ~ N(0, s2)

``phi`` are the features of a deep basis kernel (:mod:`gpcore.models.dbk`, DBK-RBF by default) with a
learned scale ``a``; ``k_r`` is a stationary kernel (Matérn-1/2 with ARD lengthscales by default, as
``vecchia``) and the noise is ``s2`` (weighted fits: ``tau^2 + s2 / w_i``, as every model). The DBK part carries the
large-scale, non-stationary structure and the input-dependent variance ``a^2 phi^T S phi``; the residual
carries the fine scale, and far from data its variance returns to its prior ``k_r(x, x)``, so intervals
widen inside gaps, where a low-rank model's do not.

Likelihood. The residual-plus-noise covariance ``Sigma_r = K_r + D`` is replaced by its Vecchia
approximation (:mod:`gpcore.models.vecchia`: maxmin order, ``m`` nearest predecessors),
``Sigma_v^{-1} = B^T Dv^{-1} B``; row ``i`` of ``Dv^{-1/2} B`` is the last row ``l_i`` of ``L_i^{-1}`` with
``L_i`` the Cholesky factor of the ``(m+1) x (m+1)`` covariance of point ``i``'s group. The low-rank
part is kept exactly, by Woodbury and the determinant lemma:

    U = Dv^{-1/2} B (a Phi),  u = Dv^{-1/2} B (y - mu0),  M = I + U^T U,
    log p(y) = -n/2 log 2 pi - 1/2 sum_i log Dv_i - 1/2 log|M| - 1/2 |u|^2 + 1/2 |L_M^{-1} U^T u|^2.

It is exact when ``m = n - 1`` (then ``Sigma_v = K_r + D``), which the tests check against the dense
``N(mu0, a^2 Phi Phi^T + K_r + D)``. One evaluation costs ``O(n m^3 + n m p + n p^2)`` and runs in
chunks: a first pass sums ``U^T U``, ``U^T u``, ``|u|^2`` and ``sum log Dv`` without a graph, the loss is
differentiated with respect to these sums, and a second pass pushes those adjoints through each chunk
(memory of one chunk, as DBK's two-pass MML). Under ``torchrun ... --distributed`` each rank runs both passes over
its share of the chunks and the sums are all-reduced between them (docs/scaling.md, "Vecchia and dbk-nn"); stage 1
trains its DBK distributed as any DBK.

Posterior and prediction. ``w | y ~ N(M^{-1} U^T u, M^{-1})`` exactly (given the Vecchia ``Sigma_v``). A new
point ``x`` conditions its residual on its ``k`` nearest training points ``N`` given ``w``:
``t = C_NN^{-1} k_Nx``, ``e = y - mu0 - a Phi w_hat`` (the training residuals),

    mean  = mu0 + a phi(x)^T w_hat + t^T e_N
    var_f = |F^T q|^2 + k_r(x, x) - k_xN t,   q = a (phi(x) - Phi_N^T t),   F F^T = M^{-1},

the residual conditional plus the weight uncertainty carried through both ``phi(x)`` and the neighbours'
residuals. Far from data ``t -> 0``: ``var_f -> a^2 phi^T M^{-1} phi + k_r(x, x)``.

Training (``train_mode``), each stage with early stopping on the validation NLL when a validation set
is given:

* ``stagewise`` (default): (1) fit the DBK alone with its own objective and settings (``dbk_*``);
  (2) freeze the features and fit ``a``, the residual kernel, ``s2``, ``mu0`` (and ``tau^2``) by the
  hybrid likelihood above, full batch, L-BFGS. The DBK's own weight posterior is discarded: ``w``'s
  posterior is the exact one of the hybrid model.
* ``joint``: after (2), (3) train everything that shapes ``phi`` (backbone, expansion) together with
  the hybrid hyperparameters by Adam on the same full-batch likelihood (``joint_epochs``, ``joint_lr``);
  kept only when it lowers the validation NLL of stage 2.

Feature check (``feature_check``, on by default, needs a validation set): before stage (2) the residual GP is
fitted alone (``a = 0``, started as a fresh ``vecchia`` fit); the screen (``feature_screen``,
:mod:`gpcore.models.dbknn_screen`) then fits the features' scale ``a`` and a common scale ``c`` of the residual at
that fit's covariance shape in closed form, and stage (2) runs only when that lowers the validation NLL by more than
``screen_se`` paired standard errors, starting there (and stopping after ``hybrid_patience`` iterations without a
gain, not ``patience``: it starts near its optimum); the features are kept only on a validation-NLL gain above
``min_improvement``; otherwise the model is its residual Vecchia GP (``w`` keeps its prior, the kernel is ``k_r``),
``features_used`` is False and ``train_info_["feature_check"]`` holds both NLLs and the screen's. The reason is the
gaps: maximum likelihood always credits the features with what they fit between measurements, while inside large gaps
a DBK extrapolates with confidence (docs/benchmarks/heaton.md). Validated on spatial blocks (``split="block"``) it
asks whether they help in gaps.

Kernel: ``k(x, x') = a^2 phi(x)^T phi(x') + k_r(x, x')`` (the prior the kernel slice shows).
Joint posterior: the joint Vecchia prediction of the residual plus the exact low-rank part
(:mod:`gpcore.models.vecchia_joint`: ``Cov = Q F F^T Q^T + U^{-1} D U^{-T}``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import ClassVar

import torch
from torch import nn

from gpcore.comm import count_once, reduce_stats_, splits_terms
from gpcore.models import spacetime as st
from gpcore.models import training, vecchia_cv
from gpcore.models.config import setting
from gpcore.models.dbk import DBK, DBKConfig, DBKModule
from gpcore.models.dbknn_grad import frozen_feature_pass
from gpcore.models.dbknn_screen import screen_features, screen_passes
from gpcore.models.linalg import LOG_2PI, combine_rows, inv_softplus, kriging_weights
from gpcore.models.memo import PointMemo
from gpcore.models.registry import register
from gpcore.models.terms import current_terms
from gpcore.models.vecchia import VecchiaConfig, VecchiaGP, VecchiaModule, _conditional_terms

#: the DBK parameters that shape phi (the others — q(w), DBK's own noise and mean — are unused here)
_FEATURE_PARAMS = ("backbone", "expand", "scale", "Z", "raw_ell", "raw_outputscale")


@dataclasses.dataclass(frozen=True)
class DBKNNConfig(VecchiaConfig):
    """dbk-nn settings: the residual's Vecchia settings (inherited), the inner DBK's (``dbk_*``) and the
    training mode. Defaults: DBK-RBF as the ``dbk-rbf`` preset but trained in batches of 2048 at a rate of 0.01
    until 10 epochs gain less than 1e-3 (docs/methods/dbknn.md, Settings), Matérn-1/2 residual with 30 neighbours."""

    train_mode: str = setting("stagewise", help="'stagewise' (DBK, then the residual with the "
                                                  "features frozen) or 'joint' (then all of it together)",
                                                  choices=("stagewise", "joint"), main=True)
    dbk_basis: str = setting("rbf", help="DBK expansion: 'rbf' or 'silu'", choices=("rbf", "silu"))
    dbk_objective: str = setting("dppgp", help="DBK stage objective", choices=("dppgp", "mml"))
    dbk_rank: int = setting(128, help="DBK basis functions r", min=1, max=8192, main=True)
    dbk_hidden: int = setting(64, help="DBK backbone width", min=1, max=4096)
    dbk_blocks: int = setting(2, help="DBK residual blocks", min=0, max=16)
    dbk_alpha: float = setting(0.1, help="DBK dPPGP trace weight", min=0.0)
    dbk_beta: float = setting(0.01, help="DBK dPPGP KL weight", min=0.0)
    dbk_batch_size: int = setting(2048, help="DBK mini-batch size", min=1)
    dbk_epochs: int = setting(100, help="DBK stage epochs", min=1, main=True)
    dbk_lr: float = setting(1e-2, help="DBK stage learning rate", min=0.0, min_inclusive=False)
    dbk_patience: int = setting(10, help="DBK stage early-stopping patience", min=1)
    dbk_min_improvement: float = setting(1e-3, help="DBK stage validation-NLL gain that resets its patience (as "
                                         "min_improvement for the residual stages)", min=0.0)
    dbk_max_seconds: float = setting(0.0, help="DBK stage time budget in seconds (0 = none)", min=0.0)
    likelihood_fraction: float = setting(0.5, help="fits on half the rows' terms (at least 20,000, at most "
                                         "likelihood_points; dbknn.md)", min=0.0, max=1.0, min_inclusive=False)
    fscale_init: float = setting(1.0, help="initial feature scale a", min=0.0, min_inclusive=False)
    joint_epochs: int = setting(20, help="joint stage: full-batch Adam steps", min=1)
    joint_lr: float = setting(2e-3, help="joint stage: Adam learning rate", min=0.0, min_inclusive=False)
    hybrid_patience: int = setting(5, help="stage (2)'s patience after the feature check's residual fit", min=1)
    feature_screen: bool = setting(True, help="feature check: fit the full hybrid only when the features, at the "
                                   "residual fit's covariance shape, lower the validation NLL (dbknn_screen.py)")
    screen_se: float = setting(1.0, help="hybrid only on a validation gain above this many paired SEs", min=0.0)
    feature_check: bool = setting(True, help="with a validation set: also fit the residual GP alone (up to epochs "
                                             "and max_seconds again) and keep the DBK features only if they lower "
                                             "the validation NLL by more than min_improvement (validate on spatial "
                                             "blocks to make this a test of the gaps)")

    def dbk_config(self) -> DBKConfig:
        return DBKConfig.from_dict({
            "basis": self.dbk_basis, "objective": self.dbk_objective, "rank": self.dbk_rank,
            "hidden": self.dbk_hidden, "blocks": self.dbk_blocks, "alpha": self.dbk_alpha, "beta": self.dbk_beta,
            "batch_size": self.dbk_batch_size, "epochs": self.dbk_epochs, "lr": self.dbk_lr,
            "patience": self.dbk_patience, "min_improvement": self.dbk_min_improvement,
            "max_seconds": self.dbk_max_seconds, "device": self.device,
            "dtype": self.dtype, "seed": self.seed, "predict_batch_size": self.predict_batch_size,
        })


class DBKNNModule(VecchiaModule):
    """The residual Vecchia GP's parameters and training structure, the DBK feature map and the posterior."""

    def __init__(self, d: int, cfg: DBKNNConfig, n: int):
        super().__init__(d, cfg, n)
        self.dbk = DBKModule(d, cfg.dbk_config()).requires_grad_(False)  # trained in stage 1; the joint stage
        # switches on the parameters that shape phi (_FEATURE_PARAMS)
        p = cfg.dbk_rank
        self.raw_fscale = nn.Parameter(torch.tensor(inv_softplus(cfg.fscale_init)))
        self.register_buffer("post_m", torch.zeros(p))  # w_hat
        self.register_buffer("post_F", torch.zeros(p, p))  # F F^T = M^{-1}, upper triangular
        self.register_buffer("e_train", torch.zeros(n))  # y - mu0 - a Phi w_hat, ordered

    #: False when the feature check dropped the features: the model is its residual GP alone (a = 0)
    features_on: bool = True

    @property
    def fscale(self) -> torch.Tensor:
        a = nn.functional.softplus(self.raw_fscale)
        return a if self.features_on else torch.zeros_like(a)


@register("dbk-nn", description="DBK features plus a nearest-neighbour (Vecchia) residual GP")
class DBKNN(VecchiaGP):
    """DBK + Vecchia residual (module docstring)."""

    Config = DBKNNConfig
    uncertainty_note: ClassVar[str] = (
        "dbk-nn adds a nearest-neighbour residual to the DBK features: intervals keep DBK's input-dependent "
        "width and widen towards the residual's prior away from measurements — but inside large gaps the DBK "
        "features extrapolate with confidence (95 % intervals under-cover in the Heaton cloud-gap "
        "benchmark). Its feature check keeps them only if they clearly validate better than the residual GP "
        "alone; train with spatial-block splits where the map has large unmeasured areas, so the check tests them."
    )

    # ---------------------------------------------------------------- stage 1 + build
    def fit(self, X, y, X_val=None, y_val=None, callback=None, *, weights=None, val_weights=None, groups=None,
            val_groups=None):
        t0 = time.perf_counter()
        cfg = self.config
        total = (cfg.dbk_epochs + cfg.epochs + (cfg.joint_epochs if cfg.train_mode == "joint" else 0)
                 + (cfg.epochs if cfg.feature_check and X_val is not None else 0))  # the residual-only refit
        dbk = DBK(**cfg.dbk_config().to_dict())
        dbk.fit(X, y, X_val, y_val, training.staged(callback, 0, total), weights=weights, val_weights=val_weights)
        callback = training.staged(callback, len(dbk.history_), total)
        self._stage1 = dbk
        cancelled = bool(dbk.train_info_.get("cancelled"))
        try:  # cancelled in stage 1: one residual iteration (a usable model), no more callbacks
            with training.config_changed(self, **({"epochs": 1, "train_mode": "stagewise"} if cancelled else {})):
                super().fit(X, y, X_val, y_val, None if cancelled else callback, weights=weights,
                            val_weights=val_weights, groups=groups, val_groups=val_groups)
        finally:
            self._stage1 = None
        self.train_info_["stage1"] = {k: v for k, v in dbk.train_info_.items() if not isinstance(v, dict)}
        self.train_info_["cancelled"] = self.train_info_.get("cancelled", False) or cancelled
        self.train_info_["fit_seconds"] = time.perf_counter() - t0
        return self

    def _make_module(self, d: int, n: int) -> DBKNNModule:
        return DBKNNModule(d, self.config, n)

    def _build(self, d, Xs, ys):
        mod = super()._build(d, Xs, ys)
        self._phi_cache, self._stats_memo = None, PointMemo()
        self._joint = False
        mod.features_on = True if Xs is not None else getattr(self, "_features_on_loaded", True)
        stage1 = getattr(self, "_stage1", None)
        if Xs is None or stage1 is None:
            return mod
        src = stage1.module_
        mod.dbk.load_state_dict({k: v for k, v in src.state_dict().items() if k != "raw_nugget"})
        # split the variance DBK's mean leaves in the training rows between the residual and the noise (DBK's own
        # noise can be far smaller: dPPGP puts variance into q(w); starting from it took 3x the L-BFGS iterations)
        s2 = float((ys.double() - stage1.predict_scaled(Xs)[0].double()).pow(2).mean())
        with torch.no_grad():
            mod.raw_outputscale.fill_(inv_softplus(max(0.5 * s2, 1e-4)))
            mod.raw_noise.fill_(inv_softplus(max(0.5 * s2 - mod.noise_floor, 1e-6)))
            mod.mu0.fill_(float(src.mu0))
        return mod

    # ---------------------------------------------------------------- features
    def _phi_of(self, Xs: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
        """``phi`` (unscaled by ``a``) of scaled inputs, float64, in chunks; with a graph in the joint stage."""
        dbk = self.module_.dbk
        Lz = dbk.chol_zz() if dbk.basis == "rbf" else None
        return torch.cat([dbk.features(Xs[i : i + chunk], Lz).double() for i in range(0, Xs.shape[0], chunk)])

    def _phi_train(self) -> torch.Tensor:
        """``phi`` of the ordered training inputs (cached; recomputed after training steps and loading)."""
        if getattr(self, "_phi_cache", None) is None:
            with torch.no_grad():
                self._phi_cache = self._phi_of(self.module_.X_train)
        return self._phi_cache

    # ---------------------------------------------------------------- the hybrid likelihood
    def _chunk_terms(self, idx: torch.Tensor, first: int, Phi: torch.Tensor, ws: torch.Tensor | None = None):
        """``(U, u, log Dv)`` of ordered training rows ``idx`` (from ``first``; float64, with a graph; ``ws`` as in
        :meth:`vecchia_terms`)."""
        ell, Gc, z = self._chunk_rows(idx, first, ws)
        U = self.module_.fscale.double() * combine_rows(ell, Gc, Phi)
        return U, (ell * z).sum(-1), -2.0 * torch.log(ell[:, -1])

    @staticmethod
    def _loglik_from_stats(S, c, uu, logdv, n: int) -> torch.Tensor:
        p = S.shape[-1]
        LM = torch.linalg.cholesky(torch.eye(p, dtype=S.dtype, device=S.device) + S)
        v = torch.linalg.solve_triangular(LM, c.unsqueeze(-1), upper=False).squeeze(-1)
        return -0.5 * n * LOG_2PI - 0.5 * logdv - torch.log(LM.diagonal()).sum() - 0.5 * uu + 0.5 * v.pow(2).sum()

    def _stats(self, Phi: torch.Tensor, ws: torch.Tensor | None = None):
        """``(U^T U, U^T u, |u|^2, sum log Dv)``; in a distributed step over this rank's chunks, then summed over
        ranks (no graph there), a factorisation failing on any rank raising on every rank (docs/scaling.md). While
        fitting above ``likelihood_points`` rows: the subset's sums times ``n / k`` (:mod:`gpcore.models.terms`)."""
        t, p, dev = current_terms(self), Phi.shape[1], Phi.device
        S = torch.zeros(p, p, dtype=torch.float64, device=dev)
        c = torch.zeros(p, dtype=torch.float64, device=dev)
        uu = torch.zeros((), dtype=torch.float64, device=dev)
        ld = torch.zeros((), dtype=torch.float64, device=dev)
        cs = self.config.chunk_size
        failed = torch.zeros((), dtype=torch.float64, device=dev)
        try:
            for idx, first in t.chunks(cs, dev):
                U, u, logdv = self._chunk_terms(idx, first, Phi, ws)
                S += U.T @ U
                c += U.T @ u
                uu += u @ u
                ld += logdv.sum()
        except torch.linalg.LinAlgError:
            if not splits_terms():
                raise
            failed += 1.0
        if splits_terms():
            reduce_stats_(S, c, uu, ld, failed)
            if failed.item() > 0:
                raise torch.linalg.LinAlgError("a factorisation failed on one of the ranks")
        return t.weigh(S), t.weigh(c), t.weigh(uu), t.weigh(ld)

    def _stats_point(self, ws) -> tuple:
        """What the sums depend on: every parameter (features included), the weights and the rows."""
        return (*self.module_.parameters(), ws, self.module_.X_train.shape[0], self._joint, current_terms(self).k)

    def log_likelihood(self, ws: torch.Tensor | None = None) -> torch.Tensor:
        """The hybrid log-likelihood of the (scaled) training targets, float64, differentiable (one pass)."""
        if not self.module_.features_on:
            return super().log_likelihood(ws)
        Phi = self._phi_of(self.module_.X_train) if self._joint else self._phi_train()
        return self._loglik_from_stats(*self._stats(Phi, ws), self.module_.X_train.shape[0])

    def _step(self, xb, yb, n, wb=None):
        """Two passes (module docstring): sums without a graph, their adjoints, then chunk by chunk."""
        if not self.module_.features_on:  # the residual GP alone: vecchia's closed-form pass
            return super()._step(xb, yb, n, wb)
        self._check_train_batch(xb)
        mod = self.module_
        N = mod.X_train.shape[0]
        Phi_graph = self._phi_of(mod.X_train) if self._joint else None
        Phi = self._phi_train() if Phi_graph is None else Phi_graph.detach().requires_grad_(True)
        with torch.no_grad():
            stats = [t.detach() for t in self._stats(Phi, wb)]
        self._stats_memo.put(self._stats_point(wb), stats)  # the posterior at this point needs no pass (memo.py)
        for t in stats:
            t.requires_grad_(True)
        loss = -self._loglik_from_stats(*stats, N) / n
        loss.backward()
        gS, gc, guu, gld = (t.grad for t in stats)
        tm = current_terms(self)
        if Phi_graph is None:  # features frozen: no graph through the features (dbknn_grad.py)
            frozen_feature_pass(self, tm, Phi, wb, gS, gc, guu, gld)
            return count_once(loss.detach())
        for idx, first in tm.chunks(self.config.chunk_size, mod.X_train.device):  # distributed: this rank's chunks
            U, u, logdv = self._chunk_terms(idx, first, Phi, wb)
            surrogate = (gS * (U.T @ U)).sum() + (gc * (U.T @ u)).sum() + guu * (u @ u) + gld * logdv.sum()
            tm.weigh(surrogate).backward()
        if Phi.grad is not None:  # None only on a rank without chunks
            Phi_graph.backward(Phi.grad)
        self._phi_cache = None  # the features move with this step
        return count_once(loss.detach())  # the loss is whole on every rank: rank 0's share

    # ---------------------------------------------------------------- stages 2 and 3
    def _feature_parameters(self) -> list[nn.Parameter]:
        return [p for name, p in self.module_.dbk.named_parameters() if name.split(".")[0] in _FEATURE_PARAMS]

    def _set_joint(self, on: bool) -> None:
        """Enter / leave the joint stage: the feature map's parameters train and phi is recomputed each step."""
        self._joint = on
        for p in self._feature_parameters():
            p.requires_grad_(on)
        self._phi_cache = None

    def _param_groups(self, weight_decay: float) -> list[dict]:
        mod = self.module_
        hyper = [p for name, p in mod.named_parameters() if not name.startswith("dbk.") and p.requires_grad]
        groups = [{"params": hyper, "weight_decay": 0.0}]
        if self._joint:
            groups.append({"params": self._feature_parameters(), "weight_decay": weight_decay})
        return groups

    def _train_hybrid(self, Xs, ys, Xv, yv, callback, ws, wv, patience: int | None = None):
        """Stage 2 (with ``patience`` instead of the config's) and 3 in ``joint`` mode — the module docstring's."""
        with training.config_changed(self, **({"patience": patience} if patience else {})):
            history, info = training.train(self, Xs, ys, Xv, yv, callback, ws=ws, wv=wv)
        for h in history:
            h["stage"] = "residual"
        if self.config.train_mode != "joint":
            return history, info
        before = {k: v.detach().clone() for k, v in self.module_.state_dict().items()}
        self._set_joint(True)
        try:  # every Adam step may count: no threshold, patience = all of them
            with training.config_changed(self, optimizer="adam", lr=self.config.joint_lr,
                                         epochs=self.config.joint_epochs, patience=self.config.joint_epochs,
                                         min_improvement=0.0):
                h2, i2 = training.train(self, Xs, ys, Xv, yv, training.staged(callback, len(history)), ws=ws, wv=wv)
        finally:
            self._set_joint(False)
        for h in h2:
            h["stage"] = "joint"
        kept = i2["best_val_nll"] is None or info["best_val_nll"] is None or i2["best_val_nll"] < info["best_val_nll"]
        if not kept:
            self.module_.load_state_dict(before)
        info = {**info, "joint": {**i2, "kept": kept}}
        if kept and i2["best_val_nll"] is not None:
            info["best_val_nll"] = i2["best_val_nll"]
        return history + h2, info

    def _fit_hyperparameters(self, Xs, ys, Xv, yv, callback, ws, wv):
        """Stage (2), or with the feature check (setting ``feature_check``, a validation set): the residual GP alone
        first (``a = 0``, started as a fresh ``vecchia`` fit), the screen at its shape, then stage (2) from the
        screen's point if the screen passed (``screen_passes``; it converges in fewer iterations); features kept on
        a real gain only."""
        if not self.config.feature_check or Xv is None or Xv.shape[0] == 0:
            return self._train_hybrid(Xs, ys, Xv, yv, callback, ws, wv)
        mod = self.module_
        fresh = VecchiaModule(Xs.shape[1], self.config, 0)  # vecchia's initial values (no data buffers)
        with torch.no_grad():
            for name in ("raw_outputscale", "raw_noise", "mu0", *(("trend",) if hasattr(mod, "trend") else ())):
                getattr(mod, name).copy_(getattr(fresh, name))
            self._init_from_neighbours(mod)  # the data-dependent ones
            if hasattr(mod, "raw_nugget"):  # weighted: the nugget starts as a fresh weighted fit's does
                mod.raw_nugget.fill_(inv_softplus(self.likelihood.initial_nugget()))
        mod.features_on = False
        h1, i1 = training.train(self, Xs, ys, Xv, yv, callback, ws=ws, wv=wv)
        for h in h1:
            h["stage"] = "residual only"
        alone = {k: v.detach().clone() for k, v in mod.state_dict().items()}
        mod.features_on, self._phi_cache = True, None
        h2, info = [], {**i1, "best_val_nll": float("inf")}  # cancelled: the residual alone
        screen = None if i1.get("cancelled") or not self.config.feature_screen else screen_features(
            self, Xs, ys, Xv, yv, ws, wv)  # (a, c) at the residual's shape, left in the model
        if screen is not None and not screen_passes(screen, self.config.screen_se):
            info = {**i1, "best_val_nll": screen["val_nll"]}  # no gain at the fitted shape: no hybrid fit
        elif not i1.get("cancelled"):  # stage (2) starts at the residual fit's optimum (or the screen's): own patience
            h2, info = self._train_hybrid(Xs, ys, Xv, yv, training.staged(callback, len(h1)), ws, wv,
                                          patience=self.config.hybrid_patience)
        kept = bool(h2) and info["best_val_nll"] < i1["best_val_nll"] - self.config.min_improvement  # tie: simpler
        if not kept:
            mod.features_on = False
            mod.load_state_dict(alone)
            self._phi_cache = None
        check = {"with_features": info["best_val_nll"], "residual_only": i1["best_val_nll"], "kept": kept,
                 "epochs_run": i1.get("epochs_run"), "train_seconds": i1.get("train_seconds"), "screen": screen,
                 "hybrid_fitted": bool(h2)}
        out = {**(info if kept else i1), "feature_check": check,
               "cancelled": bool(info.get("cancelled") or i1.get("cancelled"))}
        return h1 + h2, out

    @property
    def features_used(self) -> bool:
        """Whether the fitted model uses its DBK features (False: the feature check dropped them)."""
        return bool(self.module_.features_on)

    # ---------------------------------------------------------------- posterior and prediction
    def _finalize(self, Xs, ys, ws=None):
        super()._finalize(Xs, ys, ws)  # the ordered training weights
        mod = self.module_
        self._phi_cache = None
        p = mod.post_m.shape[0]
        eye = torch.eye(p, dtype=torch.float64, device=mod.X_train.device)
        if not mod.features_on:  # a = 0: w keeps its prior, the residuals are y - mu0
            mod.post_m.zero_()
            mod.post_F.copy_(eye.to(mod.post_F.dtype))
            mod.e_train.copy_((mod.y_train.double() - st.prior_mean(mod, mod.X_train)).to(mod.e_train.dtype))
            return
        Phi = self._phi_train()
        S, c, _, _ = self._stats_memo.get(self._stats_point(ws)) or self._stats(Phi, ws)
        LM = torch.linalg.cholesky(eye + S)
        w_hat = torch.cholesky_solve(c.unsqueeze(-1), LM).squeeze(-1)
        mod.post_m.copy_(w_hat.to(mod.post_m.dtype))
        mod.post_F.copy_(torch.linalg.solve_triangular(LM, eye, upper=False).T.to(mod.post_F.dtype))
        e = mod.y_train.double() - st.prior_mean(mod, mod.X_train) - mod.fscale.double() * (Phi @ w_hat)
        mod.e_train.copy_(e.to(mod.e_train.dtype))

    def _predict_f(self, xb):
        mod = self.module_
        idx = self._prediction_neighbors(xb)
        k = idx.shape[1]
        Phi = self._phi_train()
        a = mod.fscale.double()
        w_hat, F = mod.post_m.double(), mod.post_F.double()
        e_tr = mod.e_train.double()
        means, vars_ = [], []
        cs = self.config.chunk_size
        for i in range(0, xb.shape[0], cs):
            N = idx[i : i + cs]
            x = xb[i : i + cs]
            phi = self._phi_of(x)
            Xg = torch.cat([mod.X_train[N], x[:, None, :]], dim=1).double()
            valid = torch.ones(N.shape[0], k + 1, dtype=torch.bool, device=xb.device)
            L, _ = _conditional_terms(mod, Xg, torch.zeros(Xg.shape[:2], dtype=torch.float64, device=xb.device),
                                      valid, self._prediction_noise(N))
            l_row = L[:, -1, :-1]
            t = kriging_weights(L)  # C_NN^{-1} k_Nx
            means.append(st.prior_mean(mod, x) + a * (phi @ w_hat) + (t * e_tr[N]).sum(-1))
            q = a * (phi - combine_rows(t, N, Phi))
            vars_.append((q @ F).pow(2).sum(-1) + mod.outputscale.double() - l_row.pow(2).sum(-1))
        dt = mod.raw_noise.dtype
        return torch.cat(means).to(dt), torch.cat(vars_).to(dt) * vecchia_cv.latent_scale(self)

    def _after_conditioning(self, n0: int) -> None:
        """New conditioning rows: the posterior of ``w`` and the residuals ``e`` over all rows (no refit)."""
        self.module_.e_train = self.module_.e_train.new_zeros(self.module_.X_train.shape[0])
        self._finalize(None, None, None)

    # ---------------------------------------------------------------- joint posterior (vecchia_joint)
    def _joint_residuals(self) -> torch.Tensor:
        return self.module_.e_train.double()  # y - mu0 - a Phi w_hat (y - mu0 when the features were dropped)

    def _joint_lowrank(self):
        mod = self.module_
        if not mod.features_on:
            return None
        a, F = mod.fscale.double(), mod.post_F.double() * vecchia_cv.latent_scale(self) ** 0.5  # the calibrated F
        return a * self._phi_train(), lambda Xs: a * self._phi_of(Xs), mod.post_m.double(), F

    # ---------------------------------------------------------------- kernel, persistence
    def _kernel_s(self, x1, x2):
        mod = self.module_
        a2 = mod.fscale.pow(2)
        return a2 * self._phi_of(x1).to(x1.dtype) @ self._phi_of(x2).to(x1.dtype).T + super()._kernel_s(x1, x2)

    def _kernel_diag_s(self, xb):
        mod = self.module_
        return mod.fscale.pow(2) * self._phi_of(xb).pow(2).sum(-1).to(xb.dtype) + mod.outputscale.expand(xb.shape[0])

    @property
    def feature_scale(self) -> float:
        """The learned scale ``a`` of the DBK features."""
        return float(self.module_.fscale.detach())

    def _extra_state(self) -> dict:
        return {**super()._extra_state(), "features_on": bool(self.module_.features_on)}

    def _set_extra_state(self, state: dict) -> None:
        super()._set_extra_state(state)
        self._phi_cache = None
        self._joint = False
        self._features_on_loaded = bool(state.get("features_on", True))

