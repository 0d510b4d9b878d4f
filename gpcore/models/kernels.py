"""Stationary base kernels as plain functions of tensors (``n1 x d``, ``n2 x d`` -> ``n1 x n2``).

The lengthscale ``ell`` is a scalar or a ``d``-vector (ARD); ``outputscale`` multiplies.
"""

from __future__ import annotations

import math

import torch

KERNEL_NAMES = ("rbf", "matern12", "matern32", "matern52")


def scaled_sqdist(X1: torch.Tensor, X2: torch.Tensor, ell: torch.Tensor) -> torch.Tensor:
    """``sum_j (x1_j - x2_j)^2 / ell_j^2`` for all pairs, clamped at 0 (``n1 x n2``).

    Up to three inputs (coordinates, space-time) by direct differences: exact at ``x1 = x2``, where the expanded
    form's cancellation leaves ~1e-16 of ``|x|^2`` that a Matérn's ``sqrt`` turns into ~1e-8 of ``k``.
    """
    A = X1 / ell
    B = X2 / ell
    if A.shape[-1] <= 3:
        d2 = (A[..., :, None, 0] - B[..., None, :, 0]).square_()
        for j in range(1, A.shape[-1]):
            d2.add_((A[..., :, None, j] - B[..., None, :, j]).square_())
        return d2
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



def _group_sqdist(At: torch.Tensor, j: int) -> torch.Tensor:
    """``(a_ij - a_i'j)^2`` of every pair within each group (``b x k x k``) for input dimension ``j``; ``At`` holds
    the groups' inputs dimension-major (``b x d x k``, contiguous rows: the broadcast difference reads them in
    order, about twice as fast as strided columns of ``b x k x d``)."""
    return (At[..., j, :, None] - At[..., j, None, :]).square_()


def _rho_and_slope(name: str, d2: torch.Tensor, slope: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``rho(d2)`` and (``slope``) ``d rho / d d2`` of the named kernel; ``d2`` is overwritten. Below ``d2 = 1e-20``
    the Matérn slopes are those of autograd through :func:`stationary_sqdist`'s clamp (zero for Matérn-1/2)."""
    if name == "rbf":
        k = d2.mul_(-0.5).exp_()
        return k, (k * -0.5 if slope else None)
    if name not in KERNEL_NAMES:
        raise ValueError(f"unknown kernel {name!r}; allowed: {KERNEL_NAMES}")
    small = d2 < 1e-20 if slope and name == "matern12" else None
    r = d2.clamp_min_(1e-20).sqrt_()
    if name == "matern12":
        if not slope:
            return r.neg_().exp_(), None
        k = torch.exp(-r)
        return k, (k / r).mul_(-0.5).masked_fill_(small, 0.0)
    s = r.mul_(math.sqrt(3.0) if name == "matern32" else math.sqrt(5.0))
    e = torch.exp(-s)
    if name == "matern32":  # rho = (1 + s) e^-s, d rho / d d2 = -3/2 e^-s
        return (s + 1.0).mul_(e), (e * -1.5 if slope else None)
    # matern52: rho = (1 + s + s^2/3) e^-s, d rho / d d2 = -5/6 (1 + s) e^-s
    k = (s * s).div_(3.0).add_(s).add_(1.0).mul_(e)
    return k, ((s + 1.0).mul_(e).mul_(-5.0 / 6.0) if slope else None)


class _GroupKernel(torch.autograd.Function):
    """``outputscale * rho(|(x - x') / ell|)`` within each group of ``Xg`` (``b x k x d``), float64, with a
    closed-form backward for ``ell`` and ``outputscale``: the forward and backward work in place on ``b x k x k``
    buffers, about three times fewer passes than autograd through :func:`stationary_sqdist`."""

    @staticmethod
    def forward(ctx, Xg, ell, outputscale, name):
        At = (Xg / ell).transpose(-1, -2).contiguous()  # b x d x k
        d2 = _group_sqdist(At, 0)
        for j in range(1, At.shape[-2]):
            d2.add_(_group_sqdist(At, j))
        k, slope = _rho_and_slope(name, d2, slope=ctx.needs_input_grad[1])
        if any(ctx.needs_input_grad):
            ctx.save_for_backward(At, ell, outputscale, k, slope)
            return k * outputscale
        return k.mul_(outputscale)  # no graph (predictions, the joint factor): in place

    @staticmethod
    def backward(ctx, G):
        At, ell, outputscale, k, slope = ctx.saved_tensors
        g_os = (G * k).sum() if ctx.needs_input_grad[2] else None
        g_ell = None
        if ctx.needs_input_grad[1]:
            H = (G * slope).mul_(outputscale)  # dL/d d2
            # d d2 / d ell_j = -2 (a_j - a'_j)^2 / ell_j with a = x / ell, and for each j
            #   sum_ii' H_ii' (a_i - a_i')^2 = sum_i a_i^2 (H 1 + H^T 1)_i - 2 a^T H a
            # (one matrix product for all j instead of a k x k difference per j); a is centred in each group first
            # (differences unchanged) so that the two terms do not cancel
            Ac = At - At.mean(-1, keepdim=True)
            s = H.sum(-1) + H.sum(-2)  # b x k
            HA = torch.matmul(Ac, H.transpose(-1, -2))  # b x d x k: (H a_j)_i
            per_dim = (Ac.square() * s.unsqueeze(-2)).sum((0, -1)) - 2.0 * (Ac * HA).sum((0, -1))
            per_dim = per_dim.reshape(-1, At.shape[-2]).sum(0)  # any leading batch dims
            g_ell = (per_dim.sum() if ell.numel() == 1 else per_dim).reshape(ell.shape) * (-2.0 / ell)
        return None, g_ell, g_os, None


def group_kernel(name: str, Xg: torch.Tensor, ell: torch.Tensor, outputscale: torch.Tensor) -> torch.Tensor:
    """The named stationary kernel between the members of each group: ``Xg`` is ``b x k x d``, the result
    ``b x k x k`` (float64), differentiable in ``ell`` (scalar or ``d``-vector) and ``outputscale``; equal to
    :func:`stationary` on each group (the Vecchia family's batched conditionals, docs/methods/vecchia.md)."""
    return _GroupKernel.apply(Xg.double(), ell.double().reshape(-1), outputscale.double(), name)
