"""Stationary base kernels as plain functions of tensors (``n1 x d``, ``n2 x d`` -> ``n1 x n2``).

The lengthscale ``ell`` is a scalar or a ``d``-vector (ARD); ``outputscale`` multiplies.
"""

from __future__ import annotations

import math

import torch

KERNEL_NAMES = ("rbf", "matern12", "matern32", "matern52")


def scaled_sqdist(X1: torch.Tensor, X2: torch.Tensor, ell: torch.Tensor) -> torch.Tensor:
    """``sum_j (x1_j - x2_j)^2 / ell_j^2`` for all pairs, clamped at 0 (``n1 x n2``)."""
    A = X1 / ell
    B = X2 / ell
    d2 = A.pow(2).sum(-1, keepdim=True) - 2.0 * A @ B.transpose(-1, -2) + B.pow(2).sum(-1).unsqueeze(-2)
    return d2.clamp_min(0.0)


def stationary(
    name: str, X1: torch.Tensor, X2: torch.Tensor, ell: torch.Tensor, outputscale: torch.Tensor
) -> torch.Tensor:
    """Evaluate the named stationary kernel ``outputscale * rho(||(x1 - x2) / ell||)``."""
    return stationary_sqdist(name, scaled_sqdist(X1, X2, ell), outputscale)


def stationary_sqdist(name: str, d2: torch.Tensor, outputscale: torch.Tensor) -> torch.Tensor:
    """The named stationary kernel as a function of the scaled squared distance ``d2`` (any shape)."""
    if name == "rbf":
        return outputscale * torch.exp(-0.5 * d2)
    # Matérn: the clamp keeps sqrt finite at r = 0 (zero gradient there) without biasing k(x, x)
    r = torch.sqrt(d2.clamp_min(1e-20))
    if name == "matern12":
        k = torch.exp(-r)
    elif name == "matern32":
        s = math.sqrt(3.0) * r
        k = (1.0 + s) * torch.exp(-s)
    elif name == "matern52":
        s = math.sqrt(5.0) * r
        k = (1.0 + s + s.pow(2) / 3.0) * torch.exp(-s)
    else:
        raise ValueError(f"unknown kernel {name!r}; allowed: {KERNEL_NAMES}")
    return outputscale * k
