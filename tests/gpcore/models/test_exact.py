"""The exact-GP oracle against an independent numpy/scipy implementation (docs/methods/common.md §9.1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.linalg import cho_factor, cho_solve
from scipy.spatial.distance import cdist
from scipy.stats import multivariate_normal

from gpcore import make_model
from gpcore.models.linalg import gaussian_nll, kl_gauss_chol, kl_std_normal


def _np_kernel(name, A, B, ell, os_):
    r = cdist(A / ell, B / ell)
    if name == "rbf":
        return os_ * np.exp(-0.5 * r**2)
    if name == "matern12":
        return os_ * np.exp(-r)
    if name == "matern32":
        return os_ * (1 + np.sqrt(3) * r) * np.exp(-np.sqrt(3) * r)
    return os_ * (1 + np.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-np.sqrt(5) * r)


@pytest.mark.parametrize("kernel", ["rbf", "matern32", "matern52", "matern12"])
def test_exact_gp_matches_numpy_scipy(kernel):
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 10, size=(50, 2))
    y = 5 + np.sin(X[:, 0]) * X[:, 1] + 0.3 * rng.normal(size=50)
    Xt = rng.uniform(0, 10, size=(20, 2))
    model = make_model("exact", kernel=kernel, epochs=40, dtype="float64", device="cpu").fit(X, y)
    # read back the learned hyperparameters in caller units and redo everything in numpy
    ell = model.module_.lengthscale.detach().numpy() * model.x_span_ / 2.0
    os_ = model.module_.outputscale.item() * model.y_std_**2
    s2, mu0 = model.noise_variance, model.prior_mean
    K = _np_kernel(kernel, X, X, ell, os_)
    # 1e-7: the expanded |a|^2 - 2ab + |b|^2 distance has ~1e-16 |a|^2 cancellation error, which
    # Matern-1/2's non-smooth r = sqrt(d2) turns into ~1e-8 relative error on the diagonal
    np.testing.assert_allclose(model.kernel(X, X), K, rtol=1e-7, atol=1e-12)
    Ks = _np_kernel(kernel, Xt, X, ell, os_)
    c = cho_factor(K + s2 * np.eye(50), lower=True)
    mean = mu0 + Ks @ cho_solve(c, y - mu0)
    var = os_ - np.einsum("ij,ji->i", Ks, cho_solve(c, Ks.T))
    pred = model.predict(Xt)
    np.testing.assert_allclose(pred.mean, mean, rtol=1e-6 if kernel == "matern12" else 1e-8)
    np.testing.assert_allclose(pred.var_f, var, rtol=1e-6, atol=1e-10)
    # log marginal likelihood (9.1.1) in scaled units + Jacobian of the target standardisation
    Xs, ys = model.scale_x(X), model.scale_y(y)
    lp = model.log_marginal_likelihood(Xs, ys).item() - 50 * np.log(model.y_std_)
    ref = multivariate_normal.logpdf(y, mean=np.full(50, mu0), cov=K + s2 * np.eye(50))
    assert lp == pytest.approx(ref, rel=1e-9)


def test_exact_gp_learns_and_refuses_huge_n():
    rng = np.random.default_rng(1)
    X = rng.uniform(-1, 1, size=(200, 1))
    y = np.sin(4 * X[:, 0]) + 0.1 * rng.normal(size=200)
    model = make_model("exact", dtype="float64", device="cpu").fit(X, y)
    assert 0.003 < model.noise_variance < 0.03  # true noise variance 0.01
    with pytest.raises(ValueError, match="max_n"):
        make_model("exact", max_n=100).fit(X, y)


def test_kl_closed_forms_match_torch():
    g = torch.Generator().manual_seed(0)
    r = 5
    m = torch.randn(r, generator=g, dtype=torch.float64)
    L = torch.tril(torch.randn(r, r, generator=g, dtype=torch.float64), -1) + torch.diag(
        torch.rand(r, generator=g, dtype=torch.float64) + 0.2
    )
    q = torch.distributions.MultivariateNormal(m, scale_tril=L)
    p = torch.distributions.MultivariateNormal(torch.zeros(r, dtype=torch.float64), torch.eye(r, dtype=torch.float64))
    assert kl_std_normal(m, L).item() == pytest.approx(torch.distributions.kl_divergence(q, p).item(), rel=1e-12)
    L0 = torch.linalg.cholesky(torch.eye(r, dtype=torch.float64) * 2 + 0.3)
    p0 = torch.distributions.MultivariateNormal(torch.zeros(r, dtype=torch.float64), scale_tril=L0)
    assert kl_gauss_chol(m, L, L0).item() == pytest.approx(torch.distributions.kl_divergence(q, p0).item(), rel=1e-12)
    assert kl_gauss_chol(torch.zeros(r, dtype=torch.float64), L0, L0).item() == pytest.approx(0.0, abs=1e-12)
    assert kl_gauss_chol(m, L, L0).item() > 0


def test_expected_log_likelihood_closed_form_monte_carlo():
    rng = np.random.default_rng(0)
    mu, v, y, s2 = 0.3, 0.5, 1.1, 0.2
    f = rng.normal(mu, np.sqrt(v), size=400_000)
    mc = np.mean(-gaussian_nll(torch.tensor(y), torch.tensor(f), torch.tensor(s2)).numpy())
    closed = -gaussian_nll(torch.tensor(y), torch.tensor(mu), torch.tensor(s2)).item() - v / (2 * s2)
    assert mc == pytest.approx(closed, abs=4 * np.std(-gaussian_nll(torch.tensor(y), torch.tensor(f),
                                                                      torch.tensor(s2)).numpy()) / np.sqrt(4e5))
