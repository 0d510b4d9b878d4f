"""The Gaussian likelihood of every model, apart from the model (as GPyTorch keeps model and likelihood apart).

Observation ``i`` is ``y_i = f(x_i) + e_i`` with ``e_i ~ N(0, v_i)``:

* unweighted fits: ``v_i = sigma^2``, the module's ``noise`` (see ``models/hyper.py``);
* weighted fits (``fit(..., weights=w)``; observation ``i`` is the mean of ``w_i`` measurements):
  ``v_i = tau^2 + sigma^2 / w_i`` -- a nugget ``tau^2`` (the module's ``raw_nugget``, added only for weighted
  fits) plus the measurement noise ``sigma^2`` averaged over ``w_i`` measurements; both are learned.

The parameters stay in the model's module (so saved models keep their tensor names); a
:class:`GaussianLikelihood` is a view over them. The rows' weights are never state: every loss, step and
finalize receives the weights of the rows it is given (``_loss(xb, yb, n, wb)``) and asks
:meth:`GaussianLikelihood.variance` for their noise. Method reference: docs/calibration.md (weights).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from gpcore.errors import InputError
from gpcore.models.inputs import as_weights
from gpcore.models.linalg import inv_softplus

#: initial nugget tau^2 of a weighted fit, as a fraction of the initial noise variance sigma^2
NUGGET_INIT_FRACTION = 0.1


class GaussianLikelihood:
    """Noise variances of a model's rows, read from its module (standardised target units).

    Parameters
    ----------
    module : the model's ``nn.Module``; ``module.noise`` is ``sigma^2`` and ``module.raw_nugget`` (weighted
        fits only) the softplus-inverse of ``tau^2``.
    """

    def __init__(self, module: nn.Module):
        self.module = module

    @property
    def weighted(self) -> bool:
        """Whether the module has a nugget ``tau^2`` (fitted with per-observation weights)."""
        return hasattr(self.module, "raw_nugget")

    @property
    def noise(self) -> torch.Tensor:
        """``sigma^2``: the noise variance of one measurement less the nugget."""
        return self.module.noise

    @property
    def nugget(self) -> torch.Tensor:
        """``tau^2``: noise that averaging over measurements does not remove (zero when unweighted)."""
        if not self.weighted:
            return torch.zeros(())
        return nn.functional.softplus(self.module.raw_nugget)

    def variance(self, w: torch.Tensor | None = None, s2: torch.Tensor | None = None,
                 rows: slice | None = None) -> torch.Tensor:
        """Noise variance of the rows whose weights are ``w``: ``s2`` when ``w`` is None, else ``tau^2 + s2 / w``.

        ``s2`` defaults to :attr:`noise` (pass ``mod.noise.double()`` etc. for another precision); ``rows``
        selects the rows of ``w`` in hand (a chunk of the training set). Shape: scalar or ``(b,)``.
        """
        s2 = self.noise if s2 is None else s2
        if w is None:
            return s2
        if rows is not None:
            w = w[rows]
        return self.nugget.to(s2.dtype) + s2 / w.to(dtype=s2.dtype, device=s2.device)

    def initial_nugget(self) -> float:
        """The nugget a weighted fit starts from: a fraction of the current noise variance."""
        with torch.no_grad():
            return max(float(self.noise) * NUGGET_INIT_FRACTION, 1e-6)

    def add_nugget(self, dtype: torch.dtype) -> None:
        """Give the module the learned nugget ``tau^2`` of a weighted fit (before training, and on load)."""
        p = next(iter(self.module.parameters()))
        self.module.raw_nugget = nn.Parameter(torch.tensor(inv_softplus(self.initial_nugget()), dtype=dtype,
                                                           device=p.device))

    def observation_noise(self, weights, m: int, scale2: float, owner: str) -> np.ndarray | float:
        """Noise variance of ``m`` new observations in caller units (``scale2``: the target variance the model
        standardised by; ``weights=None``: one measurement each). ``owner`` names the model in errors."""
        s2 = float(self.noise) * scale2
        if not self.weighted:
            if weights is not None:
                raise InputError(
                    f"{owner} was fitted without weights; predict(..., weights=...) needs a model fitted with weights"
                )
            return s2
        tau2 = float(self.nugget) * scale2
        if weights is None:
            return tau2 + s2
        return tau2 + s2 / as_weights(weights, m, "weights")
