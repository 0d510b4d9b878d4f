"""Small numerical building blocks shared by the models (docs/methods/common.md §1.3, §1.5).

Every ``A^{-1} v`` is a Cholesky or triangular solve; log-determinants come from
Cholesky diagonals; Gram matrices are factorised with a jitter-retry loop.
"""

from __future__ import annotations

import math
import warnings

import torch

LOG_2PI = math.log(2.0 * math.pi)


def row_products(G: torch.Tensor, g: torch.Tensor, Phi: torch.Tensor) -> torch.Tensor:
    """``Q[b, k] = Phi[G[b, k]] . g[b]`` (``b x k``, no graph): the adjoint of :func:`combine_rows`' ``ell`` for an
    output adjoint ``g``, by the same sampled sparse product on the CPU (one ``index_select`` elsewhere)."""
    if Phi.device.type == "cpu":
        B = _csr(torch.ones(G.shape, dtype=Phi.dtype), G, Phi.shape[0])
        return torch.sparse.sampled_addmm(B, g.contiguous(), Phi.T, beta=0.0).values().view(G.shape)
    b, k = G.shape
    rows = Phi.index_select(0, G.reshape(-1)).view(b, k, Phi.shape[1])
    return torch.bmm(rows, g.unsqueeze(-1)).squeeze(-1)


