"""CaGP's linear algebra: the actions ``S``, the computation-aware posterior, the ELBO and projected NLL, and
conjugate gradients (docs/methods/cagp.md §5.1–5.4, Algorithms S1–S2).

All on top of the kernel products of ``cagp_autograd.py``; float64 factorisations throughout. The model that
trains and predicts with them is ``cagp.py``.
"""


from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gpcore.models.cagp_autograd import CaGPKernel
from gpcore.models.linalg import LOG_2PI, psd_safe_cholesky

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
