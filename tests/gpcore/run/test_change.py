"""The change posterior (gpcore/run/change.py, docs/methods/spacetime.md "The change posterior") against a dense
float64 oracle built in numpy from the model's own prior kernel, noise and mean: with every point conditioning on
all its predecessors (m = n - 1) the chunked joint change variance equals the exact GP's
var(f(x, t2) - f(x, t1)) = v1 + v2 - 2 c12, the mean its mean difference, and p_increase = Phi(mean / sd); the
independent-marginals variance v1 + v2 is not it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import norm

from gpcore import make_model
from gpcore.run.change import change_moments, change_table

QUARTERS = 2019.125 + 0.25 * np.arange(4)


def _data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    lon, lat = rng.uniform(-67.2, -65.6, n), rng.uniform(17.9, 18.5, n)
    t = rng.choice(QUARTERS, n)
    y = 1.3 + 0.3 * np.sin(3 * lon) * np.cos(4 * lat) + 0.2 * (t - 2019) + 0.05 * rng.normal(size=n)
    return np.column_stack([lon, lat, t]), y


def _cells(n=23, seed=7):
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.uniform(-67.3, -65.5, n), rng.uniform(17.85, 18.55, n)])


def _fit(kind: str):
    X, y = _data()
    n = len(y)
    model = make_model("vecchia", space_time=kind, dtype="float64", device="cpu", epochs=1, neighbors=n - 1,
                       pred_neighbors=n, joint_neighbors=400).fit(X, y)
    with torch.no_grad():  # hyperparameters away from their initial values
        model.module_.raw_ell_t.fill_(2.0)  # ell_t ~ 0.8 years: quarters correlated
        model.module_.raw_noise.fill_(-2.0)
    model.finalize(model.scale_x(X), model.scale_y(y))
    return model, X, y


def _dense_change(model, X, y, cells, t1, t2):
    """Exact GP posterior of f(x, t2) - f(x, t1) from the dense covariance (numpy, float64)."""
    Z = np.vstack([np.column_stack([cells, np.full(len(cells), t)]) for t in (t1, t2)])
    K = model.kernel(X) + model.noise_variance * np.eye(len(y))
    Kzx, Kzz = model.kernel(Z, X), model.kernel(Z)
    mean = model.prior_mean + Kzx @ np.linalg.solve(K, y - model.prior_mean)
    S = Kzz - Kzx @ np.linalg.solve(K, Kzx.T)
    c = len(cells)
    v1, v2, c12 = np.diag(S)[:c], np.diag(S)[c:], S[np.arange(c), c + np.arange(c)]
    return mean[c:] - mean[:c], v1 + v2 - 2 * c12, v1 + v2


@pytest.mark.parametrize("kind", ["separable", "gneiting"])
@pytest.mark.parametrize("chunk", [4, 256])
def test_change_variance_is_the_dense_joint_one_at_m_n_minus_1(kind, chunk):
    model, X, y = _fit(kind)
    cells = _cells()
    t1, t2 = 2019.375, 2020.125  # 2019Q2 -> 2020Q1: the later one beyond the data
    mean, var = change_moments(model, cells, t1, t2, chunk=chunk)
    d_mean, d_var, indep = _dense_change(model, X, y, cells, t1, t2)
    np.testing.assert_allclose(mean, d_mean, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(var, d_var, rtol=1e-6, atol=1e-10)
    assert np.all(indep > 1.02 * d_var), "the covariance term matters: two independent marginals overstate it"


def test_table_columns_interval_and_p_increase():
    model, X, y = _fit("separable")
    cells = _cells()
    import pandas as pd

    frame = pd.DataFrame({"cell_id": np.arange(100, 123), "lon": cells[:, 0], "lat": cells[:, 1]})
    t = change_table(model, frame, 2019.125, 2019.875, level=0.9, chunk=5)
    assert list(t.columns) == ["cell_id", "lon", "lat", "change_mean", "change_sd", "change_lo", "change_hi",
                               "p_increase"]
    assert t["cell_id"].tolist() == list(range(100, 123))
    np.testing.assert_allclose(t["p_increase"], norm.cdf(t["change_mean"] / t["change_sd"]))
    np.testing.assert_allclose(t["change_hi"] - t["change_mean"], norm.ppf(0.95) * t["change_sd"])
    np.testing.assert_allclose(t["change_mean"] - t["change_lo"], norm.ppf(0.95) * t["change_sd"])
    same = change_table(model, frame, 2019.125, 2019.125)
    assert np.allclose(same["change_mean"], 0) and np.allclose(same["change_sd"], 0, atol=1e-6)
