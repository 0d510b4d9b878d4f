"""The pair posterior (gpcore/models/vecchia_pairs.py, docs/methods/spacetime.md "The change posterior") against dense
float64 references in numpy, built from the model's own prior kernel, noise and mean: with every training point in
reach (pred_neighbors >= n) it is the exact GP's joint posterior of the two places; with fewer it is the exact GP's
given the responses of the union of both places' prediction neighbours (not of one place's alone), and so not the
joint Vecchia factor's; the latent scale of cv_calibration multiplies its covariance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpcore import make_model
from gpcore.errors import ConfigError
from gpcore.models import vecchia_cv, vecchia_pairs
from gpcore.run.change import change_moments
from tests.gpcore.run.test_change import QUARTERS
from tests.gpcore.run.test_change import _data as _change_data


def _data():
    return _change_data(n=70)  # the change tests' space-time data, a few more rows


def _pairs(n=17, seed=5):
    """Pairs of places: a place at two quarters, and two different places at different quarters."""
    rng = np.random.default_rng(seed)
    A = np.column_stack([rng.uniform(-67.3, -65.5, n), rng.uniform(17.85, 18.55, n), rng.choice(QUARTERS, n)])
    B = A.copy()
    B[:, 2] = rng.choice(np.append(QUARTERS, 2020.125), n)
    B[::3, :2] += rng.normal(0, 0.05, (len(B[::3]), 2))
    return A, B


def _fit(kind="separable", weighted=False, **kw):
    X, y = _data()
    w = np.random.default_rng(1).integers(1, 9, len(y)).astype(float) if weighted else None
    model = make_model("vecchia", space_time=kind, dtype="float64", device="cpu", epochs=2, seed=0, **kw)
    model.fit(X, y, weights=w)
    with torch.no_grad():  # hyperparameters away from their initial values
        model.module_.raw_ell_t.fill_(2.0)
        model.module_.raw_noise.fill_(-2.0)
    ws = None if w is None else torch.as_tensor(w, dtype=torch.float64)
    model.finalize(model.scale_x(X), model.scale_y(y), ws)
    return model


def _dense(model, A, B, rows=None):
    """Exact GP posterior of [f(a_i), f(b_i)] given the ordered training rows ``rows`` (all: None), caller units."""
    mod = model.module_
    Xt = vecchia_cv.caller_inputs(model)
    yt = mod.y_train.double().numpy() * model.y_std_ + model.y_mean_
    noise = model._group_noise(torch.arange(len(yt)))
    noise = np.full(len(yt), float(mod.noise.detach())) if noise is None else noise.detach().numpy()
    noise = noise * model.y_std_**2
    means, covs = [], []
    for i in range(len(A)):
        r = np.arange(len(yt)) if rows is None else rows[i]
        Z = np.vstack([A[i], B[i]])
        K = model.kernel(Xt[r]) + np.diag(noise[r])
        Kz = model.kernel(Z, Xt[r])
        means.append(model.prior_mean_at(Z) + Kz @ np.linalg.solve(K, yt[r] - model.prior_mean_at(Xt[r])))
        covs.append(model.kernel(Z) - Kz @ np.linalg.solve(K, Kz.T))
    return np.array(means), np.array(covs)


@pytest.mark.parametrize(("kind", "weighted", "trend"), [("separable", False, True), ("gneiting", False, True),
                                                      ("separable", True, True), ("separable", False, False)])
def test_with_every_training_point_in_reach_it_is_the_exact_joint_posterior(kind, weighted, trend):
    model = _fit(kind, weighted, neighbors=10, pred_neighbors=100, time_trend=trend)
    assert (getattr(model.module_, "trend", None) is not None) == trend
    A, B = _pairs()
    mean, cov = vecchia_pairs.pair_moments(model, A, B, chunk=4)
    d_mean, d_cov = _dense(model, A, B)
    np.testing.assert_allclose(mean, d_mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(cov, d_cov, rtol=1e-7, atol=1e-11)
    assert np.abs(d_cov[:, 0, 1]).min() > 1e-4, "the pairs are correlated: the covariance is tested"


def test_with_few_neighbours_it_conditions_both_places_on_the_union_of_their_neighbours():
    model = _fit(neighbors=6)  # 9 prediction neighbours per place
    A, B = _pairs()
    mean, cov = vecchia_pairs.pair_moments(model, A, B)
    Na = model._prediction_neighbors(model.scale_x(A)).numpy()
    Nb = model._prediction_neighbors(model.scale_x(B)).numpy()
    union = [np.union1d(a, b) for a, b in zip(Na, Nb, strict=True)]
    assert max(len(u) for u in union) > Na.shape[1], "the two places' neighbours differ somewhere"
    d_mean, d_cov = _dense(model, A, B, union)
    np.testing.assert_allclose(mean, d_mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(cov, d_cov, rtol=1e-7, atol=1e-11)
    _, one = _dense(model, A, B, list(Na))  # one place's neighbours alone is a different posterior
    assert np.abs(one - d_cov).max() > 1e-4


def test_the_change_of_a_place_with_itself_is_exactly_zero_and_covariances_are_symmetric_psd():
    model = _fit(neighbors=6)
    A, _ = _pairs()
    mean, cov = vecchia_pairs.pair_moments(model, A, A)
    assert np.array_equal(mean[:, 0], mean[:, 1])
    assert np.array_equal(cov[:, 0, 0] + cov[:, 1, 1] - 2 * cov[:, 0, 1], np.zeros(len(A)))
    _, cov = vecchia_pairs.pair_moments(model, *_pairs())
    np.testing.assert_allclose(cov, cov.transpose(0, 2, 1), atol=1e-15)
    assert np.linalg.eigvalsh(cov).min() > -1e-12 and np.linalg.eigvalsh(cov).max() > 1e-4


def test_the_latent_scale_of_cv_calibration_multiplies_the_covariance_only():
    model = _fit(neighbors=6)
    A, B = _pairs()
    mean, cov = vecchia_pairs.pair_moments(model, A, B)
    model.train_info_["cv_calibration"] = {"folds": "rows", "k": 10, "rows": 40, "scale": 0.5}
    assert vecchia_cv.latent_scale(model) == 0.5
    mean2, cov2 = vecchia_pairs.pair_moments(model, A, B)
    np.testing.assert_array_equal(mean2, mean)
    np.testing.assert_allclose(cov2, 0.5 * cov, rtol=1e-12)


def test_the_change_uses_pairs_where_the_model_has_them_and_the_joint_factor_elsewhere():
    model = _fit(neighbors=6)
    cells = _pairs()[0][:, :2]
    t1, t2 = 2019.125, 2019.875
    mean, var = change_moments(model, cells, t1, t2)
    mu, C = vecchia_pairs.pair_moments(model, np.column_stack([cells, np.full(len(cells), t1)]),
                                       np.column_stack([cells, np.full(len(cells), t2)]))
    np.testing.assert_allclose(mean, mu[:, 1] - mu[:, 0], rtol=1e-12)
    np.testing.assert_allclose(var, C[:, 0, 0] + C[:, 1, 1] - 2 * C[:, 0, 1], rtol=1e-12)
    _, joint = change_moments(model, cells, t1, t2, via="joint")
    assert np.abs(joint - var).max() > 1e-4 * var.max(), "the joint factor is a different approximation"
    with pytest.raises(ConfigError, match="via must be"):
        change_moments(model, cells, t1, t2, via="dense")


def _dense_dbknn(model, A, B):
    """Exact GP posterior of [f(a_i), f(b_i)] under dbk-nn's prior a^2 phi phi^T + k_r (model.kernel), all rows."""
    X = vecchia_cv.caller_inputs(model)
    y = model.module_.y_train.double().numpy() * model.y_std_ + model.y_mean_
    K = model.kernel(X) + model.noise_variance * np.eye(len(y))
    means, covs = [], []
    for i in range(len(A)):
        Z = np.vstack([A[i], B[i]])
        Kz = model.kernel(Z, X)
        means.append(model.prior_mean_at(Z) + Kz @ np.linalg.solve(K, y - model.prior_mean_at(X)))
        covs.append(model.kernel(Z) - Kz @ np.linalg.solve(K, Kz.T))
    return np.array(means), np.array(covs)