def psd_safe_cholesky(A: torch.Tensor, jitters=(0.0, 1e-6, 1e-5, 1e-4, 1e-3), upcast: bool = False) -> torch.Tensor:
    """Lower Cholesky factor of a (numerically) PSD matrix ``A`` (``... x r x r``).

    Retries with a growing jitter ``eps * mean(diag(A)) * I`` (the ``psd_safe_cholesky``
    pattern of docs/methods/common.md §1.5). With ``upcast=True`` the factorisation runs in float64
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
    """``L = tril(A, -1) + diag(exp(rho))`` (docs/methods/dbk.md §2.2): always a valid Cholesky factor."""
    return torch.tril(raw_offdiag, diagonal=-1) + torch.diag_embed(torch.exp(log_diag))


def _tri_blocks(r: int, block: int):
    return [(j, min(j + block, r)) for j in range(0, r, block)]


class _TriangularRowSqNorm(torch.autograd.Function):
    """``||F^T phi_i||^2`` per row with a blocked triangular product and a hand-written backward.

    Autograd through sliced matmuls would allocate and zero-fill a ``b x r`` gradient per block;
    here each block's product is written once and the row-major ``b x r`` gradient is assembled
    by one concatenation, so the saved multiply-adds are not spent again on memory traffic.
    """

    @staticmethod
    def forward(ctx, phi, F, lower: bool, block: int):
        blocks = _tri_blocks(F.shape[-1], block)
        if lower:  # column block [j, e) of a lower factor lives in rows j..r
            us = [phi[:, j:] @ F[j:, j:e] for j, e in blocks]
        else:  # of an upper factor, in rows 0..e
            us = [phi[:, :e] @ F[:e, j:e] for j, e in blocks]
        ctx.save_for_backward(phi, F, *us)
        ctx.lower, ctx.block = lower, block
        out = None
        for u in us:
            part = (u * u).sum(-1)
            out = part if out is None else out + part
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        phi, F, *us = ctx.saved_tensors
        lower = ctx.lower
        blocks = _tri_blocks(F.shape[-1], ctx.block)
        Gu = torch.cat(us, dim=1) * (2.0 * g).unsqueeze(-1)  # d out / d (phi F)
        g_phi = g_F = None
        if ctx.needs_input_grad[0]:
            if lower:  # row block [i, e) of a lower factor is nonzero in columns 0..e
                g_phi = torch.cat([Gu[:, :e] @ F[i:e, :e].transpose(0, 1) for i, e in blocks], dim=1)
            else:
                g_phi = torch.cat([Gu[:, i:] @ F[i:e, i:].transpose(0, 1) for i, e in blocks], dim=1)
        if ctx.needs_input_grad[1]:
            g_F = torch.zeros_like(F)
            for j, e in blocks:
                if lower:
                    g_F[j:, j:e] = phi[:, j:].transpose(0, 1) @ Gu[:, j:e]
                else:
                    g_F[:e, j:e] = phi[:, :e].transpose(0, 1) @ Gu[:, j:e]
        return g_phi, g_F, None, None


def triangular_row_sqnorm(phi: torch.Tensor, F: torch.Tensor, lower: bool = True, block: int = 128) -> torch.Tensor:
    """``((phi @ F) ** 2).sum(-1)`` for a triangular ``r x r`` factor ``F``, skipping its zero blocks.

    Column block ``[j, j + s)`` of a lower factor is zero above row ``j`` (of an upper factor, below
    row ``j + s``), so with ``k = ceil(r / s)`` blocks the product costs ``r^2 (k + 1) / (2k)``
    multiply-adds per row instead of ``r^2`` (0.625 r^2 at r = 512, s = 128), in the forward pass
    and in both gradient products. This is the predictive variance ``||F^T phi||^2`` of every
    ``q(w) = N(m, F F^T)`` model. The gradient with respect to ``F`` is zero outside its triangle.
    ``phi`` is ``b x r`` (2-D); small ``r`` uses the dense product.
    """
    r = F.shape[-1]
    if r <= block or phi.dim() != 2:
        u = phi @ F
        return (u * u).sum(-1)
    return _TriangularRowSqNorm.apply(phi, F, lower, block)


def kl_std_normal(m: torch.Tensor, L: torch.Tensor, log_diag: torch.Tensor | None = None) -> torch.Tensor:
    """``KL(N(m, L L^T) || N(0, I_r)) = 0.5 (||m||^2 + ||L||_F^2 - r - 2 sum log L_jj)``."""
    r = m.shape[-1]
    logd = torch.log(L.diagonal(dim1=-2, dim2=-1)) if log_diag is None else log_diag
    return 0.5 * (m.pow(2).sum(-1) + L.pow(2).sum((-2, -1)) - r - 2.0 * logd.sum(-1))


def kl_gauss_chol(m: torch.Tensor, L: torch.Tensor, L0: torch.Tensor) -> torch.Tensor:
    """``KL(N(m, L L^T) || N(0, L0 L0^T))`` with lower factors ``L`` and ``L0`` (docs/methods/solvegp.md §6.3)."""
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


class _RowCombination(torch.autograd.Function):
    """``out[b] = sum_k ell[b, k] Phi[G[b, k]]`` as a sparse ``B @ Phi`` with ``B``'s rows ``ell`` at columns ``G``
    (CPU): no ``b x k x p`` gather is written. Backward: ``d ell`` is the sampled product ``(g Phi^T)[b, G[b, k]]``,
    ``d Phi = B^T g`` (scattered)."""

    @staticmethod
    def forward(ctx, ell, G, Phi):
        ctx.save_for_backward(ell, G, Phi)
        ctx.B = _csr(ell, G, Phi.shape[0])  # also the backward's sampling pattern (its values scaled by beta = 0)
        return ctx.B @ Phi

    @staticmethod
    def backward(ctx, g):
        ell, G, Phi = ctx.saved_tensors
        g = g.contiguous()
        g_ell = g_phi = None
        if ctx.needs_input_grad[0]:
            g_ell = torch.sparse.sampled_addmm(ctx.B, g, Phi.T, beta=0.0).values().view_as(ell)
        if ctx.needs_input_grad[2]:
            rows = (ell.unsqueeze(-1) * g.unsqueeze(1)).reshape(-1, Phi.shape[1])
            g_phi = torch.zeros_like(Phi).index_add_(0, G.reshape(-1), rows)
        return g_ell, None, g_phi


def _csr(values: torch.Tensor, G: torch.Tensor, n: int) -> torch.Tensor:
    """The ``b x n`` CSR matrix with row ``i``'s entries ``values[i]`` at columns ``G[i]`` (repeats add up)."""
    b, k = G.shape
    crow = torch.arange(0, b * k + 1, k, device=G.device)
    with warnings.catch_warnings():  # "sparse CSR support is in beta": the two kernels used here are stable
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, G.reshape(-1), values.reshape(-1), size=(b, n))


