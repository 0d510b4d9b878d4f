"""DBK against dense float64 oracles (docs/methods/dbk.md §9.2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal
from torch import nn

from gpcore import make_model
from gpcore.models.dbk import mml_from_stats
from gpcore.models.exact import ExactGP
from gpcore.models.kernels import stationary
from gpcore.models.linalg import gaussian_nll, kl_std_normal, tril_factor

pytestmark = pytest.mark.usefixtures("float64_default")  # tests/gpcore/models/conftest.py


def _data(n=60, d=2, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 3, size=(n, d))
    y = 3.0 + np.sin(2 * X[:, 0]) + 0.5 * X[:, -1] + 0.1 * rng.normal(size=n)
    return X, y


def _fitted(**kw):
    X, y = _data()
    settings = {"rank": 8, "hidden": 8, "epochs": 5, "lr": 1e-2, "batch_size": 16, "dtype": "float64",
                "device": "cpu", **kw}
    return make_model("dbk", **settings).fit(X, y), X, y


# ------------------------------------------------------------------ 9.2.1 / 9.2.2: marginal likelihood
@pytest.mark.parametrize("n,r", [(30, 5), (4, 9)])
def test_low_rank_mml_equals_dense_logpdf(n, r):
    g = torch.Generator().manual_seed(n + r)
    Phi = torch.randn(n, r, generator=g)
    y = torch.randn(n, generator=g) + 0.7
    mu0, s2 = torch.tensor(0.3), torch.tensor(0.25)
    lp = mml_from_stats(Phi.T @ Phi, Phi.T @ y, Phi.sum(0), y @ y, y.sum(), n, mu0, s2)
    dense = multivariate_normal.logpdf(y.numpy(), mean=np.full(n, 0.3), cov=(Phi @ Phi.T).numpy() + 0.25 * np.eye(n))
    assert abs(lp.item() - dense) <= 1e-8 * abs(dense)


def test_mml_gradient_matches_closed_forms():
    n, r = 25, 6
    g = torch.Generator().manual_seed(3)
    Phi = torch.randn(n, r, generator=g, requires_grad=True)
    y = torch.randn(n, generator=g)
    s2 = torch.tensor(0.4)
    lp = mml_from_stats(Phi.T @ Phi, Phi.T @ y, Phi.sum(0), y @ y, y.sum(), n, torch.tensor(0.0), s2)
    (grad,) = torch.autograd.grad(lp, Phi)
    P = Phi.detach()
    Sigma_inv = torch.linalg.inv(P @ P.T + s2 * torch.eye(n))
    closed = -Sigma_inv @ P + Sigma_inv @ torch.outer(y, y) @ Sigma_inv @ P
    torch.testing.assert_close(grad, closed, rtol=1e-8, atol=1e-10)
    Lam = P.T @ P + s2 * torch.eye(r)
    Li = torch.linalg.inv(Lam)
    c = P.T @ y
    G_A = -0.5 * Li - Li @ torch.outer(c, c) @ Li / (2 * s2)
    g_c = Li @ c / s2
    torch.testing.assert_close(grad, 2 * P @ G_A + torch.outer(y, g_c), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("basis", ["silu", "rbf"])
def test_two_pass_gradient_equals_autograd(basis):
    model, X, y = _fitted(objective="mml", basis=basis, epochs=2)
    Xs, ys = model.scale_x(X), model.scale_y(y)
    mod = model.module_
    mod.zero_grad()
    loss = -model.log_marginal_likelihood(Xs, ys) / Xs.shape[0]
    loss.backward()
    ref = {k: p.grad.clone() for k, p in mod.named_parameters() if p.grad is not None}
    mod.zero_grad()
    loss2 = model.two_pass_step(Xs, ys, chunk=7)
    assert abs(loss.item() - loss2.item()) < 1e-10
    for k, gref in ref.items():
        torch.testing.assert_close(dict(mod.named_parameters())[k].grad, gref, rtol=1e-7, atol=1e-10, msg=k)


def test_two_pass_used_above_chunk_size_trains_like_single_pass():
    a, X, y = _fitted(objective="mml", epochs=4)
    b, _, _ = _fitted(objective="mml", epochs=4, mml_chunk=16)
    np.testing.assert_allclose(a.predict(X).mean, b.predict(X).mean, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ 9.2.3: posterior = dense GP posterior
@pytest.mark.parametrize("basis,rank", [("silu", 8), ("rbf", 8), ("silu", 150), ("rbf", 150)])
def test_exact_dbk_prediction_equals_dense_gp_from_kernel(basis, rank):
    """rank 150 > 128 takes the blocked triangular variance path (upper posterior factor)."""
    model, X, y = _fitted(objective="mml", basis=basis, epochs=10, rank=rank)
    Xt = _data(n=15, seed=9)[0]
    K = model.kernel(X, X)
    Ks = model.kernel(Xt, X)
    Kss = model.kernel(Xt, Xt)
    s2, mu0 = model.noise_variance, model.prior_mean
    A = K + s2 * np.eye(len(X))
    mean = mu0 + Ks @ np.linalg.solve(A, y - mu0)
    var_f = np.diag(Kss - Ks @ np.linalg.solve(A, Ks.T))
    pred = model.predict(Xt)
    np.testing.assert_allclose(pred.mean, mean, rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(pred.var_f, var_f, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(pred.var_y, var_f + s2, rtol=1e-6, atol=1e-9)


# ------------------------------------------------------------------ 9.2.4 / 9.2.6: kernel
@pytest.mark.parametrize("basis", ["silu", "rbf"])
def test_kernel_is_feature_inner_product_with_rank_at_most_r(basis):
    model, X, _ = _fitted(basis=basis)
    Phi = model.features(X).numpy() * model.y_std_
    K = model.kernel(X, X)
    np.testing.assert_allclose(K, Phi @ Phi.T, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.kernel_slice(X, X[4]), Phi @ Phi[4], rtol=1e-10, atol=1e-12)
    ev = np.linalg.eigvalsh(K)
    assert ev.min() > -1e-10 * ev.max()
    assert (ev > 1e-8 * ev.max()).sum() <= model.config.rank


def test_rbf_features_obey_nystrom_bound():
    model, X, _ = _fitted(basis="rbf")
    Xw = np.random.default_rng(0).uniform(-10, 10, size=(200, 2))  # also far outside the data
    norms = model.features(Xw).pow(2).sum(-1)
    sk2 = model.module_.outputscale.item()
    assert norms.min() >= 0 and norms.max() <= sk2 * (1 + 1e-6)


# ------------------------------------------------------------------ 9.2.5: exact-GP recovery
def _identity_dbk_rbf(Xs, Z, ell, outputscale, noise):
    model = make_model("dbk", basis="rbf", rank=Z.shape[0], hidden=Xs.shape[1], objective="mml", jitter=0.0,
                       dtype="float64", device="cpu")
    mod = model._build(Xs.shape[1], None, None).double()
    mod.backbone = nn.Identity()
    with torch.no_grad():
        mod.Z.copy_(Z)
        mod.raw_ell.copy_(torch.log(torch.expm1(torch.full((Xs.shape[1],), ell))))
        mod.raw_outputscale.copy_(torch.log(torch.expm1(torch.tensor(outputscale))))
        mod.raw_noise.copy_(torch.log(torch.expm1(torch.tensor(noise - model.config.noise_floor))))
    model.module_ = mod
    return model


def test_dbk_rbf_with_identity_backbone_and_z_equals_x_is_the_exact_gp():
    g = torch.Generator().manual_seed(5)
    n = 12
    # well-separated points keep K_ZZ well conditioned, so no jitter is needed ("up to jitter")
    Xs = (torch.linspace(-1, 1, n) + 0.02 * torch.randn(n, generator=g))[:, None]
    ys = torch.sin(3 * Xs[:, 0]) + 0.1 * torch.randn(n, generator=g)
    ell, os_, s2 = 0.2, 1.3, 0.05
    dbk = _identity_dbk_rbf(Xs, Xs.clone(), ell, os_, s2)
    K = stationary("rbf", Xs, Xs, torch.tensor([ell]), torch.tensor(os_))
    exact = multivariate_normal.logpdf(ys.numpy(), cov=(K + s2 * torch.eye(n)).numpy())
    assert abs(dbk.log_marginal_likelihood(Xs, ys).item() - exact) < 1e-6 * abs(exact)
    # posterior: DBK weight posterior vs the exact GP module with the same hyperparameters
    dbk._finalize(Xs, ys)
    gp = ExactGP(kernel="rbf", ard=False, learn_mean=False, dtype="float64", device="cpu")
    gp.module_ = gp._build(1, Xs, ys).double()
    with torch.no_grad():
        gp.module_.raw_ell.copy_(torch.log(torch.expm1(torch.tensor([ell]))))
        gp.module_.raw_outputscale.copy_(torch.log(torch.expm1(torch.tensor(os_))))
        gp.module_.raw_noise.copy_(torch.log(torch.expm1(torch.tensor(s2 - 1e-6))))
    gp._finalize(Xs, ys)
    # the mean depends on k(x*, X) only, which Z = X reproduces exactly, at any x*
    Xt = torch.linspace(-1.2, 1.2, 25)[:, None]
    m1, v1 = dbk._predict_f(Xt)
    m2, v2 = gp._predict_f(Xt)
    torch.testing.assert_close(m1, m2, rtol=1e-6, atol=1e-6)
    # the variance equals the exact one at the training inputs (Q = K there); elsewhere it is
    # lower by exactly the Nystrom gap corr(x*) = k(x*, x*) - ||phi(x*)||^2 >= 0
    torch.testing.assert_close(dbk._predict_f(Xs)[1], gp._predict_f(Xs)[1], rtol=1e-6, atol=1e-7)
    corr = os_ - dbk.module_.features(Xt).pow(2).sum(-1)
    assert corr.min() >= -1e-9
    torch.testing.assert_close(v1 + corr, v2, rtol=1e-6, atol=1e-6)


def test_dbk_rbf_with_fewer_inducing_points_gives_dtc_and_titsias():
    g = torch.Generator().manual_seed(6)
    n, r = 30, 6
    Xs = torch.rand(n, 2, generator=g) * 2 - 1
    ys = Xs[:, 0] - Xs[:, 1] ** 2 + 0.1 * torch.randn(n, generator=g)
    Z = torch.rand(r, 2, generator=g) * 2 - 1
    ell, os_, s2 = 0.7, 0.9, 0.1
    dbk = _identity_dbk_rbf(Xs, Z, ell, os_, s2)
    ellt, ost = torch.full((2,), ell), torch.tensor(os_)
    Kxz = stationary("rbf", Xs, Z, ellt, ost)
    Kzz = stationary("rbf", Z, Z, ellt, ost)
    Q = Kxz @ torch.linalg.solve(Kzz, Kxz.T)
    dtc = multivariate_normal.logpdf(ys.numpy(), cov=(Q + s2 * torch.eye(n)).numpy())
    lp = dbk.log_marginal_likelihood(Xs, ys).item()
    assert abs(lp - dtc) < 1e-7 * abs(dtc)
    norms = dbk.module_.features(Xs).pow(2).sum(-1)
    titsias = lp - ((os_ - norms).sum() / (2 * s2)).item()
    K = stationary("rbf", Xs, Xs, ellt, ost)
    dense_titsias = dtc - torch.trace(K - Q).item() / (2 * s2)
    exact = multivariate_normal.logpdf(ys.numpy(), cov=(K + s2 * torch.eye(n)).numpy())
    assert abs(titsias - dense_titsias) < 1e-7 * abs(dense_titsias)
    assert titsias <= exact


# ------------------------------------------------------------------ 9.2.7: exact posterior as q
def test_exact_posterior_as_q_reproduces_exact_prediction_and_maximises_vbll_elbo():
    model, X, y = _fitted(objective="mml", epochs=6)
    Xs, ys = model.scale_x(X), model.scale_y(y)
    mod = model.module_
    U = (mod.post_U @ mod.post_U.T)
    L = torch.linalg.cholesky(U)
    q = make_model("dbk", **{**model.config.to_dict(), "objective": "dppgp"})
    q.__dict__.update({k: v for k, v in model.__dict__.items() if k.endswith("_") and k != "module_"})
    q.module_ = mod
    with torch.no_grad():
        mod.m.copy_(mod.post_m)
        mod.A.copy_(torch.tril(L, -1))
        mod.rho.copy_(torch.log(L.diagonal()))
    a, b = model.predict(X), q.predict(X)
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(a.var_y, b.var_y, rtol=1e-8, atol=1e-10)

    phi = mod.features(Xs).detach()
    s2 = mod.noise.detach()
    yc = ys - mod.mu0.detach()

    def vbll_elbo(m, Lq):
        ell = -gaussian_nll(yc, phi @ m, s2.expand_as(yc)).sum() - (phi @ Lq).pow(2).sum() / (2 * s2)
        return ell - kl_std_normal(m, Lq)

    best = vbll_elbo(mod.post_m, L)
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        dm = 1e-2 * torch.randn(mod.post_m.shape, generator=g)
        dL = torch.tril(1e-2 * torch.randn(L.shape, generator=g))
        assert vbll_elbo(mod.post_m + dm, L) < best
        assert vbll_elbo(mod.post_m, L + dL) < best


# ------------------------------------------------------------------ 9.2.8 / 9.2.10: dPPGP pieces
@pytest.mark.parametrize("basis,rank", [("silu", 8), ("silu", 150), ("rbf", 8)])
def test_dppgp_terms_equal_hand_computation(basis, rank):
    """rank 150 > 128 takes the blocked triangular variance path (lower q factor).

    The DBK-RBF case (alpha > 0) pins the trace term's k_b to the in-batch maximum of
    ``||phi||^2``, not the outputscale (the Nystrom features' bound, larger than every norm)."""
    model, X, y = _fitted(alpha=0.3, beta=0.7, rank=rank, basis=basis)
    Xs, ys = model.scale_x(X[:9]), model.scale_y(y[:9])
    n = 1234
    mod = model.module_
    t = model.dppgp_terms(Xs, ys, n)
    phi = mod.features(Xs).detach().numpy()
    m = mod.m.detach().numpy()
    L = np.tril(mod.A.detach().numpy(), -1) + np.diag(np.exp(mod.rho.detach().numpy()))
    s2 = mod.noise.item()
    mu = mod.mu0.item() + phi @ m
    s2y = np.array([p @ L @ L.T @ p for p in phi]) + s2
    yv = ys.numpy()
    data = np.mean(0.5 * np.log(2 * np.pi * s2y) + (yv - mu) ** 2 / (2 * s2y))
    norms = (phi**2).sum(1)
    trace = np.mean((norms.max() - norms) / (2 * s2))
    if basis == "rbf":  # the outputscale is a strict upper bound here, so it cannot stand in for k_b
        assert norms.max() < mod.outputscale.item() * (1 - 1e-3)
    r = len(m)
    kl = 0.5 * (m @ m + np.trace(L @ L.T) - r - np.linalg.slogdet(L @ L.T)[1])
    assert t["data"].item() == pytest.approx(data, rel=1e-10)
    assert t["trace"].item() == pytest.approx(trace, rel=1e-10)
    assert t["kl"].item() == pytest.approx(kl, rel=1e-9)
    loss = model._loss(Xs, ys, n).item()
    assert loss == pytest.approx(data + 0.3 * trace + 0.7 / n * kl, rel=1e-10)
    kl_torch = torch.distributions.kl_divergence(
        torch.distributions.MultivariateNormal(torch.tensor(m), scale_tril=torch.tensor(L)),
        torch.distributions.MultivariateNormal(torch.zeros(r), torch.eye(r)),
    )
    assert kl == pytest.approx(kl_torch.item(), rel=1e-9)


@pytest.mark.parametrize("basis,rank", [("silu", 8), ("rbf", 8), ("silu", 150), ("rbf", 150)])
def test_dppgp_prediction_equals_the_weight_space_formula(basis, rank, monkeypatch):
    """2.7: mean mu0 + m^T phi, variance phi^T L L^T phi (+ sigma2), in sub-blocks of any size."""
    model, X, y = _fitted(basis=basis, rank=rank)
    monkeypatch.setattr(type(model), "_PREDICT_BLOCK", 7)  # several inner blocks, a ragged last one
    mod = model.module_
    with torch.no_grad():
        mod.A.add_(0.1 * torch.randn_like(mod.A))  # a q factor far from its diagonal init
        Xt = _data(n=23, seed=4)[0]
        phi = mod.features(model.scale_x(Xt)).numpy()
        m = mod.m.numpy() + 0.1
        mod.m.copy_(torch.tensor(m))
        L = np.tril(mod.A.numpy(), -1) + np.diag(np.exp(mod.rho.numpy()))
    mean = mod.mu0.item() + phi @ m
    var_f = np.einsum("ij,jk,ik->i", phi, L @ L.T, phi)
    pred = model.predict(Xt)
    np.testing.assert_allclose(pred.mean, model.y_mean_ + model.y_std_ * mean, rtol=1e-10)
    np.testing.assert_allclose(pred.var_f, model.y_std_**2 * var_f, rtol=1e-9)
    np.testing.assert_allclose(pred.var_y, model.y_std_**2 * (var_f + mod.noise.item()), rtol=1e-9)


def test_dppgp_alpha_beta_zero_is_predictive_nll_and_trace_properties():
    model, X, y = _fitted(alpha=0.0, beta=0.0)
    Xs, ys = model.scale_x(X), model.scale_y(y)
    mean, var_f = model._predict_f(Xs)
    nll = gaussian_nll(ys, mean, var_f + model._noise_s()).mean()
    assert model._loss(Xs, ys, 10**6).item() == pytest.approx(nll.item(), rel=1e-12)
    t = model.dppgp_terms(Xs, ys, len(ys))
    assert t["trace"].item() >= 0
    assert model.dppgp_terms(Xs[:1], ys[:1], len(ys))["trace"].item() == 0.0
    # equal in-batch norms -> zero trace: duplicate one point (BLAS may round each row differently)
    assert model.dppgp_terms(Xs[[2, 2, 2]], ys[[2, 2, 2]], len(ys))["trace"].item() == pytest.approx(0.0, abs=1e-12)


def test_kb_gradient_flag():
    model, X, y = _fitted()
    Xs, ys = model.scale_x(X[:10]), model.scale_y(y[:10])
    grads = {}
    for detach in (False, True):
        object.__setattr__(model.config, "detach_kb", detach)
        model.module_.zero_grad()
        model.dppgp_terms(Xs, ys, 100)["trace"].backward()
        grads[detach] = model.module_.scale.grad.clone()
    object.__setattr__(model.config, "detach_kb", False)
    assert not torch.allclose(grads[False], grads[True])


def test_silu_output_scale_starts_at_plus_or_minus_one_over_sqrt_rank():
    """2.2: ``s_j = ±1/sqrt(r)`` with random signs (so k(x, x) is O(1) whatever the rank)."""
    for r in (1, 16, 150):
        torch.manual_seed(3)
        s = make_model("dbk", rank=r, hidden=4, dtype="float64", device="cpu")._build(2, None, None).scale.detach()
        np.testing.assert_allclose(np.abs(s.numpy()), np.full(r, 1 / math.sqrt(r)), rtol=1e-6)
        if r >= 16:
            assert (s > 0).any() and (s < 0).any()


def test_variational_factor_parameterisation_at_init():
    model = make_model("dbk", rank=16, hidden=4, dtype="float64", device="cpu")
    mod = model._build(2, None, None).double()
    L = mod.q_factor()
    assert torch.all(L.diagonal() > 0)
    torch.testing.assert_close(L.diagonal(), torch.full((16,), 1 / math.sqrt(16)))
    torch.testing.assert_close(torch.logdet(L @ L.T), 2 * mod.rho.sum())
    torch.testing.assert_close(L, tril_factor(mod.A, mod.rho))


# ------------------------------------------------------------------ 9.2.12: theory (discretised oracle)
def _expected_loglik(K, s2, S):
    n = S.shape[0]
    Sig = K + s2 * np.eye(n)
    _, logdet = np.linalg.slogdet(Sig)
    return -0.5 * (n * np.log(2 * np.pi) + logdet + np.trace(np.linalg.solve(Sig, S)))


def _theorem3(S, r):
    lam, U = np.linalg.eigh(S)
    lam, U = lam[::-1], U[:, ::-1]
    s2 = lam[r:].mean()
    K = (U[:, :r] * (lam[:r] - s2)) @ U[:, :r].T
    return K, s2


def test_theorem3_rank_r_optimum_beats_random_feasible_pairs():
    rng = np.random.default_rng(0)
    n, r = 12, 3
    mu = rng.normal(size=n)
    D = np.diag(rng.uniform(0.05, 1.0, size=n))
    S = np.outer(mu, mu) + D
    K, s2 = _theorem3(S, r)
    best = _expected_loglik(K, s2, S)
    for _ in range(200):
        G = rng.normal(size=(n, r)) * rng.uniform(0.1, 2)
        assert _expected_loglik(G @ G.T, rng.uniform(0.01, 2), S) < best
    # homoscedastic noise: the optimum is rank one, K* = mu mu^T with sigma2* = s^2
    S_h = np.outer(mu, mu) + 0.3 * np.eye(n)
    K_h, s2_h = _theorem3(S_h, r)
    assert np.linalg.matrix_rank(K_h, tol=1e-8) == 1
    np.testing.assert_allclose(K_h, np.outer(mu, mu), atol=1e-10)
    assert s2_h == pytest.approx(0.3)
