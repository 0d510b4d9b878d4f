"""SoftKI's linear algebra: softmax interpolation weights, the batch marginal likelihood (exact and the
Hutchinson-probe pseudo-likelihood) and the streaming QR fit of the posterior (docs/methods/softki.md §4).

Pure functions of tensors (``W``: ``b x m`` interpolation weights, ``Kzz``: ``m x m``, per-point or shared
noise); the model that trains and predicts with them is ``softki.py``.
"""


from __future__ import annotations

from collections.abc import Iterable

import torch

from gpcore.models.linalg import LOG_2PI

#: eps inside the square root of the interpolation distance (finite gradients at x = z, 4.1)
DIST_EPS = 1e-12


# --------------------------------------------------------------------------------------------
# Interpolation weights and k-means
# --------------------------------------------------------------------------------------------


def pairwise_distances(X: torch.Tensor, Z: torch.Tensor, eps: float = DIST_EPS) -> torch.Tensor:
    """Euclidean distances ``sqrt(||x_i - z_j||^2 + eps)`` (``n x d``, ``m x d`` -> ``n x m``)."""
    d2 = X.pow(2).sum(-1, keepdim=True) - 2.0 * X @ Z.transpose(-1, -2) + Z.pow(2).sum(-1).unsqueeze(-2)
    return torch.sqrt(d2.clamp_min(0.0) + eps)


