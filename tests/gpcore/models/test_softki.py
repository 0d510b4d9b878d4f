"""SoftKI (docs/methods/softki.md §4, §9.4, errata S1–S8) against dense float64 oracles."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gpcore import make_model
from gpcore.models.kernels import stationary
from gpcore.models.linalg import inv_softplus
from gpcore.models.softki_linalg import (
    batch_solve,
    exact_batch_logp,
    make_probes,
    merge_factors,
    normal_equation_fit,
    pairwise_distances,
    prior_block,
    pseudo_logp,
    qr_fit,
    qr_fit_stream,
    qr_fold,
    qr_solve_factor,
    softmax_weights,
    weights_from_distances,
)
from tests.gpcore.models.battery import ModelBattery, toy_data

DT = torch.float64


class TestSoftKIBattery(ModelBattery):
    name = "softki"
    settings = {"num_inducing": 12, "epochs": 6, "batch_size": 32, "lr": 0.05}


class TestSoftKIPaperBattery(ModelBattery):
    name = "softki-paper"
    settings = {"num_inducing": 12, "epochs": 6, "batch_size": 32, "lr": 0.05, "solver": "dense"}


class TestSoftKIExactMLLBattery(ModelBattery):
    name = "softki"
    settings = {"num_inducing": 12, "epochs": 6, "batch_size": 32, "lr": 0.05, "mll": "exact"}


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def problem(n=40, m=7, d=2, seed=0, ell=0.6, os=1.3, s2=0.05):
    """A random small problem: inputs in [-1, 1]^d, random Z, targets from a smooth function."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT) * 2 - 1
    Z = torch.rand(m, d, generator=g, dtype=DT) * 2 - 1
    y = torch.sin(3 * X[:, 0]) + 0.5 * X[:, -1] + 0.1 * torch.randn(n, generator=g, dtype=DT)
    return X, y, Z, torch.tensor(ell, dtype=DT), torch.tensor(os, dtype=DT), torch.tensor(s2, dtype=DT)


def rbf(A, B, ell, os):
    return stationary("rbf", A, B, ell, os)


def hand_model(X, y, Z, ell, os, s2, tau=1.0, jitter=0.0, dtype="float64", **extra):
    """A SoftKI model with parameters set by hand, its posterior fitted on (X, y) (scaled units)."""
    model = make_model(
        "softki", dtype=dtype, device="cpu", num_inducing=Z.shape[0], tau=tau, jitter=jitter,
        standardize_distances=False, noise_floor=0.0, **extra,
    )
    tdt = model.dtype
    model.module_ = model._build(X.shape[1], None, None).to(dtype=tdt)
    mod = model.module_
    with torch.no_grad():
        mod.Z.copy_(Z)
        mod.raw_ell.fill_(inv_softplus(float(ell)))
        mod.raw_outputscale.fill_(inv_softplus(float(os)))
        mod.raw_noise.fill_(inv_softplus(float(s2)))
    model.finalize(X.to(tdt), y.to(tdt))
    return model


def dense_degenerate_posterior(W_train, W_test, Kzz, s2, y):
    """Dense O(n^3) posterior of the degenerate GP with covariance Q~ = W Kzz W^T (float64)."""
    Qxx = W_train @ Kzz @ W_train.T
    Qsx = W_test @ Kzz @ W_train.T
    Qss = W_test @ Kzz @ W_test.T
    S = Qxx + s2 * torch.eye(Qxx.shape[0], dtype=DT)
    mean = Qsx @ torch.linalg.solve(S, y)
    cov = Qss - Qsx @ torch.linalg.solve(S, Qsx.T)
    return mean, cov.diagonal()


# --------------------------------------------------------------------------------------------
# 9.4 (1) weights
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tau", [0.3, 1.0, 3.0])
def test_weights_are_a_softmax_of_euclidean_distances(tau):
    X, _, Z, *_ = problem(n=30, m=9, d=3)
    W = softmax_weights(X, Z, tau)
    assert (W >= 0).all()
    torch.testing.assert_close(W.sum(-1), torch.ones(30, dtype=DT), rtol=0, atol=1e-14)
    D = np.linalg.norm(X.numpy()[:, None, :] - Z.numpy()[None], axis=-1)  # Euclidean, NOT squared
    E = np.exp(-D / tau)
    np.testing.assert_allclose(W.numpy(), E / E.sum(1, keepdims=True), rtol=1e-9, atol=1e-14)


