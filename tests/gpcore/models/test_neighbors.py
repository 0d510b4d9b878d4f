"""The lattice ordering of the joint posterior's new places (gpcore/models/neighbors.py, docs/decide.md "The order
of the new places") against a plain per-level reference; the max-min ordering and the neighbour sets
are checked against brute force in test_vecchia.py."""

from __future__ import annotations

import numpy as np
import pytest

from gpcore.models.neighbors import lattice_order, maxmin_order


def _finest_squares(X: np.ndarray):
    """``(lo, span, bits, q)``: the bounding square's corner and side, the finest level and each row's integer square
    coordinates there (``n x d``)."""
    lo, bits = X.min(0), min(30, 63 // X.shape[1])
    span = float((X.max(0) - lo).max())
    return lo, span, bits, np.clip(np.floor((X - lo) * (2.0**bits / span)).astype(np.int64), 0, 2**bits - 1)


def _lattice_levels(X: np.ndarray) -> tuple[list[set[int]], list[int]]:
    """The rows each level takes, by the definition (a dictionary of squares per level, no sorting tricks), and the
    rows no level takes (duplicates of taken rows), by index."""
    n = X.shape[0]
    lo, span, bits, q = _finest_squares(X)
    taken: set[int] = set()
    levels = []
    for level in range(bits + 1):
        squares: dict[tuple, list[int]] = {}
        for i in range(n):
            squares.setdefault(tuple(q[i] >> (bits - level)), []).append(i)
        picks = set()
        for key, rows in squares.items():
            if taken.intersection(rows):
                continue
            centre = lo + (np.asarray(key) + 0.5) * (span / 2.0**level)
            dist = [float(((X[i] - centre) ** 2).sum()) for i in rows]
            picks.add(min(rows, key=lambda i: (dist[rows.index(i)], i)))  # nearest the centre, lowest index on ties
        if picks:
            levels.append(picks)
            taken |= picks
        if len(taken) == n:
            break
    return levels, sorted(set(range(n)) - taken)


def _morton(X: np.ndarray) -> np.ndarray:
    """Each row's Morton (Z-order) code at the finest level: bit b of coordinate j at position b d + j."""
    n, d = X.shape
    _, _, bits, q = _finest_squares(X)
    return np.array([sum(((int(q[i, j]) >> b) & 1) << (b * d + j) for b in range(bits) for j in range(d))
                     for i in range(n)], dtype=object)


def _cases():
    rng = np.random.default_rng(4)
    g = np.linspace(0.0, 1.0, 17)
    grid = np.stack(np.meshgrid(g, g[:9]), -1).reshape(-1, 2)  # a wide regular grid: ties at every level
    dup = rng.uniform(-1, 1, (40, 2))
    return {"uniform2d": rng.uniform(-1, 1, (300, 2)), "grid_with_ties": grid,
            "clustered": np.concatenate([rng.normal(0, 0.01, (100, 2)), rng.uniform(-3, 3, (50, 2))]),
            "space_time": rng.uniform(0, 1, (200, 3)), "duplicates": np.concatenate([dup, dup[:15], dup[:3]]),
            "line": rng.uniform(0, 1, (50, 1))}


@pytest.mark.parametrize("case", list(_cases()))
def test_lattice_order_takes_each_levels_squares_by_the_definition(case):
    X = _cases()[case]
    order = lattice_order(X)
    assert sorted(order.tolist()) == list(range(len(X)))
    code = _morton(X)
    levels, rest = _lattice_levels(X)
    start = 0
    for rows in levels:
        block = order[start : start + len(rows)]
        assert set(block.tolist()) == rows
        assert (np.diff(code[block]) > 0).all()  # one row per square, in the squares' Morton order
        start += len(rows)
    assert order[start:].tolist() == rest
    assert bool(rest) == (case == "duplicates")


def test_lattice_order_spreads_its_first_rows_like_max_min():
    """Coarse to fine: the first k rows cover the set nearly as well as max-min's first k (the largest distance of
    any row to the rows taken so far; measured 1.3-1.5 times max-min's), better than a random order."""
    X = np.random.default_rng(5).uniform(0, 1, (4000, 2))
    from scipy.spatial import cKDTree

    def fill(order, k):
        return cKDTree(X[order[:k]]).query(X)[0].max()

    lat, mm = lattice_order(X), maxmin_order(X)
    rand = np.random.default_rng(0).permutation(len(X))
    for k in (16, 64, 256, 1024):
        assert fill(mm, k) < fill(lat, k) < min(1.6 * fill(mm, k), fill(rand, k))


def test_lattice_order_edge_cases():
    assert lattice_order(np.zeros((0, 2))).shape == (0,)
    np.testing.assert_array_equal(lattice_order(np.ones((5, 2))), np.arange(5))
    X4 = np.random.default_rng(6).uniform(0, 1, (60, 4))  # more than three coordinates: the exact max-min
    np.testing.assert_array_equal(lattice_order(X4), maxmin_order(X4))
