"""Small numerical building blocks shared by the models (ALGORITHMS.md 1.3, 1.5).

Every ``A^{-1} v`` is a Cholesky or triangular solve; log-determinants come from
Cholesky diagonals; Gram matrices are factorised with a jitter-retry loop.
"""

from __future__ import annotations

import math

import torch

LOG_2PI = math.log(2.0 * math.pi)


def psd_safe_cholesky(A: torch.Tensor, jitters=(0.0, 1e-6, 1e-5, 1e-4, 1e-3), upcast: bool = False) -> torch.Tensor:
    """Lower Cholesky factor of a (numerically) PSD matrix ``A`` (``... x r x r``).

    Retries with a growing jitter ``eps * mean(diag(A)) * I`` (the ``psd_safe_cholesky``
    pattern of ALGORITHMS.md 1.5). With ``upcast=True`` the factorisation runs in float64
    and the factor is cast back to ``A.dtype``.
    """
    orig_dtype = A.dtype
    if upcast and A.dtype != torch.float64:
        A = A.double()
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    scale = A.diagonal(dim1=-2, dim2=-1).mean(-1).detach().clamp_min(1e-12)[..., None, None]
    last_err = None
    for eps in jitters:
        L, info = torch.linalg.cholesky_ex(A + eps * scale * eye if eps > 0 else A)
        if not torch.any(info):
            return L.to(orig_dtype)
        last_err = info
    raise torch.linalg.LinAlgError(
        f"Cholesky failed even with jitter {jitters[-1]} x mean diagonal (info={last_err}); "
        "the matrix is far from positive definite (collapsed inducing points or a NaN in the parameters?)"
    )


def tril_factor(raw_offdiag: torch.Tensor, log_diag: torch.Tensor) -> torch.Tensor:
    """``L = tril(A, -1) + diag(exp(rho))`` (ALGORITHMS.md 2.2): always a valid Cholesky factor."""
    return torch.tril(raw_offdiag, diagonal=-1) + torch.diag_embed(torch.exp(log_diag))


def kl_std_normal(m: torch.Tensor, L: torch.Tensor, log_diag: torch.Tensor | None = None) -> torch.Tensor:
    """``KL(N(m, L L^T) || N(0, I_r)) = 0.5 (||m||^2 + ||L||_F^2 - r - 2 sum log L_jj)``."""
    r = m.shape[-1]
    logd = torch.log(L.diagonal(dim1=-2, dim2=-1)) if log_diag is None else log_diag
    return 0.5 * (m.pow(2).sum(-1) + L.pow(2).sum((-2, -1)) - r - 2.0 * logd.sum(-1))


def kl_gauss_chol(m: torch.Tensor, L: torch.Tensor, L0: torch.Tensor) -> torch.Tensor:
    """``KL(N(m, L L^T) || N(0, L0 L0^T))`` with lower factors ``L`` and ``L0`` (ALGORITHMS.md 6.3)."""
    dim = m.shape[-1]
    A = torch.linalg.solve_triangular(L0, L, upper=False)
    b = torch.linalg.solve_triangular(L0, m.unsqueeze(-1), upper=False).squeeze(-1)
    return (
        torch.log(L0.diagonal(dim1=-2, dim2=-1)).sum(-1)
        - torch.log(L.diagonal(dim1=-2, dim2=-1).abs()).sum(-1)
        + 0.5 * (A.pow(2).sum((-2, -1)) + b.pow(2).sum(-1) - dim)
    )


def gaussian_nll(y: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """Elementwise ``-log N(y; mean, var) = 0.5 log(2 pi var) + (y - mean)^2 / (2 var)``."""
    return 0.5 * (LOG_2PI + torch.log(var)) + (y - mean).pow(2) / (2.0 * var)


def inv_softplus(x: float) -> float:
    """Inverse of softplus for initialising constrained parameters."""
    return x + math.log(-math.expm1(-x)) if x < 20 else x