def combine_rows(ell: torch.Tensor, G: torch.Tensor, Phi: torch.Tensor) -> torch.Tensor:
    """``einsum("bk,bkp->bp", ell, Phi[G])`` — each row a combination of ``Phi``'s rows ``G[b]`` — differentiable in
    ``ell`` and ``Phi``. On the CPU by sparse kernels (the gathered ``b x k x p`` block cost twice the arithmetic in
    memory traffic: dbk-nn's hybrid likelihood pass, docs/methods/dbknn.md); elsewhere by one ``index_select`` and
    a batched product."""
    if Phi.device.type == "cpu":
        return _RowCombination.apply(ell, G, Phi)
    b, k = G.shape
    rows = Phi.index_select(0, G.reshape(-1)).view(b, k, Phi.shape[1])
    return torch.bmm(ell.unsqueeze(1), rows).squeeze(1)


def kriging_weights(L: torch.Tensor) -> torch.Tensor:
    """``C_NN^{-1} c_N`` for groups ``C = [[C_NN, c_N], [c_N^T, c]]`` from their Cholesky factors ``L`` (``b x k x
    k``): ``L_NN^{-T} l`` with ``l`` the last row of ``L`` (``b x (k - 1)``, no graph needed). ``L_NN^T`` is copied
    into contiguous rows first: the strided view of a batched factor's leading block is solved about four times more
    slowly (measured: docs/benchmarks/decide.md, "The lattice ordering, adopted")."""
    Lt = L[..., :-1, :-1].transpose(-1, -2).contiguous()
    return torch.linalg.solve_triangular(Lt, L[..., -1, :-1].unsqueeze(-1), upper=True).squeeze(-1)


class VecchiaRow(torch.autograd.Function):
    """``ell = e_last^T chol(C)^{-1}`` for a batch of group covariances ``C`` (``b x k x k``, float64),
    with a closed-form backward.

    ``ell`` is the Vecchia row of the group: ``ell = (-A, 1) / sqrt(D)`` with ``A = c^T C_NN^{-1}`` the
    kriging weights and ``D`` the conditional variance, so ``ell^T z`` is the standardised conditional
    residual and ``ell_last = D^{-1/2}``. For an adjoint ``lam`` of ``ell``,

        dL/dC = -sym(ell g^T) - 1/2 (lam^T ell) ell ell^T,   g = [C_NN^{-1} lam_N; 0],

    (from ``dD = b^T dC b`` and ``dA = (dc^T - A dC_NN) C_NN^{-1}`` with ``b = (-A, 1)``): two small triangular
    solves per group, where autograd through the batched Cholesky costs about ten forward passes. It returns the
    one outer product ``-ell (g + 1/2 (lam^T ell) ell)^T``, whose symmetric part is dL/dC: every ``C`` here is a
    symmetric function of the hyperparameters, so only that part reaches them (one ``k x k`` pass, not four).
    """

    @staticmethod
    def forward(ctx, C):
        L = psd_safe_cholesky(C)
        e = torch.zeros(C.shape[:-1] + (1,), dtype=C.dtype, device=C.device)
        e[..., -1, 0] = 1.0
        ell = torch.linalg.solve_triangular(L.transpose(-1, -2), e, upper=True).squeeze(-1)
        ctx.save_for_backward(L, ell)
        return ell

    @staticmethod
    def backward(ctx, lam):
        L, ell = ctx.saved_tensors
        g = torch.zeros_like(ell)
        g[..., :-1] = torch.cholesky_solve(lam[..., :-1, None], L[..., :-1, :-1]).squeeze(-1)
        g.add_(ell * (0.5 * (lam * ell).sum(-1, keepdim=True)))
        return ell.neg().unsqueeze(-1) * g.unsqueeze(-2)