def weights_from_distances(dist: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """Softmax interpolation weights ``softmax(-dist / tau)`` along the last axis (log-sum-exp stable)."""
    return torch.softmax(-dist / tau, dim=-1)


def softmax_weights(X: torch.Tensor, Z: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """SoftKI interpolation matrix (SoftKI eq. 17 with temperature, S6).

    Parameters
    ----------
    X : ``n x d`` inputs.
    Z : ``m x d`` interpolation points.
    tau : temperature; ``W[i, j] ∝ exp(-||x_i - z_j|| / tau)``. ``tau -> 0`` gives one-hot rows.

    Returns
    -------
    W : ``n x m``, non-negative, rows summing to 1.
    """
    return weights_from_distances(pairwise_distances(X, Z), tau)


# --------------------------------------------------------------------------------------------
# Training objectives
# --------------------------------------------------------------------------------------------


def _cholesky(A: torch.Tensor) -> torch.Tensor:
    """Lower Cholesky factor without a host-device sync (no info check: NaNs surface in the loss)."""
    return torch.linalg.cholesky_ex(A)[0]


def make_probes(b: int, num: int, like: torch.Tensor, dist: str = "gaussian") -> torch.Tensor:
    """``b x num`` Hutchinson probes with ``E[a a^T] = I``: unnormalised N(0, I) or Rademacher (S2)."""
    a = torch.randn(b, num, dtype=like.dtype, device=like.device)
    return a.sign() if dist == "rademacher" else a


@torch.no_grad()
def batch_solve(
    W: torch.Tensor, Kzz: torch.Tensor, noise: torch.Tensor, rhs: torch.Tensor, solver: str = "woodbury"
) -> torch.Tensor:
    """``Sig^{-1} rhs`` for ``Sig = W Kzz W^T + noise I_b``, in float64, without gradient.

    Parameters
    ----------
    W : ``b x m`` weights; Kzz : ``m x m``; noise : scalar; rhs : ``b x k``.
    solver : ``"dense"`` (Cholesky of the ``b x b`` matrix, O(b^2 m + b^3)) or ``"woodbury"``
        (``Sig^{-1} = (I - F (F^T F + s2 I)^{-1} F^T) / s2`` with ``F = W L_zz``, O(b m^2 + m^3)).

    Returns
    -------
    ``b x k`` float64 solution.
    """
    W, Kzz, rhs = W.double(), Kzz.double(), rhs.double()
    s2 = noise.double()
    if s2.dim() > 0:  # per-point noise (weighted fits): Sig = W Kzz W^T + diag(s2)
        if solver == "dense":
            return torch.cholesky_solve(rhs, _cholesky(W @ Kzz @ W.T + torch.diag(s2)))
        F = W @ _cholesky(Kzz)
        Fd = F / s2[:, None]
        Lam = F.T @ Fd + torch.eye(F.shape[1], dtype=W.dtype, device=W.device)
        t = torch.cholesky_solve(Fd.T @ rhs, _cholesky(Lam))
        return (rhs - F @ t) / s2[:, None]
    if solver == "dense":
        Sig = W @ Kzz @ W.T + s2 * torch.eye(W.shape[0], dtype=W.dtype, device=W.device)
        return torch.cholesky_solve(rhs, _cholesky(Sig))
    if solver != "woodbury":
        raise ValueError(f"unknown solver {solver!r}; allowed: 'woodbury', 'dense'")
    F = W @ _cholesky(Kzz)
    Lam = F.T @ F + s2 * torch.eye(F.shape[1], dtype=W.dtype, device=W.device)
    t = torch.cholesky_solve(F.T @ rhs, _cholesky(Lam))
    return (rhs - F @ t) / s2


def sig_bilinear(W: torch.Tensor, Kzz: torch.Tensor, noise: torch.Tensor, U: torch.Tensor, V: torch.Tensor):
    """Column-wise ``u_j^T Sig v_j`` with ``Sig = W Kzz W^T + noise I`` without forming ``Sig``.

    ``W``: ``b x m``; ``U``, ``V``: ``b x k``. Returns ``(k,)``. Differentiable in ``W, Kzz, noise``.
    ``noise`` may be ``(b,)`` (per-point noise of a weighted fit).
    """
    WU, WV = W.T @ U, W.T @ V
    if noise.dim() > 0:
        return (WU * (Kzz @ WV)).sum(0) + (noise.unsqueeze(-1) * U * V).sum(0)
    return (WU * (Kzz @ WV)).sum(0) + noise * (U * V).sum(0)


def pseudo_logp(
    W: torch.Tensor,
    Kzz: torch.Tensor,
    noise: torch.Tensor,
    y: torch.Tensor,
    probes: torch.Tensor,
    solver: str = "woodbury",
) -> torch.Tensor:
    """Hutchinson pseudo log-likelihood of a batch (docs/methods/softki.md §4.2 with S1–S3).

    ``0.5 b0^T Sig b0 - 1/(2L) sum_j b_j^T Sig a_j`` with ``Sig [b0, b_1..b_L] = [y, a_1..a_L]``
    solved without gradient, so that ``grad pseudo_logp ≈ grad log N(y; 0, Sig)`` (same sign).
    Its value is NOT the log-likelihood.

    Parameters
    ----------
    W : ``b x m`` interpolation weights; Kzz : ``m x m``; noise : scalar s2.
    y : ``(b,)`` targets; probes : ``b x L`` probes with ``E[a a^T] = I`` (unnormalised).
    solver : how the b's are solved (:func:`batch_solve`).

    Returns
    -------
    Scalar tensor (dtype of ``W``), differentiable in ``W``, ``Kzz``, ``noise``.
    """
    rhs = torch.cat([y.unsqueeze(-1), probes], dim=-1)
    B = batch_solve(W.detach(), Kzz.detach(), noise.detach(), rhs, solver).to(W.dtype)
    b0, Bp = B[:, :1], B[:, 1:]
    fit = sig_bilinear(W, Kzz, noise, b0, b0).sum()
    trace = sig_bilinear(W, Kzz, noise, Bp, probes.to(W.dtype)).mean()
    return 0.5 * fit - 0.5 * trace


def exact_batch_logp(W: torch.Tensor, Kzz: torch.Tensor, noise: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Exact ``log N(y; 0, W Kzz W^T + s2 I_b)`` by Woodbury / determinant lemma, float64, differentiable.

    With ``F = W L_zz`` (``b x m``) and ``Lam = F^T F + s2 I_m``:
    ``log|Sig| = (b - m) log s2 + log|Lam|`` and ``y^T Sig^{-1} y = (y^T y - ||L_Lam^{-1} F^T y||^2) / s2``.
    Cost O(b m^2 + m^3). Returns a float64 scalar.
    """
    W, Kzz, y = W.double(), Kzz.double(), y.double()
    s2 = noise.double()
    b, m = W.shape
    if s2.dim() > 0:  # per-point noise D (weighted fits): log|Sig| = sum log d + log|I + F^T D^-1 F|
        F = W @ _cholesky(Kzz)
        Fd = F / s2[:, None]
        LL = _cholesky(F.T @ Fd + torch.eye(m, dtype=W.dtype, device=W.device))
        v = torch.linalg.solve_triangular(LL, (Fd.T @ y).unsqueeze(-1), upper=False).squeeze(-1)
        logdet = torch.log(s2).sum() + 2.0 * torch.log(LL.diagonal()).sum()
        return -0.5 * (b * LOG_2PI + logdet + (y * y / s2).sum() - v @ v)
    F = W @ _cholesky(Kzz)
    LL = _cholesky(F.T @ F + s2 * torch.eye(m, dtype=W.dtype, device=W.device))
    v = torch.linalg.solve_triangular(LL, (F.T @ y).unsqueeze(-1), upper=False).squeeze(-1)
    logdet = (b - m) * torch.log(s2) + 2.0 * torch.log(LL.diagonal()).sum()
    quad = (y @ y - v @ v) / s2
    return -0.5 * (b * LOG_2PI + logdet + quad)


# --------------------------------------------------------------------------------------------
# Posterior fit
# --------------------------------------------------------------------------------------------


def upper_factor(Kzz: torch.Tensor) -> torch.Tensor:
    """Upper Cholesky factor ``U`` with ``U^T U = Kzz`` (float64), the block stacked in the QR (S5)."""
    return torch.linalg.cholesky(Kzz.double(), upper=True)


def qr_fold(
    chunks: Iterable[tuple[torch.Tensor, torch.Tensor]], Kzz: torch.Tensor, noise: torch.Tensor, start: torch.Tensor
) -> torch.Tensor:
    """Fold row chunks into a triangular factor: ``R_aug <- qr([R_aug ; [W_c Kzz, y_c] / s]).R`` (TSQR).

    Parameters
    ----------
    chunks : iterable of ``(W_c, y_c)``: ``c x m`` weight rows and their ``(c,)`` targets; or
        ``(W_c, y_c, d_c)`` with the rows' own noise variances (weighted fits: rows scaled by ``1/sqrt(d)``).
    Kzz : ``m x m``; noise : scalar s2.
    start : ``k x (m+1)`` initial rows (``[U | 0]`` for the prior block, or zeros).

    Returns
    -------
    ``R_aug``: at most ``(m+1) x (m+1)`` float64 upper-triangular, ``R_aug^T R_aug = A_aug^T A_aug``.
    """
    K = Kzz.double()
    s = torch.sqrt(noise.double())
    R_aug = start.double()
    for chunk in chunks:
        Wc, yc = chunk[0], chunk[1]
        if Wc.shape[0] == 0:
            continue
        sc = s if len(chunk) == 2 else torch.sqrt(chunk[2].double()).unsqueeze(-1)
        Ac = torch.cat([Wc.double() @ K, yc.double().unsqueeze(-1)], dim=1) / sc
        R_aug = torch.linalg.qr(torch.cat([R_aug, Ac], dim=0), mode="r")[1]
    return R_aug


def merge_factors(factors: list[torch.Tensor]) -> torch.Tensor:
    """Combine partial TSQR factors of disjoint row blocks: ``qr([R_1 ; R_2 ; ...]).R`` (float64)."""
    return torch.linalg.qr(torch.cat([f.double() for f in factors], dim=0), mode="r")[1]


def qr_solve_factor(R_aug: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(alpha, R)`` from ``R_aug = [[R, Q^T rhs], [0, rho]]``; R's diagonal made non-negative."""
    if R_aug.shape[0] < m:
        raise ValueError(f"the stacked system has rank < m = {m}; include the prior block [U | 0]")
    R, c = R_aug[:m, :m], R_aug[:m, m]
    sign = torch.where(R.diagonal() < 0, -1.0, 1.0).to(R.dtype)
    R, c = R * sign[:, None], c * sign
    alpha = torch.linalg.solve_triangular(R, c.unsqueeze(-1), upper=True).squeeze(-1)
    return alpha, R


def prior_block(Kzz: torch.Tensor, factor: torch.Tensor | None = None) -> torch.Tensor:
    """``[U | 0]`` (``m x (m+1)``): the stacked prior rows, ``U`` the upper Cholesky factor by default."""
    U = upper_factor(Kzz) if factor is None else factor.double()
    return torch.cat([U, U.new_zeros(U.shape[0], 1)], dim=1)


def qr_fit_stream(
    chunks: Iterable[tuple[torch.Tensor, torch.Tensor]],
    Kzz: torch.Tensor,
    noise: torch.Tensor,
    factor: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Streaming (TSQR) QR-stabilised SoftKI fit; memory O(m^2) however many rows are streamed.

    Folds ``R_aug <- qr([R_aug ; [W_c Kzz / s, y_c / s]]).R`` over the chunks, starting from
    ``[factor | 0]``; at the end ``R_aug = [[R, Q^T rhs], [0, rho]]`` and ``alpha = R^{-1} Q^T rhs``.

    Parameters
    ----------
    chunks : iterable of ``(W_c, y_c)``: ``c x m`` weight rows and their ``(c,)`` targets.
    Kzz : ``m x m``; noise : scalar s2 (``Lambda = s2 I``).
    factor : the ``m x m`` block stacked under the data; default the upper Cholesky factor
        (``U^T U = Kzz``). Passing anything else is only for tests (e.g. the lower factor of
        the paper's misprint, which gives a wrong alpha).

    Returns
    -------
    alpha : ``(m,)`` float64, ``C^ alpha = K^_zx y / s2``.
    R : ``m x m`` float64 upper-triangular with non-negative diagonal, ``R^T R = C^``.
    """
    R_aug = qr_fold(chunks, Kzz, noise, prior_block(Kzz, factor))
    return qr_solve_factor(R_aug, Kzz.shape[0])


def qr_fit(
    W: torch.Tensor,
    Kzz: torch.Tensor,
    noise: torch.Tensor,
    y: torch.Tensor,
    chunk_size: int | None = None,
    factor: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """QR-stabilised solve of ``C^ alpha = K^_zx y / s2`` (SoftKI eqs. 26–30 with S5), float64.

    One-shot (``chunk_size=None``): ``A = [W Kzz / s ; U]`` (``(n+m) x m``), ``Q, R = qr(A)``,
    ``alpha = R^{-1} Q^T [y / s ; 0]``. With ``chunk_size`` the rows are streamed through
    :func:`qr_fit_stream` instead (same alpha; ``n x m`` never formed there).

    Parameters
    ----------
    W : ``n x m`` weights; Kzz : ``m x m``; noise : scalar s2; y : ``(n,)``.
    factor : stacked ``m x m`` block (default upper Cholesky factor, see :func:`qr_fit_stream`).

    Returns
    -------
    alpha : ``(m,)``; R : ``m x m`` with ``R^T R = C^`` (non-negative diagonal).
    """
    if chunk_size is not None:
        gen = ((W[i : i + chunk_size], y[i : i + chunk_size]) for i in range(0, W.shape[0], chunk_size))
        return qr_fit_stream(gen, Kzz, noise, factor)
    K = Kzz.double()
    m = K.shape[0]
    s = torch.sqrt(noise.double())
    U = upper_factor(K) if factor is None else factor.double()
    A = torch.cat([W.double() @ K / s, U], dim=0)
    rhs = torch.cat([y.double() / s, y.new_zeros(m, dtype=torch.float64)])
    Q, R = torch.linalg.qr(A, mode="reduced")
    alpha = torch.linalg.solve_triangular(R, (Q.T @ rhs).unsqueeze(-1), upper=True).squeeze(-1)
    sign = torch.where(R.diagonal() < 0, -1.0, 1.0).to(R.dtype)
    return alpha, R * sign[:, None]


def normal_equation_fit(W: torch.Tensor, Kzz: torch.Tensor, noise: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``alpha = solve(C^, K^_zx y / s2)`` by forming ``C^ = Kzz + K^_zx K^_xz / s2`` (float64, Cholesky).

    The unstable reference the QR solve is tested against (SoftKI eq. 25).
    """
    K = Kzz.double()
    s2 = noise.double()
    Kh = W.double() @ K
    C = K + Kh.T @ Kh / s2
    return torch.cholesky_solve((Kh.T @ y.double() / s2).unsqueeze(-1), torch.linalg.cholesky(C)).squeeze(-1)


def posterior_caches(alpha: torch.Tensor, R: torch.Tensor, Kzz: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Kzz alpha, R^{-T} Kzz)``: the mean weights and the variance factor ``P``.

    ``s2_f(x) = ||R^{-T} Kzz w(x)||^2 = ||P w(x)||^2``. ``P^T P = Kzz C^{-1} Kzz <= Kzz`` is bounded
    by the prior, so (unlike ``R``) it can be stored in float32 without losing the variance.
    """
    K = Kzz.double()
    P = torch.linalg.solve_triangular(R.double().T, K, upper=False)
    return K @ alpha.double(), P


__all__ = [
    "batch_solve",
    "exact_batch_logp",
    "make_probes",
    "merge_factors",
    "normal_equation_fit",
    "pairwise_distances",
    "posterior_caches",
    "prior_block",
    "pseudo_logp",
    "qr_fit",
    "qr_fit_stream",
    "qr_fold",
    "qr_solve_factor",
    "sig_bilinear",
    "softmax_weights",
    "weights_from_distances",
]
