"""Vecchia GP: exact at m = n - 1 against dense oracles, convergence in m, ordering and neighbours
against brute force, and the shared battery (docs/methods/common.md §1.2 for the exact GP it approximates)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.linalg import cho_factor, cho_solve
from scipy.stats import multivariate_normal

from gpcore import InputError, make_model
from gpcore.models.neighbors import coord_order, maxmin_order, ordered_neighbors
from tests.gpcore.models.battery import ModelBattery
from tests.gpcore.models.test_exact import _np_kernel


def _data(n=60, d=2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 10, size=(n, d))
    y = 5 + np.sin(X[:, 0]) * X[:, -1] + 0.3 * rng.normal(size=n)
    return X, y


def _fitted_pair(X, y, kernel, **vsettings):
    """A vecchia and an exact model on the same data with the same (non-default) hyperparameters."""
    common = {"kernel": kernel, "dtype": "float64", "device": "cpu", "epochs": 1}
    vec = make_model("vecchia", **common, **vsettings).fit(X, y)
    ex = make_model("exact", **common).fit(X, y)
    raw = {"raw_ell": torch.tensor([-0.7, 0.2]), "raw_outputscale": torch.tensor(0.4),
           "raw_noise": torch.tensor(-2.0), "mu0": torch.tensor(0.3)}
    with torch.no_grad():
        for mod in (vec.module_, ex.module_):
            for k, v in raw.items():
                getattr(mod, k).copy_(v.to(torch.float64))
    ex.finalize(ex.scale_x(X), ex.scale_y(y))
    return vec, ex


def _dense_loglik(model, X, y):
    """log N(y; mu0, K + s2 I) in caller units, kernel by scipy's cdist from the hyperparameters (dense)."""
    ell = model.module_.lengthscale.detach().numpy() * model.x_span_ / 2.0
    os_ = model.module_.outputscale.item() * model.y_std_**2
    K = _np_kernel(model.config.kernel, X, X, ell, os_) + model.noise_variance * np.eye(X.shape[0])
    return multivariate_normal.logpdf(y, mean=np.full(X.shape[0], model.prior_mean), cov=K)


def _dense_predict(model, X, y, Xt):
    """Exact-GP predictive mean and latent variance in caller units (numpy/scipy, dense)."""
    ell = model.module_.lengthscale.detach().numpy() * model.x_span_ / 2.0
    os_ = model.module_.outputscale.item() * model.y_std_**2
    K = _np_kernel(model.config.kernel, X, X, ell, os_) + model.noise_variance * np.eye(X.shape[0])
    Ks = _np_kernel(model.config.kernel, Xt, X, ell, os_)
    c = cho_factor(K, lower=True)
    mu0 = model.prior_mean
    return mu0 + Ks @ cho_solve(c, y - mu0), os_ - np.einsum("ij,ji->i", Ks, cho_solve(c, Ks.T))


def dense_loglik_torch(model):
    """log N(y; m(X), K + diag(noise)) of the ordered training rows, scaled units, by a dense torch Cholesky (autograd
    through it: the reference for the closed-form gradients of the Vecchia terms)."""
    from gpcore.models import spacetime as st

    mod = model.module_
    X, y = mod.X_train.double(), mod.y_train.double()
    w = model._group_noise(torch.arange(X.shape[0])) if model.weighted else None
    noise = mod.noise.double().expand(X.shape[0]) if w is None else w
    C = mod.K(X, X).double() + torch.diag(noise)
    z = y - st.prior_mean(mod, X)
    L = torch.linalg.cholesky(C)
    v = torch.linalg.solve_triangular(L, z[:, None], upper=False)
    return -0.5 * X.shape[0] * np.log(2 * np.pi) - torch.log(torch.diagonal(L)).sum() - 0.5 * v.pow(2).sum()


