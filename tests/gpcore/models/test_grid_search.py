"""The torch grid search (gpcore/models/grid_search.py; docs/methods/vecchia.md, "Neighbour search on a GPU") against
dense brute force and the KD-tree, run on the CPU here and on CUDA where there is one; and the Vecchia family fitted
and predicting with it equals the KD-tree's fit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpcore import make_model
from gpcore.models import neighbors
from gpcore.models.grid_search import GridIndex
from gpcore.models.neighbors import NearestIndex, maxmin_order, ordered_neighbors, use_grid

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _cases():
    rng = np.random.default_rng(0)
    city = rng.normal(0.3, 0.003, (1500, 2))  # one dense city in sparse countryside, as Ookla tiles are
    return {
        "uniform": (rng.random((2000, 2)), rng.random((700, 2))),
        "city_and_outside": (np.concatenate([city, rng.random((600, 2))]), rng.random((700, 2)) * 1.6 - 0.3),
        "3d": (rng.normal(size=(1500, 3)), rng.normal(size=(400, 3))),
        "1d": (rng.random((1200, 1)), rng.random((300, 1)) * 1.2),
        "duplicates": (np.repeat(rng.random((60, 2)), 25, 0), rng.random((300, 2))),
        "collinear": (np.c_[rng.random(800), np.zeros(800)], np.c_[rng.random(200), rng.random(200) * 0.1]),
    }


def _dense_knn(R, Q, k, limit=None):
    """Distances of the ``k`` nearest rows of ``R`` per row of ``Q`` (sorted; ``inf`` pads), by a dense matrix."""
    D = np.sqrt(((Q[:, None, :] - R[None, :, :]) ** 2).sum(-1))
    if limit is not None:
        D[np.arange(R.shape[0])[None, :] >= limit[:, None]] = np.inf
    out = np.sort(D, axis=1)[:, :k]
    return np.pad(out, ((0, 0), (0, max(0, k - out.shape[1]))), constant_values=np.inf)


def _dists(R, Q, idx):
    d = np.sqrt(((R[np.maximum(idx, 0)] - Q[:, None, :]) ** 2).sum(-1))
    return np.where(idx >= 0, d, np.inf)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(_cases()))
def test_grid_knn_equals_dense_brute_force(case, device):
    R, Q = _cases()[case]
    k = 30
    idx = GridIndex(torch.as_tensor(R, device=device)).query(torch.as_tensor(Q, device=device), k).cpu().numpy()
    assert idx.shape == (Q.shape[0], k)
    d = _dists(R, Q, idx)
    np.testing.assert_allclose(d, _dense_knn(R, Q, k), rtol=0, atol=1e-12)  # the k nearest distances, nearest first
    assert all(len(set(row)) == k for row in idx)  # k distinct rows


@pytest.mark.parametrize("device", DEVICES)
def test_grid_knn_with_a_limit_takes_only_earlier_rows_and_pads(device):
    rng = np.random.default_rng(1)
    R = np.concatenate([rng.normal(0.5, 0.01, (400, 2)), rng.random((400, 2))])
    limit = rng.integers(0, R.shape[0], 500)
    Q = R[rng.integers(0, R.shape[0], 500)] + 1e-3 * rng.standard_normal((500, 2))
    k = 12
    idx = GridIndex(torch.as_tensor(R, device=device)).query(
        torch.as_tensor(Q, device=device), k, limit=torch.as_tensor(limit, device=device)).cpu().numpy()
    assert ((idx < limit[:, None]) | (idx == -1)).all()
    np.testing.assert_allclose(_dists(R, Q, idx), _dense_knn(R, Q, k, limit), rtol=0, atol=1e-12)
    assert ((idx == -1).sum(1) == np.maximum(0, k - limit)).all()  # -1 exactly where fewer than k rows qualify


def test_grid_knn_with_a_small_budget_and_no_rows():
    rng = np.random.default_rng(2)
    R, Q = rng.random((500, 2)), rng.random((100, 2))
    gi = GridIndex(torch.as_tensor(R))
    np.testing.assert_array_equal(gi.query(torch.as_tensor(Q), 9, budget=64).numpy(),
                                  gi.query(torch.as_tensor(Q), 9).numpy())  # chunking does not change the answer
    assert GridIndex(torch.as_tensor(R)).query(torch.zeros(0, 2, dtype=torch.float64), 5).shape == (0, 5)
    empty = GridIndex(torch.zeros(0, 2, dtype=torch.float64)).query(torch.as_tensor(Q), 3)
    assert empty.shape == (100, 3) and (empty == -1).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("start", [0, 1500])
def test_ordered_neighbours_by_the_grid_equal_the_kd_trees(monkeypatch, device, start):
    rng = np.random.default_rng(3)
    X = np.concatenate([rng.normal(0.3, 0.005, (1500, 2)), rng.random((1500, 2))])
    Xo = X[maxmin_order(X)]
    m = 10
    tree = ordered_neighbors(Xo, m, brute_below=256, start=start)
    monkeypatch.setattr(neighbors, "SEARCH", "grid")  # on the CPU too ("auto" takes it on an accelerator only)
    grid = ordered_neighbors(Xo, m, brute_below=256, start=start, device=device)
    assert isinstance(grid, torch.Tensor) and grid.device.type == device
    grid = grid.cpu().numpy()
    assert grid.shape == tree.shape == (3000 - start, m)
    rows = Xo[start:]
    np.testing.assert_allclose(_dists(Xo, rows, grid), _dists(Xo, rows, tree), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(grid, tree)  # continuous data: no ties, the same rows in the same order


def test_where_the_search_runs(monkeypatch):
    assert not use_grid(None) and not use_grid("cpu") and use_grid(torch.device("cuda"))
    monkeypatch.setattr(neighbors, "SEARCH", "grid")
    assert use_grid("cpu") and isinstance(NearestIndex(np.zeros((3, 2))).grid, GridIndex)
    monkeypatch.setattr(neighbors, "SEARCH", "kdtree")
    assert not use_grid("cuda") and NearestIndex(np.zeros((3, 2)), "cpu").grid is None
    monkeypatch.setattr(neighbors, "SEARCH", "gpu")
    with pytest.raises(ValueError, match="UA_NEIGHBOR_SEARCH='gpu'"):
        use_grid("cpu")


@pytest.mark.parametrize("name", ["vecchia", "dbk-nn"])
def test_a_fit_with_the_grid_search_equals_the_kd_trees(monkeypatch, name):
    """Fit, condition on validation rows, predict and the joint posterior: the same numbers with either search."""
    rng = np.random.default_rng(4)
    X = np.concatenate([rng.normal(0.4, 0.02, (150, 2)), rng.random((250, 2))])
    y = np.sin(6 * X[:, 0]) + X[:, 1] + 0.1 * rng.standard_normal(400)
    Xv, yv = rng.random((40, 2)), rng.standard_normal(40) * 0.1
    Xs = rng.random((60, 2)) * 1.2 - 0.1
    extra = dict(dbk_epochs=2, dbk_rank=8, dbk_hidden=8, feature_check=False) if name == "dbk-nn" else {}
    out = {}
    for search in ("kdtree", "grid"):
        monkeypatch.setattr(neighbors, "SEARCH", search)
        model = make_model(name, epochs=3, neighbors=8, dtype="float64", device="cpu", seed=0, **extra)
        model.fit(X, y, X_val=Xv, y_val=yv)
        p = model.predict(Xs)
        out[search] = (model.module_.nbr.cpu().numpy(), p.mean, p.var_f, model.posterior_cov(Xs[:20], Xs[:20]))
        assert model.train_info_["conditioned_on"]["validation"] == 40
        assert isinstance(model._neighbor_tree().grid, GridIndex) == (search == "grid")
    np.testing.assert_array_equal(out["grid"][0], out["kdtree"][0])
    for a, b in zip(out["grid"][1:], out["kdtree"][1:], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