def test_weights_invariant_to_a_constant_added_to_distances():
    X, _, Z, *_ = problem(n=20, m=6)
    D = pairwise_distances(X, Z)
    W = weights_from_distances(D, 0.7)
    for c in (-3.0, 0.5, 50.0):
        torch.testing.assert_close(weights_from_distances(D + c, 0.7), W, rtol=1e-12, atol=1e-14)


def test_weights_become_one_hot_on_the_nearest_point_as_tau_goes_to_zero():
    X, _, Z, *_ = problem(n=50, m=8)
    D = pairwise_distances(X, Z)
    nearest = D.argmin(-1)
    gaps = D.sort(-1).values[:, 1] - D.min(-1).values
    assert gaps.min() > 1e-3  # the nearest point is unambiguous
    onehot = torch.nn.functional.one_hot(nearest, Z.shape[0]).to(DT)
    errs = [(softmax_weights(X, Z, tau) - onehot).abs().max().item() for tau in (1.0, 1e-1, 1e-2, 1e-5)]
    assert errs[0] > 0.1  # at the paper's unit temperature the rows are far from one-hot
    assert all(a >= b for a, b in zip(errs, errs[1:], strict=False))
    assert errs[-1] < 1e-12


def test_weight_gradient_is_finite_where_x_equals_z():
    X, _, Z, *_ = problem(n=10, m=5)
    Z = Z.clone()
    Z[2] = X[4]  # coincident data and interpolation point: ||x - z|| is not differentiable there
    Z.requires_grad_(True)
    Xr = X.clone().requires_grad_(True)
    softmax_weights(Xr, Z, 0.5)[:, 2].sum().backward()
    assert torch.isfinite(Z.grad).all() and torch.isfinite(Xr.grad).all()


# --------------------------------------------------------------------------------------------
# 9.4 (2) posterior = dense degenerate GP; eq. (24) regression guard
# --------------------------------------------------------------------------------------------


