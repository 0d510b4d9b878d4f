"""Joint posterior (gpcore/posterior.py) against dense float64 oracles built from each model's own kernel.

Every oracle here is computed from ``model.kernel`` / ``model.noise_variance`` (caller units) or from a
documented equivalent form of the model (SOLVE-GP's structured SVGP over ``Z ∪ O``, 6.6), never from the
feature-form code under test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpcore import make_model
from gpcore.models.linalg import inv_softplus
from gpcore.posterior import JointPosterior
from tests.gpcore.models.battery import toy_data

SETTINGS = {
    "dbk-mml": dict(rank=12, hidden=8, epochs=5),
    "dbk": dict(rank=12, hidden=8, epochs=3),
    "dbk-rbf": dict(rank=12, hidden=8, epochs=3),
    "svgp": dict(num_inducing=8, epochs=3),
    "sv-dkl": dict(num_inducing=8, hidden=8, epochs=3),
    "softki": dict(num_inducing=8, epochs=3),
    "solvegp": dict(num_inducing=6, num_orthogonal=5, epochs=3),
    "exact": dict(epochs=5),
    "cagp": dict(num_actions=8, epochs=3),
}


@pytest.fixture(scope="module")
def data():
    X, y = toy_data(n=96, seed=3)
    return X[:60], y[:60], X[60:]


_CACHE: dict = {}


def fitted(name, data):
    if name not in _CACHE:
        Xtr, ytr, _ = data
        _CACHE[name] = make_model(name, dtype="float64", device="cpu", seed=0, **SETTINGS[name]).fit(Xtr, ytr)
    return _CACHE[name]


def gp_posterior(K_tt, K_st, K_ss, s2):
    """Dense GP posterior covariance of the test set given noisy training data (float64)."""
    A = K_tt + s2 * np.eye(K_tt.shape[0])
    return K_ss - K_st @ np.linalg.solve(A, K_st.T)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_marginals_match_predict(name, data):
    """The feature form reproduces each model's own prediction path (mean and latent variance)."""
    model = fitted(name, data)
    Xte = data[2]
    jp = JointPosterior(model)
    pred = model.predict(Xte)
    mean, var = jp.marginals(Xte)
    np.testing.assert_allclose(mean, pred.mean, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(var, pred.var_f, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(np.diag(jp.cov(Xte)), pred.var_f, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name", ["dbk-mml", "exact", "softki"])
def test_cov_equals_dense_gp_posterior(name, data):
    """Exact-posterior models: posterior_cov = K** - K*X (K_XX + s2 I)^{-1} K_X* with the model's kernel."""
    model = fitted(name, data)
    Xtr, _, Xte = data
    jp = JointPosterior(model)
    oracle = gp_posterior(model.kernel(Xtr), model.kernel(Xte, Xtr), model.kernel(Xte), model.noise_variance)
    got = jp.cov(Xte)
    np.testing.assert_allclose(got, oracle, rtol=1e-6, atol=1e-8 * np.abs(oracle).max())
    cross = jp.cov(Xte[:5], Xte[10:17])
    np.testing.assert_allclose(cross, oracle[:5, 10:17], rtol=1e-6, atol=1e-8 * np.abs(oracle).max())


def test_cov_dbk_dppgp_is_q_pushed_through_features(data):
    """dPPGP: the posterior over f is q(w) = N(m, L L^T) pushed through phi (2.7), no residual."""
    model = fitted("dbk", data)
    Xte = data[2]
    Phi = model.features(Xte).double().numpy()
    m, F = (t.detach().double().numpy() for t in model.posterior_q())
    oracle = Phi @ F @ F.T @ Phi.T * model.y_std_**2
    np.testing.assert_allclose(JointPosterior(model).cov(Xte), oracle, rtol=1e-9, atol=1e-12)


def _svgp_optimal(data):
    """SVGP with q set to its ELBO optimum, so its posterior is the Titsias (SGPR) posterior."""
    Xtr, ytr, _ = data
    model = make_model("svgp", dtype="float64", device="cpu", seed=0, num_inducing=6, epochs=3).fit(Xtr, ytr)
    with torch.no_grad():  # lengthscales shorter than the inducing spacing: a large, correlated residual
        model.module_.raw_ell.fill_(inv_softplus(0.4))
    Xs, ys = model.scale_x(Xtr), model.scale_y(ytr)
    model.set_q(*model.optimal_q(Xs, ys))
    return model


def test_svgp_cov_equals_titsias_posterior_with_residual(data):
    """SVGP at the optimal q: Sigma = K** - Q** + K*Z Kzz^-1 S_u Kzz^-1 KZ*, S_u = Kzz (Kzz + KZX KXZ / s2)^-1 Kzz.

    The K** - Q** part is the Nyström residual; dropping its off-diagonal (treating it as independent
    per place) must be detectably wrong for an area's variance.
    """
    model = _svgp_optimal(data)
    Xtr, _, Xte = data
    Z = model.inducing_points
    s2 = model.noise_variance
    jit = model.config.jitter * float(model.module_.outputscale.detach()) * model.y_std_**2
    Kzz = model.kernel(Z) + jit * np.eye(Z.shape[0])
    Kzx, Ksz = model.kernel(Z, Xtr), model.kernel(Xte, Z)
    Su = Kzz @ np.linalg.solve(Kzz + Kzx @ Kzx.T / s2, Kzz)
    B = np.linalg.solve(Kzz, Ksz.T)  # Kzz^-1 KZ*
    oracle = model.kernel(Xte) - Ksz @ B + B.T @ Su @ B
    jp = JointPosterior(model)
    got = jp.cov(Xte)
    np.testing.assert_allclose(got, oracle, rtol=1e-6, atol=1e-8 * np.abs(oracle).max())

    # an "area": the 12 test places nearest to one place, uniform weights
    order = np.argsort(np.linalg.norm(Xte - Xte[0], axis=1))[:12]
    w = np.full(12, 1 / 12)
    mean, var = jp.linear(Xte, [(order, w)])
    pred = model.predict(Xte)
    np.testing.assert_allclose(mean[0], w @ pred.mean[order], rtol=1e-10)
    np.testing.assert_allclose(var[0], w @ oracle[np.ix_(order, order)] @ w, rtol=1e-6)
    resid = model.kernel(Xte) - Ksz @ B
    indep = oracle - resid + np.diag(np.diag(resid))  # residual treated as independent per place
    wrong = w @ indep[np.ix_(order, order)] @ w
    assert abs(wrong - var[0]) > 0.2 * var[0], (wrong, var[0])


def test_solvegp_cov_equals_structured_svgp(data):
    """SOLVE-GP = SVGP over Z ∪ O with q(u, v) of 6.6: Sigma = K** - K*J KJJ^-1 KJ* + K*J KJJ^-1 S KJJ^-1 KJ*."""
    model = fitted("solvegp", data)
    Xte = data[2]
    mod = model.module_
    with torch.no_grad():
        mean_j, S = (t.numpy() for t in model.joint_q())
        Xs = model.scale_x(Xte).double()
        J = torch.cat([mod.Z, mod.O]).double()
        M = mod.Z.shape[0]
        jit = mod.jitter * float(mod.outputscale)
        Kjj = mod.K(J, J).double().numpy() + jit * np.eye(J.shape[0])
        Ksj = mod.K(Xs, J).double().numpy()
        Kss = mod.K(Xs, Xs).double().numpy()
    B = np.linalg.solve(Kjj, Ksj.T)
    oracle = (Kss - Ksj @ B + B.T @ S @ B) * model.y_std_**2
    mean = (float(mod.mu0) + B.T @ mean_j) * model.y_std_ + model.y_mean_
    jp = JointPosterior(model)
    # the jitter enters SOLVE-GP's two Cholesky factors slightly differently from one K_JJ + jit I
    np.testing.assert_allclose(jp.cov(Xte), oracle, rtol=1e-5, atol=1e-5 * np.abs(oracle).max())
    np.testing.assert_allclose(jp.marginals(Xte)[0], mean, rtol=1e-6, atol=1e-6)
    assert M > 0


def test_cagp_cov_equals_dense_projection(data):
    """CaGP: Sigma = K** - K*X S (S^T (K + s2 I) S)^{-1} S^T KX* with the dense actions (5.1)."""
    model = fitted("cagp", data)
    Xtr, _, Xte = data
    S = model.module_.actions().dense(Xtr.shape[0]).detach().double().numpy()
    K = model.kernel(Xtr)
    A = S.T @ (K + model.noise_variance * np.eye(K.shape[0])) @ S
    KsS = model.kernel(Xte, Xtr) @ S
    oracle = model.kernel(Xte) - KsS @ np.linalg.solve(A, KsS.T)
    np.testing.assert_allclose(JointPosterior(model).cov(Xte), oracle, rtol=1e-6, atol=1e-8 * np.abs(oracle).max())


@pytest.mark.parametrize("name", ["dbk-mml", "svgp", "solvegp", "exact"])
def test_areal_mean_and_variance(name, data):
    """Weighted means: w^T m and w^T Sigma w from the dense covariance, for several overlapping groups."""
    model = fitted(name, data)
    Xte = data[2]
    jp = JointPosterior(model)
    Sigma = jp.cov(Xte)
    mean = model.predict(Xte).mean
    rng = np.random.default_rng(0)
    groups = [(np.arange(0, 20), rng.uniform(0.1, 1, 20)), (np.array([3, 7, 30, 31]), np.full(4, 0.25)),
              (np.arange(36), np.full(36, 1 / 36))]
    m, v = jp.linear(Xte, groups, block=7)  # a small block exercises the blocked residual sum
    for g, (idx, w) in enumerate(groups):
        np.testing.assert_allclose(m[g], w @ mean[idx], rtol=1e-9)
        np.testing.assert_allclose(v[g], w @ Sigma[np.ix_(idx, idx)] @ w, rtol=1e-7)


@pytest.mark.parametrize("name", ["dbk", "softki", "svgp", "solvegp", "exact", "cagp"])
def test_samples_match_mean_and_cov(name, data):
    """20,000 pathwise samples: empirical mean and covariance within Monte-Carlo error; seeds reproduce."""
    model = fitted(name, data)
    Xte = data[2][:6]
    jp = JointPosterior(model)
    Sigma, mean = jp.cov(Xte), model.predict(Xte).mean
    N = 20000
    S = jp.sample(Xte, N, seed=7, num_features=128)
    sd = np.sqrt(np.diag(Sigma))
    assert np.all(np.abs(S.mean(0) - mean) < 5 * sd / np.sqrt(N) + 1e-12)
    emp = np.cov(S.T)
    # sd of an empirical covariance entry is sqrt((S_ii S_jj + S_ij^2) / N); random features make the
    # draws slightly heavier-tailed than Gaussian, hence the wide 6 sigma
    tol = 6 * np.sqrt((np.outer(sd**2, sd**2) + Sigma**2) / N)
    assert np.all(np.abs(emp - Sigma) < tol + 1e-12), np.max(np.abs(emp - Sigma) / tol)
    np.testing.assert_array_equal(jp.sample(Xte, 3, seed=11), jp.sample(Xte, 3, seed=11))
    assert not np.array_equal(jp.sample(Xte, 3, seed=11), jp.sample(Xte, 3, seed=12))


def test_samples_need_the_residual_correlation(data):
    """Samples of an SVGP whose residual dominates: the empirical covariance of nearby places carries the
    residual's off-diagonal, which an independent-residual sampler would miss."""
    model = _svgp_optimal(data)
    Xte = data[2]
    order = np.argsort(np.linalg.norm(Xte - Xte[0], axis=1))[:4]
    jp = JointPosterior(model)
    Sigma = jp.cov(Xte[order])
    S = jp.sample(Xte[order], 20000, seed=3, num_features=256)
    emp = np.cov(S.T)
    sd = np.sqrt(np.diag(Sigma))
    tol = 6 * np.sqrt((np.outer(sd**2, sd**2) + Sigma**2) / 20000)
    assert np.all(np.abs(emp - Sigma) < tol)


def test_no_feature_form_is_a_clear_error(data):
    from gpcore import InputError
    from gpcore.models import GPModel

    class Bare(GPModel):
        pass

    m = Bare()
    m.module_ = torch.nn.Module()
    with pytest.raises(InputError, match="no feature form"):
        JointPosterior(m)