def assert_vecchia_gradient_equals_dense(model):
    """At m = n - 1 the gradient of the Vecchia log-likelihood in every hyperparameter equals the dense one."""
    params = [p for p in model.module_.parameters() if p.requires_grad]
    g = torch.autograd.grad(model.log_likelihood(), params)
    g_ref = torch.autograd.grad(dense_loglik_torch(model), params)
    for a, b in zip(g, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)
    assert max(float(a.abs().max()) for a in g) > 1e-3  # away from the optimum: a real comparison


@pytest.mark.parametrize("kernel", ["matern12", "matern32", "rbf"])
@pytest.mark.parametrize("weighted", [False, True])
def test_likelihood_gradient_equals_the_dense_gradient(kernel, weighted):
    X, y = _data()
    w = np.random.default_rng(3).integers(1, 9, size=X.shape[0]).astype(float) if weighted else None
    model = make_model("vecchia", kernel=kernel, dtype="float64", device="cpu", epochs=1, neighbors=X.shape[0] - 1,
                       chunk_size=16).fit(X, y, weights=w)
    with torch.no_grad():
        model.module_.raw_ell.copy_(torch.tensor([-0.7, 0.2], dtype=torch.float64))
        model.module_.raw_noise.fill_(-2.0)
    assert_vecchia_gradient_equals_dense(model)