def _dbknn(dtype="float64", **kw):
    X, y = _data()
    model = make_model("dbk-nn", space_time="separable", dtype=dtype, device="cpu", epochs=1, dbk_rank=8,
                       dbk_hidden=8, dbk_blocks=1, dbk_epochs=2, dbk_batch_size=32, feature_check=False, **kw)
    model.fit(X, y)
    with torch.no_grad():
        model.module_.raw_fscale.fill_(0.8)  # a feature part that matters
        model.module_.raw_ell_t.fill_(2.0)
    model.finalize(model.scale_x(X), model.scale_y(y))
    assert model.module_.features_on and vecchia_pairs.supports(model)
    return model


def test_a_dbk_nn_with_its_features_is_the_exact_joint_posterior_with_every_point_in_reach():
    """The feature part a phi^T w (w's posterior from all rows) and the residual GP on the union: at m = n - 1 the
    exact GP with the kernel a^2 phi phi^T + k_r."""
    n = len(_data()[1])
    model = _dbknn(neighbors=n - 1, pred_neighbors=n)
    A, B = _pairs()
    mean, cov = vecchia_pairs.pair_moments(model, A, B, chunk=5)
    d_mean, d_cov = _dense_dbknn(model, A, B)
    np.testing.assert_allclose(mean, d_mean, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(cov, d_cov, rtol=1e-6, atol=1e-10)
    # the feature part is in it: the residual GP alone (w fixed at its mean) is not the answer
    model.module_.post_F.zero_()
    _, cov0 = vecchia_pairs.pair_moments(model, A, B)
    assert np.abs(cov0 - d_cov).max() > 1e-3 * np.abs(d_cov).max()


@pytest.mark.parametrize("dtype", ["float64", "float32"])  # float32: the feature network takes the model's dtype
def test_a_dbk_nn_s_pair_marginals_are_its_predictions_when_both_places_share_their_neighbours(dtype):
    """With few neighbours: a place paired with itself conditions on its own neighbours only, so its mean and
    variance are the model's marginal prediction's (dbk-nn's _predict_f, features included)."""
    model = _dbknn(dtype, neighbors=6)
    A, _ = _pairs()
    mean, cov = vecchia_pairs.pair_moments(model, A, A)
    pred = model.predict(A)
    tol = 1e-8 if dtype == "float64" else 1e-5
    np.testing.assert_allclose(mean[:, 0], pred.mean, rtol=tol, atol=tol)
    np.testing.assert_allclose(cov[:, 0, 0], pred.var_f, rtol=tol * 10, atol=tol * 1e-2)


def test_neighbours_searched_once_give_the_same_posterior_in_every_chunk():
    model = _fit(neighbors=6)
    A, B = _pairs()
    nb = vecchia_pairs.pair_neighbors(model, A, B)
    assert [tuple(n.shape) for n in nb] == [(len(A), 9), (len(B), 9)]
    mean, cov = vecchia_pairs.pair_moments(model, A, B, chunk=4)
    mean_nb, cov_nb = vecchia_pairs.pair_moments(model, A, B, chunk=4, neighbors=nb)
    assert np.array_equal(mean_nb, mean) and np.array_equal(cov_nb, cov)
    others = tuple(torch.roll(n, 1, dims=0) for n in nb)  # another pair's neighbours: another posterior
    assert not np.allclose(vecchia_pairs.pair_moments(model, A, B, chunk=4, neighbors=others)[1], cov)
    with pytest.raises(ValueError, match="a row per pair"):
        vecchia_pairs.pair_moments(model, A, B, neighbors=(nb[0][:-1], nb[1]))
