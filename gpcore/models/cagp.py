"""CaGP — computation-aware Gaussian process (ALGORITHMS.md section 5, errata C1–C5).

CaGP conditions the GP prior ``GP(mu0, k)`` on ``i << n`` linear projections ``S^T y`` of the data
("actions", the columns of ``S in R^{n x i}``). With ``Kh = K_XX + sigma2 I`` and
``A = S^T Kh S = L_c L_c^T`` (Cholesky, float64) the computation-aware posterior is (5.1, 5.2)::

    v~       = A^{-1} S^T (y - mu0)                      projected representer weights (i,)
    mu_i(x)  = mu0 + K(x, X) S v~
    K_i(x,x') = K(x,x') - K(x,X) S A^{-1} S^T K(X,x')     >= exact posterior covariance
    predictive y:  N(mu_i(x), K_i(x,x) + sigma2)

Training minimises the CaGP ELBO loss (5.3, closed form eq. 11) divided by n (C3) jointly over the
kernel hyperparameters and the actions:

* ``actions="opt"`` (CaGP-Opt, recommended): block-sparse learned actions (5.4.1). The training
  points are ordered (``ordering="spatial"``, the default: a kd-tree order so that each action is
  spatially local, the design option of 5.4; or ``"random"``, the reference implementation's
  shuffled order) and cut into ``i`` consecutive blocks;
  the ``n mod i`` remainder points are kept by giving the first ``n mod i`` blocks one extra point
  (C2). Action ``j`` is non-zero only on block ``j``; entries start as ``N(0, 1) / sqrt(k_j)``.
  ``S^T S`` is diagonal and ``log det(S^T S) = sum_j log ||s_j||^2`` (C4).
* ``actions="cg"`` (CaGP-CG): the actions are the first ``i`` residuals of conjugate gradients on
  ``Kh v = y - mu0`` at the current hyperparameters (not learned, no gradient through them),
  orthonormalised (same span, Lemma S4). The posterior mean then equals the CG iterate after ``i``
  iterations. Cost O(n^2 i) per step: small n or a GPU.

``K S`` is never formed from an ``n x n`` matrix (5.5): the kernel is evaluated in row tiles of at
most ``tile_size`` entries held in reused buffers, each tile is contracted with the actions at once
(blockwise for block-sparse ``S``: ``K(., X) S = sum_j K(., X_j) s_j``), and the backward pass
recomputes the tiles with closed-form kernel derivatives (:class:`_KernelActions`). At the training
inputs only the upper block triangle of the symmetric ``K`` is evaluated
(:class:`_SymBlockKernelActions`), and the ``K S`` computed by :meth:`CaGP._finalize` for validation
is reused by the next training step, so an epoch costs one backward and one forward pass, each over
half of ``K``. Memory is O(n i + tile_size); the work is O(n^2) kernel evaluations
per epoch (C1: "linear time" only with i-way parallel hardware).

Prediction inherently needs the training inputs and the actions (5.5): both are stored as buffers
together with the cached float64 factor ``L_c`` and ``v~``; a test point costs n kernel
evaluations plus O(i^2).

Feature form (joint posterior, :mod:`gpcore.posterior`): ``K_i`` is the prior downdated by the projected
data, i.e. ``F = 0`` and a residual with features ``psi(x) = L_c^{-1} S^T K(X, x)`` (``i`` of them), mean
weights ``L_c^T v~``, conditioning set ``J = X`` (the actions' layout), ``T^T = S^T`` and ``nu = sigma2``.
Supported: the joint covariance, exceedance, areas (``O(n_a^2)`` kernel values per area) and pathwise
joint samples (each place costs ``n`` kernel evaluations, as prediction does); suggestions work
through the dense engine of :mod:`gpcore.decide` (small candidate and target sets).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from gpcore.errors import InputError
from gpcore.models.base import GPModel
from gpcore.models.config import BaseConfig, setting
from gpcore.models.features import FeatureForm, Residual
from gpcore.models.hyper import SoftplusHyperparameters
from gpcore.models.kernels import stationary
from gpcore.models.linalg import LOG_2PI, inv_softplus, psd_safe_cholesky
from gpcore.models.registry import register, register_alias

CAGP_KERNELS = ("matern32", "matern52", "rbf")
_SQRT3 = math.sqrt(3.0)
_SQRT5 = math.sqrt(5.0)


# --------------------------------------------------------------------------------------------
# Kernel tiles and the blockwise product K(Xr, X) S with a recomputing backward pass
# --------------------------------------------------------------------------------------------


#: inputs are pre-scaled by ``a / ell`` so that each tile needs the fewest passes: ``u = a x / ell``
_IN_SCALE = {"matern32": _SQRT3, "matern52": _SQRT5, "rbf": math.sqrt(0.5)}


def _scaled(X: torch.Tensor, ell: torch.Tensor, name: str):
    """Scaled inputs ``u = a x / ell`` and the augmented factors whose product is the squared distance.

    Returns ``U`` (``n x d``), ``left = [u, ||u||^2, 1]`` and ``right = [-2u, 1, ||u||^2]``
    (``n x (d+2)``), so that ``left_a . right_b = ||u_a - u_b||^2`` is one GEMM per tile with no
    broadcast passes (negated for RBF, which needs ``-||u_a - u_b||^2``).
    """
    U = X * (_IN_SCALE[name] / ell)
    sq = U.pow(2).sum(-1, keepdim=True)
    one = torch.ones_like(sq)
    left = torch.cat([U, sq, one], 1)
    right = torch.cat([-2.0 * U, one, sq], 1)
    return U, (-left if name == "rbf" else left), right


class _Workspace:
    """Reusable flat buffers for the tiles: fresh multi-megabyte allocations per tile are returned
    to the OS and page-faulted back in every time, which costs more than the arithmetic on CPU."""

    def __init__(self, like: torch.Tensor, size: int):
        self.like, self.size, self.bufs = like, size, {}

    def get(self, k: int, rows: int, cols: int) -> torch.Tensor:
        if k not in self.bufs:
            self.bufs[k] = self.like.new_empty(self.size)
        return self.bufs[k][: rows * cols].view(rows, cols)


def _tile(lr, rc, name: str, ws: _Workspace):
    """Unit-outputscale kernel tile and its lengthscale derivative, from the factors of :func:`_scaled`.

    Parameters
    ----------
    lr, rc : ``c x (d+2)`` rows of ``left`` and ``w x (d+2)`` rows of ``right``.
    name : kernel name in :data:`CAGP_KERNELS`.
    ws : workspace; the tiles live in its buffers 0..3 (buffer 4 is left to the caller).

    Returns
    -------
    K : ``c x w`` tile ``k / outputscale``.
    psi : ``c x w`` tile with ``dk/d ell_d = outputscale * psi_scale * psi * (u_a,d - u_b,d)^2 / ell_d``
        (for RBF it shares storage with ``K``).
    psi_scale : float.
    """
    c, w = lr.shape[0], rc.shape[0]
    D = torch.mm(lr, rc.transpose(0, 1), out=ws.get(0, c, w))
    if name == "rbf":  # k = exp(-||u - u'||^2), psi = 2 k
        D.clamp_max_(0.0).exp_()
        return D, D, 2.0
    D.clamp_min_(0.0).sqrt_()  # s = ||u - u'||
    E = torch.neg(D, out=ws.get(1, c, w)).exp_()
    if name == "matern32":  # k = (1 + s) e^{-s},  psi = e^{-s}
        return torch.addcmul(E, D, E, out=ws.get(2, c, w)), E, 1.0
    if name == "matern52":  # k = (1 + s + s^2/3) e^{-s},  psi = (1 + s) e^{-s} / 3
        psi = torch.addcmul(E, D, E, out=ws.get(2, c, w))
        return torch.addcmul(psi, D.square_(), E, value=1.0 / 3.0, out=ws.get(3, c, w)), psi, 1.0 / 3.0
    raise ValueError(f"unknown kernel {name!r}; allowed: {CAGP_KERNELS}")


@contextmanager
def _cpu_threads(threads: int, device: torch.device):
    """Temporarily run PyTorch's CPU ops on ``threads`` threads (no-op for 0 or non-CPU devices)."""
    if threads <= 0 or device.type != "cpu" or torch.get_num_threads() == threads:
        yield
        return
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def _rows_per_tile(tile_size: int, P: int, unit: int = 1) -> int:
    return max(1, tile_size // max(P * unit, 1)) * unit


class _KernelActions(torch.autograd.Function):
    """``out = outputscale * k1(Xr, Xc) S`` tile by tile (``R x i``), never forming ``R x P``.

    ``blocked=True``: ``S`` is block-sparse and given by its values ``(i, kmax)``; ``Xc`` is the
    ``(i * kmax) x d`` block layout (block ``j`` occupies rows ``j*kmax .. (j+1)*kmax - 1``).
    ``blocked=False``: ``S`` is a dense ``P x i`` matrix with rows aligned to ``Xc``.
    The backward pass recomputes the tiles and returns gradients for ``S``, ``ell`` and the
    outputscale (the inputs ``Xr`` and ``Xc`` are treated as constants). ``cached``: a previously
    computed output for the same arguments (skips the forward computation).
    """

    @staticmethod
    def forward(ctx, Xr, Xc, S, ell, outputscale, name, blocked, tile_size, threads=0, cached=None):
        ctx.threads = threads
        with _cpu_threads(threads, Xr.device):
            return _KernelActions._forward(ctx, Xr, Xc, S, ell, outputscale, name, blocked, tile_size, cached)

    @staticmethod
    def _forward(ctx, Xr, Xc, S, ell, outputscale, name, blocked, tile_size, cached):
        R, P = Xr.shape[0], Xc.shape[0]
        i = S.shape[0] if blocked else S.shape[1]
        if cached is not None:
            out = cached.clone()
        else:
            ur, lr, _ = _scaled(Xr, ell, name)
            _, _, rc = _scaled(Xc, ell, name)
            c = _rows_per_tile(tile_size, P)
            ws = _Workspace(ur, min(c, R) * P)
            out = Xr.new_empty(R, i)
            for r0 in range(0, R, c):
                K, _, _ = _tile(lr[r0 : r0 + c], rc, name, ws)
                if blocked:
                    torch.sum(K.view(K.shape[0], i, -1).mul_(S), -1, out=out[r0 : r0 + c])
                else:
                    torch.mm(K, S, out=out[r0 : r0 + c])
            out.mul_(outputscale)
        ctx.save_for_backward(Xr, Xc, S, ell, outputscale, out)
        ctx.name, ctx.blocked, ctx.tile_size = name, blocked, tile_size
        return out

    @staticmethod
    def backward(ctx, G):
        with _cpu_threads(ctx.threads, G.device):
            return _KernelActions._backward(ctx, G) + (None, None)

    @staticmethod
    def _backward(ctx, G):
        Xr, Xc, S, ell, outputscale, out = ctx.saved_tensors
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            raise NotImplementedError("gradients with respect to the CaGP inputs X are not implemented")
        need_s, need_ell, need_o = ctx.needs_input_grad[2:5]
        gS = gell = go = None
        if need_o:
            go = (G * out).sum() / outputscale
        if need_s or need_ell:
            R, P = Xr.shape[0], Xc.shape[0]
            i = S.shape[0] if ctx.blocked else S.shape[1]
            ur, lr, _ = _scaled(Xr, ell, ctx.name)
            uc, _, rc = _scaled(Xc, ell, ctx.name)
            c = _rows_per_tile(ctx.tile_size, P)
            ws = _Workspace(ur, min(c, R) * P)
            ucT = uc.transpose(0, 1).contiguous()
            gS = torch.zeros_like(S) if need_s else None
            gu = ur.new_zeros(ur.shape[1])
            m_col = ur.new_zeros(P)
            psi_scale = 1.0
            for r0 in range(0, R, c):
                Gc = G[r0 : r0 + c]
                K, psi, psi_scale = _tile(lr[r0 : r0 + c], rc, ctx.name, ws)
                cc = K.shape[0]
                scratch = ws.get(4, cc, P)
                if need_s:  # dS = K^T G restricted to the sparsity pattern of S
                    if ctx.blocked:
                        gS += torch.mul(K.view(cc, i, -1), Gc.unsqueeze(-1), out=scratch.view(cc, i, -1)).sum(
                            0
                        )
                    else:
                        gS.addmm_(K.transpose(0, 1), Gc)
                if need_ell:  # M = psi * (G S^T);  sum_ap M_ap (u_a - u_p)^2 by reductions
                    if ctx.blocked:
                        W = torch.mul(Gc.unsqueeze(-1), S.unsqueeze(0), out=scratch.view(cc, i, -1)).view(
                            cc, P
                        )
                    else:
                        W = torch.mm(Gc, S.transpose(0, 1), out=scratch)
                    gu += _weighted_sqdist_sum(psi.mul_(W), ur[r0 : r0 + c], ucT, m_col, 0)
            if need_s:
                gS.mul_(outputscale)
            if need_ell:
                gu += (uc.pow(2) * m_col.unsqueeze(1)).sum(0)
                gell = _ell_grad(gu, ell, outputscale, psi_scale)
        return None, None, gS, gell, go, None, None, None


def _weighted_sqdist_sum(M, ur, ucT, m_col, c0: int) -> torch.Tensor:
    """``sum_ap M_ap (ur_a - uc_{c0+p})^2`` per dimension, except the ``uc`` part which is accumulated
    into ``m_col`` (column sums of ``M``) and finished by the caller. ``ucT`` is ``uc^T`` (``d x P``)."""
    Pc = M.shape[1]
    part = ur.pow(2).mul_(M.sum(1, keepdim=True)).sum(0)
    part -= 2.0 * (ur * (ucT[:, c0 : c0 + Pc] @ M.transpose(0, 1)).transpose(0, 1)).sum(0)  # d x c GEMM: fast
    m_col[c0 : c0 + Pc] += M.sum(0)
    return part


def _ell_grad(gu, ell, outputscale, psi_scale: float) -> torch.Tensor:
    """``d out / d ell_d = outputscale * psi_scale * gu_d / ell_d`` (summed for a shared lengthscale)."""
    g = gu * (psi_scale * outputscale) / ell
    if ell.numel() != g.numel():
        g = g.sum().reshape(ell.shape)
    return g


class _SymBlockKernelActions(torch.autograd.Function):
    """``K(X, X) S`` for block-sparse ``S`` over its own block layout ``X``, using the symmetry of K.

    Rows are processed one group of whole blocks at a time (rows ``a0:a1``, blocks ``j0:j1``) against
    the columns ``a0:P`` only, i.e. the upper block triangle of ``K``: the tile gives
    ``out[a0:a1, j0:] += T S[j0:]`` and, transposed, ``out[a1:, j0:j1] += T[:, a1-a0:]^T s_{j0:j1}``.
    Half the kernel evaluations of :class:`_KernelActions`, forward and backward.
    """

    @staticmethod
    def forward(ctx, X, V, ell, outputscale, name, tile_size, threads=0, cached=None):
        ctx.threads = threads
        with _cpu_threads(threads, X.device):
            return _SymBlockKernelActions._forward(ctx, X, V, ell, outputscale, name, tile_size, cached)

    @staticmethod
    def _forward(ctx, X, V, ell, outputscale, name, tile_size, cached):
        i, kmax = V.shape
        P = X.shape[0]
        if cached is not None:
            out = cached.clone()
        else:
            _, left, right = _scaled(X, ell, name)
            g = _rows_per_tile(tile_size, P, kmax) // kmax  # blocks per row group
            ws = _Workspace(X, min(g, i) * kmax * P)
            out = X.new_zeros(P, i)
            for j0 in range(0, i, g):
                j1 = min(i, j0 + g)
                a0, a1 = j0 * kmax, j1 * kmax
                c = a1 - a0
                T, _, _ = _tile(left[a0:a1], right[a0:], name, ws)
                if a1 < P:
                    Tt = T.view(j1 - j0, kmax, P - a0)[:, :, c:]
                    out[a1:, j0:j1] += torch.bmm(V[j0:j1].unsqueeze(1), Tt).squeeze(1).transpose(0, 1)
                out[a0:a1, j0:] += T.view(c, i - j0, kmax).mul_(V[j0:]).sum(-1)
            out.mul_(outputscale)
        ctx.save_for_backward(X, V, ell, outputscale, out)
        ctx.name, ctx.tile_size = name, tile_size
        return out

    @staticmethod
    def backward(ctx, G):
        with _cpu_threads(ctx.threads, G.device):
            return _SymBlockKernelActions._backward(ctx, G) + (None, None)

    @staticmethod
    def _backward(ctx, G):
        X, V, ell, outputscale, out = ctx.saved_tensors
        if ctx.needs_input_grad[0]:
            raise NotImplementedError("gradients with respect to the CaGP inputs X are not implemented")
        need_v, need_ell, need_o = ctx.needs_input_grad[1:4]
        gV = gell = go = None
        if need_o:
            go = (G * out).sum() / outputscale
        if need_v or need_ell:
            i, kmax = V.shape
            P = X.shape[0]
            u, left, right = _scaled(X, ell, ctx.name)
            g = _rows_per_tile(ctx.tile_size, P, kmax) // kmax
            ws = _Workspace(u, min(g, i) * kmax * P)
            uT = u.transpose(0, 1).contiguous()
            gV = torch.zeros_like(V)
            gu = u.new_zeros(u.shape[1])
            m_col = u.new_zeros(P)
            psi_scale = 1.0
            for j0 in range(0, i, g):
                j1 = min(i, j0 + g)
                a0, a1 = j0 * kmax, j1 * kmax
                c, rest = a1 - a0, P - a1
                T, psi, psi_scale = _tile(left[a0:a1], right[a0:], ctx.name, ws)
                scratch = ws.get(4, c, P - a0)
                G1 = G[a0:a1, j0:]  # adjoint of out[a0:a1, j0:]
                G2t = G[a1:, j0:j1].transpose(0, 1).contiguous()  # adjoint of out[a1:, j0:j1], transposed
                if need_v:
                    gV[j0:] += torch.mul(
                        T.view(c, i - j0, kmax), G1.unsqueeze(-1), out=scratch.view(c, i - j0, kmax)
                    ).sum(0)
                    if rest:
                        Tt = T.view(j1 - j0, kmax, P - a0)[:, :, c:]
                        gV[j0:j1] += torch.bmm(Tt, G2t.unsqueeze(-1)).squeeze(-1)
                if need_ell:
                    W = torch.mul(G1.unsqueeze(-1), V[j0:].unsqueeze(0), out=scratch.view(c, i - j0, kmax))
                    W = W.view(c, P - a0)
                    if rest:
                        W.view(j1 - j0, kmax, P - a0)[:, :, c:].addcmul_(
                            V[j0:j1].unsqueeze(-1), G2t.unsqueeze(1)
                        )
                    gu += _weighted_sqdist_sum(psi.mul_(W), u[a0:a1], uT, m_col, a0)
            if need_ell:
                gu += (u.pow(2) * m_col.unsqueeze(1)).sum(0)
                gell = _ell_grad(gu, ell, outputscale, psi_scale)
            gV = gV.mul_(outputscale) if need_v else None
        return None, gV, gell, go, None, None


class CaGPKernel(SoftplusHyperparameters, nn.Module):
    """Stationary kernel ``outputscale * rho(||(x - x') / ell||)`` (Matérn-3/2 ARD by default).

    Parameters
    ----------
    d : input dimension.
    name : ``"matern32"``, ``"matern52"`` or ``"rbf"``.
    ard : one lengthscale per dimension (otherwise one shared).
    lengthscale_init, outputscale_init : initial values (softplus-parameterised).
    tile_size : kernel entries per tile in :meth:`times_actions` (bounds memory).
    cpu_threads : intra-op threads for the tile loops on CPU (0: leave PyTorch's setting).
    """

    def __init__(
        self,
        d: int,
        name: str = "matern32",
        ard: bool = True,
        lengthscale_init: float = 0.3,
        outputscale_init: float = 1.0,
        tile_size: int = 1 << 20,
        cpu_threads: int = 0,
    ):
        super().__init__()
        if name not in CAGP_KERNELS:
            raise ValueError(f"unknown kernel {name!r}; allowed: {CAGP_KERNELS}")
        self.name = name
        self.tile_size = int(tile_size)
        self.cpu_threads = int(cpu_threads)
        self.raw_ell = nn.Parameter(torch.full((d if ard else 1,), inv_softplus(lengthscale_init)))
        self.raw_outputscale = nn.Parameter(torch.tensor(inv_softplus(outputscale_init)))

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        """Dense kernel matrix ``n1 x n2`` (small inputs only)."""
        return stationary(self.name, x1, x2, self.lengthscale, self.outputscale)

    def diag(self, x: torch.Tensor) -> torch.Tensor:
        """``k(x, x)`` for each row of ``x`` (``(n,)``)."""
        return self.outputscale.expand(x.shape[0])

    def times_actions(
        self,
        xr: torch.Tensor,
        Xc: torch.Tensor,
        S: torch.Tensor,
        blocked: bool,
        cached: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``K(xr, Xc) S`` (``R x i``) tile by tile; see :class:`_KernelActions`."""
        return _KernelActions.apply(
            xr,
            Xc,
            S,
            self.lengthscale,
            self.outputscale,
            self.name,
            blocked,
            self.tile_size,
            self.cpu_threads,
            cached,
        )

    def sym_block_actions(self, X: torch.Tensor, V: torch.Tensor, cached: torch.Tensor | None = None):
        """``K(X, X) S`` (``P x i``) for block-sparse ``S`` (values ``V``) over its block layout ``X``,
        evaluating only the upper block triangle of ``K``; see :class:`_SymBlockKernelActions`."""
        return _SymBlockKernelActions.apply(
            X, V, self.lengthscale, self.outputscale, self.name, self.tile_size, self.cpu_threads, cached
        )


# --------------------------------------------------------------------------------------------
# Actions
# --------------------------------------------------------------------------------------------


def block_sizes(n: int, i: int) -> list[int]:
    """Sizes of ``i`` blocks covering ``n`` points: the first ``n mod i`` blocks get ``n // i + 1`` (C2)."""
    if not 1 <= i <= n:
        raise ValueError(f"need 1 <= i <= n for block actions, got i = {i}, n = {n}")
    k, rem = divmod(n, i)
    return [k + 1] * rem + [k] * (i - rem)


def spatial_order(X: np.ndarray, sizes: list[int]) -> np.ndarray:
    """kd-tree order of the rows of ``X`` (``n x d``) so that consecutive chunks of ``sizes`` are compact.

    The point set is split recursively at the position that separates the first half of the blocks
    from the second, along the coordinate of largest spread.
    """

    def rec(idx: np.ndarray, sz: list[int]) -> list[np.ndarray]:
        if len(sz) == 1:
            return [idx]
        h = len(sz) // 2
        cut = sum(sz[:h])
        pts = X[idx]
        dim = int(np.argmax(pts.max(0) - pts.min(0)))
        idx = idx[np.argsort(pts[:, dim], kind="stable")]
        return rec(idx[:cut], sz[:h]) + rec(idx[cut:], sz[h:])

    return np.concatenate(rec(np.arange(X.shape[0]), list(sizes)))


def block_layout(
    Xs: torch.Tensor, i: int, ordering: str = "random", generator: torch.Generator | None = None
):
    """Assign the ``n`` training points to ``i`` blocks (C2).

    Parameters
    ----------
    Xs : ``n x d`` training inputs (used by ``ordering="spatial"``).
    i : number of blocks (actions), ``1 <= i <= n``.
    ordering : ``"random"`` (a seeded permutation) or ``"spatial"`` (:func:`spatial_order`).

    Returns
    -------
    index : ``(i, kmax)`` long, training index of each slot (padding slots repeat the block's first point).
    mask : ``(i, kmax)`` bool, which slots hold a point (``mask.sum() == n``).
    """
    n = Xs.shape[0]
    sizes = block_sizes(n, i)
    if ordering == "random":
        order = torch.randperm(n, generator=generator)
    elif ordering == "spatial":
        order = torch.as_tensor(spatial_order(Xs.detach().double().cpu().numpy(), sizes))
    else:
        raise ValueError(f"unknown ordering {ordering!r}; allowed: 'random', 'spatial'")
    sz = torch.tensor(sizes)
    offsets = torch.cumsum(sz, 0) - sz
    pos = torch.arange(sizes[0]).unsqueeze(0)
    mask = pos < sz.unsqueeze(1)
    flat = torch.where(mask, offsets.unsqueeze(1) + pos, offsets.unsqueeze(1))
    return order[flat].to(Xs.device), mask.to(Xs.device)


def init_block_values(mask: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Initial action entries ``N(0, 1) / sqrt(k_j)`` on each block's slots, 0 on padding (``(i, kmax)``)."""
    k = mask.sum(1, keepdim=True).clamp_min(1)
    z = torch.randn(mask.shape, generator=generator, dtype=torch.float64).to(mask.device)
    return torch.where(mask, z / k.sqrt(), torch.zeros_like(z))


class BlockActions:
    """Block-sparse actions ``S`` (n x i): action ``j`` is ``values[j]`` on the points ``index[j]``.

    Parameters
    ----------
    values : ``(i, kmax)`` entries (must be 0 on padding slots).
    index : ``(i, kmax)`` long training indices; mask : ``(i, kmax)`` bool.
    X : ``(i * kmax) x d`` training inputs in block layout (``X_train[index.reshape(-1)]``).
    """

    blocked = True

    def __init__(self, values, index, mask, X):
        self.values, self.index, self.mask, self.X = values, index, mask, X

    @classmethod
    def from_data(cls, Xs, values, index, mask) -> BlockActions:
        return cls(values * mask, index, mask, Xs[index.reshape(-1)])

    @property
    def num_actions(self) -> int:
        return self.values.shape[0]

    @property
    def row_mask(self) -> torch.Tensor:
        """``(P,)`` which layout rows are real training points."""
        return self.mask.reshape(-1)

    def rows(self, v: torch.Tensor) -> torch.Tensor:
        """Gather a per-training-point tensor into the block layout (``P x ...``)."""
        return v[self.index.reshape(-1)]

    def dense(self, n: int) -> torch.Tensor:
        """The dense ``n x i`` matrix S (test helper; O(n i) memory)."""
        i = self.num_actions
        S = self.values.new_zeros(n, i)
        cols = torch.arange(i, device=S.device).unsqueeze(1).expand_as(self.index)
        S[self.index[self.mask], cols[self.mask]] = self.values[self.mask]
        return S

    def kernel_times(self, kernel: CaGPKernel, xr: torch.Tensor) -> torch.Tensor:
        """``K(xr, X) S`` (``R x i``), blockwise ``sum_j K(xr, X_j) s_j``."""
        return kernel.times_actions(xr, self.X, self.values, blocked=True)

    def train_kernel_times(self, kernel: CaGPKernel, cached: torch.Tensor | None = None) -> torch.Tensor:
        """``K(X, X) S`` (``P x i``) at the training inputs (symmetric tiles: half the kernel evaluations).

        A symmetric row group holds at least one whole block (``kmax x P`` entries); when that exceeds
        8 tiles (few, large blocks), the row-tiled non-symmetric product keeps memory bounded instead.
        """
        if self.values.shape[1] * self.X.shape[0] > 8 * kernel.tile_size:
            return kernel.times_actions(self.X, self.X, self.values, blocked=True, cached=cached)
        return kernel.sym_block_actions(self.X, self.values, cached)

    def t_rows(self, M: torch.Tensor) -> torch.Tensor:
        """``S^T M`` for ``M`` with rows in block layout (``P`` or ``P x m``)."""
        i = self.num_actions
        V = self.values.to(M.dtype)
        if M.dim() == 1:
            return (V * M.view(i, -1)).sum(-1)
        return torch.einsum("jt,jtm->jm", V, M.view(i, V.shape[1], -1))

    def gram(self) -> torch.Tensor:
        """``S^T S = diag(||s_j||^2)`` (``i x i``)."""
        return torch.diag_embed(self.values.pow(2).sum(-1))

    def noise_gram(self, d: torch.Tensor) -> torch.Tensor:
        """``S^T diag(d) S`` for per-training-point noise ``d`` (``(n,)``, training order): diagonal too."""
        return torch.diag_embed((self.values.double().pow(2) * d.double()[self.index]).sum(-1))

    def logdet_gram(self) -> torch.Tensor:
        """``log det(S^T S) = sum_j log ||s_j||^2`` (C4: a sum of logs, not the log of a sum)."""
        return torch.log(self.values.double().pow(2).sum(-1)).sum()


class DenseActions:
    """Dense actions ``S`` (``n x i``) with rows aligned to the training inputs ``X`` (``n x d``)."""

    blocked = False

    def __init__(self, S, X):
        self.S, self.X = S, X

    @property
    def num_actions(self) -> int:
        return self.S.shape[1]

    @property
    def row_mask(self) -> torch.Tensor:
        return torch.ones(self.S.shape[0], dtype=torch.bool, device=self.S.device)

    def rows(self, v: torch.Tensor) -> torch.Tensor:
        return v

    def dense(self, n: int) -> torch.Tensor:
        return self.S

    def kernel_times(self, kernel: CaGPKernel, xr: torch.Tensor) -> torch.Tensor:
        return kernel.times_actions(xr, self.X, self.S, blocked=False)

    def train_kernel_times(self, kernel: CaGPKernel, cached: torch.Tensor | None = None) -> torch.Tensor:
        return kernel.times_actions(self.X, self.X, self.S, blocked=False, cached=cached)

    def t_rows(self, M: torch.Tensor) -> torch.Tensor:
        return self.S.to(M.dtype).transpose(0, 1) @ M

    def gram(self) -> torch.Tensor:
        return self.S.transpose(0, 1) @ self.S

    def noise_gram(self, d: torch.Tensor) -> torch.Tensor:
        S = self.S.double()
        return (S * d.double().unsqueeze(1)).transpose(0, 1) @ S

    def logdet_gram(self) -> torch.Tensor:
        L = psd_safe_cholesky(self.gram().double(), jitters=(0.0,))
        return 2.0 * torch.log(L.diagonal()).sum()


# --------------------------------------------------------------------------------------------
# Posterior, ELBO and projected NLL (Algorithm S2)
# --------------------------------------------------------------------------------------------


@dataclass
class CaGPParts:
    """Everything Algorithm S2 computes at the training inputs (float64 small factors).

    Attributes
    ----------
    KS : ``P x i`` ``K(X, X) S`` with rows in the actions' layout.
    StKS : ``i x i`` ``S^T K S`` (symmetrised, float64).
    StS : ``i x i`` ``S^T S`` (float64).
    Lc : ``i x i`` lower Cholesky factor of ``S^T Kh S`` (float64).
    ytil : ``(i,)`` ``S^T (y - mu0)`` (float64).
    vt : ``(i,)`` ``v~ = (S^T Kh S)^{-1} S^T (y - mu0)`` (float64).
    """

    KS: torch.Tensor
    StKS: torch.Tensor
    StS: torch.Tensor
    Lc: torch.Tensor
    ytil: torch.Tensor
    vt: torch.Tensor


def cagp_parts(kernel: CaGPKernel, actions, y: torch.Tensor, mu0, s2, cached_KS=None) -> CaGPParts:
    """Algorithm S2 at the training inputs: ``K S``, ``L_c = chol(S^T Kh S)`` (float64) and ``v~``.

    Parameters
    ----------
    kernel : the prior kernel; actions : :class:`BlockActions` or :class:`DenseActions`.
    y : ``(n,)`` targets in training order; mu0 : prior mean; s2 : noise variance, a scalar or
        ``(n,)`` per training point (weighted fits: ``Kh = K + diag(s2)``).
    cached_KS : optional ``K S`` computed earlier for the same kernel and actions (the forward
        computation is skipped; gradients still flow).
    """
    KS = actions.train_kernel_times(kernel, cached_KS)
    StKS = actions.t_rows(KS.double())  # accumulated in float64
    StKS = 0.5 * (StKS + StKS.transpose(0, 1))
    StS = actions.gram().double()
    noise = s2.double() * StS if s2.dim() == 0 else actions.noise_gram(s2)  # S^T D S
    Lc = psd_safe_cholesky(StKS + noise)
    r = (actions.rows(y) - mu0) * actions.row_mask
    ytil = actions.t_rows(r.double())
    vt = torch.cholesky_solve(ytil.unsqueeze(-1), Lc).squeeze(-1)
    return CaGPParts(KS, StKS, StS, Lc, ytil, vt)


def elbo_loss(kernel: CaGPKernel, actions, y: torch.Tensor, mu0, s2, parts: CaGPParts | None = None):
    """CaGP ELBO loss ``l_ELBO = -E_q[log p(y|f)] + KL(q_S || p)`` in closed form (eq. 11), sum over n.

    ``l_ELBO >= -log p(y)`` with equality for ``i = n`` and full-rank ``S``. Returns a float64 scalar.
    """
    p = cagp_parts(kernel, actions, y, mu0, s2) if parts is None else parts
    if s2.dim() > 0:
        return _elbo_loss_diag(kernel, actions, y, mu0, s2, p)
    mask = actions.row_mask
    n = y.shape[0]
    i = p.Lc.shape[0]
    s2d = s2.double()
    KS = p.KS.double() * mask.unsqueeze(1)
    mean = mu0 + KS @ p.vt
    resid2 = ((actions.rows(y).double() - mean).pow(2) * mask).sum()
    # sum_j K_i(x_j, x_j) = sum_j k(x_j, x_j) - tr(A^{-1} (KS)^T KS)
    tr_Ki = (kernel.diag(actions.X).double() * mask).sum() - torch.cholesky_solve(KS.T @ KS, p.Lc).trace()
    quad = p.vt @ (p.StKS @ p.vt)
    tr_term = torch.cholesky_solve(p.StKS, p.Lc).trace()
    logdet_A = 2.0 * torch.log(p.Lc.diagonal()).sum()
    return 0.5 * (
        (resid2 + tr_Ki) / s2d
        + (n - i) * torch.log(s2d)
        + n * LOG_2PI
        + quad
        - tr_term
        + logdet_A
        - actions.logdet_gram()
    )


def _elbo_loss_diag(kernel: CaGPKernel, actions, y: torch.Tensor, mu0, s2: torch.Tensor, p: CaGPParts):
    """:func:`elbo_loss` with per-point noise ``D = diag(s2)`` (weighted fits), float64 scalar:
    ``0.5 [sum_j (log d_j + ((y_j - mu_j)^2 + K_i(x_j, x_j)) / d_j) + n log 2pi + v~^T S^T K S v~
    - tr((S^T Kh S)^-1 S^T K S) + log det(S^T Kh S) - log det(S^T D S)]``; the KL part is
    ``KL(N(mu_i, K_i) || N(mu0, K))`` with ``log det K - log det K_i = log det(S^T Kh S) - log det(S^T D S)``."""
    mask = actions.row_mask
    n = y.shape[0]
    KS = p.KS.double() * mask.unsqueeze(1)
    mean = mu0 + KS @ p.vt
    d = torch.where(mask, actions.rows(s2.double()), torch.ones((), dtype=torch.float64, device=KS.device))
    W = torch.linalg.solve_triangular(p.Lc, KS.T, upper=False)
    Ki = kernel.diag(actions.X).double() - W.pow(2).sum(0)
    data = ((torch.log(d) + ((actions.rows(y).double() - mean).pow(2) + Ki) / d) * mask).sum()
    quad = p.vt @ (p.StKS @ p.vt)
    tr_term = torch.cholesky_solve(p.StKS, p.Lc).trace()
    logdet_A = 2.0 * torch.log(p.Lc.diagonal()).sum()
    Ld = psd_safe_cholesky(actions.noise_gram(s2), jitters=(0.0,))
    logdet_D = 2.0 * torch.log(Ld.diagonal()).sum()
    return 0.5 * (data + n * LOG_2PI + quad - tr_term + logdet_A - logdet_D)


def projected_nll(kernel: CaGPKernel, actions, y: torch.Tensor, mu0, s2, parts: CaGPParts | None = None):
    """Projected-data NLL (eq. 9; a negative control, 5.3): ``-log N(S^T y; S^T mu0, S^T Kh S)``
    with the ``-log det(S^T S)`` correction that makes it invariant to ``S -> S W``. Float64 scalar."""
    p = cagp_parts(kernel, actions, y, mu0, s2) if parts is None else parts
    i = p.Lc.shape[0]
    return 0.5 * (
        p.ytil @ p.vt + 2.0 * torch.log(p.Lc.diagonal()).sum() - actions.logdet_gram() + i * LOG_2PI
    )


class CaGPPosterior:
    """The computation-aware posterior ``GP(mu_i, K_i)`` of given actions (5.1), for prediction and tests."""

    def __init__(self, kernel: CaGPKernel, actions, Lc: torch.Tensor, vt: torch.Tensor, mu0):
        self.kernel, self.actions, self.Lc, self.vt, self.mu0 = kernel, actions, Lc, vt, mu0

    @classmethod
    def fit(cls, kernel: CaGPKernel, actions, y: torch.Tensor, mu0, s2) -> CaGPPosterior:
        p = cagp_parts(kernel, actions, y, mu0, s2)
        return cls(kernel, actions, p.Lc, p.vt, mu0)

    def mean_var(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean ``mu_i(x)`` and latent variance ``K_i(x, x)`` at ``b x d`` inputs (``(b,)`` each, float64)."""
        KSx = self.actions.kernel_times(self.kernel, x).double()
        mean = self.mu0 + KSx @ self.vt
        W = torch.linalg.solve_triangular(self.Lc, KSx.T, upper=False)
        var = self.kernel.diag(x).double() - W.pow(2).sum(0)
        return mean, var

    def cov(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        """Dense posterior covariance ``K_i(x1, x2)`` (``n1 x n2``, float64; small inputs only)."""
        W1 = torch.linalg.solve_triangular(
            self.Lc, self.actions.kernel_times(self.kernel, x1).double().T, upper=False
        )
        W2 = torch.linalg.solve_triangular(
            self.Lc, self.actions.kernel_times(self.kernel, x2).double().T, upper=False
        )
        return self.kernel(x1, x2).double() - W1.T @ W2

    def representer_weights(self, n: int) -> torch.Tensor:
        """``v_i = C_i (y - mu0) = S v~`` in training order (``(n,)``)."""
        return self.actions.dense(n).double() @ self.vt


# --------------------------------------------------------------------------------------------
# Conjugate gradients (CaGP-CG actions) and the iterative reference algorithm S1
# --------------------------------------------------------------------------------------------


def conjugate_gradients(matvec, b: torch.Tensor, iters: int, tol: float = 0.0, last_iterate: bool = True):
    """Plain CG on ``A v = b`` from ``v_0 = 0`` for at most ``iters`` iterations.

    Returns
    -------
    residuals : ``n x m`` the residuals ``r_0 = b, r_1, ..., r_{m-1}`` (``m <= iters``; stops early
        once ``||r_m|| <= tol ||b||``). They span the Krylov space ``K_m(A, b)``.
    iterates : list of the CG iterates ``v_1 .. v_m`` (``v_m`` in ``span(r_0..r_{m-1})``); with
        ``last_iterate=False`` the final iteration (only needed for ``v_m``) is skipped.
    """
    r = b.clone()
    p = r.clone()
    v = torch.zeros_like(b)
    rr = r @ r
    bnorm = rr.sqrt()
    residuals, iterates = [r], []
    for _ in range(iters):
        if len(residuals) == iters and not last_iterate:
            break
        Ap = matvec(p)
        alpha = rr / (p @ Ap)
        v = v + alpha * p
        iterates.append(v)
        r = r - alpha * Ap
        rr_new = r @ r
        if len(residuals) == iters or bool(rr_new.sqrt() <= tol * bnorm):
            break
        residuals.append(r)
        p = r + (rr_new / rr) * p
        rr = rr_new
    return torch.stack(residuals, 1), iterates


def cg_actions(kernel: CaGPKernel, X: torch.Tensor, r0: torch.Tensor, s2, i: int, tol: float = 1e-4):
    """CaGP-CG actions: an orthonormal basis (``n x m``, ``m <= i``) of the first ``i`` CG residuals of
    ``(K + s2 I) v = r0``.

    In floating point, CG residuals lose orthogonality as CG converges; since the posterior depends
    only on ``colspan(S)`` (Lemma S4), the residuals are orthonormalised by a float64 QR, which keeps
    ``S^T Kh S`` well conditioned without changing the posterior.
    """
    with torch.no_grad():

        def matvec(v):
            return kernel.times_actions(X, X, v.unsqueeze(1), blocked=False).squeeze(1) + s2 * v

        R, _ = conjugate_gradients(matvec, r0, i, tol, last_iterate=False)
        return torch.linalg.qr(R.double())[0].to(R.dtype)


def itergp_dense(Khat: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """Algorithm S1 (IterGP) on dense matrices: ``C_i`` by rank-1 updates (``n x n``; tests, small n).

    ``d_j = s_j - C_{j-1} Kh s_j``, ``eta_j = s_j^T Kh d_j``, ``C_j = C_{j-1} + d_j d_j^T / eta_j``.
    """
    n = Khat.shape[0]
    C = Khat.new_zeros(n, n)
    for j in range(S.shape[1]):
        s = S[:, j]
        d = s - C @ (Khat @ s)
        eta = s @ (Khat @ d)
        C = C + torch.outer(d, d) / eta
    return C


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaGPConfig(BaseConfig):
    actions: str = setting(
        "opt",
        help="'opt' (learned block-sparse, CaGP-Opt) or 'cg' (CG residuals, CaGP-CG)",
        choices=("opt", "cg"),
        main=True,
    )
    num_actions: int = setting(256, help="number of actions i (capped at n)", min=1, max=8192, main=True)
    ordering: str = setting(
        "spatial",
        help="assignment of training points to action blocks: 'spatial' "
        "(kd-tree order, local actions) or 'random' (the reference implementation)",
        choices=("spatial", "random"),
        main=True,
    )
    loss: str = setting(
        "elbo",
        help="'elbo' (CaGP ELBO, recommended) or 'projected_nll' (negative control)",
        choices=("elbo", "projected_nll"),
    )
    kernel: str = setting("matern32", help="stationary base kernel", choices=CAGP_KERNELS, main=True)
    ard: bool = setting(True, help="one lengthscale per input dimension")
    lengthscale_init: float = setting(
        0.3, help="initial lengthscale (inputs live in [-1, 1])", min=0.0, min_inclusive=False
    )
    outputscale_init: float = setting(1.0, help="initial outputscale", min=0.0, min_inclusive=False)
    noise_init: float = setting(
        0.5, help="initial noise variance (standardised units)", min=0.0, min_inclusive=False
    )
    noise_floor: float = setting(1e-4, help="lower bound of the noise variance", min=0.0)
    learn_mean: bool = setting(False, help="learn a constant prior mean (the paper uses mu0 = 0)")
    cg_tol: float = setting(1e-4, help="relative residual tolerance of CG (actions='cg')", min=0.0)
    tile_size: int = setting(1 << 20, help="kernel entries per tile when computing K S (memory bound)", min=1)
    cpu_threads: int = setting(
        1,
        help="CPU threads for the O(n^2) kernel tiles (0 = PyTorch default); the many "
        "small tile operations run faster on one thread when cores are shared",
        min=0,
    )
    epochs: int = setting(60, help="full-batch optimisation steps", min=1, main=True)
    lr: float = setting(0.1, help="Adam learning rate", min=0.0, min_inclusive=False, main=True)
    patience: int = setting(20, help="epochs without validation-NLL improvement before stopping", min=1)


class CaGPModule(SoftplusHyperparameters, nn.Module):
    """Parameters (kernel, noise, mean, actions) and prediction caches of a CaGP model.

    Buffers: ``X_train`` (training inputs; block layout for ``actions="opt"``), ``index`` / ``mask``
    (block assignment, ``"opt"``), ``S`` (dense CG actions, ``"cg"``), and the float64 caches
    ``Lc`` (``i x i``) and ``vt`` (``(i,)``).
    """

    _float64_buffers = ("Lc", "vt")

    def __init__(self, d: int, cfg: CaGPConfig, Xs: torch.Tensor | None):
        super().__init__()
        self.mode = cfg.actions
        self.noise_floor = cfg.noise_floor
        self.kernel = CaGPKernel(
            d, cfg.kernel, cfg.ard, cfg.lengthscale_init, cfg.outputscale_init, cfg.tile_size, cfg.cpu_threads
        )
        self.raw_noise = nn.Parameter(torch.tensor(inv_softplus(max(cfg.noise_init - cfg.noise_floor, 1e-8))))
        self.mu0 = nn.Parameter(torch.zeros(()), requires_grad=cfg.learn_mean)
        gen = torch.Generator().manual_seed(cfg.seed)
        n = 0 if Xs is None else Xs.shape[0]  # loading (Xs None): the loader restores the shapes
        if self.mode == "opt":
            if Xs is None:
                index = torch.zeros(0, 0, dtype=torch.long)
                mask = torch.zeros(0, 0, dtype=torch.bool)
                values = torch.zeros(0, 0)
                X_train = torch.zeros(0, d)
            else:
                index, mask = block_layout(Xs, min(cfg.num_actions, n), cfg.ordering, gen)
                values = init_block_values(mask.cpu(), gen).to(Xs.device)
                X_train = Xs[index.reshape(-1)]
            self.s_raw = nn.Parameter(values.float())
            self.register_buffer("index", index)
            self.register_buffer("mask", mask)
        else:
            X_train = torch.zeros(0, d) if Xs is None else Xs.detach().clone()
            self.register_buffer("S", torch.zeros(n, 0))
        self.register_buffer("X_train", X_train.detach().clone())
        self.register_buffer("Lc", torch.zeros(0, 0, dtype=torch.float64))
        self.register_buffer("vt", torch.zeros(0, dtype=torch.float64))

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        for name in self._float64_buffers:  # the small factors stay float64 under .to(dtype)
            buf = self._buffers.get(name)
            if buf is not None and buf.dtype != torch.float64:
                self._buffers[name] = buf.double()
        return self

    def actions(self, Xs: torch.Tensor | None = None):
        """The current actions over ``Xs`` (default: the stored training inputs)."""
        if self.mode == "opt":
            if Xs is None:
                return BlockActions(self.s_raw * self.mask, self.index, self.mask, self.X_train)
            return BlockActions.from_data(Xs, self.s_raw, self.index, self.mask)
        return DenseActions(self.S, self.X_train if Xs is None else Xs)


@register("cagp", description="Computation-aware GP (CaGP-Opt: learned block-sparse actions, ELBO)")
class CaGP(GPModel):
    """Computation-aware GP (ALGORITHMS.md 5): CaGP-Opt (default) or CaGP-CG, trained on the CaGP ELBO / n.

    Defaults, scaled from the paper (5.6) to a 2-core CPU and n ~ 20,000 spatial points:

    ================  =========================================  ==========================================
    setting           paper (CaGP-Opt)                           gpcore default
    ================  =========================================  ==========================================
    num_actions i     512                                        256 (k = n / i ~ 80 points per block)
    optimiser, lr     Adam, lr in {1, 0.1, 0.01}, LinearLR       AdamW without decay, lr 0.1, constant
                      (end factor 0.1)                           (the trainer has no schedule hook)
    epochs            1000 (200 on Power), best epoch chosen     60, early stopping (patience 20) on a
                      on the test set                            validation split (C5)
    kernel            Matérn-3/2 ARD + outputscale, mu0 = 0      same (``rbf`` / ``matern52`` optional)
    noise             learned (GPyTorch init ~0.69)              learned, init 0.5, floor 1e-4
    blocks            truncate n to i (n // i), random order     keep the remainder (C2); kd-tree order
                                                                 (``ordering="spatial"``); ``"random"``
                                                                 is the reference implementation's
    ================  =========================================  ==========================================

    Cost (5.5, C1): one epoch is one full-batch step, i.e. the backward pass over the upper block
    triangle of ``K`` (the forward ``K S`` is reused from the previous validation pass) plus one
    no-grad forward for the prediction caches and the validation predictions. Measured on n = 20,000,
    d = 2, i = 256 in float32 on the shared 2-core CPU: about 3.3 s of CPU time per epoch (tiles on
    one thread, ``cpu_threads=1``), so the 60-epoch cap is about 3.3 minutes; on the Missouri
    Ookla sample (n = 18,047) early stopping ended a default fit after 30 epochs (best epoch 10) in
    2.7 minutes of wall-clock time on the loaded machine (97 s of CPU time).

    Measured choices (Missouri 2020Q4, log10 Mbps, 80/10/10 split, test NLL / RMSE in log10 units):
    ``ordering="spatial"`` 0.806 / 0.542 (default, 30 epochs) against ``"random"`` 0.825 / 0.547
    (stopped after 30 epochs; 0.811 / 0.545 after 150 epochs); ``noise_init`` 0.1 needed ~100
    epochs to reach the validation NLL that 0.5 reaches in 10 on this noise-dominated target.
    """

    Config = CaGPConfig
    needs_finalize = True

    @property
    def full_batch(self) -> bool:
        return True

    def _build(self, d, Xs, ys) -> CaGPModule:
        return CaGPModule(d, self.config, Xs)

    # ------------------------------------------------------------------ pieces exposed for tests
    def actions(self, Xs: torch.Tensor | None = None, S: torch.Tensor | None = None):
        """The model's actions, or dense ``S`` (``n x i``) on ``Xs`` when given."""
        if S is not None:
            return DenseActions(S, Xs)
        return self.module_.actions(Xs)

    def posterior(self, Xs: torch.Tensor, ys: torch.Tensor, S: torch.Tensor | None = None) -> CaGPPosterior:
        """Computation-aware posterior on scaled data for the model's actions or a dense ``S``."""
        mod = self.module_
        return CaGPPosterior.fit(mod.kernel, self.actions(Xs, S), ys, mod.mu0, mod.noise)

    def elbo(self, Xs: torch.Tensor, ys: torch.Tensor, S: torch.Tensor | None = None) -> torch.Tensor:
        """CaGP ELBO loss ``l_ELBO`` (sum over the n points, eq. 11) on scaled data."""
        mod = self.module_
        return elbo_loss(mod.kernel, self.actions(Xs, S), ys, mod.mu0, mod.noise)

    def projected_nll(
        self, Xs: torch.Tensor, ys: torch.Tensor, S: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Projected-data NLL (eq. 9) on scaled data."""
        mod = self.module_
        return projected_nll(mod.kernel, self.actions(Xs, S), ys, mod.mu0, mod.noise)

    def refresh_cg_actions(self, Xs: torch.Tensor, ys: torch.Tensor, ws: torch.Tensor | None = None) -> None:
        """Recompute the CaGP-CG actions at the current hyperparameters (``actions="cg"``; ``ws``: row weights)."""
        mod = self.module_
        S = cg_actions(
            mod.kernel,
            Xs,
            ys - mod.mu0.detach(),
            self.likelihood.variance(ws, mod.noise.detach()),
            min(self.config.num_actions, Xs.shape[0]),
            self.config.cg_tol,
        )
        mod.register_buffer("S", S.to(mod.X_train.dtype))

    # ------------------------------------------------------------------ training
    def _state_key(self, Xs: torch.Tensor) -> tuple:
        """Identifies (data, parameter values) without a device sync: tensor identities and the
        in-place version counters that every optimizer step and state-dict load bumps."""
        ts = [Xs, *self.module_.parameters()]
        return tuple((t.data_ptr(), t._version, tuple(t.shape), t.dtype) for t in ts)

    def _loss(self, xb, yb, n, wb=None):
        if xb.shape[0] != self.n_train_:
            raise InputError(
                f"CaGP is trained full-batch: the loss needs all {self.n_train_} training points, "
                f"got {xb.shape[0]}"
            )
        mod = self.module_
        # _finalize (run for validation after the previous step) already computed K S at exactly these
        # parameters: reuse it instead of a second O(n^2) forward pass (the backward still recomputes)
        cache = getattr(self, "_cache", None)
        hit = cache is not None and cache[0] == self._state_key(xb)
        self._cache = None
        if self.config.actions == "cg" and not hit:
            self.refresh_cg_actions(xb, yb, wb)
        acts = mod.actions(xb)
        fn = elbo_loss if self.config.loss == "elbo" else projected_nll
        s2 = self.likelihood.variance(wb, mod.noise)  # sigma^2, or per point tau^2 + sigma^2 / w_i (weighted fits)
        parts = cagp_parts(mod.kernel, acts, yb, mod.mu0, s2, cached_KS=cache[1] if hit else None)
        loss = fn(mod.kernel, acts, yb, mod.mu0, s2, parts=parts)
        return (loss / n).to(xb.dtype)

    def _finalize(self, Xs, ys, ws=None):
        mod = self.module_
        if self.config.actions == "cg":
            self.refresh_cg_actions(Xs, ys, ws)
        p = cagp_parts(mod.kernel, mod.actions(Xs), ys, mod.mu0, self.likelihood.variance(ws, mod.noise))
        mod.register_buffer("Lc", p.Lc.detach().clone())
        mod.register_buffer("vt", p.vt.detach().clone())
        self._cache = (self._state_key(Xs), p.KS.detach())

    # ------------------------------------------------------------------ prediction
    def _predict_f(self, xb):
        mod = self.module_
        post = CaGPPosterior(mod.kernel, mod.actions(), mod.Lc, mod.vt, mod.mu0.double())
        mean, var = post.mean_var(xb)
        return mean.to(xb.dtype), var.clamp_min(0.0).to(xb.dtype)

    def _feature_form(self):
        mod = self.module_
        acts = mod.actions()
        Lc, vt = mod.Lc.double(), mod.vt.double()
        kern = mod.kernel

        def features(xs):
            KS = acts.kernel_times(kern, xs.to(acts.X.dtype)).double()
            return torch.linalg.solve_triangular(Lc, KS.T, upper=False).T

        res = Residual(
            latent=lambda xs: xs.double(),
            kernel=lambda a1, a2: stationary(kern.name, a1.double(), a2.double(), kern.lengthscale.double(),
                                             kern.outputscale.double()),
            base=kern.name,
            lengthscale=kern.lengthscale.detach().double(),
            outputscale=float(kern.outputscale),
            cond=acts.X.detach().double(),
            chol=Lc,
            nu=float(mod.noise),
            project=lambda v: acts.t_rows(v.to(torch.float64)),
        )
        return FeatureForm(features=features, mean=Lc.T @ vt, factor=torch.zeros(Lc.shape[0], 0, dtype=torch.float64),
                           mu0=float(mod.mu0), residual=res, note="prior downdated by i projections of the data")

    def _kernel_s(self, x1, x2):
        return self.module_.kernel(x1, x2)

    def _kernel_diag_s(self, xb):
        return self.module_.kernel.diag(xb)

    @property
    def lengthscale(self) -> np.ndarray:
        """Learned lengthscale(s) in the model's scaled input units ([-1, 1] box)."""
        return self.module_.kernel.lengthscale.detach().cpu().numpy()


register_alias("cagp-opt", "cagp", "CaGP-Opt: learned block-sparse actions (ELBO)", actions="opt")
register_alias(
    "cagp-cg", "cagp", "CaGP-CG: conjugate-gradient residual actions (ELBO; O(n^2 i) per step)", actions="cg"
)
