"""The one interface every gpcore model implements, plus the model registry.

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
  ``_predict_f``, ``_kernel_s``, ``_noise_s``); the rest (validation, batching, scaling,
  persistence, the training loop in :mod:`gpcore.train`) is shared.
* ``__init__`` only stores validated settings; fitted state lives in attributes ending in ``_``.

Per-observation weights (``fit(..., weights=w)``): observation ``i`` is the mean of ``w_i``
measurements, so its noise variance is ``tau^2 + sigma^2 / w_i`` -- a nugget ``tau^2`` (the module's
``raw_nugget``, added only for weighted fits) plus measurement noise ``sigma^2`` (the model's usual
noise) averaged over ``w_i`` measurements; both are learned. Without weights nothing changes (no
nugget, noise ``sigma^2``). While a weighted model trains or finalises, ``self._wb`` holds the
weights of the rows being processed and :meth:`GPModel._noise_rows` gives their noise variances.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from statistics import NormalDist
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from gpcore.device import DTYPES, resolve_device, resolve_dtype
from gpcore.errors import ConfigError, InputError

FORMAT_VERSION = 1


# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------


def setting(default, *, help: str = "", choices=None, min=None, max=None, main: bool = False, min_inclusive=True):
    """A config field with validation metadata (``choices`` or a ``[min, max]`` range)."""
    meta = {"help": help, "choices": choices, "min": min, "max": max, "main": main, "min_inclusive": min_inclusive}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class BaseConfig:
    """Settings shared by every model (training loop, device, precision, seed)."""

    epochs: int = setting(200, help="maximum number of passes over the training data", min=1, main=True)
    batch_size: int = setting(1024, help="mini-batch size (ignored by full-batch objectives)", min=1, main=True)
    lr: float = setting(1e-3, help="Adam(W) learning rate", min=0.0, min_inclusive=False, main=True)
    weight_decay: float = setting(0.0, help="AdamW weight decay on backbone weights only", min=0.0)
    patience: int = setting(20, help="epochs without validation-NLL improvement before stopping", min=1)
    max_seconds: float = setting(0.0, help="wall-clock budget for training in seconds (0 = none)", min=0.0)
    device: str = setting("auto", help="'auto' picks CUDA when available, else CPU", choices=("auto", "cpu", "cuda"))
    dtype: str = setting("float32", help="precision of networks and n-sized tensors", choices=tuple(DTYPES))
    seed: int = setting(0, help="random seed (initialisation and batch order)", min=0)
    predict_batch_size: int = setting(16384, help="points per prediction batch (bounds memory)", min=1)
    recalibrate: str = setting(
        "none", help="scale predictive variances on the validation split: 'none', 'global' or 'group' (per stratum)",
        choices=("none", "global", "group"))

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_dict(cls, settings: dict[str, Any]) -> BaseConfig:
        """Build and validate a config; unknown keys raise :class:`ConfigError` naming the allowed ones."""
        allowed = cls.field_names()
        unknown = [k for k in settings if k not in allowed]
        if unknown:
            raise ConfigError(
                f"unknown setting(s) {', '.join(map(repr, unknown))} for {cls.__name__}; "
                f"allowed: {', '.join(allowed)}"
            )
        coerced = {}
        for f in fields(cls):
            if f.name in settings:
                coerced[f.name] = _coerce(f, settings[f.name], cls.__name__)
        cfg = cls(**coerced)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            meta = f.metadata
            if meta.get("choices") is not None and v not in meta["choices"]:
                raise ConfigError(
                    f"setting {f.name}={v!r} is not allowed; allowed values: {', '.join(map(repr, meta['choices']))}"
                )
            lo, hi = meta.get("min"), meta.get("max")
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"setting {f.name}={v!r} is not a finite number; give a number such as {f.default!r}")
            if lo is not None and (v < lo or (v == lo and not meta.get("min_inclusive", True))):
                op = ">=" if meta.get("min_inclusive", True) else ">"
                raise ConfigError(f"setting {f.name}={v!r} is out of range; it must be {op} {lo}")
            if hi is not None and v > hi:
                raise ConfigError(f"setting {f.name}={v!r} is out of range; it must be <= {hi}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> BaseConfig:
        return type(self).from_dict({**self.to_dict(), **changes})


def _coerce(f: dataclasses.Field, value, cls_name: str):
    """Coerce strings from the CLI / UI to the field's type, with a clear error."""
    default = f.default
    try:
        if isinstance(default, bool):
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if isinstance(default, int):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if isinstance(default, float):
            return float(value)
        if isinstance(default, str):
            return str(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"setting {f.name}={value!r} of {cls_name} must be of type {type(default).__name__}"
        ) from None
    return value


