"""A two-component noise shape: a skewed predictive for the Vecchia family (setting ``noise_shape``;
docs/calibration.md, "A skewed noise from cross-validation").

With ``m`` a row's posterior mean, ``v`` its latent variance (as the model fitted it) and ``s`` its Gaussian noise
variance (``tau^2 + sigma^2 / w`` in a weighted fit), a new observation is

    y = m + sqrt(c v) z_f + e,     e ~ (1 - pi) N(a sqrt(s), c_1 s) + pi N(b sqrt(s), c_2 s),  a = -pi b / (1 - pi),

so its predictive distribution is the two-Gaussian mixture

    (1 - pi) N(m + a sqrt(s), c v + c_1 s) + pi N(m + b sqrt(s), c v + c_2 s).

``c`` scales the latent variance (as the Gaussian ``cv_calibration`` does), ``c_1`` and ``c_2 >= FLOOR`` scale the
noise of the two components, ``pi`` is the second's share and ``b`` its offset in noise standard deviations; the
first sits at ``a`` so that the noise has mean 0: ``m`` stays the mean of a new observation, as the Gaussian fit that
estimated it assumed, and the shape only redistributes the noise around it (skews it). With ``pi = 0`` it is a
Gaussian. Ookla's errors on the log10 scale are left-skewed (most tests near the tile's typical speed, a few far
slower): the maximum-likelihood shape on the held-out rows is a narrow component a little above ``m`` and a wider
one below it (docs/benchmarks/race.md, "A skewed predictive from the cross-validated rows").

The latent function stays Gaussian: the shape changes only what a *new observation* may be (NLL, CRPS, intervals
and coverage of ``y``); exceedance, areal averages and samples of the latent field are those of the Gaussian
posterior with its latent variance times ``c``.

:func:`fit` picks ``(c, c_1, c_2, pi, b)`` by maximum likelihood on rows predicted from other rows (the
cross-validation folds of ``cv_calibration``); everything else here is closed form or a bisection.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy.special import ndtr

__all__ = ["COLUMNS", "FLOOR", "NoiseShape", "conformal_stretch", "fit", "of_rows"]

#: columns of a table of predictions (a run's test_predictions.parquet) that carry its shape, one value per table
COLUMNS = {"noise_c": "latent_scale", "noise_c1": "c1", "noise_c2": "c2", "noise_pi": "pi", "noise_offset": "offset"}

#: smallest noise scale of a component: keeps every density bounded where the latent variance is ~0
FLOOR = 1e-3
_SQRT2PI = math.sqrt(2.0 * math.pi)


@dataclass(frozen=True)
class NoiseShape:
    """The fitted shape (see the module docstring). ``latent_scale`` is ``c``."""

    latent_scale: float
    c1: float
    c2: float
    pi: float
    offset: float

    def __post_init__(self):
        vals = (self.latent_scale, self.c1, self.c2, self.pi, self.offset)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in vals):
            raise ValueError(f"noise shape parameters must be finite numbers, got {vals}")
        if self.latent_scale <= 0 or self.c1 <= 0 or self.c2 <= 0 or not 0.0 <= self.pi < 1.0:
            raise ValueError(f"noise shape needs c, c1, c2 > 0 and 0 <= pi < 1, got {vals}")

    # ------------------------------------------------------------------ record
    def to_dict(self) -> dict:
        return {k: float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d) -> NoiseShape | None:
        """The shape recorded by :meth:`to_dict`; ``None`` for anything else (a run written without one)."""
        if not isinstance(d, dict):
            return None
        try:
            return cls(**{k: d[k] for k in ("latent_scale", "c1", "c2", "pi", "offset")})
        except (KeyError, TypeError, ValueError):
            return None

    def canonical(self) -> NoiseShape:
        """The same distribution with the second component the smaller one (``pi <= 1/2``; the components swapped)."""
        if self.pi <= 0.5:
            return self
        return NoiseShape(self.latent_scale, self.c2, self.c1, 1.0 - self.pi, self.first_offset())

    def stretched(self, k: float) -> NoiseShape:
        """The shape of ``k`` times the residual: ``(k^2 c, k^2 c_1, k^2 c_2, pi, k b)``."""
        return NoiseShape(k * k * self.latent_scale, k * k * self.c1, k * k * self.c2, self.pi, k * self.offset)

    def columns(self) -> dict[str, float]:
        """The shape as the :data:`COLUMNS` of a predictions table (:func:`of_rows` reads them back)."""
        return {col: float(getattr(self, attr)) for col, attr in COLUMNS.items()}

    # ------------------------------------------------------------------ the mixture
    def noise_factor(self) -> float:
        """Variance of ``e`` in units of ``s``: ``(1 - pi) (c_1 + a^2) + pi (c_2 + b^2)`` (its mean is 0)."""
        a = self.first_offset()
        return (1 - self.pi) * (self.c1 + a * a) + self.pi * (self.c2 + self.offset**2)

    def noise_of(self, var_y, var_f) -> np.ndarray:
        """Each row's Gaussian noise variance ``s`` from its predictive and latent variances: ``(var_y - var_f) /
        noise_factor()`` (``var_y`` holds the mixture's variance)."""
        extra = np.maximum(np.asarray(var_y, dtype=float) - np.asarray(var_f, dtype=float), 0.0)
        return extra / self.noise_factor()

    def first_offset(self) -> float:
        """``a = -pi b / (1 - pi)``: the first component's offset in noise SDs (the noise's mean is 0)."""
        return -self.pi * self.offset / (1.0 - self.pi)

    def components(self, var_f, s):
        """``(weights (2,), offsets (m, 2), variances (m, 2))`` of the mixture around ``m``; ``var_f`` is the latent
        variance *with* ``c`` applied (what a calibrated model's ``Prediction.var_f`` holds)."""
        var_f, s = np.broadcast_arrays(np.asarray(var_f, dtype=float), np.asarray(s, dtype=float))
        off = np.stack([self.first_offset() * np.sqrt(s), self.offset * np.sqrt(s)], axis=-1)
        var = np.stack([var_f + self.c1 * s, var_f + self.c2 * s], axis=-1)
        return np.array([1.0 - self.pi, self.pi]), off, var

    def logpdf(self, r, var_f, s) -> np.ndarray:
        """Log density of the residual ``r = y - m``."""
        w, off, var = self.components(var_f, s)
        r = np.asarray(r, dtype=float)[..., None]
        with np.errstate(divide="ignore"):
            lw = np.log(w)
        terms = lw - 0.5 * np.log(2 * np.pi * var) - 0.5 * (r - off) ** 2 / var
        return np.logaddexp(terms[..., 0], terms[..., 1])

    def cdf(self, r, var_f, s) -> np.ndarray:
        w, off, var = self.components(var_f, s)
        r = np.asarray(r, dtype=float)[..., None]
        return (w * ndtr((r - off) / np.sqrt(var))).sum(-1)

    def quantile(self, p: float, var_f, s, iters: int = 64) -> np.ndarray:
        """The residual ``r`` with ``cdf(r) = p`` (per row), by bisection between the components' extremes."""
        if not 0.0 < p < 1.0:
            raise ValueError(f"p must be in (0, 1), got {p}")
        _, off, var = self.components(var_f, s)
        sd = np.sqrt(var)
        lo, hi = (off - 12 * sd).min(-1), (off + 12 * sd).max(-1)
        for _ in range(iters):
            mid = 0.5 * (lo + hi)
            below = self.cdf(mid, var_f, s) < p
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        return 0.5 * (lo + hi)

    def interval(self, level: float, var_f, s) -> tuple[np.ndarray, np.ndarray]:
        """Ends of the central ``level`` interval of ``r`` (add ``m`` for ``y``)."""
        if not 0.0 < level < 1.0:
            raise ValueError(f"level must be in (0, 1), got {level}")
        a = (1.0 - level) / 2.0
        return self.quantile(a, var_f, s), self.quantile(1.0 - a, var_f, s)

    def crps(self, r, var_f, s) -> np.ndarray:
        """CRPS of a Gaussian mixture (Grimit et al. 2006): ``sum_i w_i A(r - mu_i, s_i^2) - 1/2 sum_ij w_i w_j
        A(mu_i - mu_j, s_i^2 + s_j^2)``, ``A(mu, s^2) = E|N(mu, s^2)|``."""
        w, off, var = self.components(var_f, s)
        r = np.asarray(r, dtype=float)[..., None]
        first = (w * _abs_mean(r - off, var)).sum(-1)
        second = sum(w[i] * w[j] * _abs_mean(off[..., i] - off[..., j], var[..., i] + var[..., j])
                     for i in range(2) for j in range(2))
        return first - 0.5 * second


def conformal_stretch(shape: NoiseShape, r, v, s, level: float = 0.95) -> float:
    """The split-conformal ``k``: the smallest stretch of ``shape`` (:meth:`NoiseShape.stretched`) whose central
    ``level`` intervals hold the ``ceil((n + 1) level)``-th smallest share of held-out residuals ``r`` (unscaled
    latent variances ``v``, noise ``s``). Row ``i`` is inside once ``k >= r_i / u_i`` (``r_i > 0``) or ``k >= r_i /
    l_i`` (``r_i < 0``), ``[l_i, u_i]`` its interval at ``k = 1``; 1 when an interval does not straddle 0."""
    r, v, s = (np.asarray(a, dtype=float).reshape(-1) for a in (r, v, s))
    lo, hi = shape.interval(level, shape.latent_scale * v, s)
    if r.size == 0 or np.any(lo >= 0) or np.any(hi <= 0):
        return 1.0
    need = np.sort(np.where(r > 0, r / hi, r / lo))
    return float(need[min(math.ceil((r.size + 1) * level), r.size) - 1])


def of_rows(table) -> NoiseShape | None:
    """The shape of a predictions table (one run's rows, or one model's rows of several runs): ``None`` without the
    :data:`COLUMNS` or when they are empty (a Gaussian run's rows); ``ValueError`` when they hold two shapes."""
    if not all(c in getattr(table, "columns", ()) for c in COLUMNS):
        return None
    vals = {}
    for col, attr in COLUMNS.items():
        v = np.asarray(table[col], dtype=float)
        v = v[np.isfinite(v)]
        if v.size == 0:
            return None
        if v.size != len(table) or np.any(v != v[0]):
            raise ValueError("these predictions mix several noise shapes (or Gaussian rows): score each run's apart")
        vals[attr] = float(v[0])
    return NoiseShape(**vals)


def _abs_mean(mu, var):
    """``E|X|`` for ``X ~ N(mu, var)``: ``2 sd phi(mu/sd) + mu (2 Phi(mu/sd) - 1)``."""
    sd = np.sqrt(var)
    z = mu / sd
    return 2 * sd * np.exp(-0.5 * z * z) / _SQRT2PI + mu * (2 * ndtr(z) - 1)


def _unpack(theta: np.ndarray) -> NoiseShape:
    c, c1, c2 = np.exp(theta[0]), FLOOR + np.exp(theta[1]), FLOOR + np.exp(theta[2])
    pi = 1.0 / (1.0 + np.exp(-theta[3]))
    return NoiseShape(float(c), float(c1), float(c2), float(min(pi, 1 - 1e-9)), float(theta[4]))


def _negloglik(theta: np.ndarray, r: np.ndarray, v: np.ndarray, s: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean negative log density of residuals ``r`` at the packed parameters ``theta`` (see :func:`fit`), and its
    gradient in ``theta`` (through each row's component responsibilities)."""
    shape = _unpack(theta)
    sq = np.sqrt(s)
    c, c1, c2 = shape.latent_scale, shape.c1, shape.c2
    v1, v2 = c * v + c1 * s, c * v + c2 * s
    ratio = shape.pi / (1.0 - shape.pi)
    d1 = r - shape.first_offset() * sq
    d2 = r - shape.offset * sq
    l1 = math.log1p(-shape.pi) - 0.5 * np.log(2 * np.pi * v1) - 0.5 * d1 * d1 / v1
    l2 = math.log(max(shape.pi, 1e-300)) - 0.5 * np.log(2 * np.pi * v2) - 0.5 * d2 * d2 / v2
    ll = np.logaddexp(l1, l2)
    g2 = np.exp(l2 - ll)  # the second component's responsibility
    g1 = 1.0 - g2
    dv1 = 0.5 * (d1 * d1 / v1 - 1.0) / v1  # d l1 / d v1
    dv2 = 0.5 * (d2 * d2 / v2 - 1.0) / v2
    da = np.mean(g1 * d1 / v1 * sq)  # d / d a, with a = -b pi / (1 - pi)
    grad = np.array([
        np.mean((g1 * dv1 + g2 * dv2) * v) * c,  # d / d log c
        np.mean(g1 * dv1 * s) * (c1 - FLOOR),
        np.mean(g2 * dv2 * s) * (c2 - FLOOR),
        np.mean(g2 - shape.pi) - da * shape.offset * ratio,  # d / d logit pi (d(pi / (1 - pi)) = pi / (1 - pi))
        np.mean(g2 * d2 / v2 * sq) - da * ratio,
    ])
    return -float(ll.mean()), -grad


def fit(r, v, s, scale_bounds: tuple[float, float] = (0.05, 20.0)) -> tuple[NoiseShape, float]:
    """Maximum-likelihood shape of held-out residuals ``r`` with *unscaled* latent variances ``v`` and noise
    variances ``s`` (rows with a non-finite residual are left out), its latent scale ``c`` within ``scale_bounds``
    (where the held-out rows cannot tell latent variance from noise, the likelihood would give it all to the
    noise); returns it with its mean log density. Several
    starts (a narrow component above ``m``, a rare slow one far below, ...), each by L-BFGS on ``(log c,
    log(c_1 - FLOOR), log(c_2 - FLOOR), logit pi, b)``; the best is kept, its smaller component second
    (:meth:`NoiseShape.canonical`)."""
    from scipy.optimize import minimize

    r, v, s = (np.asarray(a, dtype=float).reshape(-1) for a in (r, v, s))
    ok = np.isfinite(r) & np.isfinite(v) & np.isfinite(s) & (s > 0) & (v >= 0)
    r, v, s = r[ok], v[ok], s[ok]
    if r.size < 10:
        raise ValueError(f"a noise shape needs at least 10 held-out rows, got {r.size}")
    best = None
    log_c = tuple(np.log(scale_bounds))
    for pi0, b0 in ((0.3, 1.0), (0.05, -2.5), (0.02, -4.0), (0.1, -1.0)):
        theta0 = np.array([float(np.clip(0.0, *log_c)), 0.0, math.log(1.0 - FLOOR), math.log(pi0 / (1 - pi0)), b0])
        res = minimize(_negloglik, theta0, args=(r, v, s), jac=True, method="L-BFGS-B",
                       bounds=[log_c, (-12, 5), (-12, 5), (-12, 6), (-12, 12)], options={"maxiter": 500})
        if np.isfinite(res.fun) and (best is None or res.fun < best.fun):
            best = res
    if best is None:
        raise ValueError("no noise shape could be fitted to these rows")
    return _unpack(best.x).canonical(), -float(best.fun)
