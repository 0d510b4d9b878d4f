"""The one interface every gpcore model implements: :class:`GPModel` and its :class:`Prediction`.

Usage (the estimator contract)::

    from gpcore import make_model, load_model
    model = make_model("dbk", basis="silu", rank=128, objective="dppgp", epochs=200)
    model.fit(X, y, X_val, y_val)                 # X: n x d array-like, y: (n,)
    pred = model.predict(X_new)                   # Prediction(mean, var_f, var_y), numpy, (m,)
    lo, hi = pred.interval(0.95)
    K = model.kernel(X1, X2)                      # prior kernel, n1 x n2
    s = model.kernel_slice(X, x_ref)              # k(X, x_ref), (n,)
    model.save("run/model"); model2 = load_model("run/model")

Conventions
-----------
* Callers work in their own units. Inside, inputs are scaled per dimension to ``[-1, 1]`` from
  the training bounds and targets are standardised; outputs (mean, variances, kernel values,
  ``noise_variance``, ``prior_mean``) are converted back to the caller's units.
* Subclasses implement a handful of hooks on scaled tensors (``_build``, ``_loss``,
  ``_predict_f``, ``_kernel_s``); the rest (validation, batching, scaling, persistence, the
  training loop in :mod:`gpcore.models.training`) is shared.
* ``__init__`` only stores validated settings; fitted state lives in attributes ending in ``_``.

Beside this file: ``config.py``, ``registry.py``, ``inputs.py``, ``likelihood.py`` (noise ``tau^2 + sigma^2 / w_i``;
the rows' weights are passed to every loss), ``recalibration.py``, ``io.py`` (save / load), ``training.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from statistics import NormalDist
from typing import Any, ClassVar

import numpy as np
import torch
from scipy.special import ndtr
from torch import nn

from gpcore.device import resolve_device, resolve_dtype
from gpcore.errors import ConfigError, InputError
from gpcore.models import recalibration, training
from gpcore.models.config import BaseConfig
from gpcore.models.features import JointPosteriorAPI
from gpcore.models.inputs import as_1d_float, as_2d_float, as_groups, check_scalers, training_inputs
from gpcore.models.io import save_model
from gpcore.models.likelihood import GaussianLikelihood
from gpcore.models.noise_shape import NoiseShape

# --------------------------------------------------------------------------------------------
# Prediction result
# --------------------------------------------------------------------------------------------


@dataclass
class Prediction:
    """Predictive marginals, in the caller's target units: Gaussian, or with the two-component noise ``shape`` of
    a model calibrated with ``noise_shape="two_component"`` (:mod:`gpcore.models.noise_shape`).

    Attributes
    ----------
    mean : (m,) posterior mean of f (and, for a Gaussian, of y).
    var_f : (m,) latent-function variance.
    var_y : (m,) predictive variance of a new observation, ``var_f + noise``; for a model fitted with
        per-observation weights, a new observation averaged over the ``weights`` passed to
        ``predict`` (one measurement when none are): ``var_f + tau^2 + sigma^2 / w``. With a ``shape`` the
        noise part is ``shape.noise_factor() (tau^2 + sigma^2 / w)``, the mixture's variance.
    shape : the noise shape, or ``None`` for a Gaussian predictive ``N(mean, var_y)``.
    """

    mean: np.ndarray
    var_f: np.ndarray
    var_y: np.ndarray
    shape: NoiseShape | None = None

    @property
    def sd(self) -> np.ndarray:
        """Predictive standard deviation of y."""
        return np.sqrt(self.var_y)

    def noise(self) -> np.ndarray:
        """``s``, each row's Gaussian noise variance (``var_y - var_f`` without a shape)."""
        if self.shape is not None:
            return self.shape.noise_of(self.var_y, self.var_f)
        return np.maximum(self.var_y - self.var_f, 0.0)

    def interval(self, level: float = 0.95, latent: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Central ``level`` prediction interval of y (``mean ± z sd`` for a Gaussian; the mixture's
        ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles with a ``shape``), or of f with ``latent=True``."""
        if not 0.0 < level < 1.0:
            raise ValueError(f"level must be in (0, 1), got {level}")
        if self.shape is not None and not latent:
            lo, hi = self.shape.interval(level, self.var_f, self.noise())
            return self.mean + lo, self.mean + hi
        z = NormalDist().inv_cdf(0.5 + level / 2.0)
        sd = np.sqrt(self.var_f if latent else self.var_y)
        return self.mean - z * sd, self.mean + z * sd

    def cdf(self, t) -> np.ndarray:
        """``P(y <= t)`` of a new observation, per row."""
        if self.shape is not None:
            return self.shape.cdf(np.asarray(t, dtype=float) - self.mean, self.var_f, self.noise())
        return ndtr((np.asarray(t, dtype=float) - self.mean) / np.sqrt(self.var_y))

    def subset(self, rows) -> Prediction:
        """The rows ``rows`` (an index or mask), shape kept."""
        return Prediction(self.mean[rows], self.var_f[rows], self.var_y[rows], self.shape)

    def width(self, level: float = 0.95) -> np.ndarray:
        lo, hi = self.interval(level)
        return hi - lo


class GPModel(JointPosteriorAPI):
    """Base class: shared fit / predict / kernel / save logic over subclass hooks.

    Subclass hooks (all on scaled inputs ``x in [-1, 1]^d`` and standardised targets):

    * ``_build(d, Xs, ys)`` -> ``nn.Module`` holding every parameter and prediction cache.
    * ``_loss(xb, yb, n, wb)`` -> scalar per-point training loss for a batch (``n`` = training size, ``wb``
      the rows' weights or None; their noise is ``self.likelihood.variance(wb)``).
    * ``_predict_f(xb)`` -> ``(mean, var_f)`` tensors of the latent function.
    * ``_kernel_s(x1, x2)`` -> prior kernel matrix; ``_noise_s()`` -> noise variance tensor.
    * optional: ``_finalize(Xs, ys)`` (posterior caches from the full training set),
      ``_step(xb, yb, n, wb)`` (custom backward, e.g. two-pass), ``_param_groups``, ``_prior_mean_s``,
      ``_kernel_diag_s``, ``_feature_slicer``.
    """

    name: ClassVar[str] = "base"
    Config: ClassVar[type[BaseConfig]] = BaseConfig
    #: whether ``fit(..., weights=)`` is implemented (a model that would ignore weights refuses them instead)
    supports_weights: bool = True
    #: the ``recalibrate`` a run with strata applies when its settings name none (gpcore.run.pipeline)
    run_recalibration: ClassVar[str] = "group"
    #: True when predictions need caches computed from the full training data (``_finalize``).
    needs_finalize: ClassVar[bool] = False
    #: config settings this model never reads (e.g. ``batch_size`` of an always full-batch model); the Train page
    #: does not offer them
    unused_settings: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **settings):
        self.config = self.Config.from_dict(settings)
        self.registry_name = self.name
        self.module_: nn.Module | None = None
        self.history_: list[dict] = []
        self.train_info_: dict = {}
        self.fitted_ = False
        self.recal_: dict | None = None

    # ---------------------------------------------------------------- properties
    @property
    def device(self) -> torch.device:
        return resolve_device(self.config.device)

    @property
    def dtype(self) -> torch.dtype:
        return resolve_dtype(self.config.dtype)

    @property
    def full_batch(self) -> bool:
        """Whether every optimisation step uses the whole training set."""
        return False

    def __repr__(self) -> str:
        changed = {
            f.name: getattr(self.config, f.name)
            for f in fields(self.config)
            if getattr(self.config, f.name) != f.default
        }
        args = ", ".join(f"{k}={v!r}" for k, v in changed.items())
        return f"{type(self).__name__}({args})"

    # ---------------------------------------------------------------- scaling
    def _set_scalers(self, X: np.ndarray, y: np.ndarray) -> None:
        lo, hi = X.min(axis=0), X.max(axis=0)
        span = np.where(hi - lo > 0, hi - lo, 1.0)
        self.x_lo_, self.x_span_ = lo, span
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported by _check_scalers
            self.y_mean_ = float(y.mean())
            sd = float(y.std())
        self.y_std_ = 1.0 if sd == 0 else sd  # NaN/inf stay visible to _check_scalers

    def _to_tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(a, dtype=self.dtype, device=self.device)

    def scale_x(self, X: np.ndarray) -> torch.Tensor:
        """Map caller inputs to the model's ``[-1, 1]`` box (``n x d`` tensor)."""
        return self._to_tensor(2.0 * (X - self.x_lo_) / self.x_span_ - 1.0)

    def scale_y(self, y: np.ndarray) -> torch.Tensor:
        return self._to_tensor((y - self.y_mean_) / self.y_std_)

    # ---------------------------------------------------------------- fitting
    def fit(
        self, X, y, X_val=None, y_val=None, callback: Callable | None = None, *, weights=None, val_weights=None,
        groups=None, val_groups=None,
    ) -> GPModel:
        """Train on ``X`` (``n x d``), ``y`` (``n``); early stopping on ``(X_val, y_val)`` if given.

        ``callback(progress)`` is called after every epoch with a :class:`gpcore.models.training.Progress`;
        returning ``False`` cancels training, keeping the best state so far.

        ``weights`` (``(n,)``, > 0): observation ``i`` is the mean of ``weights[i]`` measurements; its
        noise variance is ``tau^2 + sigma^2 / weights[i]`` with both learned (module docstring).
        ``val_weights`` are the validation rows' weights (required with weights and a validation set).
        ``weights=None`` is the unweighted model, exactly as before.

        ``groups`` / ``val_groups``: a stratum label per training / validation row. With the setting
        ``recalibrate="group"`` (or ``"global"``) the predictive variance is rescaled after training
        from the validation split only (:meth:`recalibrate`); ``groups`` are accepted for symmetry and
        not used by training.
        """
        X, y, w, X_val, y_val, wv, has_val = training_inputs(
            X, y, X_val, y_val, weights, val_weights, type(self).__name__ if not self.supports_weights else None)
        torch.manual_seed(self.config.seed)
        np.random.seed(self.config.seed)
        self.d_ = X.shape[1]
        self.n_train_ = X.shape[0]
        self._set_scalers(X, y)
        check_scalers(self.x_lo_, self.x_span_, self.y_mean_, self.y_std_, "the training data")
        Xs, ys = self.scale_x(X), self.scale_y(y)
        Xv = self.scale_x(X_val) if has_val else None
        yv = self.scale_y(y_val) if has_val else None
        self.module_ = self._build(self.d_, Xs, ys).to(device=self.device, dtype=self.dtype)
        ws = wvs = None
        if w is not None:
            self._add_nugget()
            ws, wvs = self._to_tensor(w), (self._to_tensor(wv) if wv is not None else None)
        t0 = time.perf_counter()
        try:
            self.history_, self.train_info_ = self._train(Xs, ys, Xv, yv, callback, ws, wvs)
            self.finalize(Xs, ys, ws)
        except torch.linalg.LinAlgError as e:  # a factorisation of NaN/inf parameters: training diverged
            from gpcore.errors import TrainingError

            raise TrainingError(
                f"training diverged: a matrix factorisation failed ({str(e).splitlines()[0][:200]}); lower the "
                "learning rate (lr) or use dtype='float64'"
            ) from e
        self.train_info_["fit_seconds"] = time.perf_counter() - t0
        self.fitted_ = True
        self.recal_ = None
        if groups is not None:
            as_groups(groups, X.shape[0], "groups")
        if self.config.recalibrate != "none":
            if not has_val:
                raise InputError(
                    f"recalibrate={self.config.recalibrate!r} is fitted on the validation split: pass X_val and y_val"
                )
            self.recalibrate(X_val, y_val, val_weights=val_weights, val_groups=val_groups)
        return self

    # ---------------------------------------------------------------- recalibration
    def recalibrate(self, X_val, y_val, *, val_weights=None, val_groups=None, kind: str | None = None) -> dict:
        """Fit the variance recalibration on validation rows only; stored in ``recal_`` (and saved).

        ``kind`` (default the ``recalibrate`` setting): ``"global"`` or ``"group"`` (per stratum of ``val_groups``);
        see :mod:`gpcore.models.recalibration`. ``predict`` multiplies ``var_y`` by the scale, not ``var_f``.
        """
        kind = kind or self.config.recalibrate
        if kind not in ("global", "group"):
            raise ConfigError(f"recalibrate kind {kind!r} is not allowed; allowed values: 'global', 'group'")
        self._check_fitted()
        X_val = as_2d_float(X_val, "X_val", d=self.d_)
        y_val = as_1d_float(y_val, X_val.shape[0], "y_val")
        if X_val.shape[0] == 0:
            raise InputError("recalibration needs validation rows; the validation split is empty")
        self.recal_ = None  # score the uncalibrated model
        pred = self.predict(X_val, weights=val_weights)
        z = np.abs(y_val - pred.mean) / np.sqrt(pred.var_y)
        state = recalibration.fit_recalibration(z, kind, val_groups)
        self.recal_ = state
        return state

    def variance_scale(self, m: int, groups=None) -> np.ndarray | float:
        """The recalibration factor of ``var_y`` for ``m`` rows (:func:`recalibration.variance_scale`)."""
        return recalibration.variance_scale(getattr(self, "recal_", None), m, groups)

    @torch.no_grad()
    def finalize(self, Xs: torch.Tensor, ys: torch.Tensor, ws: torch.Tensor | None = None) -> None:
        """Recompute prediction caches from the (scaled) training data, if the model needs them."""
        if self.needs_finalize:
            self.module_.eval()
            self._check_weights(ws)
            self._finalize(Xs, ys, ws)

    # ---------------------------------------------------------------- likelihood and per-observation weights
    @property
    def likelihood(self) -> GaussianLikelihood:
        """The Gaussian likelihood over the module's noise parameters (:mod:`gpcore.models.likelihood`)."""
        return GaussianLikelihood(self.module_)

    @property
    def weighted(self) -> bool:
        """Whether the model was fitted with per-observation weights (it has a nugget tau^2)."""
        return self.module_ is not None and self.likelihood.weighted

    def _add_nugget(self) -> None:
        """Give the module the learned nugget ``tau^2`` of a weighted fit (before training; see load_model)."""
        self.likelihood.add_nugget(self.dtype)

    def _check_weights(self, ws) -> None:
        if ws is not None and not self.weighted:
            raise InputError(f"{type(self).__name__} was fitted without weights; it takes no training weights")
        if ws is None and self.weighted and self.needs_finalize:
            raise InputError(f"{type(self).__name__} was fitted with weights; pass the training rows' weights too")

    def _nugget_s(self) -> torch.Tensor:
        """Nugget ``tau^2`` in standardised units (zero for an unweighted model)."""
        return self.likelihood.nugget

    # ---------------------------------------------------------------- prediction
    def _check_fitted(self) -> None:
        if self.module_ is None:
            raise InputError(f"{type(self).__name__} is not fitted yet; call fit(X, y) first")

    @torch.no_grad()
    def predict_scaled(self, Xs: torch.Tensor, batch_size: int | None = None):
        """``(mean, var_f)`` in standardised units for scaled inputs, computed in batches."""
        self.module_.eval()
        bs = batch_size or self.config.predict_batch_size
        means, vars_ = [], []
        for i in range(0, Xs.shape[0], bs):
            m, v = self._predict_f(Xs[i : i + bs])
            means.append(m)
            vars_.append(v.clamp_min(0.0))
        if not means:
            empty = Xs.new_zeros(0)
            return empty, empty
        return torch.cat(means), torch.cat(vars_)

    @torch.no_grad()
    def predict(self, X, batch_size: int | None = None, *, weights=None, groups=None) -> Prediction:
        """Predictive marginals at ``X`` (``m x d``), in the caller's units, batch by batch.

        Memory beyond the ``(m,)`` outputs is bounded by one batch. For a model fitted with weights,
        ``var_y`` is for a new observation averaged over ``weights`` measurements (``(m,)``;
        ``None`` = one measurement): ``var_f + tau^2 + sigma^2 / w``. ``var_f`` does not depend on it.

        A recalibrated model (setting ``recalibrate``) multiplies ``var_y`` by its validation-fitted
        scale, per row's stratum in ``groups`` for ``"group"`` (:meth:`variance_scale`).
        """
        self._check_fitted()
        X = as_2d_float(X, "X", d=self.d_)
        noise = self.observation_noise(weights, X.shape[0])
        vscale = self.variance_scale(X.shape[0], groups)
        self.module_.eval()
        m = X.shape[0]
        mean = np.empty(m)
        var_f = np.empty(m)
        bs = batch_size or self.config.predict_batch_size
        for i in range(0, m, bs):
            mu, v = self._predict_f(self.scale_x(X[i : i + bs]))
            mean[i : i + bs] = mu.double().cpu().numpy()
            var_f[i : i + bs] = v.clamp_min(0.0).double().cpu().numpy()
        s2 = self.y_std_**2
        mean = mean * self.y_std_ + self.y_mean_
        var_f = var_f * s2
        shape = self.noise_shape()
        var_y = var_f + noise * (1.0 if shape is None else shape.noise_factor())
        if not (isinstance(vscale, float) and vscale == 1.0):
            var_y = var_y * vscale
        return Prediction(mean=mean, var_f=var_f, var_y=var_y, shape=shape)

    def observation_noise(self, weights=None, m: int = 1) -> np.ndarray | float:
        """The Gaussian noise variance ``s`` of ``m`` new observations, in the caller's units (``weights=None``: one
        measurement each): ``tau^2 + sigma^2 / w`` (the likelihood's), times the Vecchia family's noise scale per
        tests-count bin where its cross-validation fitted one (:meth:`noise_multiplier`). :meth:`predict` adds it
        (times the shape's factor) to ``var_f``; a stored grid's decisions read it back with it."""
        with torch.no_grad():
            noise = self.likelihood.observation_noise(weights, m, self.y_std_**2, type(self).__name__)
        return noise * self.noise_multiplier(weights, m)

    def noise_multiplier(self, weights, m: int) -> np.ndarray | float:
        """A factor of each row's noise variance fitted after training (1: none). The Vecchia family's
        cross-validation fits one per tests-count bin (:func:`gpcore.models.vecchia_cv.count_scales`)."""
        return 1.0

    def noise_shape(self) -> NoiseShape | None:
        """The two-component noise of a new observation (:mod:`gpcore.models.noise_shape`), or ``None``: Gaussian
        noise. Only the Vecchia family fits one (setting ``noise_shape``)."""
        return None

    # ---------------------------------------------------------------- kernel
    @torch.no_grad()
    def kernel(self, X1, X2=None) -> np.ndarray:
        """Prior kernel matrix ``k(X1, X2)`` (``n1 x n2``) in the caller's target units squared."""
        self._check_fitted()
        X1 = as_2d_float(X1, "X1", d=self.d_)
        X2 = X1 if X2 is None else as_2d_float(X2, "X2", d=self.d_)
        self.module_.eval()
        K = self._kernel_s(self.scale_x(X1), self.scale_x(X2))
        return K.double().cpu().numpy() * self.y_std_**2

    @torch.no_grad()
    def kernel_slice(self, X, x_ref, batch_size: int | None = None) -> np.ndarray:
        """``k(X, x_ref)`` of shape ``(n,)`` computed batch by batch, never forming ``n x n``."""
        return self.kernel_slicer(X, batch_size)(x_ref)

    @torch.no_grad()
    def kernel_diag(self, X, batch_size: int | None = None) -> np.ndarray:
        """Prior variance ``k(x, x)`` at each row of ``X`` (``(n,)``)."""
        self._check_fitted()
        X = as_2d_float(X, "X", d=self.d_)
        self.module_.eval()
        bs = batch_size or 4096
        out = np.empty(X.shape[0])
        for i in range(0, X.shape[0], bs):
            out[i : i + bs] = self._kernel_diag_s(self.scale_x(X[i : i + bs])).double().cpu().numpy()
        return out * self.y_std_**2

    @torch.no_grad()
    def kernel_slicer(self, X, batch_size: int | None = None) -> Callable[[Any], np.ndarray]:
        """Precompute what depends on ``X`` only; return ``f(x_ref) -> k(X, x_ref)``.

        The dashboard calls this once per (run, grid) and then only ``f`` per click. Feature
        models (DBK) cache ``phi(X)`` so a slice is one matrix-vector product.
        """
        self._check_fitted()
        X = as_2d_float(X, "X", d=self.d_)
        self.module_.eval()
        Xs = self.scale_x(X)
        inner = self._feature_slicer(Xs, batch_size or 8192)
        scale = self.y_std_**2

        def slicer(x_ref) -> np.ndarray:
            xr = as_2d_float(np.asarray(x_ref, dtype=np.float64).reshape(1, -1), "x_ref", d=self.d_)
            with torch.no_grad():
                self.module_.eval()
                return inner(self.scale_x(xr)).double().cpu().numpy() * scale

        return slicer

    def _feature_slicer(self, Xs: torch.Tensor, batch_size: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def inner(xr: torch.Tensor) -> torch.Tensor:
            return torch.cat(
                [self._kernel_s(Xs[i : i + batch_size], xr)[:, 0] for i in range(0, Xs.shape[0], batch_size)]
            )

        return inner

    def _kernel_diag_s(self, xb: torch.Tensor) -> torch.Tensor:
        return torch.stack([self._kernel_s(x[None], x[None])[0, 0] for x in xb])

    @property
    def noise_variance(self) -> float:
        """Learned Gaussian noise variance sigma^2, in the caller's target units squared.

        For a model fitted with weights: the noise of one measurement, ``tau^2 + sigma^2``
        (see :attr:`nugget_variance` and :attr:`measurement_noise_variance`).
        """
        self._check_fitted()
        with torch.no_grad():
            return float(self._noise_s() + self._nugget_s()) * self.y_std_**2

    @property
    def measurement_noise_variance(self) -> float:
        """``sigma^2``: the noise of one measurement less the nugget (caller units; = noise_variance unweighted)."""
        self._check_fitted()
        with torch.no_grad():
            return float(self._noise_s()) * self.y_std_**2

    @property
    def nugget_variance(self) -> float:
        """``tau^2``: noise that averaging over measurements does not remove (0 for an unweighted model)."""
        self._check_fitted()
        with torch.no_grad():
            return float(self._nugget_s()) * self.y_std_**2

    @property
    def prior_mean(self) -> float:
        """Constant prior mean in the caller's target units."""
        self._check_fitted()
        with torch.no_grad():
            return self.y_mean_ + self.y_std_ * float(self._prior_mean_s())

    def _prior_mean_s(self) -> torch.Tensor:
        """The module's ``mu0`` (standardised units); zero for modules without a learned mean."""
        mu0 = getattr(self.module_, "mu0", None)
        return torch.zeros(()) if mu0 is None else mu0

    # ---------------------------------------------------------------- training hooks
    def _step(self, xb: torch.Tensor, yb: torch.Tensor, n: int, wb: torch.Tensor | None = None) -> torch.Tensor:
        """One backward pass; returns the detached loss. Override for custom (two-pass) gradients."""
        loss = self._loss(xb, yb, n, wb)
        loss.backward()
        return loss.detach()

    def _train(self, Xs, ys, Xv, yv, callback, ws, wv) -> tuple[list[dict], dict]:
        """Optimise the built module on the scaled data; ``(history, info)``. One :func:`training.train` call
        by default; a model with training stages (``dbk-nn``) runs several."""
        return training.train(self, Xs, ys, Xv, yv, callback, ws=ws, wv=wv)

    def _param_groups(self, weight_decay: float) -> list[dict]:
        """Optimizer parameter groups; by default decay only parameters under ``module_.backbone``."""
        decay, rest = [], []
        for name, p in self.module_.named_parameters():
            if not p.requires_grad:
                continue
            (decay if name.startswith("backbone.") else rest).append(p)
        groups = [{"params": rest, "weight_decay": 0.0}]
        if decay:
            groups.append({"params": decay, "weight_decay": weight_decay})
        return groups

    def _on_epoch_start(self, epoch: int) -> None:
        """Hook called by the trainer before each epoch (e.g. learning-rate schedules)."""

    # ---------------------------------------------------------------- hooks to implement
    def _build(self, d: int, Xs: torch.Tensor, ys: torch.Tensor) -> nn.Module:
        raise NotImplementedError

    def _loss(self, xb: torch.Tensor, yb: torch.Tensor, n: int, wb: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def _finalize(self, Xs: torch.Tensor, ys: torch.Tensor, ws: torch.Tensor | None = None) -> None:
        pass

    def _predict_f(self, xb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _kernel_s(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _noise_s(self) -> torch.Tensor:
        """Noise variance sigma^2 in standardised units: the module's ``noise`` (see models/hyper.py)."""
        return self.likelihood.noise

    def _feature_form(self):
        """The posterior in feature form (:class:`gpcore.models.features.FeatureForm`); see gpcore/posterior.py."""
        raise InputError(f"{type(self).__name__} has no feature form, so joint posterior operations are unavailable")

    # ---------------------------------------------------------------- persistence
    def _extra_state(self) -> dict:
        """JSON-serialisable state a subclass needs to rebuild its module (shapes etc.)."""
        return {}

    def _set_extra_state(self, state: dict) -> None:
        pass

    def save(self, path) -> Path:
        """Save to a directory: ``model.json`` (config, scalers) + ``model.safetensors`` (tensors)."""
        return save_model(self, path)
