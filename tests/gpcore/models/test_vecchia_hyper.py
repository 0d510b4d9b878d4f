"""REML and the hyperparameters' Laplace posterior of vecchia / dbk-nn (gpcore/models/vecchia_hyper.py,
docs/methods/spacetime.md "Hyperparameter uncertainty") against a dense float64 REML written out here: at m = n - 1
the Vecchia REML, its gradient and the GLS mean equal the exact GP's; the mode and the Hessian equal the dense
objective's (scipy's optimum, torch autograd's Hessian); draws leave the fitted model untouched."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from gpcore import make_model
from gpcore.errors import InputError
from gpcore.models import spacetime as st
from gpcore.models import vecchia_hyper as vh

QUARTERS = 2022.125 + 0.25 * np.arange(4)


def _world(n_places=30, seed=3):
    """A draw from a separable space-time GP (exponential x exponential) with noise, every place in 3 of 4 quarters."""
    rng = np.random.default_rng(seed)
    P = np.column_stack([rng.uniform(-67.2, -65.6, n_places), rng.uniform(17.9, 18.5, n_places)])
    rows = [(i, q) for i in range(n_places) for q in range(4) if rng.random() < 0.75]
    i, q = np.array(rows).T
    X = np.column_stack([P[i], QUARTERS[q]])
    d = np.sqrt(((X[:, None, :2] - X[None, :, :2]) ** 2).sum(-1))
    K = 0.09 * np.exp(-d / 0.3 - np.abs(X[:, None, 2] - X[None, :, 2]) / 0.5)
    f = np.linalg.cholesky(K + 1e-10 * np.eye(len(X))) @ rng.standard_normal(len(X))
    return X, 1.3 + f + 0.1 * rng.standard_normal(len(X))


def _fit(name="vecchia", kind="separable", **kw):
    X, y = _world()
    n = len(y)
    model = make_model(name, space_time=kind, dtype="float64", device="cpu", epochs=3, neighbors=n - 1,
                       pred_neighbors=n, seed=0, **kw).fit(X, y)
    return model, X, y


@torch.no_grad()
def _dense_reml(mod, Xs, ys, noise=None):
    """(R, beta_hat) of the exact GP from the module's own dense kernel, float64 (``noise``: each row's variance;
    default the module's noise for every row)."""
    n = len(ys)
    noise = mod.noise.double() * torch.ones(n, dtype=torch.float64) if noise is None else noise.double()
    K = mod.K(Xs, Xs).double() + torch.diag(noise)
    H = st.mean_design(mod, Xs)
    L = torch.linalg.cholesky(K)
    A = H.T @ torch.cholesky_solve(H, L)
    beta = torch.linalg.solve(A, H.T @ torch.cholesky_solve(ys[:, None], L)).ravel()
    r = (ys - H @ beta)[:, None]
    R = (0.5 * (r * torch.cholesky_solve(r, L)).sum() + torch.log(torch.diagonal(L)).sum() + 0.5 * torch.logdet(A)
         + 0.5 * (n - H.shape[1]) * math.log(2 * math.pi))
    return R, beta


def _explicit_reml(theta, Xs, ys, H):
    """The dense REML as a function of theta (log ell_lon, log ell_lat, log ell_t, log outputscale, log noise) with
    the separable Matern-1/2 x exponential kernel written out, for autograd and scipy."""
    ell, ell_t, os, s2 = torch.exp(theta[:2]), torch.exp(theta[2]), torch.exp(theta[3]), torch.exp(theta[4])
    d = (((Xs[:, None, :2] - Xs[None, :, :2]) / ell) ** 2).sum(-1).clamp_min(1e-300).sqrt()
    K = os * torch.exp(-d - (Xs[:, None, 2] - Xs[None, :, 2]).abs() / ell_t) + s2 * torch.eye(len(ys),
                                                                                           dtype=torch.float64)
    L = torch.linalg.cholesky(K)
    A = H.T @ torch.cholesky_solve(H, L)
    beta = torch.linalg.solve(A, H.T @ torch.cholesky_solve(ys[:, None], L)).ravel()
    r = (ys - H @ beta)[:, None]
    return (0.5 * (r * torch.cholesky_solve(r, L)).sum() + torch.log(torch.diagonal(L)).sum()
            + 0.5 * torch.logdet(A) + 0.5 * (len(ys) - H.shape[1]) * math.log(2 * math.pi))


