"""Exact nearest-neighbour search in torch, on whatever device the points are on: a multi-level grid over one
Morton-sorted array (docs/methods/vecchia.md, "Neighbour search on a GPU").

The KD-tree of :mod:`gpcore.models.neighbors` runs on CPU cores only; with the model on a GPU these searches
were most of a large fit's set-up. Here every step is a batched tensor operation (sort, ``searchsorted``,
gathers, ``topk``), so the same code runs on CUDA and, for the tests, on the CPU.

The reference points are bucketed on their first ``b = min(d, 2)`` coordinates into square cells of side
``h0 / 2^l`` at levels ``l = 0 .. L``; one sort by the level-``L`` Morton code makes every cell of every level a
contiguous range of the sorted array. A query starts at the finest level whose ``3^b`` cells around it hold at least
``target`` points, takes the ``k`` nearest among them (distances in all ``d`` coordinates) and is done when the
``k``-th of them is no farther than the nearest point outside those cells can be (the distance to their boundary
in the bucketed coordinates, a lower bound on the full distance); otherwise it retries one level coarser. At level 0
the cells cover every point, so the search is exact. ``limit`` restricts the query ``q`` to reference rows with
index ``< limit[q]`` (the predecessors of an ordered set).
"""

from __future__ import annotations

import itertools

import torch

__all__ = ["GridIndex"]

_SPREAD = ((16, 0x0000FFFF0000FFFF), (8, 0x00FF00FF00FF00FF), (4, 0x0F0F0F0F0F0F0F0F),
           (2, 0x3333333333333333), (1, 0x5555555555555555))


def _spread(x: torch.Tensor) -> torch.Tensor:
    """The bits of ``x`` (int64, ``< 2^31``) moved to the even bit positions."""
    for shift, mask in _SPREAD:
        x = (x | (x << shift)) & mask
    return x


