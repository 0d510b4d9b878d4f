"""Positive kernel hyperparameters as softplus of unconstrained parameters (one definition).

Every model module stores its hyperparameters unconstrained (``raw_ell``, ``raw_outputscale``,
``raw_noise``, initialised with :func:`gpcore.models.linalg.inv_softplus`) and reads them through
these properties; ``noise_floor`` bounds the noise variance from below. A module defines only the
raw parameters it learns, and a property whose raw parameter is missing raises ``AttributeError``.
"""

from __future__ import annotations

import torch
from torch import nn


class SoftplusHyperparameters:
    """Mixin for ``nn.Module`` subclasses: ``lengthscale``, ``outputscale`` and ``noise`` properties."""

    noise_floor: float = 0.0

    @property
    def lengthscale(self) -> torch.Tensor:
        return nn.functional.softplus(self.raw_ell)

    @property
    def outputscale(self) -> torch.Tensor:
        return nn.functional.softplus(self.raw_outputscale)

    @property
    def noise(self) -> torch.Tensor:
        return self.noise_floor + nn.functional.softplus(self.raw_noise)