@pytest.mark.parametrize("kernel", ["matern32", "matern12", "matern52", "rbf"])
@pytest.mark.parametrize("ordering", ["maxmin", "coord"])
def test_full_neighbour_sets_equal_the_exact_gp(kernel, ordering):
    X, y = _data()
    n = X.shape[0]
    vec, ex = _fitted_pair(X, y, kernel, neighbors=n - 1, pred_neighbors=n, ordering=ordering)
    # likelihood: scaled-unit Vecchia value + Jacobian of the target standardisation = dense caller-unit value
    ll = vec.log_likelihood().item() - n * np.log(vec.y_std_)
    assert ll == pytest.approx(_dense_loglik(vec, X, y), rel=1e-9, abs=1e-8)
    # the exact model's expanded |a|^2 - 2ab + |b|^2 distances carry ~1e-9 relative error for Matern-1/2
    assert vec.log_likelihood().item() == pytest.approx(
        ex.log_marginal_likelihood(ex.scale_x(X), ex.scale_y(y)).item(), rel=1e-8)
    Xt = np.random.default_rng(5).uniform(0, 10, size=(25, 2))
    a = vec.predict(Xt)
    mean, var_f = _dense_predict(vec, X, y, Xt)
    np.testing.assert_allclose(a.mean, mean, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(a.var_f, var_f, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(a.var_y, var_f + vec.noise_variance, rtol=1e-8, atol=1e-8)
    b = ex.predict(Xt)  # as above: the exact model's own distance rounding limits Matern-1/2 to ~1e-7
    tol = 1e-6 if kernel == "matern12" else 1e-8
    np.testing.assert_allclose(a.mean, b.mean, rtol=tol, atol=tol)
    np.testing.assert_allclose(a.var_y, b.var_y, rtol=tol, atol=tol)


def test_likelihood_approaches_exact_as_m_grows():
    X, y = _data(n=200, seed=3)
    gaps = []
    ms = [1, 2, 4, 8, 16, 32, 64, 199]
    for m in ms:
        vec, ex = _fitted_pair(X, y, "matern32", neighbors=m)
        exact = ex.log_marginal_likelihood(ex.scale_x(X), ex.scale_y(y)).item()
        gaps.append(abs(vec.log_likelihood().item() - exact))
    assert gaps[0] > 1.0  # m = 1 is a poor approximation here, so the test can see convergence
    assert gaps[-1] < 1e-8 * abs(exact)
    for prev, nxt in zip(gaps, gaps[1:], strict=False):
        assert nxt <= prev * 1.05 + 1e-9, gaps  # monotone up to small wiggles
    assert gaps[4] < 0.1 * gaps[0], gaps


def _maxmin_brute(X):
    n = X.shape[0]
    first = int(np.argmin(((X - X.mean(0)) ** 2).sum(1)))
    order = [first]
    dist = np.sqrt(((X - X[first]) ** 2).sum(1))
    taken = np.zeros(n, bool)
    taken[first] = True
    for _ in range(n - 1):
        cand = np.where(taken, -np.inf, dist)
        i = int(np.argmax(cand))
        order.append(i)
        taken[i] = True
        dist = np.minimum(dist, np.sqrt(((X - X[i]) ** 2).sum(1)))
    return np.array(order)


@pytest.mark.parametrize("case", ["uniform2d", "uniform3d", "grid_with_ties", "duplicates"])
def test_maxmin_order_matches_brute_force(case):
    rng = np.random.default_rng(1)
    if case == "uniform2d":
        X = rng.uniform(-1, 1, size=(400, 2))
    elif case == "uniform3d":
        X = rng.normal(size=(300, 3))
    elif case == "grid_with_ties":
        g = np.linspace(-1, 1, 13)
        X = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    else:
        X = rng.uniform(-1, 1, size=(60, 2))
        X = np.concatenate([X, X[:20]])
    np.testing.assert_array_equal(maxmin_order(X), _maxmin_brute(X))
    np.testing.assert_array_equal(coord_order(X), np.argsort(X[:, 0], kind="stable"))


@pytest.mark.parametrize("brute_below", [0, 50, 2048])
def test_neighbours_match_brute_force(brute_below):
    rng = np.random.default_rng(2)
    X = rng.uniform(-1, 1, size=(500, 2))
    Xo = X[maxmin_order(X)]
    m = 7
    nbr = ordered_neighbors(Xo, m, brute_below=brute_below)
    assert nbr.shape == (500, m)
    for i in range(500):
        d = np.sqrt(((Xo[:i] - Xo[i]) ** 2).sum(1))
        ref = np.argsort(d, kind="stable")[:m]
        k = min(i, m)
        np.testing.assert_array_equal(nbr[i, :k], ref, err_msg=f"row {i}")  # nearest first
        assert (nbr[i, k:] == -1).all()


@pytest.mark.parametrize("brute_below", [0, 300, 2048])
def test_neighbours_report_their_rows_as_they_become_final(brute_below):
    """``on_rows(out, k)``: rows below ``k`` are already what the search returns (the joint factor's loop reads them
    on another thread while the later rows are searched); ``k`` grows to every row."""
    rng = np.random.default_rng(4)
    X = rng.uniform(-1, 1, size=(1500, 2))
    Xo = X[maxmin_order(X)]
    seen = []
    nbr = ordered_neighbors(Xo, 6, brute_below=brute_below, on_rows=lambda out, k: seen.append((k, out[:k].copy())))
    np.testing.assert_array_equal(nbr, ordered_neighbors(Xo, 6, brute_below=brute_below))
    ks = [k for k, _ in seen]
    assert ks == sorted(ks) and ks[-1] == 1500 and len(ks) >= 3
    for k, rows in seen:
        np.testing.assert_array_equal(rows, nbr[:k], err_msg=f"rows below {k}")


def test_learns_the_noise_and_has_no_feature_form():
    from gpcore.posterior import JointPosterior

    rng = np.random.default_rng(1)
    X = rng.uniform(-1, 1, size=(300, 1))
    y = np.sin(4 * X[:, 0]) + 0.1 * rng.normal(size=300)
    model = make_model("vecchia", neighbors=10, epochs=150, dtype="float64", device="cpu").fit(X, y)
    assert 0.003 < model.noise_variance < 0.03  # true noise variance 0.01
    with pytest.raises(InputError, match="no feature form.*joint Vecchia prediction"):
        JointPosterior(model)  # its joint posterior is gpcore.posterior.VecchiaJointPosterior (test_vecchia_joint.py)


class TestVecchiaBattery(ModelBattery):
    name = "vecchia"
    # the battery scores the validation rows against the trainer: the posterior before they join it
    settings = {"epochs": 15, "neighbors": 10, "condition_on_validation": False}


def test_same_approximation_as_gpboost_when_installed():
    """GPBoost's Vecchia likelihood on the points in our maxmin order (its ordering 'none') is ours."""
    gpb = pytest.importorskip("gpboost")
    X, y = _data(n=400, seed=4)
    vec, _ = _fitted_pair(X, y, "matern32", neighbors=10)
    mod = vec.module_
    with torch.no_grad():
        mod.raw_ell.fill_(-1.0)  # isotropic: GPBoost's 'matern' has one range
        ll = vec.log_likelihood().item()
    gp = gpb.GPModel(gp_coords=mod.X_train.numpy(), cov_function="matern", cov_fct_shape=1.5, likelihood="gaussian",
                     gp_approx="vecchia", num_neighbors=10, vecchia_ordering="none")
    cov_pars = np.array([mod.noise.item(), mod.outputscale.item(), mod.lengthscale[0].item()])
    nll = gp.neg_log_likelihood(cov_pars=cov_pars, y=(mod.y_train - mod.mu0).detach().numpy())
    assert -nll == pytest.approx(ll, rel=1e-9)


@pytest.mark.parametrize("pred", [0, 7])
def test_marginal_predictions_take_3m_over_2_neighbours_and_the_joint_m_unless_set(pred):
    """pred_neighbors = 0: a marginal prediction conditions on the 3m/2 nearest training points, the joint posterior on
    m; a value set explicitly is both. The marginal is the exact GP's on those points."""
    X, y = _data(n=200, seed=5)
    m = 6
    vec = make_model("vecchia", neighbors=m, pred_neighbors=pred, epochs=2, dtype="float64", device="cpu",
                     condition_on_validation=False).fit(X, y)
    Xt = np.random.default_rng(6).uniform(0, 10, size=(5, 2))
    xs = vec.scale_x(Xt)
    N = vec._prediction_neighbors(xs)
    assert N.shape[1] == (pred or 9) and vec._prediction_neighbors(xs, joint=True).shape[1] == (pred or m)
    mod = vec.module_
    Xtr = mod.X_train.double().numpy()
    d = np.linalg.norm(Xtr[None, :, :] - xs.double().numpy()[:, None, :], axis=-1)
    np.testing.assert_array_equal(np.sort(N.numpy(), 1), np.sort(np.argsort(d, 1)[:, : N.shape[1]], 1))
    mean, var_f = (t.double() for t in vec._predict_f(xs))
    with torch.no_grad():
        for j in range(5):  # the exact GP on the chosen neighbours
            idx = N[j]
            K = mod.K(mod.X_train[idx].double(), mod.X_train[idx].double()) + mod.noise.double() * torch.eye(len(idx))
            k = mod.K(mod.X_train[idx].double(), xs[j : j + 1].double())[:, 0]
            sol = torch.linalg.solve(K, torch.stack([mod.y_train.double()[idx] - mod.mu0.double(), k], 1))
            assert mean[j].item() == pytest.approx((mod.mu0.double() + k @ sol[:, 0]).item(), rel=1e-7)
            assert var_f[j].item() == pytest.approx((mod.outputscale.double() - k @ sol[:, 1]).item(), abs=1e-8)


def test_auto_lengthscale_init_is_the_neighbourhood_radius():
    X, y = _data(n=301)
    model = make_model("vecchia", neighbors=8, dtype="float64", device="cpu")
    model.d_ = 2
    model._set_scalers(X, y)
    mod = model._build(2, model.scale_x(X), model.scale_y(y))
    Xs = model.scale_x(X).numpy()
    Xo = Xs[maxmin_order(Xs)]
    radius = [np.sort(np.linalg.norm(Xo[:i] - Xo[i], axis=1))[7] for i in range(150, 301)]  # 151: odd median
    np.testing.assert_allclose(mod.lengthscale.detach().numpy(), np.median(radius), rtol=1e-6)  # float32 parameter


@pytest.mark.parametrize("extra, where", [(0.0, "5 %"), (2.0, "between"), (20.0, "90 %")])
def test_auto_initial_variances_are_the_nearest_predecessors_semivariance(extra, where):
    """noise_init = outputscale_init = 0 (auto): the noise starts at half the mean squared difference of each row
    of the ordering's second half and its nearest predecessor, clamped to 5-90 % of the target variance, and the
    outputscale at the rest; set values are kept (recomputed here by brute force in numpy)."""
    X, y = _data(n=301)
    y = y + extra * np.random.default_rng(9).normal(size=y.shape)  # 0: smooth, 20: almost all noise
    model = make_model("vecchia", neighbors=8, dtype="float64", device="cpu")
    model.d_ = 2
    model._set_scalers(X, y)
    Xs, ys = model.scale_x(X).numpy(), model.scale_y(y).numpy()
    mod = model._build(2, model.scale_x(X), model.scale_y(y))
    perm = maxmin_order(Xs)
    Xo, yo = Xs[perm], ys[perm]
    nearest = [int(np.argmin(np.linalg.norm(Xo[:i] - Xo[i], axis=1))) for i in range(150, 301)]
    v = yo.var(ddof=1)
    semi = 0.5 * np.mean((yo[150:] - yo[nearest]) ** 2)
    noise = min(max(semi, 0.05 * v), 0.9 * v)
    assert {"5 %": semi < 0.05 * v, "between": 0.05 * v < semi < 0.9 * v, "90 %": semi > 0.9 * v}[where]
    assert mod.noise.item() == pytest.approx(noise, rel=1e-6)  # float32 parameters until fit casts the module
    assert mod.outputscale.item() == pytest.approx(v - noise, rel=1e-6)
    fixed = make_model("vecchia", neighbors=8, dtype="float64", device="cpu", noise_init=0.3, outputscale_init=2.0)
    fixed.d_ = 2
    fixed._set_scalers(X, y)
    mod = fixed._build(2, fixed.scale_x(X), fixed.scale_y(y))
    assert mod.noise.item() == pytest.approx(0.3, rel=1e-6) and mod.outputscale.item() == pytest.approx(2.0, rel=1e-6)


def test_weighted_full_neighbour_sets_equal_the_dense_weighted_gp():
    """Per-observation weights: noise tau^2 + s2 / w_i in every conditional; with m = n - 1 the likelihood and
    the predictions are the dense GP's with that diagonal noise (float64)."""
    X, y = _data(n=70, seed=3)
    n = X.shape[0]
    w = np.random.default_rng(3).integers(1, 20, size=n).astype(float)
    vec = make_model("vecchia", kernel="matern32", neighbors=n - 1, pred_neighbors=n, dtype="float64", device="cpu",
                     epochs=1).fit(X, y, weights=w)
    with torch.no_grad():
        vec.module_.raw_ell.copy_(torch.tensor([-0.7, 0.2], dtype=torch.float64))
        vec.module_.raw_noise.fill_(-1.0)
        vec.module_.raw_nugget.fill_(-3.0)
    vec.finalize(vec.scale_x(X), vec.scale_y(y), vec._to_tensor(w))
    ell = vec.module_.lengthscale.detach().numpy() * vec.x_span_ / 2.0
    os_ = vec.module_.outputscale.item() * vec.y_std_**2
    noise = vec.nugget_variance + vec.measurement_noise_variance / w
    K = _np_kernel("matern32", X, X, ell, os_) + np.diag(noise)
    mu0 = vec.prior_mean
    # the training step's weights, as the trainer hands them over
    ll = vec.log_likelihood(vec._to_tensor(w)).item() - n * np.log(vec.y_std_)
    assert ll == pytest.approx(multivariate_normal.logpdf(y, mean=np.full(n, mu0), cov=K), rel=1e-9)
    Xt = np.random.default_rng(6).uniform(0, 10, size=(20, 2))
    Ks = _np_kernel("matern32", Xt, X, ell, os_)
    c = cho_factor(K, lower=True)
    p = vec.predict(Xt, weights=np.full(20, 4.0))
    np.testing.assert_allclose(p.mean, mu0 + Ks @ cho_solve(c, y - mu0), rtol=1e-8, atol=1e-8)
    var_f = os_ - np.einsum("ij,ji->i", Ks, cho_solve(c, Ks.T))
    np.testing.assert_allclose(p.var_f, var_f, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(p.var_y, var_f + vec.nugget_variance + vec.measurement_noise_variance / 4.0, rtol=1e-8)
    # the weights matter: the unweighted fit with the same hyperparameters predicts otherwise
    assert np.abs(p.mean - (mu0 + Ks @ cho_solve(cho_factor(K - np.diag(noise) + np.diag(
        np.full(n, noise.mean())), lower=True), y - mu0))).max() > 1e-3


def test_lbfgs_reaches_the_exact_gp_maximum_likelihood():
    """With m = n - 1 the Vecchia likelihood is exact, so L-BFGS must land on the dense likelihood's maximum
    (found independently by scipy's L-BFGS-B on the dense float64 log-likelihood)."""
    from scipy.optimize import minimize

    rng = np.random.default_rng(2)
    X = rng.uniform(0, 10, size=(80, 1))
    y = np.sin(X[:, 0]) + 0.2 * rng.normal(size=80)
    vec = make_model("vecchia", kernel="matern32", neighbors=79, ard=False, dtype="float64", device="cpu",
                     optimizer="lbfgs", epochs=60).fit(X, y)
    ys = (y - vec.y_mean_) / vec.y_std_
    Xs = 2 * (X - vec.x_lo_) / vec.x_span_ - 1

    def neg(theta):
        ell, os_, s2 = np.log1p(np.exp(theta[:3]))
        s2 = s2 + vec.config.noise_floor
        K = _np_kernel("matern32", Xs, Xs, np.array([ell]), os_) + s2 * np.eye(80)
        return -multivariate_normal.logpdf(ys, mean=np.full(80, theta[3]), cov=K)

    best = min((minimize(neg, x0, method="L-BFGS-B") for x0 in ([-1.0, 0.0, -2.0, 0.0], [0.0, 1.0, -4.0, 0.0])),
               key=lambda r: r.fun)
    ours = -vec.log_likelihood().item()
    assert ours == pytest.approx(best.fun, abs=1e-4)
    assert vec.train_info_["epochs_run"] < 60  # converged: stopped by its own tolerance, not the step limit


def test_lbfgs_stops_once_an_iteration_changes_the_loss_by_less_than_the_tolerance():
    """``lbfgs_tolerance`` (GPBoost's delta_rel_conv): the fit stops at the first iteration whose loss change is
    within the tolerance, and not before; 0 leaves only the patience and the epoch limit."""
    X, y = _data(n=120, seed=3)
    loose = make_model("vecchia", neighbors=8, epochs=40, lbfgs_tolerance=1e-3, seed=0).fit(X, y)
    losses = [h["loss"] for h in loose.history_]
    steps = [abs(b - a) / max(1.0, abs(b)) for a, b in zip(losses, losses[1:], strict=False)]
    assert len(losses) < 40 and steps[-1] <= 1e-3 and all(s > 1e-3 for s in steps[:-1]), steps
    full = make_model("vecchia", neighbors=8, epochs=len(losses) + 3, lbfgs_tolerance=0.0, seed=0).fit(X, y)
    assert len(full.history_) > len(losses)
    np.testing.assert_allclose([h["loss"] for h in full.history_][: len(losses)], losses, rtol=1e-12)