def test_posterior_mean_and_variance_equal_the_dense_degenerate_gp():
    X, y, Z, ell, os, s2 = problem(n=60, m=8)
    Xt = torch.cat([problem(n=25, seed=1)[0], 3.0 * torch.ones(1, 2, dtype=DT)])  # includes an extrapolation
    model = hand_model(X, y, Z, ell, os, s2, tau=0.5)
    mean, var = model._predict_f(Xt)
    Kzz = rbf(Z, Z, ell, os)
    m_ref, v_ref = dense_degenerate_posterior(softmax_weights(X, Z, 0.5), softmax_weights(Xt, Z, 0.5), Kzz, s2, y)
    torch.testing.assert_close(mean, m_ref, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(var, v_ref, rtol=1e-7, atol=1e-10)
    # the prior kernel is w(x)^T Kzz w(x') (docs/methods/softki.md §4.1)
    Wt = softmax_weights(Xt, Z, 0.5)
    torch.testing.assert_close(model._kernel_s(Xt, Xt[:4]), Wt @ Kzz @ Wt[:4].T, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(model._kernel_diag_s(Xt), (Wt @ Kzz @ Wt.T).diagonal(), rtol=1e-10, atol=1e-12)


def test_default_standardised_distances_posterior_equals_the_dense_degenerate_gp():
    """The default path (``standardize_distances=True``) with per-dimension training sds far from 1:
    distances are ``||(x - z) / s||`` with ``s`` the training sd of each scaled input column, for x
    AND Z (scaling only x moves every point away from its interpolation points)."""
    rng = np.random.default_rng(7)
    n = 70
    X = np.column_stack([rng.normal(0.0, 1.0, n) ** 3, rng.uniform(0.0, 100.0, n)])  # spiky and wide columns
    y = np.sin(X[:, 0]) + 0.01 * X[:, 1] + 0.1 * rng.normal(size=n)
    model = make_model("softki", dtype="float64", device="cpu", num_inducing=9, epochs=3, batch_size=32,
                       lr=0.05, mll="exact", seed=0)
    assert model.config.standardize_distances  # the default under test
    model.fit(X, y)
    Xs = 2.0 * (X - X.min(0)) / (X.max(0) - X.min(0)) - 1.0  # the model's [-1, 1] box, computed here
    sd = Xs.std(0)
    assert np.all(np.abs(np.log(sd)) > 0.3)  # far from unit scale in both columns
    Xt = np.concatenate([Xs[:10] + 0.05, rng.uniform(-1.2, 1.2, size=(15, 2))])
    mod = model.module_
    Z = mod.Z.detach().numpy()
    tau = model.config.tau

    def W(A):
        D = np.linalg.norm((A[:, None, :] - Z[None]) / sd, axis=-1)
        E = np.exp(-(D - D.min(1, keepdims=True)) / tau)
        return torch.tensor(E / E.sum(1, keepdims=True))

    with torch.no_grad():
        Kzz = mod.Kzz()
        s2 = mod.noise
        mean, var = model._predict_f(torch.tensor(Xt))
    m_ref, v_ref = dense_degenerate_posterior(W(Xs), W(Xt), Kzz, s2, model.scale_y(y))
    torch.testing.assert_close(mean, m_ref, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(var, v_ref, rtol=1e-6, atol=1e-9)


def test_paper_eq24_variance_is_wrong_and_the_corrected_form_is_right():
    """Regression guard (S4): eq. (24) as printed is far from the dense oracle; the corrected form matches."""
    X, y, Z, ell, os, s2 = problem(n=60, m=8)
    Xt = problem(n=25, seed=1)[0]
    tau = 0.5
    W, Wt = softmax_weights(X, Z, tau), softmax_weights(Xt, Z, tau)
    Kzz = rbf(Z, Z, ell, os)
    _, v_ref = dense_degenerate_posterior(W, Wt, Kzz, s2, y)
    n = X.shape[0]
    Lam_inv = torch.eye(n, dtype=DT) / s2
    Kxz = W @ Kzz
    C = Kzz + Kxz.T @ Lam_inv @ Kxz
    Qsx, Qxx, Qss = Wt @ Kzz @ W.T, W @ Kzz @ W.T, Wt @ Kzz @ Wt.T
    # SoftKI eq. (24), transcribed from the paper:
    #   Q~_** - Q~_*x ( Lam^-1 - Lam^-1 K^_xz C^-1 K^_zx Lam^-1 Q~_xx Lam^-1 ) Q~_x*
    inner24 = Lam_inv - Lam_inv @ Kxz @ torch.linalg.solve(C, Kxz.T) @ Lam_inv @ Qxx @ Lam_inv
    v24 = (Qss - Qsx @ inner24 @ Qsx.T).diagonal()
    assert (v24 - v_ref).abs().max() > 100.0 * v_ref.abs().max()  # orders of magnitude off
    # corrected form (S4): drop the spurious Q~_xx Lam^-1 factor
    inner = Lam_inv - Lam_inv @ Kxz @ torch.linalg.solve(C, Kxz.T) @ Lam_inv
    torch.testing.assert_close((Qss - Qsx @ inner @ Qsx.T).diagonal(), v_ref, rtol=1e-7, atol=1e-10)
    # ... which is K^_*z C^-1 K^_z* = ||R^-T k*||^2, what the model computes
    model = hand_model(X, y, Z, ell, os, s2, tau=tau)
    torch.testing.assert_close(model._predict_f(Xt)[1], v_ref, rtol=1e-7, atol=1e-10)


def test_float32_model_keeps_the_variance_with_small_fixed_noise():
    """The cached R^{-T} K_zz keeps float32 variances accurate even with the paper's noise 1e-3."""
    X, y, Z, ell, os, _ = problem(n=200, m=20, ell=0.5)
    Xt = problem(n=50, seed=3)[0]
    s2 = torch.tensor(1e-3, dtype=DT)
    ref = hand_model(X, y, Z, ell, os, s2, tau=0.3, jitter=1e-6)
    m64, v64 = ref._predict_f(Xt)
    f32 = hand_model(X, y, Z, ell, os, s2, tau=0.3, jitter=1e-6, dtype="float32")
    m32, v32 = f32._predict_f(Xt.float())
    assert (m32.double() - m64).abs().max() < 1e-3 * y.abs().max()
    assert (v32.double() - v64).abs().max() < 1e-4 * float(os)


# --------------------------------------------------------------------------------------------
# 9.4 (3) QR solve = normal equations; the lower factor is wrong; 9.4 (7) streaming QR
# --------------------------------------------------------------------------------------------


def test_qr_alpha_equals_the_normal_equation_solve():
    X, y, Z, ell, os, s2 = problem(n=70, m=9)
    W, Kzz = softmax_weights(X, Z, 0.4), rbf(Z, Z, ell, os)
    alpha, R = qr_fit(W, Kzz, s2, y)
    torch.testing.assert_close(alpha, normal_equation_fit(W, Kzz, s2, y), rtol=1e-8, atol=1e-10)
    Kh = W @ Kzz
    C = Kzz + Kh.T @ Kh / s2
    torch.testing.assert_close(R.T @ R, C, rtol=1e-10, atol=1e-10)  # R^T R = C^
    torch.testing.assert_close(alpha, torch.linalg.solve(C, Kh.T @ y / s2), rtol=1e-8, atol=1e-10)
    assert torch.equal(R, torch.triu(R)) and (R.diagonal() > 0).all()


def test_qr_with_the_lower_factor_stacked_gives_a_wrong_alpha():
    """S5: the paper's U U^T = K_zz (lower factor) makes A^T A != C^."""
    X, y, Z, ell, os, s2 = problem(n=70, m=9)
    W, Kzz = softmax_weights(X, Z, 0.4), rbf(Z, Z, ell, os)
    good = normal_equation_fit(W, Kzz, s2, y)
    L = torch.linalg.cholesky(Kzz)
    for chunk in (None, 11):
        bad, _ = qr_fit(W, Kzz, s2, y, chunk_size=chunk, factor=L)
        assert (bad - good).norm() > 1e-2 * good.norm()
        ok, _ = qr_fit(W, Kzz, s2, y, chunk_size=chunk, factor=L.T)  # the upper factor: right
        torch.testing.assert_close(ok, good, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("chunk", [1, 7, 16, 70, 1000])
def test_streaming_qr_equals_one_shot_qr(chunk):
    X, y, Z, ell, os, s2 = problem(n=70, m=9)
    W, Kzz = softmax_weights(X, Z, 0.4), rbf(Z, Z, ell, os)
    a1, R1 = qr_fit(W, Kzz, s2, y)
    a2, R2 = qr_fit(W, Kzz, s2, y, chunk_size=chunk)
    torch.testing.assert_close(a2, a1, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(R2, R1, rtol=1e-9, atol=1e-10)
    a3, _ = qr_fit_stream(iter([(W[:0], y[:0])]), Kzz, s2)  # no data: alpha = 0 (prior)
    assert torch.equal(a3, torch.zeros_like(a3))


def test_partial_tsqr_factors_merge_to_the_one_shot_fit():
    """What a sharded (multi-rank) fit does: fold disjoint row blocks separately, prior block once, merge."""
    X, y, Z, ell, os, s2 = problem(n=70, m=9)
    W, Kzz = softmax_weights(X, Z, 0.4), rbf(Z, Z, ell, os)
    a1, R1 = qr_fit(W, Kzz, s2, y)
    blocks = [(0, 30), (30, 33), (33, 33), (33, 70)]  # uneven, one empty
    parts = []
    for k, (i, j) in enumerate(blocks):
        start = prior_block(Kzz) if k == 0 else Kzz.new_zeros(0, 10)
        parts.append(qr_fold([(W[i:j], y[i:j])], Kzz, s2, start))
    a2, R2 = qr_solve_factor(merge_factors(parts), 9)
    torch.testing.assert_close(a2, a1, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(R2, R1, rtol=1e-9, atol=1e-10)


def test_model_finalize_is_chunk_independent():
    X, y, Z, ell, os, s2 = problem(n=60, m=8)
    Xt = problem(n=10, seed=2)[0]
    a = hand_model(X, y, Z, ell, os, s2, tau=0.5, fit_chunk=7)
    b = hand_model(X, y, Z, ell, os, s2, tau=0.5, fit_chunk=10_000)
    for ta, tb in zip(a._predict_f(Xt), b._predict_f(Xt), strict=True):
        torch.testing.assert_close(ta, tb, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------------------------
# 9.4 (4) Hutchinson pseudo-loss gradient; exact batch MLL
# --------------------------------------------------------------------------------------------


def _theta(seed=0, n=40, m=6):
    X, y, Z, ell, os, s2 = problem(n=n, m=m, seed=seed, ell=0.5, os=1.2, s2=0.1)
    return X, y, Z.clone().requires_grad_(True), ell.clone().requires_grad_(True), \
        os.clone().requires_grad_(True), s2.clone().requires_grad_(True)


def _grads(fn, params):
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(fn, params)])


def test_exact_batch_logp_equals_dense_logpdf_and_finite_differences():
    X, y, Z, ell, os, s2 = _theta()
    tau = 0.5
    W, Kzz = softmax_weights(X, Z, tau), rbf(Z, Z, ell, os)
    Sig = W @ Kzz @ W.T + s2 * torch.eye(X.shape[0], dtype=DT)
    dense = torch.distributions.MultivariateNormal(torch.zeros_like(y), covariance_matrix=Sig).log_prob(y)
    got = exact_batch_logp(W, Kzz, s2, y)
    torch.testing.assert_close(got, dense, rtol=1e-10, atol=1e-10)
    # also with m > b (the determinant lemma with a negative (b - m))
    small = exact_batch_logp(W[:4], Kzz, s2, y[:4])
    Sig4 = Sig[:4, :4]
    torch.testing.assert_close(
        small, torch.distributions.MultivariateNormal(torch.zeros(4, dtype=DT), Sig4).log_prob(y[:4]),
        rtol=1e-10, atol=1e-10,
    )
    # autograd gradient w.r.t. the lengthscale vs central finite differences

    def f(e):
        with torch.no_grad():
            return exact_batch_logp(softmax_weights(X, Z, tau), rbf(Z, Z, e, os), s2, y)

    (g,) = torch.autograd.grad(got, ell)
    h = 1e-6
    fd = (f(ell.detach() + h) - f(ell.detach() - h)) / (2 * h)
    torch.testing.assert_close(g, fd, rtol=1e-5, atol=1e-6)


def test_batch_solvers_agree():
    X, y, Z, ell, os, s2 = problem(n=30, m=6)
    W, Kzz = softmax_weights(X, Z, 0.5), rbf(Z, Z, ell, os)
    rhs = torch.randn(30, 4, generator=torch.Generator().manual_seed(0), dtype=DT)
    Sig = W @ Kzz @ W.T + s2 * torch.eye(30, dtype=DT)
    ref = torch.linalg.solve(Sig, rhs)
    for solver in ("woodbury", "dense"):
        torch.testing.assert_close(batch_solve(W, Kzz, s2, rhs, solver), ref, rtol=1e-8, atol=1e-9)


def test_pseudo_loss_gradient_matches_the_exact_batch_mll_gradient():
    """9.4 (4): with many fixed probes the gradient of pseudo_logp is that of log N(y_B; 0, Sig_B),
    within Monte-Carlo error and with the SAME sign (S1), for lengthscale, outputscale, Z and noise."""
    X, y, Z, ell, os, s2 = _theta()
    tau = 0.5
    params = [ell, os, Z, s2]

    def terms():
        return softmax_weights(X, Z, tau), rbf(Z, Z, ell, os)

    W, Kzz = terms()
    g_exact = _grads(exact_batch_logp(W, Kzz, s2, y), params)
    groups, per = 20, 100
    probes = torch.randn(X.shape[0], groups * per, generator=torch.Generator().manual_seed(1), dtype=DT)
    g_groups = torch.stack([
        _grads(pseudo_logp(*terms(), s2, y, probes[:, k * per : (k + 1) * per]), params) for k in range(groups)
    ])
    g_hat = g_groups.mean(0)
    # one call with all 2000 probes is the same estimator
    torch.testing.assert_close(_grads(pseudo_logp(*terms(), s2, y, probes), params), g_hat, rtol=1e-9, atol=1e-9)
    se = g_groups.std(0) / math.sqrt(groups)
    assert ((g_hat - g_exact).abs() <= 4.0 * se + 1e-8).all(), (g_hat, g_exact, se)
    assert ((g_hat - g_exact).abs() <= 0.1 * g_exact.abs().max()).all()
    strong = g_exact.abs() > 4.0 * se
    assert strong[0] and strong[1] and strong[-1] and strong[2:-1].sum() >= 4  # ell, os, noise, several Z
    assert torch.equal(torch.sign(g_hat[strong]), torch.sign(g_exact[strong]))
    # the sign printed in the paper (eq. 19) gives the opposite direction
    W, Kzz = terms()
    g_paper = _grads(-pseudo_logp(W, Kzz, s2, y, probes), params)
    assert torch.equal(torch.sign(g_paper[strong]), -torch.sign(g_exact[strong]))


def test_unit_length_probes_bias_the_trace_term():
    """S2: probes normalised to unit length shrink the log-det gradient by 1/b (noise gradient is off)."""
    X, y, Z, ell, os, s2 = _theta()
    W, Kzz = softmax_weights(X, Z, 0.5), rbf(Z, Z, ell, os)
    probes = torch.randn(X.shape[0], 2000, generator=torch.Generator().manual_seed(1), dtype=DT)
    (g_exact,) = torch.autograd.grad(exact_batch_logp(W, Kzz, s2, y), s2)
    (g_unnorm,) = torch.autograd.grad(pseudo_logp(W, Kzz, s2, y, probes), s2)
    (g_unit,) = torch.autograd.grad(pseudo_logp(W, Kzz, s2, y, probes / probes.norm(dim=0)), s2)
    assert abs(g_unnorm - g_exact) < 0.1 * abs(g_exact)
    assert abs(g_unit - g_exact) > 0.5 * abs(g_exact)


def test_probes_have_identity_second_moment():
    like = torch.zeros((), dtype=DT)
    torch.manual_seed(0)
    for dist in ("gaussian", "rademacher"):
        a = make_probes(5, 40_000, like, dist)
        torch.testing.assert_close(a @ a.T / 40_000, torch.eye(5, dtype=DT), rtol=0, atol=0.03)
    assert torch.equal(make_probes(3, 7, like, "rademacher").abs(), torch.ones(3, 7, dtype=DT))


def test_model_losses_are_the_documented_objectives():
    X, y, Z, ell, os, s2 = problem(n=30, m=6)
    for mll in ("exact", "hutchinson"):
        model = hand_model(X, y, Z, ell, os, s2, tau=0.5, mll=mll, num_probes=3)
        W, K, noise = model.batch_terms(X)
        torch.manual_seed(5)
        loss = model._loss(X, y, 100)
        if mll == "exact":
            torch.testing.assert_close(loss, -exact_batch_logp(W, K, noise, y) / 30, rtol=1e-12, atol=1e-12)
        else:
            torch.manual_seed(5)
            probes = make_probes(30, 3, W)
            torch.testing.assert_close(loss, -pseudo_logp(W, K, noise, y, probes) / 30, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------------
# 9.4 (5) exact-GP limit; (6) variance bounds
# --------------------------------------------------------------------------------------------


def test_exact_gp_limit_with_z_equal_x_and_tau_to_zero():
    X, y, _, ell, os, s2 = problem(n=25, m=1, ell=0.4, s2=0.05)
    K = rbf(X, X, ell, os)
    S = K + s2 * torch.eye(25, dtype=DT)
    m_gp = K @ torch.linalg.solve(S, y)  # exact GP at the training inputs
    v_gp = (K - K @ torch.linalg.solve(S, K)).diagonal()
    errs = []
    for tau in (1.0, 0.1, 0.01, 1e-4):
        model = hand_model(X, y, X.clone(), ell, os, s2, tau=tau)
        mean, var = model._predict_f(X)
        errs.append(max((mean - m_gp).abs().max().item(), (var - v_gp).abs().max().item()))
    assert errs[0] > 1e-2  # not at the paper's unit temperature (X1)
    assert all(a > b for a, b in zip(errs, errs[1:], strict=False))
    assert errs[-1] < 1e-8


def test_prior_and_posterior_variance_bounds():
    X, y, Z, ell, os, s2 = problem(n=50, m=10)
    g = torch.Generator().manual_seed(7)
    Xt = torch.cat([torch.rand(200, 2, generator=g, dtype=DT) * 2 - 1, torch.randn(50, 2, generator=g, dtype=DT) * 10])
    for jitter in (0.0, 1e-6):
        model = hand_model(X, y, Z, ell, os, s2, tau=0.5, jitter=jitter)
        prior = model._kernel_diag_s(Xt)
        _, post = model._predict_f(Xt)
        assert (prior <= os * (1 + jitter) + 1e-12).all()  # w^T K_zz w <= outputscale
        assert (post >= 0).all()
        assert (post <= prior + 1e-12).all()
        assert (post < prior).any()


# --------------------------------------------------------------------------------------------
# k-means, fitting, caches
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained():
    X, y = toy_data(n=90, d=2, seed=1)
    model = make_model("softki", dtype="float64", device="cpu", num_inducing=10, epochs=25, batch_size=30, lr=0.05)
    return model.fit(X, y), X, y


def test_training_increases_the_full_data_likelihood(trained):
    model, X, y = trained
    Xs, ys = model.scale_x(X), model.scale_y(y)
    start = make_model("softki", dtype="float64", device="cpu", num_inducing=10)
    start.d_, start.n_train_ = model.d_, model.n_train_
    start._set_scalers(X, y)
    torch.manual_seed(0)
    start.module_ = start._build(2, Xs, ys).to(DT)
    with torch.no_grad():
        before = exact_batch_logp(*start.batch_terms(Xs), ys)
        after = exact_batch_logp(*model.batch_terms(Xs), ys)
    assert after > before + 5.0
    pred = model.predict(X)
    assert np.sqrt(np.mean((pred.mean - y) ** 2)) < 0.6 * np.std(y)


def test_fitted_model_keeps_no_n_by_m_tensor(trained):
    model, X, _ = trained
    n, m, d = X.shape[0], 10, X.shape[1]
    shapes = {k: tuple(v.shape) for k, v in model.module_.state_dict().items()}
    assert all(n not in s for s in shapes.values()), shapes
    assert shapes["Z"] == (m, d)
    assert shapes["kzz_alpha"] == (m,) and shapes["R"] == (m, m) and shapes["var_factor"] == (m, m)
    assert max(math.prod(s) for s in shapes.values()) <= m * m
    # R is the QR factor of C^ at the fitted parameters
    mod = model.module_
    with torch.no_grad():
        W, K = mod.weights(model.scale_x(X)), mod.Kzz()
        C = K + (W @ K).T @ (W @ K) / mod.noise
    torch.testing.assert_close(mod.R.T @ mod.R, C, rtol=1e-8, atol=1e-8)


def test_fixed_noise_option_is_paper_faithful():
    X, y = toy_data(n=60, d=2, seed=2)
    model = make_model("softki-paper", dtype="float64", device="cpu", num_inducing=8, epochs=3, batch_size=20)
    assert model.config.num_inducing == 8 and not model.config.learn_noise
    model.fit(X, y)
    assert not model.module_.raw_noise.requires_grad
    assert model.noise_variance == pytest.approx(1e-3 * model.y_std_**2, rel=1e-12)
    learned = make_model("softki", dtype="float64", device="cpu", num_inducing=8, epochs=3, batch_size=20).fit(X, y)
    assert learned.module_.raw_noise.requires_grad
    assert learned.noise_variance >= 1e-4 * learned.y_std_**2
    assert learned.noise_variance != pytest.approx(0.1 * learned.y_std_**2, rel=1e-6)  # it moved


def test_kernel_slicer_without_the_weight_cache(trained, monkeypatch):
    import gpcore.models.softki as sk

    model, X, _ = trained
    cached = model.kernel_slice(X, X[3])
    monkeypatch.setattr(sk, "SLICER_CACHE_ENTRIES", 0)
    np.testing.assert_allclose(model.kernel_slice(X, X[3], batch_size=7), cached, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(cached, model.kernel(X, X[3:4])[:, 0], rtol=1e-10, atol=1e-12)
