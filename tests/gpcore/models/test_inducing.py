"""The shared inducing-point k-means (SVGP / PPGP / SV-DKL, SoftKI, SOLVE-GP)."""

from __future__ import annotations

import numpy as np
import torch

from gpcore.models.inducing import kmeans, kmeans_objective

DT = torch.float64


def _clusters(seed=0, n=60):
    g = torch.Generator().manual_seed(seed)
    centres = torch.tensor([[-0.8, -0.8], [0.0, 0.7], [0.8, -0.5]], dtype=DT)
    return centres, torch.cat([c + 0.05 * torch.randn(n, 2, generator=g, dtype=DT) for c in centres])


def test_kmeans_recovers_separated_clusters_and_is_seeded():
    centres, X = _clusters()
    C = kmeans(X, 3, iters=10, seed=3)
    order = torch.cdist(centres, C).argmin(-1)
    assert sorted(order.tolist()) == [0, 1, 2]
    # converged centres are the cluster means
    torch.testing.assert_close(C[order], torch.stack([X[60 * i : 60 * (i + 1)].mean(0) for i in range(3)]))
    assert torch.equal(kmeans(X, 3, iters=10, seed=3), C)
    assert torch.equal(kmeans(X, 3, iters=10, generator=torch.Generator().manual_seed(3)), C)


def test_lloyd_iterations_do_not_increase_the_objective_and_centres_are_distinct():
    _, X = _clusters(1)
    X = torch.cat([X, X[:30]])  # duplicated rows (repeated map tiles) must not give duplicated centres
    C0 = kmeans(X, 12, iters=0, seed=1)
    C1 = kmeans(X, 12, iters=10, seed=1)
    assert float(kmeans_objective(X, C1)) <= float(kmeans_objective(X, C0))
    assert torch.unique(C0, dim=0).shape[0] == 12 and torch.unique(C1, dim=0).shape[0] == 12
    # the seeding picks data rows
    assert (torch.cdist(C0, X).min(1).values < 1e-6).all()  # cdist rounds at sqrt(eps)


def test_kmeans_plus_plus_beats_the_objective_of_random_distinct_rows_on_average():
    """D^2 seeding spreads the centres: over seeds its objective is below that of k random rows."""
    rng = np.random.default_rng(5)
    X = torch.tensor(np.concatenate([rng.normal(c, 0.02, (200, 2)) for c in np.linspace(-1, 1, 8)]))
    pp = [float(kmeans_objective(X, kmeans(X, 8, iters=0, seed=s))) for s in range(10)]
    rand = [float(kmeans_objective(X, X[torch.randperm(len(X), generator=torch.Generator().manual_seed(s))[:8]]))
            for s in range(10)]
    assert np.mean(pp) < 0.5 * np.mean(rand)


def test_fewer_distinct_rows_than_centres_fill_the_bounding_box():
    _, X = _clusters(2)
    few = torch.cat([X[:4], X[:4]])
    C = kmeans(few, 7, iters=3, seed=0)
    assert C.shape == (7, 2) and torch.unique(C, dim=0).shape[0] == 7
    assert (torch.cdist(X[:4], C).min(1).values < 1e-6).all()  # every distinct row is a centre
    lo, hi = X[:4].min(0).values, X[:4].max(0).values
    assert ((C >= lo) & (C <= hi)).all()


def test_max_points_subsamples_and_float32_works():
    _, X = _clusters(3, n=400)
    C = kmeans(X.float(), 5, iters=5, seed=0, max_points=100, chunk=37)
    assert C.dtype == torch.float32 and C.shape == (5, 2) and torch.isfinite(C).all()
    # every centre lies in the data's bounding box
    assert ((C >= X.min(0).values.float() - 1e-6) & (C <= X.max(0).values.float() + 1e-6)).all()
