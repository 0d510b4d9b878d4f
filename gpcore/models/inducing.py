"""Inducing-point initialisation: one seeded k-means for every model that needs one.

SVGP / PPGP / SV-DKL (on the inputs' latent images), SoftKI and SOLVE-GP all start their inducing
points from :func:`kmeans`: k-means++ seeding on the distinct rows, then Lloyd iterations. Every
random number comes from a CPU ``torch.Generator``, so the centres are the same on any device.
"""

from __future__ import annotations

import torch


def _sqdist(X: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    return (X.pow(2).sum(-1, keepdim=True) - 2.0 * X @ C.T + C.pow(2).sum(-1)).clamp_min(0.0)


@torch.no_grad()
def kmeans(
    X: torch.Tensor,
    k: int,
    iters: int = 10,
    generator: torch.Generator | None = None,
    *,
    seed: int = 0,
    max_points: int = 50_000,
    chunk: int = 65_536,
) -> torch.Tensor:
    """Seeded k-means: k-means++ seeding on the distinct rows of ``X``, then ``iters`` Lloyd iterations.

    Parameters
    ----------
    X : ``n x d`` points (any device and float dtype).
    k : number of centres.
    iters : Lloyd iterations after the seeding; an empty cluster keeps its centre.
    generator : CPU generator for all randomness; default ``torch.Generator().manual_seed(seed)``.
    max_points : the algorithm runs on a random subset of at most this many rows.
    chunk : rows per distance block (memory ``O(chunk k)``).

    Returns
    -------
    ``k x d`` distinct centres, same dtype and device as ``X``. Duplicate rows (repeated map tiles)
    are removed first; when fewer than ``k`` distinct rows remain, all of them are centres and the
    rest are drawn uniformly from the rows' bounding box.
    """
    gen = torch.Generator().manual_seed(int(seed)) if generator is None else generator
    dev = X.device
    if X.shape[0] > max_points:
        X = X[torch.randperm(X.shape[0], generator=gen)[:max_points].to(dev)]
    U = torch.unique(X, dim=0)
    n, d = U.shape
    if n <= k:
        lo, hi = U.min(0).values, U.max(0).values
        extra = torch.rand(k - n, d, generator=gen, dtype=U.dtype).to(dev)
        return torch.cat([U, lo + (hi - lo) * extra])
    # k-means++: each next centre is drawn with probability proportional to the squared distance to
    # the nearest chosen one (chosen rows have distance 0, so the centres are distinct rows)
    idx = [int(torch.randint(n, (1,), generator=gen))]
    best = _sqdist(U, U[idx[0]][None])[:, 0]
    best[idx[0]] = 0.0
    for u in torch.rand(k - 1, generator=gen, dtype=torch.float64).tolist():
        cum = torch.cumsum(best.double(), 0)
        j = int(torch.searchsorted(cum, u * cum[-1], right=True).clamp_max(n - 1))
        if best[j] <= 0.0:  # only on ties at an interval edge
            j = int(best.argmax())
        idx.append(j)
        best = torch.minimum(best, _sqdist(U, U[j][None])[:, 0])
        best[j] = 0.0
    C = U[torch.tensor(idx, device=dev)].clone()
    ones = torch.ones(n, dtype=U.dtype, device=dev)
    for _ in range(iters):
        assign = torch.cat([_sqdist(U[i : i + chunk], C).argmin(-1) for i in range(0, n, chunk)])
        sums = torch.zeros_like(C).index_add_(0, assign, U)
        counts = torch.zeros(k, dtype=U.dtype, device=dev).index_add_(0, assign, ones)
        C = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1.0)[:, None], C)
    return C


def kmeans_objective(X: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """Mean squared distance of each row of ``X`` to its nearest centre in ``C``."""
    return torch.cdist(X, C).min(1).values.pow(2).mean()
