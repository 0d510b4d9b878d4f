"""CaGP (docs/methods/cagp.md §5, §9.5, errata C1–C5) against dense float64 oracles and the exact GP."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from gpcore import make_model
from gpcore.models.cagp_autograd import CAGP_KERNELS, CaGPKernel, _KernelActions, _SymBlockKernelActions
from gpcore.models.cagp_linalg import (
    BlockActions,
    block_layout,
    block_sizes,
    cg_actions,
    conjugate_gradients,
    elbo_loss,
    init_block_values,
    itergp_dense,
    projected_nll,
    spatial_order,
)
from tests.gpcore.models.battery import ModelBattery

DT = torch.float64
N, D, I = 37, 2, 6  # n % i != 0: unequal block sizes (C2)


class TestCaGPBattery(ModelBattery):
    name = "cagp"
    settings = {"num_actions": 8, "epochs": 10, "lr": 0.1}


class TestCaGPSpatialBattery(ModelBattery):
    name = "cagp"
    settings = {"num_actions": 7, "epochs": 6, "lr": 0.1, "ordering": "spatial", "kernel": "rbf"}


class TestCaGPCGBattery(ModelBattery):
    name = "cagp-cg"
    settings = {"num_actions": 6, "epochs": 5, "lr": 0.1}


# --------------------------------------------------------------------------------------------
# helpers: a hand-built model and the dense oracles
# --------------------------------------------------------------------------------------------


def problem(n=N, d=D, seed=0, n_test=9):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT) * 2 - 1
    y = torch.sin(3 * X[:, 0]) + 0.5 * X[:, -1] + 0.3 * torch.randn(n, generator=g, dtype=DT)
    Xt = torch.rand(n_test, d, generator=g, dtype=DT) * 2.4 - 1.2
    return X, y, Xt


def built_model(X, y, i=I, kernel="matern32", noise=0.05, mu0=0.2, ell=(0.6, 0.9), os=1.3, **cfg):
    """A CaGP model built on (X, y) with hyperparameters set by hand (no training)."""
    m = make_model(
        "cagp", num_actions=i, kernel=kernel, dtype="float64", device="cpu", learn_mean=True, **cfg
    )
    m.n_train_ = X.shape[0]
    m.module_ = m._build(X.shape[1], X, y).to(DT)
    mod = m.module_
    with torch.no_grad():
        mod.kernel.raw_ell.copy_(
            torch.log(torch.expm1(torch.tensor(ell[: mod.kernel.raw_ell.numel()], dtype=DT)))
        )
        mod.kernel.raw_outputscale.copy_(torch.log(torch.expm1(torch.tensor(os, dtype=DT))))
        mod.raw_noise.copy_(torch.log(torch.expm1(torch.tensor(noise - mod.noise_floor, dtype=DT))))
        mod.mu0.fill_(mu0)
    return m


def exact_oracle(m, X, y):
    """The exact GP (gpcore.models.exact) with the same kernel, noise and mean as CaGP model ``m``."""
    ex = make_model("exact", kernel=m.config.kernel, dtype="float64", device="cpu")
    ex.module_ = ex._build(X.shape[1], X, y).to(DT)
    src, dst = m.module_, ex.module_
    with torch.no_grad():
        dst.raw_ell.copy_(src.kernel.raw_ell)
        dst.raw_outputscale.copy_(src.kernel.raw_outputscale)
        dst.raw_noise.copy_(torch.log(torch.expm1(src.noise - dst.noise_floor)))
        dst.mu0.copy_(src.mu0)
    ex._finalize(X, y)
    return ex


def dense_parts(m, X, y, S):
    mod = m.module_
    with torch.no_grad():
        K = mod.kernel(X, X)
        s2 = mod.noise
        Kh = K + s2 * torch.eye(X.shape[0], dtype=DT)
        C = S @ torch.linalg.solve(S.T @ Kh @ S, S.T)
        return K, Kh, C, s2, mod.mu0.detach()


def dense_posterior(m, X, y, S, Xt):
    """mu_i(Xt), K_i(Xt, Xt) from C_i = S (S^T Kh S)^{-1} S^T (dense, 5.1)."""
    K, Kh, C, s2, mu0 = dense_parts(m, X, y, S)
    with torch.no_grad():
        Kxt = m.module_.kernel(Xt, X)
        mean = mu0 + Kxt @ C @ (y - mu0)
        cov = m.module_.kernel(Xt, Xt) - Kxt @ C @ Kxt.T
    return mean, cov


def block_S(m, n):
    return m.module_.actions().dense(n).detach()


def random_block_S(n, i, seed):
    g = torch.Generator().manual_seed(seed)
    X = torch.zeros(n, 1, dtype=DT)
    index, mask = block_layout(X, i, "random", g)
    vals = init_block_values(mask, g)
    return BlockActions.from_data(X, vals, index, mask).dense(n)


# --------------------------------------------------------------------------------------------
# 9.5.1 ELBO closed form = definition;  9.5.2 upper bound on the NLL (C3 scaling)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["block", "dense"])
def test_elbo_closed_form_equals_dense_definition(kind):
    X, y, _ = problem()
    m = built_model(X, y)
    n = X.shape[0]
    S = (
        block_S(m, n)
        if kind == "block"
        else torch.randn(n, I, generator=torch.Generator().manual_seed(3), dtype=DT)
    )
    K, _, C, s2, mu0 = dense_parts(m, X, y, S)
    mq = mu0 + K @ C @ (y - mu0)
    Kq = K - K @ C @ K
    eye = torch.eye(n, dtype=DT)
    jit = 1e-10
    nll_term = (
        0.5 * math.log(2 * math.pi) + 0.5 * torch.log(s2) + ((y - mq) ** 2 + Kq.diagonal()) / (2 * s2)
    ).sum()
    q = torch.distributions.MultivariateNormal(mq, Kq + jit * eye)
    p = torch.distributions.MultivariateNormal(mu0 * torch.ones(n, dtype=DT), K + jit * eye)
    definition = nll_term + torch.distributions.kl_divergence(q, p)
    with torch.no_grad():
        closed = m.elbo(X, y) if kind == "block" else m.elbo(X, y, S)
    torch.testing.assert_close(closed, definition, rtol=1e-6, atol=1e-6)
    # the training loss is the ELBO divided by n (C3)
    if kind == "block":
        with torch.no_grad():
            torch.testing.assert_close(m._loss(X, y, n), closed / n, rtol=1e-12, atol=0)


def test_elbo_upper_bounds_nll_with_equality_at_full_rank():
    X, y, _ = problem()
    n = X.shape[0]
    m = built_model(X, y)
    with torch.no_grad():
        nll = -exact_oracle(m, X, y).log_marginal_likelihood(X, y)
        gaps = []
        for seed in range(4):
            g = torch.Generator().manual_seed(seed)
            for S in (random_block_S(n, I, seed), torch.randn(n, I + seed, generator=g, dtype=DT)):
                gaps.append(float(m.elbo(X, y, S) - nll))
        assert min(gaps) > 1e-6, gaps
        assert float(m.elbo(X, y) - nll) > 1e-6  # the model's own block actions
        # i = n with full-rank S: identity, random dense, and block-sparse with blocks of one point
        full = built_model(X, y, i=n)
        for S in (
            torch.eye(n, dtype=DT),
            torch.randn(n, n, generator=torch.Generator().manual_seed(7), dtype=DT),
        ):
            torch.testing.assert_close(m.elbo(X, y, S), nll, rtol=1e-7, atol=1e-8)
        torch.testing.assert_close(full.elbo(X, y), nll, rtol=1e-7, atol=1e-8)


# --------------------------------------------------------------------------------------------
# 9.5.3 exact recovery;  9.5.4 never overconfident, nested actions
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", CAGP_KERNELS)
def test_full_rank_actions_recover_exact_gp(kernel):
    X, y, Xt = problem()
    n = X.shape[0]
    m = built_model(X, y, i=n, kernel=kernel)
    ex = exact_oracle(m, X, y)
    with torch.no_grad():
        ex_mean, ex_var = ex._predict_f(Xt)
        Kxt = ex.module_.K(Xt, X)
        ex_cov = ex.module_.K(Xt, Xt) - Kxt @ torch.cholesky_solve(Kxt.T, ex.module_.L)
        for S in (
            None,
            torch.eye(n, dtype=DT),
            torch.randn(n, n, generator=torch.Generator().manual_seed(1), dtype=DT),
        ):
            post = m.posterior(X, y, S)
            mean, var = post.mean_var(Xt)
            torch.testing.assert_close(mean, ex_mean, rtol=1e-7, atol=1e-8)
            torch.testing.assert_close(var, ex_var, rtol=1e-6, atol=1e-8)
            torch.testing.assert_close(post.cov(Xt, Xt), ex_cov, rtol=1e-6, atol=1e-8)
        # through the model's prediction path (finalize + cached float64 factor)
        m.finalize(X, y)
        mean, var = m._predict_f(Xt)
        torch.testing.assert_close(mean, ex_mean, rtol=1e-7, atol=1e-8)
        torch.testing.assert_close(var, ex_var, rtol=1e-6, atol=1e-8)


def test_posterior_matches_dense_formula_and_is_never_overconfident():
    X, y, Xt = problem(n_test=40)
    n = X.shape[0]
    m = built_model(X, y)
    ex = exact_oracle(m, X, y)
    with torch.no_grad():
        _, ex_var = ex._predict_f(Xt)
        for S in (None, torch.randn(n, I, generator=torch.Generator().manual_seed(2), dtype=DT)):
            Sd = block_S(m, n) if S is None else S
            mean, var = m.posterior(X, y, S).mean_var(Xt)
            dmean, dcov = dense_posterior(m, X, y, Sd, Xt)
            torch.testing.assert_close(mean, dmean, rtol=1e-8, atol=1e-10)
            torch.testing.assert_close(var, dcov.diagonal(), rtol=1e-8, atol=1e-10)
            assert (var >= ex_var - 1e-10).all()
            assert (var - ex_var).max() > 1e-3  # computational uncertainty is really there
        # nested actions: more columns never increase the variance (Prop. S1)
        S_all = torch.randn(n, n, generator=torch.Generator().manual_seed(5), dtype=DT)
        prev = m.module_.kernel.diag(Xt)
        for j in (1, 3, 8, 20, n):
            var_j = m.posterior(X, y, S_all[:, :j]).mean_var(Xt)[1]
            assert (var_j <= prev + 1e-10).all()
            assert (var_j >= ex_var - 1e-9).all()
            prev = var_j
        torch.testing.assert_close(prev, ex_var, rtol=1e-6, atol=1e-9)


# --------------------------------------------------------------------------------------------
# 9.5.5 column-space invariance
# --------------------------------------------------------------------------------------------


def test_column_space_invariance():
    X, y, Xt = problem()
    n = X.shape[0]
    m = built_model(X, y)
    g = torch.Generator().manual_seed(11)
    S = block_S(m, n)
    Ws = {
        "permutation": torch.eye(I, dtype=DT)[torch.randperm(I, generator=g)],
        "diagonal": torch.diag(torch.rand(I, generator=g, dtype=DT) * 3 + 0.1),
        "general": torch.randn(I, I, generator=g, dtype=DT) + 2 * torch.eye(I, dtype=DT),
    }
    with torch.no_grad():
        ref_post = m.posterior(X, y)
        ref = (*ref_post.mean_var(Xt), ref_post.cov(Xt, Xt), m.elbo(X, y), m.projected_nll(X, y))
        for W in Ws.values():
            post = m.posterior(X, y, S @ W)
            got = (*post.mean_var(Xt), post.cov(Xt, Xt), m.elbo(X, y, S @ W), m.projected_nll(X, y, S @ W))
            for a, b in zip(got, ref, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)
        # the block-sparse path itself: permuting and rescaling blocks keeps the block structure
        mod = m.module_
        perm = torch.randperm(I, generator=g)
        scale = torch.rand(I, 1, generator=g, dtype=DT) * 5 + 0.05
        acts = BlockActions.from_data(X, mod.s_raw[perm] * scale, mod.index[perm], mod.mask[perm])
        s2, mu0 = mod.noise, mod.mu0
        torch.testing.assert_close(elbo_loss(mod.kernel, acts, y, mu0, s2), ref[3], rtol=1e-10, atol=1e-9)
        torch.testing.assert_close(projected_nll(mod.kernel, acts, y, mu0, s2), ref[4], rtol=1e-10, atol=1e-9)
        # without the -log det(S^T S) term the projected NLL would change under rescaling
        assert abs(float(acts.logdet_gram() - mod.actions().logdet_gram())) > 1e-2


# --------------------------------------------------------------------------------------------
# 9.5.6 batch (S2) = iterative (S1)
# --------------------------------------------------------------------------------------------


def test_batch_algorithm_equals_iterative_rank1_updates():
    X, y, Xt = problem()
    n = X.shape[0]
    m = built_model(X, y)
    K, Kh, C_batch, _, mu0 = dense_parts(m, X, y, block_S(m, n))
    for S in (block_S(m, n), torch.randn(n, 9, generator=torch.Generator().manual_seed(4), dtype=DT)):
        C_iter = itergp_dense(Kh, S)
        with torch.no_grad():
            post = m.posterior(X, y, S)
            mean, _ = post.mean_var(Xt)
            Kxt = m.module_.kernel(Xt, X)
            torch.testing.assert_close(mean, mu0 + Kxt @ C_iter @ (y - mu0), rtol=1e-8, atol=1e-10)
            torch.testing.assert_close(
                post.cov(Xt, Xt), m.module_.kernel(Xt, Xt) - Kxt @ C_iter @ Kxt.T, rtol=1e-8, atol=1e-10
            )
            torch.testing.assert_close(post.representer_weights(n), C_iter @ (y - mu0), rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(itergp_dense(Kh, block_S(m, n)), C_batch, rtol=1e-8, atol=1e-10)


# --------------------------------------------------------------------------------------------
# 9.5.7 block-sparse bookkeeping (C2, C4) and the tiled K S with its custom backward
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ordering", ["random", "spatial"])
@pytest.mark.parametrize("n,i", [(37, 6), (40, 8), (5, 5), (9, 1)])
def test_block_layout_keeps_every_point(ordering, n, i):
    X, _, _ = problem(n=n)
    index, mask = block_layout(X, i, ordering, torch.Generator().manual_seed(0))
    assert sorted(index[mask].tolist()) == list(range(n))  # nothing dropped, nothing repeated
    sizes = mask.sum(1).tolist()
    assert sizes == block_sizes(n, i) and max(sizes) - min(sizes) <= 1 and sum(sizes) == n


def test_spatial_ordering_gives_compact_blocks():
    X, _, _ = problem(n=400)
    sizes = block_sizes(400, 16)
    order = spatial_order(X.numpy(), sizes)
    spread = lambda idx: X[idx].var(0).sum()  # noqa: E731
    offs = np.cumsum([0] + sizes)
    spatial = np.mean([spread(order[a:b]) for a, b in zip(offs[:-1], offs[1:], strict=True)])
    rnd = np.random.default_rng(0).permutation(400)
    random = np.mean([spread(rnd[a:b]) for a, b in zip(offs[:-1], offs[1:], strict=True)])
    assert spatial < 0.2 * random


@pytest.mark.parametrize("kernel", CAGP_KERNELS)
@pytest.mark.parametrize("tile", [50, 20])  # symmetric block tiles; row tiles (blocks larger than 8 tiles)
def test_block_sparse_bookkeeping_and_blockwise_KS(kernel, tile):
    X, y, Xt = problem()
    n = X.shape[0]
    m = built_model(X, y, kernel=kernel, tile_size=tile)  # tiles of a few rows: many tiles
    acts = m.module_.actions(X)
    S = acts.dense(n).detach()
    StS = S.T @ S
    assert torch.count_nonzero(StS - torch.diag(StS.diagonal())) == 0
    norms2 = (S**2).sum(0)
    torch.testing.assert_close(acts.logdet_gram(), torch.log(norms2).sum(), rtol=1e-12, atol=0)
    torch.testing.assert_close(acts.logdet_gram(), torch.linalg.slogdet(StS)[1], rtol=1e-10, atol=1e-12)
    assert abs(float(acts.logdet_gram().detach() - torch.log(norms2.sum()))) > 1.0  # C4: not the log of a sum
    with torch.no_grad():
        K = m.module_.kernel(X, X)
        torch.testing.assert_close(acts.kernel_times(m.module_.kernel, X), K @ S, rtol=1e-10, atol=1e-12)
        Kt = m.module_.kernel(Xt, X)
        torch.testing.assert_close(acts.kernel_times(m.module_.kernel, Xt), Kt @ S, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(m.elbo(X, y), m.elbo(X, y, S), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("loss", ["elbo", "projected_nll"])
@pytest.mark.parametrize("tile", [64, 20])  # symmetric block tiles; row tiles
def test_block_path_gradients_equal_dense_autograd(loss, tile):
    """The tiled K S with its closed-form backward gives the same ELBO gradients as dense autograd."""
    X, y, _ = problem()
    n = X.shape[0]
    m = built_model(X, y, tile_size=tile)
    mod = m.module_
    params = [mod.s_raw, mod.kernel.raw_ell, mod.kernel.raw_outputscale, mod.raw_noise, mod.mu0]
    fn = m.elbo if loss == "elbo" else m.projected_nll
    g_block = torch.autograd.grad(fn(X, y), params)

    def dense_loss():
        S = mod.actions(X).dense(n)
        K = mod.kernel(X, X)
        s2, mu0 = mod.noise, mod.mu0
        Kh = K + s2 * torch.eye(n, dtype=DT)
        A = S.T @ Kh @ S
        r = y - mu0
        ytil = S.T @ r
        vt = torch.linalg.solve(A, ytil)
        logdet_StS = torch.logdet(S.T @ S)
        if loss == "projected_nll":
            return 0.5 * (ytil @ vt + torch.logdet(A) - logdet_StS + I * math.log(2 * math.pi))
        C = S @ torch.linalg.solve(A, S.T)
        mq = mu0 + K @ S @ vt
        Kq_diag = K.diagonal() - (K @ C * K).sum(1)
        StKS = S.T @ K @ S
        return 0.5 * (
            ((y - mq) ** 2).sum() / s2
            + Kq_diag.sum() / s2
            + (n - I) * torch.log(s2)
            + n * math.log(2 * math.pi)
            + vt @ StKS @ vt
            - torch.linalg.solve(A, StKS).trace()
            + torch.logdet(A)
            - logdet_StS
        )

    g_dense = torch.autograd.grad(dense_loss(), params)
    for a, b in zip(g_block, g_dense, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("kernel", CAGP_KERNELS)
@pytest.mark.parametrize("blocked", [True, False])
@pytest.mark.parametrize("ard", [True, False])
def test_kernel_actions_gradcheck(kernel, blocked, ard):
    X, _, Xt = problem(n=13)
    ker = CaGPKernel(D, kernel, ard, 0.5, 1.2)
    index, mask = block_layout(X, 4, "random", torch.Generator().manual_seed(0))
    if blocked:
        S = (init_block_values(mask) * mask).requires_grad_(True)
        Xc = X[index.reshape(-1)]
    else:
        S = torch.randn(13, 3, dtype=DT, requires_grad=True)
        Xc = X
    ell = ker.lengthscale.detach().double().requires_grad_(True)
    o = ker.outputscale.detach().double().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda s, e, oo: _KernelActions.apply(Xt, Xc, s, e, oo, kernel, blocked, 20), (S, ell, o)
    )


@pytest.mark.parametrize("kernel", CAGP_KERNELS)
@pytest.mark.parametrize("tile", [1, 30, 10**6])  # one block per row group, a few, all at once
def test_symmetric_block_KS_equals_dense_and_gradchecks(kernel, tile):
    X, _, _ = problem(n=14)
    index, mask = block_layout(X, 4, "random", torch.Generator().manual_seed(2))  # sizes 4, 4, 3, 3
    Xb = X[index.reshape(-1)]
    V = (init_block_values(mask) * mask).requires_grad_(True)
    ker = CaGPKernel(D, kernel, True, 0.5, 1.2, tile_size=tile).double()
    with torch.no_grad():
        S = BlockActions.from_data(X, V, index, mask).dense(14)
        dense = ker(Xb, X) @ S
        torch.testing.assert_close(ker.sym_block_actions(Xb, V), dense, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(ker.sym_block_actions(Xb, V, cached=dense), dense, rtol=0, atol=0)
    ell = ker.lengthscale.detach().double().requires_grad_(True)
    o = ker.outputscale.detach().double().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda v, e, oo: _SymBlockKernelActions.apply(Xb, v * mask, e, oo, kernel, tile), (V, ell, o)
    )


# --------------------------------------------------------------------------------------------
# 9.5.8 CG actions
# --------------------------------------------------------------------------------------------


def test_cg_residuals_span_krylov_space_and_mean_equals_cg_iterate():
    X, y, Xt = problem()
    n = X.shape[0]
    m = built_model(X, y)
    mod = m.module_
    with torch.no_grad():
        _, Kh, _, s2, mu0 = dense_parts(m, X, y, torch.eye(n, dtype=DT))
        r0 = y - mu0
        for i in (1, 3, 6):
            R = cg_actions(mod.kernel, X, r0, s2, i, tol=0.0)
            assert R.shape == (n, i)
            kry = [r0]
            for _ in range(i - 1):
                kry.append(Kh @ kry[-1])
            Q1 = torch.linalg.qr(R)[0]
            Q2 = torch.linalg.qr(torch.stack(kry, 1) / torch.stack(kry, 1).norm(dim=0))[0]
            torch.testing.assert_close(Q1 @ Q1.T, Q2 @ Q2.T, rtol=0, atol=1e-8)
            # CaGP with S = CG residuals: representer weights and mean are the CG iterate v_i
            _, iterates = conjugate_gradients(lambda v: Kh @ v, r0, i)
            v_i = iterates[-1]
            post = m.posterior(X, y, R)
            torch.testing.assert_close(post.representer_weights(n), v_i, rtol=1e-7, atol=1e-9)
            torch.testing.assert_close(
                post.mean_var(Xt)[0], mu0 + mod.kernel(Xt, X) @ v_i, rtol=1e-7, atol=1e-9
            )


def test_cagp_cg_model_mean_equals_cg_iterate():
    X, y, Xt = problem()
    n = X.shape[0]
    m = built_model(X, y, i=5, actions="cg", cg_tol=0.0)
    mod = m.module_
    with torch.no_grad():
        m.finalize(X, y)
        assert mod.S.shape == (n, 5)
        Kh = mod.kernel(X, X) + mod.noise * torch.eye(n, dtype=DT)
        v_5 = conjugate_gradients(lambda v: Kh @ v, y - mod.mu0, 5)[1][-1]
        mean, _ = m._predict_f(Xt)
        torch.testing.assert_close(mean, mod.mu0 + mod.kernel(Xt, X) @ v_5, rtol=1e-7, atol=1e-9)
        # CG run to convergence: the orthonormalised residuals span R^n and CaGP-CG is the exact GP
        m_conv = built_model(X, y, i=n, actions="cg", cg_tol=1e-10)
        m_conv.finalize(X, y)
        torch.testing.assert_close(
            m_conv.module_.S.T @ m_conv.module_.S, torch.eye(n, dtype=DT), rtol=0, atol=1e-12
        )
        ex_mean, ex_var = exact_oracle(m_conv, X, y)._predict_f(Xt)
        mean, var = m_conv._predict_f(Xt)
        torch.testing.assert_close(mean, ex_mean, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(var, ex_var, rtol=1e-8, atol=1e-10)


# --------------------------------------------------------------------------------------------
# model-level behaviour
# --------------------------------------------------------------------------------------------


def test_training_lowers_the_elbo_and_float32_path_agrees():
    X, y, _ = problem(n=120, seed=3)
    Xn, yn = X.numpy() * 10 + 3, y.numpy() * 2 + 5
    threads = torch.get_num_threads()
    m = make_model("cagp", num_actions=12, epochs=25, lr=0.1, dtype="float64", device="cpu").fit(Xn, yn)
    assert torch.get_num_threads() == threads  # the tile loops' thread setting is restored
    losses = [h["loss"] for h in m.history_]
    assert losses[-1] < losses[0] - 0.1
    Xs, ys = m.scale_x(Xn), m.scale_y(yn)
    with torch.no_grad():
        torch.testing.assert_close(
            m.elbo(Xs, ys) / 120, torch.tensor(losses[-1], dtype=DT), rtol=0.2, atol=0.1
        )
        # float32 evaluation of the same trained model
        m32 = make_model("cagp", num_actions=12, dtype="float32", device="cpu")
        m32.n_train_ = 120
        m32.module_ = copy.deepcopy(m.module_).float()
        torch.testing.assert_close(m32.elbo(Xs.float(), ys.float()), m.elbo(Xs, ys), rtol=1e-4, atol=1e-3)
        assert m32.module_.Lc.dtype == torch.float64


@pytest.mark.parametrize("actions", ["opt", "cg"])
def test_finalize_cache_gives_the_same_loss_and_gradients(actions):
    X, y, _ = problem()
    m = built_model(X, y, i=5, actions=actions)
    params = [p for p in m.module_.parameters() if p.requires_grad]

    def loss_and_grads():
        loss = m._loss(X, y, X.shape[0])
        return loss.detach(), torch.autograd.grad(loss, params)

    fresh = loss_and_grads()
    m.finalize(X, y)
    assert m._cache is not None
    cached = loss_and_grads()
    assert m._cache is None  # used once
    torch.testing.assert_close(cached, fresh, rtol=1e-12, atol=1e-14)
    # an in-place parameter change (an optimizer step) invalidates the cache
    m.finalize(X, y)
    with torch.no_grad():
        m.module_.kernel.raw_ell.add_(0.3)
    changed = loss_and_grads()
    m._cache = None
    torch.testing.assert_close(changed, loss_and_grads(), rtol=1e-12, atol=1e-14)
    assert abs(float(changed[0] - fresh[0])) > 1e-4
