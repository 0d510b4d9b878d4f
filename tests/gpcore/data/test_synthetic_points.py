"""The vectorised synthetic Ookla world (``synthetic.ookla_points``): its truth, its density, its seed."""

from __future__ import annotations

import numpy as np

from gpcore.data import synthetic


def test_ookla_points_follow_the_truth_and_stay_in_the_box():
    X, y, mu, sd = synthetic.ookla_points(50_000, seed=3, quarter_index=2)
    assert X.shape == (50_000, 2) and y.shape == mu.shape == sd.shape == (50_000,)
    w, e, s, n = synthetic.SYNTH_BBOX
    assert ((X[:, 0] >= w) & (X[:, 0] <= e) & (X[:, 1] >= s) & (X[:, 1] <= n)).all()
    mu_true, sd_true = synthetic.ookla_truth(X[:, 0], X[:, 1], 2)
    np.testing.assert_array_equal(mu, mu_true)
    np.testing.assert_array_equal(sd, sd_true)
    z = (y - mu) / sd  # N(0, 1): mean within 5 SE (0.022), sd within 0.03
    assert abs(z.mean()) < 0.022 and abs(z.std() - 1) < 0.03


def test_ookla_points_are_dense_in_cities_and_sparse_in_the_countryside():
    X, *_ = synthetic.ookla_points(40_000, seed=0)
    urban = synthetic.urban_intensity(X[:, 0], X[:, 1]) > 0.3
    U, *_ = synthetic.ookla_points(40_000, seed=0, city_share=0.0)  # uniform: the cities' share of the area
    area = synthetic.urban_intensity(U[:, 0], U[:, 1]) > 0.3
    assert area.mean() < 0.15 and urban.mean() > 3 * area.mean()


def test_ookla_points_are_seeded():
    a = synthetic.ookla_points(1000, seed=7)
    b = synthetic.ookla_points(1000, seed=7)
    c = synthetic.ookla_points(1000, seed=8)
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a[0], c[0])