# --------------------------------------------------------------------------------------------
# Prediction result
# --------------------------------------------------------------------------------------------


@dataclass
class Prediction:
    """Gaussian predictive marginals, in the caller's target units.

    Attributes
    ----------
    mean : (m,) posterior mean of f (and of y).
    var_f : (m,) latent-function variance.
    var_y : (m,) predictive variance of a new observation, ``var_f + noise``; for a model fitted with
        per-observation weights, a new observation averaged over the ``weights`` passed to
        ``predict`` (one measurement when none are): ``var_f + tau^2 + sigma^2 / w``.
    """

    mean: np.ndarray
    var_f: np.ndarray
    var_y: np.ndarray

    @property
    def sd(self) -> np.ndarray:
        """Predictive standard deviation of y."""
        return np.sqrt(self.var_y)

    def interval(self, level: float = 0.95, latent: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Central ``level`` prediction interval ``mean ± z sd`` (of y, or of f with ``latent=True``)."""
        if not 0.0 < level < 1.0:
            raise ValueError(f"level must be in (0, 1), got {level}")
        z = NormalDist().inv_cdf(0.5 + level / 2.0)
        sd = np.sqrt(self.var_f if latent else self.var_y)
        return self.mean - z * sd, self.mean + z * sd

    def width(self, level: float = 0.95) -> np.ndarray:
        lo, hi = self.interval(level)
        return hi - lo


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    name: str
    cls: type
    preset: dict
    description: str


_REGISTRY: dict[str, ModelSpec] = {}


def register(name: str, description: str = "", **preset):
    """Class decorator registering a model under ``name`` (more names via :func:`register_alias`)."""

    def deco(cls):
        cls.name = name
        _REGISTRY[name] = ModelSpec(name, cls, dict(preset), description or (cls.__doc__ or "").strip().split("\n")[0])
        return cls

    return deco


def register_alias(name: str, base: str, description: str, **preset) -> None:
    """Register ``name`` as ``base`` with some settings preset (e.g. ``dbk-rbf`` = ``dbk`` with basis=rbf)."""
    spec = _REGISTRY[base]
    _REGISTRY[name] = ModelSpec(name, spec.cls, {**spec.preset, **preset}, description)


def _ensure_models_loaded() -> None:
    """Every family is registered: importing this module first runs ``gpcore/models/__init__.py``, which
    imports each family (so the registry never has to import the package that imports it)."""


def available_models() -> list[str]:
    """Names accepted by :func:`make_model` (families and presets such as ``dbk-rbf``)."""
    _ensure_models_loaded()
    return sorted(_REGISTRY)


def model_spec(name: str) -> ModelSpec:
    _ensure_models_loaded()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}; available: {', '.join(sorted(_REGISTRY))}") from None


def make_model(name: str, **settings) -> GPModel:
    """Create an unfitted model by registry name; settings override the preset of that name."""
    spec = model_spec(name)
    model = spec.cls(**{**spec.preset, **settings})
    model.registry_name = name
    return model


# --------------------------------------------------------------------------------------------
# Input checking
# --------------------------------------------------------------------------------------------


def as_2d_float(X, what: str = "X", d: int | None = None) -> np.ndarray:
    """Validate a point array: numeric, finite, 2-D (a 1-D array is one column)."""
    try:
        arr = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{what} must be numeric; it holds values that are not numbers") from None
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise InputError(f"{what} must be a 2-D array of shape (n, d); got shape {arr.shape}")
    bad = ~np.isfinite(arr).all(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise InputError(
            f"{what} has {rows.size} row(s) with NaN or inf (rows {', '.join(map(str, rows[:8]))}"
            f"{', ...' if rows.size > 8 else ''}); drop or impute them first"
        )
    if d is not None and arr.shape[1] != d:
        raise InputError(f"{what} has {arr.shape[1]} column(s) but the model was fitted with d = {d}")
    return arr


def as_weights(w, n: int, what: str = "weights") -> np.ndarray:
    """Validate per-observation weights: ``(n,)``, finite and > 0 (e.g. a count of measurements)."""
    arr = as_1d_float(w, n, what)
    bad = ~(arr > 0)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise InputError(
            f"{what} has {rows.size} value(s) <= 0 (rows {', '.join(map(str, rows[:8]))}"
            f"{', ...' if rows.size > 8 else ''}); a weight is a number of measurements, so it must be > 0: "
            "drop those rows or fix the weight column"
        )
    return arr


def as_groups(groups, n: int, what: str = "groups") -> np.ndarray:
    """Validate stratum labels: one per row (strings; missing values become ``'nan'``)."""
    arr = np.asarray(groups).astype(str).reshape(-1)
    if arr.shape[0] != n:
        raise InputError(f"{what} has {arr.shape[0]} labels but X has {n} rows; they must match")
    return arr


def as_1d_float(y, n: int, what: str = "y") -> np.ndarray:
    try:
        arr = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{what} must be numeric; it holds values that are not numbers") from None
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise InputError(f"{what} must be 1-D of shape (n,); got shape {arr.shape}")
    if arr.shape[0] != n:
        raise InputError(f"{what} has {arr.shape[0]} values but X has {n} rows; they must match")
    bad = ~np.isfinite(arr)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise InputError(
            f"{what} has {rows.size} NaN or inf value(s) (rows {', '.join(map(str, rows[:8]))}"
            f"{', ...' if rows.size > 8 else ''}); drop or impute them first"
        )
    return arr


# --------------------------------------------------------------------------------------------
# The base model
# --------------------------------------------------------------------------------------------


class GPModel:
    """Base class: shared fit / predict / kernel / save logic over subclass hooks.

    Subclass hooks (all on scaled inputs ``x in [-1, 1]^d`` and standardised targets):

    * ``_build(d, Xs, ys)`` -> ``nn.Module`` holding every parameter and prediction cache.
    * ``_loss(xb, yb, n)`` -> scalar per-point training loss for a batch (``n`` = training size).
    * ``_predict_f(xb)`` -> ``(mean, var_f)`` tensors of the latent function.
    * ``_kernel_s(x1, x2)`` -> prior kernel matrix; ``_noise_s()`` -> noise variance tensor.
    * optional: ``_finalize(Xs, ys)`` (posterior caches from the full training set),
      ``_step`` (custom backward, e.g. two-pass), ``_param_groups``, ``_prior_mean_s``,
      ``_kernel_diag_s``, ``_feature_slicer``.
    """

    name: ClassVar[str] = "base"
    Config: ClassVar[type[BaseConfig]] = BaseConfig
    #: whether ``fit(..., weights=)`` is implemented (a model that would ignore weights refuses them instead)
    supports_weights: bool = True
    #: weights of the rows the current training step / finalize sees (scaled tensor), None when unweighted
    _wb: torch.Tensor | None = None
    #: initial nugget tau^2 of a weighted fit, as a fraction of the initial noise variance sigma^2
    NUGGET_INIT_FRACTION: ClassVar[float] = 0.1
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

        ``callback(progress)`` is called after every epoch with a :class:`gpcore.train.Progress`;
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
        X = as_2d_float(X, "X")
        y = as_1d_float(y, X.shape[0], "y")
        w = None if weights is None else as_weights(weights, X.shape[0], "weights")
        if w is not None and not self.supports_weights:
            raise InputError(
                f"{type(self).__name__} does not take per-observation weights yet; fit it without weights "
                "(CLI: leave out --weight; Data page: Weight column '(none)') or choose another model"
            )
        if X.shape[0] < 2:
            raise InputError(f"need at least 2 training points, got {X.shape[0]}")
        has_val = X_val is not None or y_val is not None
        if has_val:
            if X_val is None or y_val is None:
                raise InputError("pass both X_val and y_val, or neither")
            X_val = as_2d_float(X_val, "X_val", d=X.shape[1])
            y_val = as_1d_float(y_val, X_val.shape[0], "y_val")
            if X_val.shape[0] == 0:
                has_val = False
        if val_weights is not None and w is None:
            raise InputError("val_weights were given without weights; pass weights for the training rows too")
        wv = None
        if has_val and w is not None:
            if val_weights is None:
                raise InputError("the model is fitted with weights: pass val_weights for the validation rows too")
            wv = as_weights(val_weights, X_val.shape[0], "val_weights")
        torch.manual_seed(self.config.seed)
        np.random.seed(self.config.seed)
        self.d_ = X.shape[1]
        self.n_train_ = X.shape[0]
        self._set_scalers(X, y)
        _check_scalers(self.x_lo_, self.x_span_, self.y_mean_, self.y_std_, "the training data")
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
    #: fewer validation rows than this in a stratum: that stratum uses the global scale
    RECAL_MIN_ROWS: ClassVar[int] = 20
    #: the interval level the recalibrated variances are conformal for
    RECAL_LEVEL: ClassVar[float] = 0.95

    @staticmethod
    def conformal_variance_scale(z: np.ndarray, level: float = 0.95) -> float:
        """Variance scale ``c`` making ``mean ± z_level sqrt(c var_y)`` a split-conformal ``level`` interval.

        ``z = |y - mean| / sd`` on calibration rows; ``q`` is the ``ceil((n + 1) level)``-th smallest
        (the finite-sample conformal quantile; the largest when that exceeds ``n``) and ``c = (q / z_level)^2``.
        """
        z = np.sort(np.asarray(z, dtype=np.float64))
        k = min(int(math.ceil((z.size + 1) * level)), z.size)
        return float((z[k - 1] / NormalDist().inv_cdf(0.5 + level / 2.0)) ** 2)

    def recalibrate(self, X_val, y_val, *, val_weights=None, val_groups=None, kind: str | None = None) -> dict:
        """Fit the variance recalibration on validation rows only; stored in ``recal_`` (and saved).

        ``kind`` (default the ``recalibrate`` setting): ``"global"`` one scale ``c``; ``"group"`` one
        scale per stratum of ``val_groups`` (Mondrian split-conformal), strata with fewer than
        ``RECAL_MIN_ROWS`` validation rows use the global one. ``predict`` multiplies ``var_y`` by the
        scale (``var_f`` is the latent variance and is left as it is).
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
        state = {"kind": kind, "level": self.RECAL_LEVEL, "global": self.conformal_variance_scale(z, self.RECAL_LEVEL),
                 "n": int(z.size), "scales": {}, "counts": {}}
        if kind == "group":
            if val_groups is None:
                raise InputError("recalibrate='group' needs val_groups: a stratum label per validation row")
            g = as_groups(val_groups, X_val.shape[0], "val_groups")
            for label in sorted(set(g.tolist())):
                sel = g == label
                state["counts"][label] = int(sel.sum())
                if sel.sum() >= self.RECAL_MIN_ROWS:
                    state["scales"][label] = self.conformal_variance_scale(z[sel], self.RECAL_LEVEL)
        self.recal_ = state
        return state

    def variance_scale(self, m: int, groups=None) -> np.ndarray | float:
        """The recalibration factor of ``var_y`` for ``m`` rows (1 without recalibration).

        ``"group"``: each row's stratum scale; rows without ``groups``, or of a stratum that had too few
        validation rows or was not in the validation split, get the global scale.
        """
        state = getattr(self, "recal_", None)
        if not state:
            return 1.0
        if state["kind"] == "global" or groups is None:
            return state["global"]
        g = as_groups(groups, m, "groups")
        return np.array([state["scales"].get(label, state["global"]) for label in g.tolist()], dtype=np.float64)

    @torch.no_grad()
    def finalize(self, Xs: torch.Tensor, ys: torch.Tensor, ws: torch.Tensor | None = None) -> None:
        """Recompute prediction caches from the (scaled) training data, if the model needs them."""
        if self.needs_finalize:
            self.module_.eval()
            self._check_weights(ws)
            with self.row_weights(ws):
                self._finalize(Xs, ys)

    # ---------------------------------------------------------------- per-observation weights
    @property
    def weighted(self) -> bool:
        """Whether the model was fitted with per-observation weights (it has a nugget tau^2)."""
        return self.module_ is not None and hasattr(self.module_, "raw_nugget")

    def _add_nugget(self) -> None:
        """Give the module the learned nugget ``tau^2`` of a weighted fit (before training; see load_model)."""
        from gpcore.models.linalg import inv_softplus

        p = next(iter(self.module_.parameters()))
        self.module_.raw_nugget = nn.Parameter(torch.tensor(inv_softplus(self._nugget_init()), dtype=self.dtype,
                                                            device=p.device))

    def _nugget_init(self) -> float:
        """The nugget a weighted fit starts from: a fraction of the current noise variance."""
        with torch.no_grad():
            return max(float(self._noise_s()) * self.NUGGET_INIT_FRACTION, 1e-6)

    def _check_weights(self, ws) -> None:
        if ws is not None and not self.weighted:
            raise InputError(f"{type(self).__name__} was fitted without weights; it takes no training weights")
        if ws is None and self.weighted and self.needs_finalize:
            raise InputError(f"{type(self).__name__} was fitted with weights; pass the training rows' weights too")

    def _nugget_s(self) -> torch.Tensor:
        """Nugget ``tau^2`` in standardised units (zero for an unweighted model)."""
        if not self.weighted:
            return torch.zeros(())
        return nn.functional.softplus(self.module_.raw_nugget)

    def _noise_rows(self, s2: torch.Tensor | None = None, start: int | None = None, stop: int | None = None):
        """Noise variance of the rows in hand: ``s2`` unweighted, else ``tau^2 + s2 / w`` per row.

        ``w`` is ``self._wb`` (the current batch's or finalize's weights), sliced ``[start:stop]``.
        ``s2`` defaults to the model's noise ``sigma^2`` (standardised units).
        """
        s2 = self._noise_s() if s2 is None else s2
        w = self._wb
        if w is None:
            return s2
        if start is not None or stop is not None:
            w = w[start:stop]
        return self._nugget_s().to(s2.dtype) + s2 / w.to(dtype=s2.dtype, device=s2.device)

    def _noise_of(self, w: torch.Tensor | None) -> torch.Tensor:
        """:meth:`_noise_rows` for the rows whose weights are ``w`` (None: unweighted / one noise level)."""
        with self.row_weights(w):
            return self._noise_rows()

    @contextlib.contextmanager
    def row_weights(self, w: torch.Tensor | None):
        """Within the block, losses, likelihoods and finalize see the rows' (scaled) weights ``w`` (``_wb``);
        the previous weights are restored after it."""
        prev, self._wb = self._wb, w
        try:
            yield
        finally:
            self._wb = prev

    def _obs_noise_np(self, weights, m: int) -> np.ndarray | float:
        """Noise variance of new observations in caller units (``weights=None``: one measurement)."""
        s2 = float(self._noise_s()) * self.y_std_**2
        if not self.weighted:
            if weights is not None:
                raise InputError(
                    f"{type(self).__name__} was fitted without weights; predict(..., weights=...) needs a model "
                    "fitted with weights"
                )
            return s2
        tau2 = float(self._nugget_s()) * self.y_std_**2
        if weights is None:
            return tau2 + s2
        return tau2 + s2 / as_weights(weights, m, "weights")

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
        noise = self._obs_noise_np(weights, X.shape[0])
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
        var_y = var_f + noise
        if not (isinstance(vscale, float) and vscale == 1.0):
            var_y = var_y * vscale
        return Prediction(mean=mean, var_f=var_f, var_y=var_y)

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
    def _step(self, xb: torch.Tensor, yb: torch.Tensor, n: int) -> torch.Tensor:
        """One backward pass; returns the detached loss. Override for custom (two-pass) gradients."""
        loss = self._loss(xb, yb, n)
        loss.backward()
        return loss.detach()

    def _train(self, Xs, ys, Xv, yv, callback, ws, wv) -> tuple[list[dict], dict]:
        """Optimise the built module on the scaled data; ``(history, info)``. One :func:`gpcore.train.train`
        call by default; a model with training stages (``dbk-nn``) runs several."""
        from gpcore.train import train

        return train(self, Xs, ys, Xv, yv, callback, ws=ws, wv=wv)

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

    def _loss(self, xb: torch.Tensor, yb: torch.Tensor, n: int) -> torch.Tensor:
        raise NotImplementedError

    def _finalize(self, Xs: torch.Tensor, ys: torch.Tensor) -> None:
        pass

    def _predict_f(self, xb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _kernel_s(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _noise_s(self) -> torch.Tensor:
        """Noise variance in standardised units: the module's ``noise`` (see models/hyper.py)."""
        return self.module_.noise

    def _feature_form(self):
        """The posterior in feature form (:class:`gpcore.posterior.FeatureForm`); see gpcore/posterior.py."""
        raise InputError(f"{type(self).__name__} has no feature form, so joint posterior operations are unavailable")

    # ---------------------------------------------------------------- persistence
    def _extra_state(self) -> dict:
        """JSON-serialisable state a subclass needs to rebuild its module (shapes etc.)."""
        return {}

    def _set_extra_state(self, state: dict) -> None:
        pass

    def save(self, path) -> Path:
        """Save to a directory: ``model.json`` (config, scalers) + ``model.safetensors`` (tensors)."""
        from safetensors.torch import save_file

        self._check_fitted()
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        meta = {
            "format": "gpcore-model",
            "format_version": FORMAT_VERSION,
            "model": self.name,
            "registry_name": self.registry_name,
            "config": self.config.to_dict(),
            "d": self.d_,
            "n_train": self.n_train_,
            "x_lo": [float(v) for v in self.x_lo_],
            "x_span": [float(v) for v in self.x_span_],
            "y_mean": self.y_mean_,
            "y_std": self.y_std_,
            "extra": self._extra_state(),
            "weighted": self.weighted,
            "recalibration": getattr(self, "recal_", None),
            "train_info": _jsonable(self.train_info_),
            "history": _jsonable(self.history_),
        }
        tensors = {k: v.detach().cpu().contiguous().clone() for k, v in self.module_.state_dict().items()}
        save_file(tensors, str(path / "model.safetensors"))
        (path / "model.json").write_text(json.dumps(meta, indent=2))
        return path


def load_model(path, device: str | None = None) -> GPModel:
    """Load a model saved by :meth:`GPModel.save`. Reads JSON and safetensors only (no pickle).

    ``model.json`` is validated (types, ``d`` against ``x_lo``/``x_span``, finite scalers) before any
    module is built, and the tensors must be finite and match the module: a damaged or crafted model
    raises :class:`InputError`.
    """
    path = Path(path)
    meta_path = path / "model.json"
    if not meta_path.exists():
        raise InputError(f"'{path}' is not a saved gpcore model (no model.json); pass the directory save() wrote")
    try:
        meta = json.loads(meta_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"'{meta_path}' is not valid JSON ({e}); the model files are damaged, re-run the fit") \
            from None
    if not isinstance(meta, dict) or meta.get("format") != "gpcore-model":
        raise InputError(f"'{meta_path}' is not a gpcore model file")
    _check_saved_meta(meta, meta_path)
    spec = model_spec(meta["model"])
    cfg = dict(meta["config"])
    if device is not None:
        cfg["device"] = device
    model = spec.cls(**cfg)
    model.registry_name = meta.get("registry_name", meta["model"])
    model.d_ = int(meta["d"])
    model.n_train_ = int(meta["n_train"])
    model.x_lo_ = np.asarray(meta["x_lo"], dtype=np.float64)
    model.x_span_ = np.asarray(meta["x_span"], dtype=np.float64)
    model.y_mean_ = float(meta["y_mean"])
    model.y_std_ = float(meta["y_std"])
    model._set_extra_state(meta.get("extra", {}))
    model.train_info_ = meta.get("train_info", {})
    model.recal_ = meta.get("recalibration")
    model.history_ = meta.get("history", [])
    state = _load_tensors(path / "model.safetensors")
    bad = sorted(k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all()))
    if bad:
        raise InputError(f"'{path}': tensor(s) {', '.join(bad[:5])} hold NaN or inf; re-run the fit")
    with torch.device("meta"):  # sizes the config implies, without allocating anything
        probe = model._build(model.d_, None, None)
    implied = sum(v.numel() for v in probe.state_dict().values())
    saved = sum(v.numel() for v in state.values())
    if implied > 2 * saved + 4096:
        raise InputError(
            f"'{path}': model.json implies {implied:,} parameters but model.safetensors holds {saved:,}; "
            "the model files do not belong together, re-run the fit"
        )
    module = model._build(model.d_, None, None).to(device=model.device, dtype=model.dtype)
    model.module_ = module
    if meta.get("weighted", False):  # absent in models saved before weights existed: unweighted
        model._add_nugget()
    _load_state_resizing(module, {k: v.to(model.device) for k, v in state.items()})
    model.module_ = module
    model.module_.eval()
    model.fitted_ = True
    return model


def _load_tensors(file: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``model.safetensors`` file (InputError when missing or damaged)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not file.is_file():
        raise InputError(f"'{file}' is missing; the model files are incomplete, re-run the fit")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise InputError(f"'{file}' is not a readable safetensors file ({e}); re-run the fit") from None


def _check_scalers(x_lo, x_span, y_mean, y_std, what: str) -> None:
    """The input box and target scale must be finite (and positive): else every prediction is NaN."""
    x_lo, x_span = np.asarray(x_lo, dtype=np.float64), np.asarray(x_span, dtype=np.float64)
    if not (np.all(np.isfinite(x_lo)) and np.all(np.isfinite(x_span)) and np.all(x_span > 0)):
        raise InputError(
            f"{what}: the input coordinates span a non-finite range (values near the float limit); "
            "check the coordinate columns"
        )
    if not (math.isfinite(y_mean) and math.isfinite(y_std) and y_std > 0):
        raise InputError(
            f"{what}: the target's mean or standard deviation is not finite (values near the float limit, e.g. "
            "1e308, overflow); rescale the target column (divide it by a power of ten) or use a log transform"
        )


#: Largest input dimension a saved model may declare (spatial models use 2; the guard stops a crafted
#: model.json from allocating gigabytes before its tensors are checked).
MAX_SAVED_D = 4096


def _check_saved_meta(meta: dict, meta_path: Path) -> None:
    """Validate model.json's types and sizes before anything is allocated (InputError naming the field)."""

    def bad(field: str, why: str) -> InputError:
        return InputError(f"'{meta_path}': field '{field}' {why}; the model files are damaged, re-run the fit")

    for key in ("model", "config", "d", "n_train", "x_lo", "x_span", "y_mean", "y_std"):
        if key not in meta:
            raise bad(key, "is missing")
    if not isinstance(meta["model"], str):
        raise bad("model", "is not a model name")
    if not isinstance(meta["config"], dict):
        raise bad("config", "is not an object of settings")
    d = meta["d"]
    if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= MAX_SAVED_D:
        raise bad("d", f"= {d!r} is not an input dimension in 1..{MAX_SAVED_D}")
    n = meta["n_train"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise bad("n_train", f"= {n!r} is not a positive count")
    for key in ("x_lo", "x_span"):
        v = meta[key]
        if not isinstance(v, list) or len(v) != d or not all(
            isinstance(a, (int, float)) and not isinstance(a, bool) for a in v
        ):
            raise bad(key, f"is not a list of {d} numbers (d = {d})")
    for key in ("y_mean", "y_std"):
        if isinstance(meta[key], bool) or not isinstance(meta[key], (int, float)):
            raise bad(key, "is not a number")
    for key in ("extra", "train_info"):
        if key in meta and not isinstance(meta[key], dict):
            raise bad(key, "is not an object")
    if "history" in meta and not isinstance(meta["history"], list):
        raise bad("history", "is not a list")
    try:
        _check_scalers(meta["x_lo"], meta["x_span"], float(meta["y_mean"]), float(meta["y_std"]), str(meta_path))
    except InputError as e:
        raise InputError(f"{e}; the model files are damaged, re-run the fit") from None


def _load_state_resizing(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """``load_state_dict`` that also accepts data-dependent buffer/parameter shapes."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise InputError(f"saved tensors do not match the model: missing {missing}, unexpected {unexpected}")
    for key, value in state.items():
        if own[key].shape != value.shape:
            *parents, leaf = key.split(".")
            owner = module
            for p in parents:
                owner = getattr(owner, p)
            current = getattr(owner, leaf)
            if isinstance(current, nn.Parameter):
                setattr(owner, leaf, nn.Parameter(torch.empty_like(value), requires_grad=current.requires_grad))
            else:
                owner.register_buffer(leaf, torch.empty_like(value))
    module.load_state_dict(state, strict=True)


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
