"""Orderings and nearest-neighbour sets of the Vecchia family (numpy / scipy; once per fit and per joint
prediction): the exact max-min ordering, the coordinate ordering and the exact ``m`` nearest predecessors
(docs/methods/vecchia.md, "Ordering and neighbours")."""

from __future__ import annotations

import heapq

import numpy as np

ORDERINGS = ("maxmin", "coord")



def maxmin_order(X: np.ndarray) -> np.ndarray:
    """Exact max-min ordering of the rows of ``X`` (``n x d``); returns a permutation of ``range(n)``.

    First the row nearest the centroid (lowest index on ties), then repeatedly the row whose
    distance to the rows already taken is largest (lowest index on ties).
    """
    from scipy.spatial import cKDTree

    X = np.asarray(X, dtype=np.float64)
    n = X.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    first = int(np.argmin(((X - X.mean(0)) ** 2).sum(1)))
    dist = np.sqrt(((X - X[first]) ** 2).sum(1))
    taken = np.zeros(n, dtype=bool)
    taken[first] = True
    order = [first]
    heap = [(-dist[i], i) for i in range(n) if i != first]
    heapq.heapify(heap)
    tree = cKDTree(X)
    while heap:
        negd, i = heapq.heappop(heap)
        if taken[i] or -negd != dist[i]:
            continue  # stale entry: the point was taken or has come closer since
        taken[i] = True
        order.append(i)
        r = dist[i]
        if r <= 0:  # only duplicates of taken points are left: they keep distance 0, take them in index order
            continue
        ball = np.asarray(tree.query_ball_point(X[i], r * (1.0 + 1e-9)), dtype=np.int64)
        ball = ball[~taken[ball]]
        if ball.size == 0:
            continue
        nd = np.sqrt(((X[ball] - X[i]) ** 2).sum(1))
        closer = nd < dist[ball]
        for j, dj in zip(ball[closer].tolist(), nd[closer].tolist(), strict=True):
            dist[j] = dj
            heapq.heappush(heap, (-dj, j))
    return np.asarray(order, dtype=np.int64)


def coord_order(X: np.ndarray) -> np.ndarray:
    """Order by the first coordinate (stable: ties keep their input order)."""
    return np.argsort(np.asarray(X, dtype=np.float64)[:, 0], kind="stable")


def ordered_neighbors(Xo: np.ndarray, m: int, brute_below: int = 2048, start: int = 0) -> np.ndarray:
    """The ``m`` nearest predecessors of every row of the already-ordered ``Xo`` (``n x d``).

    Returns ``n x m`` int64 row indices into ``Xo``, nearest first, ``-1`` where row ``i`` has fewer
    than ``m`` predecessors (``i < m``). Exact: brute force for the first ``brute_below`` rows, then
    KD-tree queries over all rows with ``k`` growing until ``m`` predecessors are among them.
    With ``start > 0`` only rows ``start ..`` are searched (rows appended to an ordered set, e.g. new conditioning
    rows): the result is ``(n - start) x m``, row ``i - start`` for row ``i``.
    """
    from scipy.spatial import cKDTree

    Xo = np.asarray(Xo, dtype=np.float64)
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
        idx = np.argsort(D, axis=1, kind="stable")[:, :k]
        valid = np.take_along_axis(D, idx, 1) < np.inf
        out[s:e, :k] = np.where(valid, idx, -1)
    rest = np.arange(max(nb, start), n)
    if rest.size == 0:
        return out[start:]
    tree = cKDTree(Xo)
    k = min(n, 4 * m)
    while rest.size:
        k = min(n, k)
        _, idx = tree.query(Xo[rest], k=k)
        idx = idx.reshape(rest.size, k)
        pred = idx < rest[:, None]
        done = pred.sum(1) >= m
        if k >= n:
            done[:] = True  # every row has >= m predecessors here (rest starts at nb > m)
        if done.any():
            rows = np.flatnonzero(done)
            sel = np.argsort(~pred[rows], axis=1, kind="stable")[:, :m]  # first m predecessors, nearest first
            out[rest[rows]] = np.take_along_axis(idx[rows], sel, 1)
        rest = rest[~done]
        k *= 4
    return out[start:]
