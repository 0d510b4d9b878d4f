"""SOLVE-GP's reference quantities: the collapsed bounds and dense marginals (docs/methods/solvegp.md §6).

The collapsed SOLVE-GP bound (eq. 9) with ``q(u)`` optimised out, the Titsias bound it reduces to, the
optimal ``q(v)`` and the optimal bound, and the marginals by dense float64 solves (eqs. 33–34). They are
not on the training path (``solvegp.py`` trains the uncollapsed ELBO by Algorithm 1); they check it, and
:class:`SolveGPBounds` is mixed into :class:`~gpcore.models.solvegp.SolveGP` so that ``model.titsias_bound(...)``
etc. read the model's current parameters.
"""

from __future__ import annotations

import torch

from gpcore.models.linalg import (
    LOG_2PI,
    kl_gauss_chol,
)


def _tri(L: torch.Tensor, B: torch.Tensor, transpose: bool = False) -> torch.Tensor:
    """``L \\ B`` (or ``L^T \\ B`` with ``transpose=True``) for a lower-triangular ``L``."""
    if transpose:
        return torch.linalg.solve_triangular(L.transpose(-1, -2), B, upper=True)
    return torch.linalg.solve_triangular(L, B, upper=False)


class SolveGPBounds:
    """Reference bounds of a fitted :class:`~gpcore.models.solvegp.SolveGP` (float64, scaled data)."""

    def marginals_dense(self, Xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The same marginals by eqs. (33)–(34) with dense float64 solves (a reference path for tests).

        ``mu = K_fu K_uu^{-1} m_u + C_fv C_vv^{-1} m_v``,
        ``s2 = diag(K_fu K_uu^{-1} S_u K_uu^{-1} K_uf) + diag(C_ff)
        + diag(C_fv C_vv^{-1} (S_v - C_vv) C_vv^{-1} C_vf)``.
        """
        mod = self.module_
        pr = self.prior_factors()
        Z, O, X = mod.Z.double(), mod.O.double(), Xs.double()
        Kuu = pr["L_u0"] @ pr["L_u0"].T
        Cvv = pr["L_v0"] @ pr["L_v0"].T
        m_u, L_u, m_v, L_v = self.q_unwhitened(pr)
        S_u, S_v = L_u @ L_u.T, L_v @ L_v.T
        Kfu = mod.K(X, Z)
        Kuu_inv_Kuf = torch.linalg.solve(Kuu, Kfu.T)
        Cfv = mod.K(X, O) - Kfu @ torch.linalg.solve(Kuu, mod.K(Z, O))
        Cvv_inv_Cvf = torch.linalg.solve(Cvv, Cfv.T)
        mu = Kuu_inv_Kuf.T @ m_u + Cvv_inv_Cvf.T @ m_v
        kff = mod.outputscale.double().expand(X.shape[0])
        c_ff = kff - (Kfu * Kuu_inv_Kuf.T).sum(1)
        s2 = (
            (Kuu_inv_Kuf * (S_u @ Kuu_inv_Kuf)).sum(0)
            + c_ff
            + (Cvv_inv_Cvf * ((S_v - Cvv) @ Cvv_inv_Cvf)).sum(0)
        )
        return mod.mu0.double() + mu, s2

    def _collapsed_parts(self, Xs: torch.Tensor, pr: dict):
        """float64 ``B = L_u0^{-1} K_uf`` (M x N), ``D = L_v0^{-1} C_vf`` (M2 x N), ``G = C_vv^{-1} C_vf``."""
        mod = self.module_
        X = Xs.double()
        B = _tri(pr["L_u0"], mod.K(mod.Z.double(), X))
        D = _tri(pr["L_v0"], mod.K(mod.O.double(), X) - pr["A"].T @ B)
        G = _tri(pr["L_v0"], D, transpose=True)
        return B, D, G

    @staticmethod
    def _lowrank_logpdf(r: torch.Tensor, W: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
        """``log N(r; 0, W^T W + s2 I_N)`` for ``W`` of shape ``k x N`` by Woodbury, O(N k^2)."""
        N, k = r.shape[0], W.shape[0]
        Lam = torch.eye(k, dtype=W.dtype, device=W.device) + (W @ W.T) / s2
        L = torch.linalg.cholesky(Lam)
        c = _tri(L, (W @ r).unsqueeze(-1)).squeeze(-1)
        quad = (r @ r - c @ c / s2) / s2
        logdet = N * torch.log(s2) + 2.0 * torch.log(L.diagonal()).sum()
        return -0.5 * (N * LOG_2PI + logdet + quad)

    @staticmethod
    def _kl_general(m: torch.Tensor, S: torch.Tensor, L0: torch.Tensor) -> torch.Tensor:
        """``KL(N(m, S) || N(0, L0 L0^T))`` for a full covariance ``S`` (dimension ``len(m)``)."""
        LS = torch.linalg.cholesky(S)
        return kl_gauss_chol(m, LS, L0)

    def collapsed_bound(self, Xs: torch.Tensor, ys: torch.Tensor, m_v: torch.Tensor | None = None,
                        S_v: torch.Tensor | None = None) -> torch.Tensor:
        """Collapsed SOLVE-GP bound, eq. (9), with q(u) optimised out (Gaussian likelihood; float64).

        ``log N(y; mu0 + C_fv C_vv^{-1} m_v, Q_ff + sigma2 I) - tr(S_fperp) / (2 sigma2)
        - KL[N(m_v, S_v) || N(0, C_vv)]``, ``S_fperp = C_ff + C_fv C_vv^{-1} (S_v - C_vv) C_vv^{-1} C_vf``;
        computed in O(N (M + M2)^2) by Woodbury.

        Parameters
        ----------
        Xs, ys : ``N x d`` scaled inputs and ``(N,)`` standardised targets.
        m_v, S_v : ``(M2,)`` mean and ``M2 x M2`` covariance of ``q(v_perp)`` in the **unwhitened** space;
            default: the model's current ``q(v_perp)``.
        """
        mod = self.module_
        pr = self.prior_factors()
        if m_v is None or S_v is None:
            _, _, m_cur, L_cur = self.q_unwhitened(pr)
            m_v = m_cur if m_v is None else m_v
            S_v = L_cur @ L_cur.T if S_v is None else S_v
        m_v, S_v = m_v.double(), S_v.double()
        B, D, G = self._collapsed_parts(Xs, pr)
        s2 = mod.noise.double()
        r = ys.double() - mod.mu0.double() - G.T @ m_v
        fit = self._lowrank_logpdf(r, B, s2)
        kff = mod.outputscale.double() * Xs.shape[0]
        tr = kff - B.pow(2).sum() - D.pow(2).sum() + (G * (S_v @ G)).sum()
        return fit - tr / (2.0 * s2) - self._kl_general(m_v, S_v, pr["L_v0"])

    def titsias_bound(self, Xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        """Titsias' collapsed bound with the standard inducing points Z only (float64)."""
        pr = self.prior_factors()
        mod = self.module_
        B, _, _ = self._collapsed_parts(Xs, pr)
        s2 = mod.noise.double()
        r = ys.double() - mod.mu0.double()
        tr = mod.outputscale.double() * Xs.shape[0] - B.pow(2).sum()
        return self._lowrank_logpdf(r, B, s2) - tr / (2.0 * s2)

    def _ainv(self, B: torch.Tensor, R: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
        """``(B^T B + s2 I_N)^{-1} R`` by Woodbury (``B``: M x N, ``R``: N x k)."""
        M = B.shape[0]
        L = torch.linalg.cholesky(s2 * torch.eye(M, dtype=B.dtype, device=B.device) + B @ B.T)
        return (R - B.T @ torch.cholesky_solve(B @ R, L)) / s2

    def optimal_qv(self, Xs: torch.Tensor, ys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Optimal ``q(v_perp) = N(m_v*, S_v*)`` for the collapsed bound (eqs. 28–29; float64, unwhitened).

        ``m_v* = C_vv [C_vv + C_vf A^{-1} C_fv]^{-1} C_vf A^{-1} y``,
        ``S_v* = C_vv [C_vv + sigma^{-2} C_vf C_fv]^{-1} C_vv``, ``A = Q_ff + sigma2 I``; evaluated through
        ``C_vv = L_v0 L_v0^T`` and ``D = L_v0^{-1} C_vf`` as ``L_v0 (I + D A^{-1} D^T)^{-1} D A^{-1} y`` and
        ``L_v0 (I + D D^T / sigma2)^{-1} L_v0^T``.
        """
        mod = self.module_
        pr = self.prior_factors()
        B, D, _ = self._collapsed_parts(Xs, pr)
        s2 = mod.noise.double()
        y = ys.double() - mod.mu0.double()
        M2 = D.shape[0]
        eye = torch.eye(M2, dtype=D.dtype, device=D.device)
        AiDt = self._ainv(B, torch.cat([D.T, y[:, None]], 1), s2)
        P = eye + D @ AiDt[:, :M2]
        P = 0.5 * (P + P.T)
        m = pr["L_v0"] @ torch.linalg.solve(P, D @ AiDt[:, M2])
        Q = eye + D @ D.T / s2
        Lq = torch.linalg.cholesky(0.5 * (Q + Q.T))
        W = _tri(Lq, pr["L_v0"].T)  # Lq^{-1} L_v0^T
        return m, W.T @ W

    def optimal_bound(self, Xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        """Collapsed bound at the optimal ``q(v_perp)`` in closed form (eq. 30; float64). [Derived]

        ``log N(y; mu0, Q_ff + C_fv C_vv^{-1} C_vf + sigma2 I) - tr(C_ff - C_fv C_vv^{-1} C_vf) / (2 sigma2)
        + 0.5 log|I + D A^{-1} D^T| - 0.5 log|I + D D^T / sigma2|``, with ``D = L_v0^{-1} C_vf`` and
        ``A = Q_ff + sigma2 I``. The first two terms are Titsias' bound over ``Z ∪ O``; the log-det
        difference (<= 0) is the price of the structured (block-independent) q(u) q(v_perp).
        """
        mod = self.module_
        pr = self.prior_factors()
        B, D, _ = self._collapsed_parts(Xs, pr)
        s2 = mod.noise.double()
        y = ys.double() - mod.mu0.double()
        W = torch.cat([B, D], 0)
        tr = mod.outputscale.double() * Xs.shape[0] - W.pow(2).sum()
        eye = torch.eye(D.shape[0], dtype=D.dtype, device=D.device)
        P = eye + D @ self._ainv(B, D.T, s2)
        Q = eye + D @ D.T / s2
        return (
            self._lowrank_logpdf(y, W, s2)
            - tr / (2.0 * s2)
            + 0.5 * torch.linalg.slogdet(0.5 * (P + P.T))[1]
            - 0.5 * torch.linalg.slogdet(0.5 * (Q + Q.T))[1]
        )