@pytest.mark.parametrize(("name", "kind", "extra"), [
    ("vecchia", "separable", {}),
    ("vecchia", "gneiting", {}),
    ("vecchia", "separable", {"time_trend": False}),
    ("vecchia", "none", {}),
    ("dbk-nn", "separable", {"dbk_rank": 8, "dbk_hidden": 8, "dbk_blocks": 1, "dbk_epochs": 1}),
])
def test_reml_value_gradient_and_gls_mean_are_the_dense_ones_at_m_n_minus_1(name, kind, extra):
    model, X, y = _fit(name, kind, **extra)
    if name == "dbk-nn":
        model.module_.features_on = False  # as the feature check leaves it when it drops the features
    assert vh.supports(model)
    work = vh.working_copy(model)
    theta = vh.get_theta(work) + np.linspace(-0.3, 0.3, len(vh.names(model)))  # away from the fit
    vh._set_theta(work, theta)
    value, grad, beta = vh.reml(work)
    mod = work.module_
    R, d_beta = _dense_reml(mod, mod.X_train.double(), mod.y_train.double())
    assert value == pytest.approx(float(R), rel=1e-9)
    np.testing.assert_allclose(beta, d_beta.numpy(), rtol=1e-8, atol=1e-10)
    assert len(beta) == (1 if kind == "none" or extra.get("time_trend") is False else 2)
    fd = []
    for j in range(len(theta)):
        e = np.zeros(len(theta))
        e[j] = 1e-5
        vh._set_theta(work, theta + e)
        up = vh.reml(work, grad=False)[0]
        vh._set_theta(work, theta - e)
        fd.append((up - vh.reml(work, grad=False)[0]) / 2e-5)
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_the_reml_term_is_not_the_likelihood():
    """R differs from the profiled negative log likelihood by exactly 1/2 log det(H^T K^-1 H) - p/2 log 2 pi."""
    model, _, _ = _fit()
    work = vh.working_copy(model)
    mod = work.module_
    Xs, ys = mod.X_train.double(), mod.y_train.double()
    K = mod.K(Xs, Xs).double() + mod.noise.double() * torch.eye(len(ys), dtype=torch.float64)
    H = st.mean_design(mod, Xs)
    _, beta = _dense_reml(mod, Xs, ys)
    nll = -torch.distributions.MultivariateNormal(H @ beta, K).log_prob(ys)
    logdetA = torch.logdet(H.T @ torch.linalg.solve(K, H))
    assert vh.reml(work, grad=False)[0] == pytest.approx(float(nll + 0.5 * logdetA - math.log(2 * math.pi)),
                                                         rel=1e-9)


def test_mode_and_hessian_are_the_dense_objectives():
    model, _, _ = _fit()
    post = vh.hyper_posterior(model)
    assert post.converged
    mod = model.module_
    Xs, ys = mod.X_train.double(), mod.y_train.double()
    H = st.mean_design(mod, Xs)

    def f(th):
        t = torch.tensor(th, dtype=torch.float64, requires_grad=True)
        v = _explicit_reml(t, Xs, ys, H)
        v.backward()
        return float(v.detach()), t.grad.numpy()

    ref = minimize(f, vh.get_theta(model), jac=True, method="L-BFGS-B", options={"gtol": 1e-9, "maxiter": 500})
    np.testing.assert_allclose(post.mode, ref.x, atol=2e-4)
    assert post.value == pytest.approx(ref.fun, abs=1e-7)
    Hd = torch.autograd.functional.hessian(lambda t: _explicit_reml(t, Xs, ys, H),
                                           torch.tensor(post.mode, dtype=torch.float64)).numpy()
    w, V = np.linalg.eigh(Hd)
    np.testing.assert_allclose(post.cov, (V / np.maximum(w, vh.EIGEN_FLOOR)) @ V.T, rtol=1e-3, atol=1e-6)
    draws = post.draws(4000, seed=1)
    np.testing.assert_allclose(np.cov(draws.T), post.cov, atol=0.1 * np.sqrt(np.outer(np.diag(post.cov),
                                                                                    np.diag(post.cov))).max())
    np.testing.assert_array_equal(post.draws(3, seed=5), post.draws(3, seed=5))