class GridIndex:
    """Exact ``k``-nearest-neighbour queries against the rows of ``ref`` (``n x d``, any device; float64 inside)."""

    def __init__(self, ref: torch.Tensor, max_level: int | None = None):
        R = torch.as_tensor(ref).detach().double()
        self.R = R
        n, d = R.shape
        self.b = max(1, min(d, 2))
        P = R[:, : self.b]
        self.lo = P.min(0).values if n else torch.zeros(self.b, dtype=R.dtype, device=R.device)
        span = (P.max(0).values - self.lo).max() if n else torch.ones((), dtype=R.dtype, device=R.device)
        h0 = float(span)
        self.h0 = h0 if h0 > 0 else 1.0
        if max_level is None:  # finest cells hold about one point on spread-out data, a few levels finer for clusters
            per_dim = max(n, 1) ** (1.0 / self.b)
            max_level = int(min(31 if self.b == 2 else 62, int(max(1.0, per_dim)).bit_length() + 3))
        self.L = int(max_level)
        self.codes, self.perm = torch.sort(self._codes(self._cells(P)))
        self.offsets = torch.tensor(list(itertools.product((-1, 0, 1), repeat=self.b)), device=R.device)  # 3^b x b

    # ------------------------------------------------------------------ cells and codes
    def _cells(self, P: torch.Tensor) -> torch.Tensor:
        """Level-``L`` cell coordinates (int64, clamped into the grid) of the bucketed coordinates ``P``."""
        G = 1 << self.L
        return ((P - self.lo) * (G / self.h0)).floor().clamp(0, G - 1).long()

    def _codes(self, C: torch.Tensor) -> torch.Tensor:
        if self.b == 1:
            return C[:, 0]
        return _spread(C[:, 0]) | (_spread(C[:, 1]) << 1)

    def _ranges(self, C: torch.Tensor, level: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``start, count`` (``q x 3^b``) in the sorted array of the ``3^b`` level-``level`` cells around the
        level-``level`` cells ``C`` (``q x b``); cells outside the grid are empty."""
        G = 1 << level
        shift = self.b * (self.L - level)
        N = C[:, None, :] + self.offsets[None]  # q x 3^b x b
        inside = ((N >= 0) & (N < G)).all(-1)
        code = self._codes(N.clamp(0, G - 1).reshape(-1, self.b)).reshape(N.shape[:2])
        lo = torch.searchsorted(self.codes, code << shift)
        hi = torch.searchsorted(self.codes, (code + 1) << shift)
        count = torch.where(inside, hi - lo, torch.zeros_like(lo))
        return lo, count

    def _bound2(self, P: torch.Tensor, C: torch.Tensor, level: int) -> torch.Tensor:
        """Squared distance from each query to the nearest point outside its ``3^b`` cells (``inf`` when they
        cover the grid), less a relative ``1e-9`` for the rounding of the cell assignment."""
        G = 1 << level
        h = self.h0 / G
        x = (P - self.lo) / h  # in cells
        below = torch.where(C - 1 <= 0, torch.full_like(x, float("inf")), x - (C - 1))
        above = torch.where(C + 1 >= G - 1, torch.full_like(x, float("inf")), (C + 2) - x)
        gap = (torch.minimum(below, above).min(-1).values * h - 1e-9 * self.h0).clamp_min(0)
        return gap * gap

    # ------------------------------------------------------------------ queries
    def query(self, Q: torch.Tensor, k: int, limit: torch.Tensor | None = None, target: int | None = None,
              budget: int | None = None) -> torch.Tensor:
        """Indices (``q x k`` int64 on the device, nearest first, ``-1`` where fewer than ``k`` rows qualify) of the
        ``k`` nearest reference rows of each query row; with ``limit`` (``q``) only rows ``< limit[q]`` qualify.
        ``budget`` caps the candidate distances held at once (default ``2^20`` on the CPU, ``2^24`` elsewhere)."""
        Q = torch.as_tensor(Q, device=self.R.device).detach().double()
        nq, n = Q.shape[0], self.R.shape[0]
        out = torch.full((nq, max(k, 0)), -1, dtype=torch.long, device=Q.device)
        if nq == 0 or n == 0 or k <= 0:
            return out
        if budget is None:
            budget = 1 << (20 if Q.device.type == "cpu" else 24)
        target = target or (8 * k if limit is not None else 4 * k)
        P = Q[:, : self.b]
        CL = self._cells(P)
        # the finest level whose cells around the query hold `target` points
        level = torch.zeros(nq, dtype=torch.long, device=Q.device)
        for lev in range(1, self.L + 1):
            _, count = self._ranges(CL >> (self.L - lev), lev)
            level = torch.where(count.sum(1) >= target, torch.full_like(level, lev), level)
        pending = torch.arange(nq, device=Q.device)
        while pending.numel():
            lev_p = level[pending]
            failed = []
            for lev in torch.unique(lev_p).tolist():
                rows = pending[lev_p == lev]
                bad = self._search(Q, P, CL, rows, int(lev), k, limit, budget, out)
                if bad.numel():
                    failed.append(bad)
            pending = torch.cat(failed) if failed else pending[:0]
            level[pending] -= 1
        return out

    def _search(self, Q, P, CL, rows, lev, k, limit, budget, out) -> torch.Tensor:
        """Search ``rows`` at one level, write the finished ones into ``out``; return those to retry coarser."""
        C = CL[rows] >> (self.L - lev)
        start, count = self._ranges(C, lev)
        total = count.sum(1)
        srt = torch.argsort(total)
        rows, C, start, count, total = rows[srt], C[srt], start[srt], count[srt], total[srt]
        bound2 = self._bound2(P[rows], C, lev)
        retry = []
        i, nr = 0, rows.numel()
        totals = total.tolist()
        while i < nr:
            j = min(nr, i + max(1, budget // max(1, totals[i])))
            while j - i > 1 and totals[j - 1] * (j - i) > budget:
                j = i + max(1, (j - i) // 2)
            sl = slice(i, j)
            maxc = max(1, totals[j - 1])
            cum = count[sl].cumsum(1)  # b x 3^b
            t = torch.arange(maxc, device=Q.device).expand(j - i, maxc)
            cell = torch.searchsorted(cum, t.contiguous(), right=True).clamp_max(cum.shape[1] - 1)
            before = torch.gather(cum - count[sl], 1, cell)
            pos = (torch.gather(start[sl], 1, cell) + t - before).clamp(0, self.codes.numel() - 1)
            ref = self.perm[pos]  # b x maxc reference rows
            d2 = ((self.R[ref] - Q[rows[sl], None, :]) ** 2).sum(-1)
            ok = t < total[sl, None]
            if limit is not None:
                ok &= ref < limit[rows[sl], None]
            d2 = torch.where(ok, d2, torch.full_like(d2, float("inf")))
            kk = min(k, maxc)
            val, arg = torch.topk(d2, kk, dim=1, largest=False, sorted=True)
            idx = torch.where(torch.isfinite(val), torch.gather(ref, 1, arg), torch.full_like(arg, -1))
            found = torch.isfinite(val).sum(1)
            kth = val[:, k - 1] if kk == k else torch.full_like(val[:, 0], float("inf"))
            b2 = bound2[sl]
            done = torch.isinf(b2) | ((found >= k) & (kth <= b2))
            r = rows[sl]
            out[r[done], :kk] = idx[done]
            retry.append(r[~done])
            i = j
        return torch.cat(retry)

