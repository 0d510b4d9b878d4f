"""Orderings and nearest-neighbour sets of the Vecchia family (once per fit and per joint prediction): the exact
max-min ordering, the coordinate ordering, the lattice ordering of the joint posterior's new places, the exact ``m``
nearest predecessors and the nearest training points of new places (docs/methods/vecchia.md, "Ordering and
neighbours"; docs/decide.md, "The order of the new places").

Neighbour searches run where the model does: a KD-tree (scipy, every CPU core) for a model on the CPU, the torch
grid search of :mod:`gpcore.models.grid_search` on an accelerator; both are exact, so they return the same sets
(docs/methods/vecchia.md, "Neighbour search on a GPU"). The ordering is numpy on the CPU either way."""

from __future__ import annotations

import heapq
import os

import numpy as np
import torch

ORDERINGS = ("maxmin", "coord")
#: KD-tree queries use every core (scipy's ``workers``; the sets are exact, so the same on any number of cores)
WORKERS = -1
SEARCHES = ("auto", "grid", "kdtree")
#: where neighbour searches run: ``"auto"`` the grid search on an accelerator and the KD-tree on the CPU; ``"grid"`` /
#: ``"kdtree"`` one of them everywhere (``$UA_NEIGHBOR_SEARCH``; the tests run the grid search on the CPU)
SEARCH = os.environ.get("UA_NEIGHBOR_SEARCH", "auto").strip() or "auto"


def use_grid(device) -> bool:
    """Whether a search for points on ``device`` (None: the CPU) uses the grid search (:data:`SEARCH`)."""
    if SEARCH not in SEARCHES:
        from gpcore.errors import ConfigError

        raise ConfigError(f"environment variable UA_NEIGHBOR_SEARCH={SEARCH!r} is not a neighbour search: set it to "
                          f"one of {', '.join(SEARCHES)}, or unset it (auto)")
    if SEARCH != "auto":
        return SEARCH == "grid"
    return device is not None and torch.device(device).type != "cpu"


class NearestIndex:
    """The ``k`` nearest rows of ``ref`` (``n x d`` numpy) for query rows: ``query(Q, k)`` returns ``q x k`` int64
    indices, nearest first, as a tensor on ``device`` (a KD-tree on the CPU, the grid search elsewhere)."""

    def __init__(self, ref: np.ndarray, device=None):
        self.device = torch.device(device if device is not None else "cpu")
        self.n = int(ref.shape[0])
        if use_grid(device):
            from gpcore.models.grid_search import GridIndex

            ref_t = torch.as_tensor(np.asarray(ref, dtype=np.float64), device=self.device)
            self.grid, self.tree = GridIndex(ref_t), None
        else:
            from scipy.spatial import cKDTree

            self.grid, self.tree = None, cKDTree(np.asarray(ref, dtype=np.float64))

    def query(self, Q: np.ndarray, k: int) -> torch.Tensor:
        k = min(int(k), self.n)
        if self.grid is not None:
            return self.grid.query(torch.as_tensor(np.asarray(Q, dtype=np.float64), device=self.device), k)
        _, idx = self.tree.query(np.asarray(Q, dtype=np.float64), k=k, workers=WORKERS)
        return torch.as_tensor(np.asarray(idx, dtype=np.int64).reshape(len(Q), k), device=self.device)



def maxmin_order(X: np.ndarray, k_local: int = 16) -> np.ndarray:
    """Exact max-min ordering of the rows of ``X`` (``n x d``); returns a permutation of ``range(n)``.

    First the row nearest the centroid (lowest index on ties), then repeatedly the row whose
    distance to the rows already taken is largest (lowest index on ties).

    A lazy max-heap of upper bounds: taking a row lowers its neighbours' distances in the array only, and an entry
    that reaches the top with a stale bound goes back with its current distance unless that still beats every other
    bound (an entry whose current distance is no worse than all bounds is the true maximum, since every other entry
    bounds its row from above). A taken row's radius is usually inside its ``k_local`` nearest rows (one vectorised
    query for all rows); only larger radii query the KD-tree.
    """
    from scipy.spatial import cKDTree

    X = np.asarray(X, dtype=np.float64)
    n = X.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    first = int(np.argmin(((X - X.mean(0)) ** 2).sum(1)))
    dist = np.sqrt(((X - X[first]) ** 2).sum(1))
    order = np.empty(n, dtype=np.int64)
    order[0] = first
    count = 1
    tree = cKDTree(X)
    k = min(n, k_local + 1)
    knn_d, knn_i = tree.query(X, k=k, workers=WORKERS)
    knn_d, knn_i = knn_d.reshape(n, k), knn_i.reshape(n, k)
    reach = knn_d[:, -1].tolist()
    # Each heap entry is one Python int, ((2^63 - bits(d)) << sh) | i: for d >= 0 the IEEE bits of a float64 order
    # as the values do, so the smallest key is the largest distance and, among equal distances, the lowest index --
    # the same order as (-d, i) tuples, whose comparisons made the heap three times slower
    bits = dist.view(np.int64)  # shares dist's memory: the updates below show through
    bits_at, dist_at = bits.item, dist.item
    sh = max(1, int(n).bit_length())
    mask, top = (1 << sh) - 1, 1 << 63
    heap = [((top - b) << sh) | i for i, b in enumerate(bits.tolist()) if i != first]
    heapq.heapify(heap)
    pop, replace = heapq.heappop, heapq.heapreplace
    key = pop(heap) if heap else None
    while key is not None:
        i = key & mask
        current = ((top - bits_at(i)) << sh) | i
        if current != key and heap and current > heap[0]:
            key = replace(heap, current)  # stale bound: back with its current distance, the best bound out (one sift)
            continue
        # current bound, or a stale one whose current distance still beats every other bound: the maximum
        order[count] = i
        count += 1
        r = dist_at(i)
        if r > 0:  # r = 0: only duplicates of taken points are left, taken in index order
            r = r * (1.0 + 1e-9)
            if r < reach[i]:
                ball, nd = knn_i[i], knn_d[i]
            else:
                ball = np.asarray(tree.query_ball_point(X[i], r), dtype=np.int64)
                nd = np.sqrt(((X[ball] - X[i]) ** 2).sum(1))
            dist[ball] = np.minimum(dist[ball], nd)
        key = pop(heap) if heap else None
    return order