def test_draws_leave_the_fitted_model_as_it_was_and_predict_at_their_own_hyperparameters():
    model, X, y = _fit()
    before = {k: v.clone() for k, v in model.module_.state_dict().items()}
    pred = model.predict(X[:5])
    post = vh.hyper_posterior(model)
    theta = post.draws(1, seed=2)[0]
    draw = vh.at_theta(model, theta)
    for k, v in model.module_.state_dict().items():
        assert torch.equal(v, before[k]), k
    np.testing.assert_array_equal(model.predict(X[:5]).mean, pred.mean)
    np.testing.assert_allclose(vh.get_theta(draw), theta, rtol=1e-12)
    # the draw's prior mean is its GLS mean; its predictions the exact GP's at its hyperparameters
    K = draw.kernel(X) + draw.noise_variance * np.eye(len(y))
    Hc = np.column_stack([np.ones(len(y)), X[:, 2]])
    Ki = np.linalg.inv(K)
    beta = np.linalg.solve(Hc.T @ Ki @ Hc, Hc.T @ Ki @ y)
    np.testing.assert_allclose(draw.prior_mean_at(X), Hc @ beta, rtol=1e-8)
    Z = X[:5] + 0.01
    mean = draw.prior_mean_at(Z) + draw.kernel(Z, X) @ Ki @ (y - Hc @ beta)
    np.testing.assert_allclose(draw.predict(Z).mean, mean, rtol=1e-7)
    assert not np.allclose(model.predict(Z).mean, mean, rtol=1e-4)


def test_a_model_with_features_has_no_reml_posterior():
    model, _, _ = _fit("dbk-nn", dbk_rank=8, dbk_hidden=8, dbk_blocks=1, dbk_epochs=1, feature_check=False)
    assert model.features_used and not vh.supports(model)
    with pytest.raises(InputError, match="no REML"):
        vh.working_copy(model)


def test_the_posterior_is_kept_until_the_model_changes():
    model, X, y = _fit()
    post = vh.hyper_posterior(model)
    assert vh.hyper_posterior(model) is post
    model.condition_on(X[:3] + 0.01, y[:3])  # more conditioning rows: a new posterior
    again = vh.hyper_posterior(model)
    assert again is not post and not np.allclose(again.mode, post.mode, rtol=1e-6)
    with torch.no_grad():
        model.module_.raw_noise.add_(0.5)  # a new start: the same data, so the same mode from another start
    assert vh.hyper_posterior(model) is not again


def test_a_float32_dbknn_without_features_draws_like_the_vecchia_gp():
    """The default dtype: the feature network stays float32 beside float64 hyperparameters."""
    X, y = _world()
    kw = {"space_time": "separable", "device": "cpu", "epochs": 3, "seed": 0}
    dbknn = make_model("dbk-nn", dbk_rank=8, dbk_hidden=8, dbk_blocks=1, dbk_epochs=1, feature_check=False,
                       **kw).fit(X, y)
    dbknn.module_.features_on = False
    dbknn.finalize(dbknn.scale_x(X), dbknn.scale_y(y))
    theta = vh.get_theta(dbknn) + 0.1
    draw = vh.at_theta(dbknn, theta)
    assert next(draw.module_.dbk.parameters()).dtype == torch.float32
    np.testing.assert_allclose(vh.get_theta(draw), theta, rtol=1e-12)
    # the residual GP alone: its predictions are the Vecchia GP's at the same hyperparameters and mean
    vecchia = make_model("vecchia", **kw).fit(X, y)
    vecchia.module_.load_state_dict({k: v for k, v in dbknn.module_.state_dict().items()
                                     if k in vecchia.module_.state_dict()})
    ref = vh.at_theta(vecchia, theta)
    Z = X[:7] + 0.02
    np.testing.assert_allclose(draw.predict(Z).mean, ref.predict(Z).mean, rtol=1e-5)
    np.testing.assert_allclose(draw.predict(Z).var_f, ref.predict(Z).var_f, rtol=1e-4)


