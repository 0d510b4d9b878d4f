"""Target transforms and their inverses: ``identity``, ``log10`` and ``log``.

Models are trained on ``v = forward(y)``; users see ``inverse(v)`` in the original units (e.g.
Mbps). For a Gaussian predictive ``N(mu, s2)`` in log space, ``inverse(mu)`` is the predictive
*median* in original units and :meth:`TargetTransform.mean` the log-normal mean; interval ends map
through ``inverse`` because the transforms are monotone.

>>> t = get_transform("log10")
>>> float(t.forward(100.0)), float(t.inverse(2.0)), t.units_label("Mbps")
(2.0, 100.0, 'log10(Mbps)')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpcore.errors import ConfigError


@dataclass(frozen=True)
class TargetTransform:
    """A monotone map of the target and its inverse.

    Attributes
    ----------
    name : str
        ``"identity"``, ``"log10"`` or ``"log"``.
    needs_positive : bool
        Whether ``forward`` is defined only for ``y > 0``.
    """

    name: str
    _forward: Callable[[np.ndarray], np.ndarray]
    _inverse: Callable[[np.ndarray], np.ndarray]
    needs_positive: bool = False
    #: d log(inverse(v)) / dv, used for the log-normal mean (0 for identity)
    _log_base: float = 0.0

    def forward(self, y):
        """Original units -> model space, elementwise; ``y`` any shape."""
        return self._forward(np.asarray(y, dtype=float))

    def inverse(self, v):
        """Model space -> original units, elementwise; ``v`` any shape."""
        return self._inverse(np.asarray(v, dtype=float))

    def mean(self, mu, var):
        """Mean in original units of ``N(mu, var)`` in model space (log-normal mean for log transforms).

        ``mu``, ``var`` broadcastable arrays; for ``log10``: ``10**(mu + 0.5 * var * ln 10)``.
        """
        mu = np.asarray(mu, dtype=float)
        if self._log_base == 0.0:
            return mu.copy()
        return self.inverse(mu + 0.5 * np.asarray(var, dtype=float) * self._log_base)

    def invalid(self, y) -> np.ndarray:
        """Boolean mask (same shape as ``y``) of finite values the forward map cannot take (``y <= 0``)."""
        y = np.asarray(y, dtype=float)
        if not self.needs_positive:
            return np.zeros(y.shape, dtype=bool)
        with np.errstate(invalid="ignore"):
            return np.isfinite(y) & (y <= 0)

    def units_label(self, units: str = "") -> str:
        """Axis label of model-space values, e.g. ``"log10(Mbps)"``; ``units`` may be empty."""
        inner = units or "y"
        if self.name == "identity":
            return units
        return f"{self.name}({inner})"


TRANSFORMS: dict[str, TargetTransform] = {
    "identity": TargetTransform("identity", lambda y: y.copy(), lambda v: v.copy()),
    "log10": TargetTransform("log10", np.log10, lambda v: np.power(10.0, v), True, float(np.log(10.0))),
    "log": TargetTransform("log", np.log, np.exp, True, 1.0),
}


def get_transform(name: str | TargetTransform | None) -> TargetTransform:
    """The transform called ``name`` (``None`` means identity); an instance passes through.

    Raises
    ------
    ConfigError
        For an unknown name; the message lists the allowed ones.
    """
    if isinstance(name, TargetTransform):
        return name
    key = "identity" if name is None else str(name).strip().lower()
    key = {"none": "identity", "ln": "log", "log_e": "log"}.get(key, key)
    try:
        return TRANSFORMS[key]
    except KeyError:
        raise ConfigError(f"unknown target transform {name!r}; allowed: {', '.join(TRANSFORMS)}") from None