def lattice_order(X: np.ndarray) -> np.ndarray:
    """Coarse-to-fine lattice ordering of the rows of ``X`` (``n x d``, ``d <= 3``; more dimensions: the exact
    :func:`maxmin_order`); returns a permutation of ``range(n)``.

    The rows' bounding square (side ``s``, the largest extent) is cut into ``2^l`` squares per side at levels
    ``l = 0, 1, ..``; level ``l`` takes, in every square holding none of the rows taken so far, its row nearest the
    square's centre (ties: lowest index), in the Morton (Z-order) order of the squares; rows that never get a square
    of their own (duplicates) come last, by index. Like the max-min ordering, each level spreads its rows about
    ``s / 2^l`` apart and fills the gaps of the levels before; but one Morton sort makes every square of every level
    a contiguous run, so each level is a few vectorised passes (``O(n)``) where the max-min heap loop is a Python step
    per row (docs/decide.md, "The order of the new places", with the accuracy of both).
    """
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    if d > 3:
        return maxmin_order(X)
    if n < 2:
        return np.arange(n, dtype=np.int64)
    lo = X.min(0)
    span = float((X.max(0) - lo).max())
    if span <= 0.0:  # every row the same point
        return np.arange(n, dtype=np.int64)
    bits = min(30, 63 // d)
    q = np.clip(np.floor((X - lo) * (2.0**bits / span)).astype(np.int64), 0, 2**bits - 1)
    code = np.zeros(n, dtype=np.int64)
    for b in range(bits):  # Morton code: bit b of dimension j at position b d + j
        for j in range(d):
            code |= ((q[:, j] >> b) & 1) << (b * d + j)
    perm = np.argsort(code, kind="stable")  # every square of every level is one contiguous run of perm
    code, q, Xp = code[perm], q[perm], X[perm]
    inv = np.empty(n, dtype=np.int64)
    inv[perm] = np.arange(n)
    taken = np.zeros(n, dtype=bool)
    out = []
    for level in range(bits + 1):
        key = code >> (d * (bits - level))
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        free = ~np.logical_or.reduceat(taken, starts)  # squares holding no taken row
        if not free.any():
            continue
        run = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, n]))
        pos = np.flatnonzero(free[run])  # the rows of those squares, square by square
        centre = lo + ((q[pos] >> (bits - level)) + 0.5) * (span / 2.0**level)
        dist = ((Xp[pos] - centre) ** 2).sum(1)
        first = np.flatnonzero(np.r_[True, run[pos][1:] != run[pos][:-1]])
        near = dist == np.repeat(np.minimum.reduceat(dist, first), np.diff(np.r_[first, pos.size]))
        best = np.minimum.reduceat(np.where(near, perm[pos], n), first)  # lowest index among the nearest
        taken[inv[best]] = True
        out.append(best)
        if taken.all():
            break
    rest = perm[~taken]  # rows sharing the finest square with a taken row (duplicates)
    out.append(np.sort(rest))
    return np.concatenate(out)


def coord_order(X: np.ndarray) -> np.ndarray:
    """Order by the first coordinate (stable: ties keep their input order)."""
    return np.argsort(np.asarray(X, dtype=np.float64)[:, 0], kind="stable")