@torch.no_grad()
def test_a_weighted_fit_s_reml_has_each_row_s_noise():
    """Weights: row i's noise is tau^2 + s2 / w_i (the nugget held at its fitted value, not drawn)."""
    X, y = _world()
    n = len(y)
    w = np.random.default_rng(1).integers(1, 9, n).astype(float)
    model = make_model("vecchia", space_time="separable", dtype="float64", device="cpu", epochs=3, neighbors=n - 1,
                       pred_neighbors=n, seed=0).fit(X, y, weights=w)
    work = vh.working_copy(model)
    mod = work.module_
    noise = work._group_noise(torch.arange(n))
    assert noise.std() > 0.1 * noise.mean(), "the rows' noise differs"
    R, beta = _dense_reml(mod, mod.X_train.double(), mod.y_train.double(), noise)
    value, _, b = vh.reml(work, grad=False)
    assert value == pytest.approx(float(R), rel=1e-9)
    np.testing.assert_allclose(b, beta.numpy(), rtol=1e-8)


def test_draws_share_the_model_s_neighbour_index():
    model, _, _ = _fit()
    model._tree = None
    work = vh.working_copy(model)
    assert model._tree is not None and work._neighbor_tree() is model._tree


def test_a_record_gives_the_posterior_back_exactly_and_only_to_the_model_it_came_from():
    import json

    model, X, y = _fit()
    post = vh.hyper_posterior(model)
    record = json.loads(json.dumps(vh.to_record(model, post), allow_nan=False))  # as a run keeps it
    back = vh.from_record(model, record)
    assert back is not None and back.names == post.names
    for a in ("mode", "cov", "beta"):
        assert np.array_equal(getattr(back, a), getattr(post, a)), a
    assert (back.value, back.iterations, back.converged) == (post.value, post.iterations, post.converged)
    other, _, _ = _fit()
    with torch.no_grad():
        other.module_.raw_noise.add_(1e-6)  # the same data, another parameter: not its posterior
    assert vh.from_record(other, record) is None
    bad = [None, [], {**record, "format": "other"}, {**record, "names": record["names"][::-1]},
           {**record, "mode": record["mode"][:-1]}, {**record, "mode": [math.nan] * len(record["mode"])},
           {**record, "cov": [[v + (i < j) * 1e-3 for j, v in enumerate(r)] for i, r in enumerate(record["cov"])]},
           {**record, "beta": record["beta"] + [0.0]}, {**record, "iterations": "13"},
           {k: v for k, v in record.items() if k != "value"}, {**record, "rows": [1, 3]}]
    assert [vh.from_record(model, b) for b in bad] == [None] * len(bad)


def test_a_remembered_posterior_is_the_one_hyper_posterior_returns(monkeypatch):
    model, X, y = _fit()
    post = vh.hyper_posterior(model)
    fresh, _, _ = _fit()
    assert vh.cached(fresh) is None
    vh.remember(fresh, post)
    monkeypatch.setattr(vh, "_hyper_posterior", lambda *a: pytest.fail("computed again"))
    assert vh.cached(fresh) is post and vh.hyper_posterior(fresh) is post
    with torch.no_grad():
        fresh.module_.raw_noise.add_(0.5)
    assert vh.cached(fresh) is None
