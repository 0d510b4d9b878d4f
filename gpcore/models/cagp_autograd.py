"""CaGP's kernel products ``K(Xr, X) S`` as custom autograd functions (docs/methods/cagp.md §5.5).

``K S`` is never formed from an ``n x n`` matrix: the kernel is evaluated in row tiles of at most ``tile_size``
entries held in reused buffers, each tile is contracted with the actions at once (blockwise for block-sparse
``S``), and the backward pass recomputes the tiles with closed-form kernel derivatives
(:class:`_KernelActions`). At the training inputs only the upper block triangle of the symmetric ``K`` is
evaluated (:class:`_SymBlockKernelActions`). :class:`CaGPKernel` is the kernel module (hyperparameters) these
functions differentiate; the actions, the ELBO and the model are in ``cagp_linalg.py`` and ``cagp.py``.
"""


from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch import nn

from gpcore.models.hyper import SoftplusHyperparameters
from gpcore.models.kernels import stationary
from gpcore.models.linalg import inv_softplus

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