def ordered_neighbors(Xo: np.ndarray, m: int, brute_below: int = 2048, start: int = 0, device=None, on_rows=None):
    """The ``m`` nearest predecessors of every row of the already-ordered ``Xo`` (``n x d``).

    Returns ``n x m`` int64 row indices into ``Xo``, nearest first, ``-1`` where row ``i`` has fewer
    than ``m`` predecessors (``i < m``). Exact: brute force for the first ``brute_below`` rows, then for each
    block ``[s, 2s)`` KD-tree queries over its first ``2s`` rows with ``k`` growing until ``m`` predecessors are
    among them.
    With ``start > 0`` only rows ``start ..`` are searched (rows appended to an ordered set, e.g. new conditioning
    rows): the result is ``(n - start) x m``, row ``i - start`` for row ``i``.
    A numpy array from the KD-tree; with the grid search (:func:`use_grid` of ``device``) a tensor on ``device``: the
    same sets (ties between equally distant points aside), from the same blocks.
    ``on_rows(out, k)`` (KD-tree search, ``start = 0``): called each time rows ``< k`` of the array it returns are
    final, so that a caller on another thread can use them while the later rows are searched.
    """
    from scipy.spatial import cKDTree

    Xo = np.asarray(Xo, dtype=np.float64)
    if use_grid(device):
        return _ordered_grid(Xo, m, brute_below, start, torch.device(device if device is not None else "cpu"))
    n = Xo.shape[0]
    out = np.full((n, m), -1, dtype=np.int64)
    if n == 0 or m == 0:
        return out[start:]
    nb = min(n, max(brute_below, m + 1))
    block = 256
    for s in range(max(1, start), nb, block):  # row 0 has no predecessors
        e = min(s + block, nb)
        D = ((Xo[s:e, None, :] - Xo[None, :e, :]) ** 2).sum(-1)
        D[np.arange(e)[None, :] >= np.arange(s, e)[:, None]] = np.inf  # only predecessors
        k = min(m, e - 1)
        idx = _smallest_stable(D, k)
        valid = np.take_along_axis(D, idx, 1) < np.inf
        out[s:e, :k] = np.where(valid, idx, -1)
        if on_rows is not None:
            on_rows(out, e)
    # then blocks [s, 2s) of the ordering, each against a tree of its first 2s rows: at least half of a block row's
    # tree neighbours are its predecessors, so k ~ 2m finds them (a tree over all n rows needs k ~ m n / i)
    for s, e in _doubling_blocks(n, nb, start):
        tree = cKDTree(Xo[:e])
        rest = np.arange(s, e)
        k = min(e, 2 * m + 8)
        while rest.size:
            _, idx = tree.query(Xo[rest], k=k, workers=WORKERS)
            idx = idx.reshape(rest.size, k)
            pred = idx < rest[:, None]
            done = (pred.sum(1) >= m) | (k >= e)  # k = e: every predecessor is among them (rest >= nb > m)
            if done.any():
                rows = np.flatnonzero(done)
                first = pred[rows] & (np.cumsum(pred[rows], 1) <= m)  # the first m predecessors, nearest first
                out[rest[rows]] = idx[rows][first].reshape(rows.size, m)
            rest = rest[~done]
            k = min(e, 4 * k)
        if on_rows is not None:
            on_rows(out, e)
    return out[start:]


def _smallest_stable(D: np.ndarray, k: int) -> np.ndarray:
    """``np.argsort(D, axis=1, kind="stable")[:, :k]`` without sorting whole rows: each row's candidates are the
    entries no larger than its ``k``-th smallest (ties included, in column order), and only they are sorted."""
    if k >= D.shape[1]:
        return np.argsort(D, axis=1, kind="stable")[:, :k]
    cand = D <= np.partition(D, k - 1, axis=1)[:, k - 1 : k]
    count = cand.sum(1)
    r, c = np.nonzero(cand)  # row by row, columns ascending
    slot = np.arange(r.size) - np.repeat(np.cumsum(count) - count, count)
    cols = np.zeros((D.shape[0], int(count.max())), dtype=np.int64)
    vals = np.full(cols.shape, np.inf)
    cols[r, slot], vals[r, slot] = c, D[r, c]
    return np.take_along_axis(cols, np.argsort(vals, axis=1, kind="stable")[:, :k], 1)


def _doubling_blocks(n: int, nb: int, start: int):
    """The row blocks ``[s, 2s)`` (the last cut at ``n``) of an ordered set from row ``max(nb, start)`` on: each is
    searched against its first ``2s`` rows, at least half of them predecessors of a block row."""
    s = max(nb, start)
    while s < n:
        yield s, min(n, 2 * s)
        s = min(n, 2 * s)


def _ordered_grid(Xo: np.ndarray, m: int, brute_below: int, start: int, device: torch.device) -> torch.Tensor:
    """:func:`ordered_neighbors` by the grid search on ``device``: rows ``[1, nb)`` against the first ``nb`` rows, then
    each block ``[s, 2s)`` against its first ``2s`` rows (at least half of them predecessors of a block row)."""
    from gpcore.models.grid_search import GridIndex

    X = torch.as_tensor(Xo, device=device)
    n = X.shape[0]
    out = torch.full((n, m), -1, dtype=torch.long, device=device)
    if n == 0 or m == 0:
        return out[start:]
    nb = min(n, max(brute_below, m + 1))
    first = [(max(1, start), nb)] if max(1, start) < nb else []  # row 0 has no predecessors
    for s, e in first + list(_doubling_blocks(n, nb, start)):
        rows = torch.arange(s, e, device=device)
        out[s:e] = GridIndex(X[:e]).query(X[s:e], m, limit=rows)
    return out[start:]
