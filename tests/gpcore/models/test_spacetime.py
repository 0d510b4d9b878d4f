"""Space-time covariances of vecchia and dbk-nn (gpcore/models/spacetime.py, docs/methods/spacetime.md) against
dense float64 references built independently in numpy: the separable kernel is the product of the space and time
kernels, Gneiting's kernel is its formula and the spatial kernel at lag 0, all neighbours give the exact space-time
GP (likelihood, predictions, joint posterior), one quarter gives the spatial model, and the parameters survive
save and load."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.linalg import cho_factor, cho_solve
from scipy.stats import multivariate_normal

from gpcore import InputError, make_model
from gpcore.models import load_model
from gpcore.models.kernels import stationary_sqdist
from gpcore.models.neighbors import maxmin_order, ordered_neighbors
from gpcore.models.spacetime import gneiting_psi, metric_coords, spacetime_sqdist, time_lengthscale_years
from tests.gpcore.models.test_exact import _np_kernel
from tests.gpcore.models.test_vecchia import assert_vecchia_gradient_equals_dense

QUARTERS = 2019.125 + 0.25 * np.arange(4)  # 2019Q1..Q4, decimal years (quarter middles)
COMMON = {"dtype": "float64", "device": "cpu", "epochs": 1}
TINY_DBK = {"dbk_rank": 8, "dbk_hidden": 8, "dbk_blocks": 1, "dbk_epochs": 3, "dbk_batch_size": 32,
            "feature_check": False}


def _data(n=72, seed=0, quarters=QUARTERS):
    """``n`` points (lon, lat, t) over the given quarters and a field that changes with time."""
    rng = np.random.default_rng(seed)
    lon, lat = rng.uniform(-67.2, -65.6, n), rng.uniform(17.9, 18.5, n)
    t = rng.choice(quarters, n)
    y = 20 + 5 * np.sin(3 * lon) * np.cos(4 * lat) + 8 * (t - 2019) + rng.normal(size=n)
    return np.column_stack([lon, lat, t]), y


def _new_places(seed=5, n=20):
    rng = np.random.default_rng(seed)
    t = rng.choice(np.append(QUARTERS, 2020.125), n)  # some in the next, unseen quarter
    return np.column_stack([rng.uniform(-67.4, -65.4, n), rng.uniform(17.8, 18.6, n), t])


def _set_hypers(model, beta_raw=0.4):
    """Non-default hyperparameters (the same for every model that has them)."""
    mod = model.module_
    with torch.no_grad():
        mod.raw_ell.copy_(torch.tensor([-0.7, 0.2], dtype=torch.float64)[: mod.raw_ell.numel()])
        mod.raw_outputscale.fill_(0.4)
        mod.raw_noise.fill_(-2.0)
        mod.mu0.fill_(0.3)
        if hasattr(mod, "raw_ell_t"):
            mod.raw_ell_t.fill_(-0.3)
        if hasattr(mod, "raw_beta"):
            mod.raw_beta.fill_(beta_raw)
        if hasattr(mod, "trend"):  # the prior mean's time trend b: mu0 + b t
            mod.trend.fill_(0.25)


def _fit(X, y, kind, *, name="vecchia", full=True, **kw):
    n = X.shape[0]
    if full:  # every point conditions on all its predecessors, every prediction on all training points
        kw = {"neighbors": n - 1, "pred_neighbors": n, "joint_neighbors": 200, **kw}
    extra = TINY_DBK if name == "dbk-nn" else {}
    model = make_model(name, space_time=kind, **COMMON, **extra, **kw).fit(X, y)
    _set_hypers(model)
    model.finalize(model.scale_x(X), model.scale_y(y))
    return model


def _caller_hypers(model):
    """Spatial lengthscales, time lengthscale (years), outputscale, Gneiting's beta in caller units."""
    mod = model.module_
    ell = mod.lengthscale.detach().numpy() * model.x_span_[:2] / 2.0
    ell_t = torch.nn.functional.softplus(mod.raw_ell_t).item() * model.x_span_[2] / 2.0
    os_ = mod.outputscale.item() * model.y_std_**2
    beta = torch.sigmoid(mod.raw_beta).item() if hasattr(mod, "raw_beta") else None
    return ell, ell_t, os_, beta


def test_time_lengthscale_in_years():
    X, y = _data()
    model = _fit(X, y, "separable")
    assert time_lengthscale_years(model) == pytest.approx(_caller_hypers(model)[1], rel=1e-12)
    fresh = make_model("vecchia", space_time="separable", time_lengthscale_init=0.75, **COMMON).fit(X, y)
    assert fresh.module_.st_ell0[1].item() * fresh.x_span_[2] / 2 == pytest.approx(0.75, rel=1e-12)


def _np_time(name, t1, t2, ell_t):
    u = np.abs(t1[:, None] - t2[None, :]) / ell_t
    return np.exp(-u) if name == "matern12" else (1 + np.sqrt(3) * u) * np.exp(-np.sqrt(3) * u)


def _np_gneiting(kernel, X1, X2, ell, ell_t, os_, beta, alpha=1.0):
    """Gneiting (2002) eq. 14 directly: o^2 psi^{-1} rho(h / sqrt(psi)), psi = ((u^2)^alpha + 1)^beta, d_s = 2."""
    u2 = ((X1[:, None, 2] - X2[None, :, 2]) / ell_t) ** 2
    psi = (u2**alpha + 1.0) ** beta
    h = np.sqrt((((X1[:, None, :2] - X2[None, :, :2]) / ell) ** 2).sum(-1))
    r = h / np.sqrt(psi)
    rho = {"matern12": np.exp(-r), "matern32": (1 + np.sqrt(3) * r) * np.exp(-np.sqrt(3) * r),
           "rbf": np.exp(-0.5 * r**2)}[kernel]
    return os_ * rho / psi


def _np_cov(model, X1, X2):
    """The model's prior covariance in caller units, from its hyperparameters and numpy only."""
    cfg = model.config
    ell, ell_t, os_, beta = _caller_hypers(model)
    if cfg.space_time == "separable":
        return _np_kernel(cfg.kernel, X1[:, :2], X2[:, :2], ell, os_) * _np_time(cfg.time_kernel, X1[:, 2], X2[:, 2],
                                                                                  ell_t)
    return _np_gneiting(cfg.kernel, X1, X2, ell, ell_t, os_, beta, cfg.gneiting_alpha)


def _prior(model, X1, X2):
    """``_np_cov`` plus dbk-nn's feature part ``a^2 phi phi^T`` when it uses its features."""
    K = _np_cov(model, X1, X2)
    if getattr(model, "features_used", False):
        phi1, phi2 = (model.module_.dbk.features(model.scale_x(Z)).detach().numpy() for Z in (X1, X2))
        K = K + model.feature_scale**2 * model.y_std_**2 * phi1 @ phi2.T
    return K


def _dense(model, X, y, Xt):
    """Exact GP: log N(y; mu, K + s2 I) with the prior mean ``mu = mu0 + b t`` (time trend), predictive mean, latent
    variance and covariance at ``Xt``."""
    n = X.shape[0]
    K = _prior(model, X, X) + model.noise_variance * np.eye(n)
    Ks, Kss = _prior(model, Xt, X), _prior(model, Xt, Xt)
    mu, mut = model.prior_mean_at(X), model.prior_mean_at(Xt)
    c = cho_factor(K, lower=True)
    cov = Kss - Ks @ cho_solve(c, Ks.T)
    ll = multivariate_normal.logpdf(y, mean=mu, cov=K)
    return ll, mut + Ks @ cho_solve(c, y - mu), np.diag(cov).copy(), cov


# ------------------------------------------------------------------------------------------------ kernels


@pytest.mark.parametrize("kernel,time_kernel", [("matern12", "matern12"), ("matern32", "matern12"),
                                                ("matern32", "matern32"), ("rbf", "matern32")])
def test_separable_kernel_is_the_product_of_the_space_and_time_kernels(kernel, time_kernel):
    X, y = _data()
    model = _fit(X, y, "separable", kernel=kernel, time_kernel=time_kernel)
    ell, ell_t, os_, _ = _caller_hypers(model)
    Xt = _new_places()
    spatial = _np_kernel(kernel, Xt[:, :2], X[:, :2], ell, os_)
    temporal = _np_time(time_kernel, Xt[:, 2], X[:, 2], ell_t)
    assert temporal.min() < 0.9  # the quarters are far enough apart in time for the factor to matter
    np.testing.assert_allclose(model.kernel(Xt, X), spatial * temporal, rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(model.kernel_diag(Xt), np.full(len(Xt), os_), rtol=1e-12)
    # the batched group covariance (likelihood, prediction, joint posterior) is the same kernel
    from gpcore.models.vecchia import group_covariance

    mod = model.module_
    Xg = model.scale_x(np.stack([X[:9], X[9:18]]))
    C = group_covariance(mod, Xg, torch.ones(2, 9, dtype=torch.bool)).detach().numpy()
    for g in range(2):
        rows = X[9 * g : 9 * (g + 1)]
        dense = _np_cov(model, rows, rows) / model.y_std_**2 + mod.noise.item() * np.eye(9)
        np.testing.assert_allclose(C[g], dense, rtol=1e-9, atol=1e-14)  # Matérn clamp: 1e-10
    with torch.no_grad():  # no graph (predictions, the joint factor): the in-place form gives the same numbers
        C0 = group_covariance(mod, Xg, torch.ones(2, 9, dtype=torch.bool))
    np.testing.assert_allclose(C0.numpy(), C, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("kernel", ["matern12", "matern32", "rbf"])
def test_gneiting_kernel_is_its_formula_and_the_spatial_kernel_at_lag_zero(kernel):
    X, y = _data()
    model = _fit(X, y, "gneiting", kernel=kernel)
    ell, ell_t, os_, beta = _caller_hypers(model)
    assert 0 < beta < 1
    Xt = _new_places()
    np.testing.assert_allclose(model.kernel(Xt, X), _np_gneiting(kernel, Xt, X, ell, ell_t, os_, beta),
                               rtol=1e-7, atol=1e-12)
    same_t = X.copy()
    same_t[:, 2] = Xt[0, 2]
    np.testing.assert_allclose(model.kernel(Xt[:1], same_t), _np_kernel(kernel, Xt[:1, :2], X[:, :2], ell, os_),
                               rtol=1e-7, atol=1e-12)
    # the piece functions: u = 0 gives the spatial kernel exactly; alpha < 1 against numpy, finite gradients at 0
    d2 = torch.tensor([0.0, 0.3, 1.7, 4.0], dtype=torch.float64)
    zero = torch.zeros_like(d2)
    for b in (0.2, 0.9):
        np.testing.assert_array_equal(spacetime_sqdist("gneiting", kernel, d2, zero, 1.3, beta=b).numpy(),
                                      stationary_sqdist(kernel, d2, 1.3).numpy())
    u2 = torch.tensor([0.0, 0.25, 1.0, 9.0], dtype=torch.float64, requires_grad=True)
    got = spacetime_sqdist("gneiting", kernel, d2, u2, 1.3, alpha=0.5, beta=0.7, n_space=2)
    psi = (np.sqrt(u2.detach().numpy()) + 1.0) ** 0.7  # alpha = 0.5
    r = np.sqrt(d2.numpy() / psi)
    rho = {"matern12": np.exp(-r), "matern32": (1 + np.sqrt(3) * r) * np.exp(-np.sqrt(3) * r),
           "rbf": np.exp(-0.5 * r**2)}[kernel]
    np.testing.assert_allclose(got.detach().numpy(), 1.3 * rho / psi, rtol=1e-9)  # Matérn clamp: 1e-10
    (g,) = torch.autograd.grad(gneiting_psi(u2, 0.5, 0.7).sum(), u2)
    assert torch.isfinite(g).all() and g[0] == 0


# ------------------------------------------------------------------------------------------------ exactness


@pytest.mark.parametrize("kind,kernel", [("separable", "matern32"), ("separable", "matern12"),
                                         ("gneiting", "matern12"), ("gneiting", "matern32")])
def test_all_neighbours_equal_the_exact_space_time_gp(kind, kernel):
    X, y = _data()
    n = X.shape[0]
    model = _fit(X, y, kind, kernel=kernel)
    Xt = _new_places()
    ll, mean, var_f, _ = _dense(model, X, y, Xt)
    # scaled-unit Vecchia value + the Jacobian of the target standardisation = the dense caller-unit value
    assert model.log_likelihood().item() - n * np.log(model.y_std_) == pytest.approx(ll, rel=1e-9)
    p = model.predict(Xt)
    np.testing.assert_allclose(p.mean, mean, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(p.var_f, var_f, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(p.var_y, var_f + model.noise_variance, rtol=1e-7)
    # a Vecchia approximation with few neighbours is not the exact GP (the test can tell them apart)
    few = _fit(X, y, kind, kernel=kernel, full=False, neighbors=3)
    assert abs(few.log_likelihood().item() - n * np.log(few.y_std_) - ll) > 1e-3


@pytest.mark.parametrize("kind", ["separable", "gneiting"])
def test_posterior_cov_at_all_neighbours_is_the_dense_exact_posterior(kind):
    X, y = _data()
    model = _fit(X, y, kind)
    Xt = _new_places()
    _, mean, _, cov = _dense(model, X, y, Xt)
    tol = 1e-9 * np.abs(cov).max()
    np.testing.assert_allclose(model.posterior_cov(Xt), cov, rtol=1e-6, atol=tol)
    np.testing.assert_allclose(model.posterior_cov(Xt[:6], Xt[3:11]), cov[:6, 3:11], rtol=1e-6, atol=tol)
    joint = model.joint_s(model.scale_x(Xt))
    np.testing.assert_allclose(joint.mean * model.y_std_ + model.y_mean_, mean, rtol=1e-8, atol=1e-8)
    # the change f(t2) - f(t1) at one place between two quarters, from the joint posterior
    a = np.array([[-66.0, 18.2, QUARTERS[0]], [-66.0, 18.2, QUARTERS[-1]]])
    _, _, _, cab = _dense(model, X, y, a)
    C = model.posterior_cov(a)
    assert C[0, 0] + C[1, 1] - 2 * C[0, 1] == pytest.approx(cab[0, 0] + cab[1, 1] - 2 * cab[0, 1], rel=1e-6)


@pytest.mark.parametrize("kind", ["separable", "gneiting"])
def test_one_quarter_reduces_to_the_spatial_model(kind):
    """All t equal: the space-time model's ordering, neighbours, initial lengthscale, likelihood and predictions
    are the spatial model's on (lon, lat) with the same hyperparameters (m < n - 1: the orderings must agree)."""
    X, y = _data(n=70, quarters=QUARTERS[:1])
    st_model = make_model("vecchia", space_time=kind, neighbors=10, **COMMON).fit(X, y)
    sp_model = make_model("vecchia", neighbors=10, **COMMON).fit(X[:, :2], y)
    a, b = st_model.module_, sp_model.module_
    np.testing.assert_array_equal(a.order.numpy(), b.order.numpy())
    np.testing.assert_array_equal(a.nbr.numpy(), b.nbr.numpy())
    fresh_st = make_model("vecchia", space_time=kind, neighbors=10, **COMMON)
    fresh_sp = make_model("vecchia", neighbors=10, **COMMON)
    fresh_st._set_scalers(X, y)
    fresh_sp._set_scalers(X[:, :2], y)
    init_st = fresh_st._build(3, fresh_st.scale_x(X), fresh_st.scale_y(y)).lengthscale
    init_sp = fresh_sp._build(2, fresh_sp.scale_x(X[:, :2]), fresh_sp.scale_y(y)).lengthscale
    np.testing.assert_allclose(init_st.detach().numpy(), init_sp.detach().numpy(), rtol=1e-12)
    for m in (st_model, sp_model):
        _set_hypers(m)
    with torch.no_grad():  # one quarter: the trend's b t is one constant, which the spatial model's mu0 holds
        b.mu0.add_(a.trend * st_model.scale_x(X)[0, 2])
    st_model.finalize(st_model.scale_x(X), st_model.scale_y(y))
    sp_model.finalize(sp_model.scale_x(X[:, :2]), sp_model.scale_y(y))
    assert st_model.log_likelihood().item() == pytest.approx(sp_model.log_likelihood().item(), rel=1e-12)
    Xt = _new_places()
    Xt[:, 2] = QUARTERS[0]
    p, q = st_model.predict(Xt), sp_model.predict(Xt[:, :2])
    np.testing.assert_allclose(p.mean, q.mean, rtol=1e-12)
    np.testing.assert_allclose(p.var_y, q.var_y, rtol=1e-12)
    np.testing.assert_allclose(st_model.posterior_cov(Xt[:8]), sp_model.posterior_cov(Xt[:8, :2]), rtol=1e-9,
                               atol=1e-14)


# ------------------------------------------------------------------------------------------------ metric, training


def test_neighbours_are_searched_in_the_scaled_space_time_metric():
    X, y = _data(n=240, seed=2)
    m = 8
    for years in (1e-3, 1.0, 1e3):
        model = make_model("vecchia", space_time="separable", neighbors=m, time_lengthscale_init=years,
                           **COMMON).fit(X, y)
        mod = model.module_
        ell_s0, ell_t0 = mod.st_ell0.tolist()
        assert ell_t0 == pytest.approx(years * 2 / model.x_span_[2])
        Z = metric_coords(mod, mod.X_train)
        np.testing.assert_allclose(Z, mod.X_train.numpy() / [ell_s0, ell_s0, ell_t0])
        np.testing.assert_array_equal(mod.nbr.numpy(), ordered_neighbors(Z, m))
        # the ordering is the maxmin ordering of the scaled inputs in this metric
        Xs = model.scale_x(X).numpy() / [ell_s0, ell_s0, ell_t0]
        np.testing.assert_array_equal(mod.order.numpy(), maxmin_order(Xs))
        t = mod.X_train[:, 2].numpy()
        late = np.arange(120, 240)
        same = (t[mod.nbr.numpy()[late]] == t[late, None]).mean()
        if years == 1e-3:  # time dominates: neighbours from the point's own quarter
            assert same == 1.0
        elif years == 1.0:  # earlier (and other) quarters count
            assert 0.3 < same < 1.0
        else:  # space dominates: the quarter hardly matters
            assert same < 0.5


def test_training_learns_the_time_lengthscale_and_beta():
    X, y = _data(n=120, seed=4)
    model = make_model("vecchia", space_time="gneiting", neighbors=10, dtype="float64", device="cpu",
                       epochs=15).fit(X, y)
    mod = model.module_
    fresh = make_model("vecchia", space_time="gneiting", neighbors=10, **COMMON)
    assert mod.raw_ell.numel() == 2 and mod.raw_ell_t.numel() == 1
    assert abs(torch.sigmoid(mod.raw_beta).item() - fresh.config.gneiting_beta_init) > 1e-4
    ell_t0 = mod.st_ell0[1].item()
    assert abs(torch.nn.functional.softplus(mod.raw_ell_t).item() - ell_t0) > 1e-4
    loss = -model.log_likelihood()
    loss.backward()
    for p in (mod.raw_ell, mod.raw_ell_t, mod.raw_beta):
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_space_time_needs_a_space_column_and_none_adds_nothing():
    X, y = _data(n=40)
    with pytest.raises(InputError, match="space column"):
        make_model("vecchia", space_time="separable", **COMMON).fit(X[:, 2:], y)
    with pytest.raises(InputError, match="time_column"):
        make_model("vecchia", space_time="separable", time_column=3, **COMMON).fit(X, y)
    keys = set(make_model("vecchia", **COMMON).fit(X, y).module_.state_dict())
    assert not any("ell_t" in k or "beta" in k or "st_ell0" in k for k in keys)
    # time_column picks the column: t first gives the same model as t last
    a = _fit(X, y, "separable")
    b = make_model("vecchia", space_time="separable", time_column=0, neighbors=39, pred_neighbors=40,
                   **COMMON).fit(X[:, [2, 0, 1]], y)
    _set_hypers(b)
    b.finalize(b.scale_x(X[:, [2, 0, 1]]), b.scale_y(y))
    assert b.log_likelihood().item() == pytest.approx(a.log_likelihood().item(), rel=1e-10)


# ------------------------------------------------------------------------------------------------ persistence, dbk-nn


@pytest.mark.parametrize("kind", ["separable", "gneiting"])
def test_save_and_load_keep_the_space_time_model(kind, tmp_path):
    X, y = _data()
    model = make_model("vecchia", space_time=kind, time_kernel="matern32", neighbors=10, gneiting_alpha=0.8,
                       dtype="float64", device="cpu", epochs=4).fit(X, y)
    back = load_model(model.save(tmp_path / "m"))
    assert back.config == model.config
    for k, v in model.module_.state_dict().items():
        np.testing.assert_array_equal(back.module_.state_dict()[k].numpy(), v.numpy(), err_msg=k)
    Xt = _new_places()
    p, q = model.predict(Xt), back.predict(Xt)
    np.testing.assert_array_equal(q.mean, p.mean)
    np.testing.assert_array_equal(q.var_y, p.var_y)
    np.testing.assert_allclose(back.posterior_cov(Xt[:6]), model.posterior_cov(Xt[:6]), rtol=1e-12)


@pytest.mark.parametrize("kind", ["separable", "gneiting"])
def test_dbknn_residual_takes_the_space_time_kernel(kind):
    """dbk-nn at m = n - 1: N(mu0, a^2 Phi Phi^T + C + s2 I) with C the space-time residual kernel (dense)."""
    X, y = _data(n=64)
    n = X.shape[0]
    model = _fit(X, y, kind, name="dbk-nn")
    with torch.no_grad():
        model.module_.raw_fscale.fill_(0.8)
    model.finalize(model.scale_x(X), model.scale_y(y))
    a2 = model.feature_scale**2 * model.y_std_**2
    phi = model.module_.dbk.features(model.scale_x(X)).detach().numpy()
    Xt = _new_places()
    phit = model.module_.dbk.features(model.scale_x(Xt)).detach().numpy()
    K = a2 * phi @ phi.T + _np_cov(model, X, X) + model.noise_variance * np.eye(n)
    Ks = a2 * phit @ phi.T + _np_cov(model, Xt, X)
    kss = a2 * (phit**2).sum(1) + _caller_hypers(model)[2]
    mu, mut = model.prior_mean_at(X), model.prior_mean_at(Xt)  # mu0 + b t
    ll = model.log_likelihood().item() - n * np.log(model.y_std_)
    assert ll == pytest.approx(multivariate_normal.logpdf(y, mean=mu, cov=K), rel=1e-9)
    c = cho_factor(K, lower=True)
    p = model.predict(Xt)
    np.testing.assert_allclose(p.mean, mut + Ks @ cho_solve(c, y - mu), rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(p.var_f, kss - np.einsum("ij,ji->i", Ks, cho_solve(c, Ks.T)), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(model.kernel(Xt, X), Ks, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("name,check", [("vecchia", False), ("dbk-nn", True), ("dbk-nn", False)])
def test_validation_rows_join_the_space_time_posterior(name, check):
    """condition_on (fit with a validation set) orders the new rows in the space-time metric; with all neighbours
    the posterior is the exact GP's on training + validation rows (hyperparameters unchanged); dbk-nn runs its
    feature check in space-time."""
    X, y = _data(n=80, seed=6)
    tr, va = np.arange(60), np.arange(60, 80)
    extra = {**TINY_DBK, "feature_check": check} if name == "dbk-nn" else {}
    model = make_model(name, space_time="gneiting", neighbors=79, pred_neighbors=80, joint_neighbors=100,
                       **COMMON, **extra).fit(X[tr], y[tr], X[va], y[va])
    assert model.module_.X_train.shape[0] == 80
    if name == "dbk-nn":  # the check ran (whichever it kept, the posterior below is exact); without it, features
        assert ("feature_check" in model.train_info_) == check and (model.features_used or check)
    Xt = _new_places()
    _, mean, var_f, cov = _dense(model, X, y, Xt)
    p = model.predict(Xt)
    np.testing.assert_allclose(p.mean, mean, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(p.var_f, var_f, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(model.posterior_cov(Xt[:8]), cov[:8, :8], rtol=1e-6, atol=1e-9 * np.abs(cov).max())


# ------------------------------------------------------------------------------------------------ the time trend


def _trend_data(n=400, seed=2):
    """A field that rises by 0.6 a year over eight quarters (2019Q1-2020Q4) plus a spatial pattern and noise."""
    rng = np.random.default_rng(seed)
    q = 2019.125 + 0.25 * np.arange(8)
    lon, lat, t = rng.uniform(-67.2, -65.6, n), rng.uniform(17.9, 18.5, n), rng.choice(q, n)
    y = 1.0 + 0.3 * np.sin(3 * lon) * np.cos(4 * lat) + 0.6 * (t - 2019) + 0.1 * rng.normal(size=n)
    return np.column_stack([lon, lat, t]), y


@pytest.mark.parametrize("name", ["vecchia", "dbk-nn"])
def test_the_time_trend_is_learned_and_a_forecast_follows_it(name):
    """On a field that rises 0.6 a year, the learned prior mean rises about as much, and a forecast a year past the
    last quarter follows the rise; without the trend (``time_trend=False``) it falls back towards the average."""
    X, y = _trend_data()
    extra = TINY_DBK if name == "dbk-nn" else {}
    kw = dict(space_time="separable", neighbors=10, dtype="float64", device="cpu", epochs=30, **extra)
    with_trend = make_model(name, **kw).fit(X, y)
    flat = make_model(name, time_trend=False, **kw).fit(X, y)
    assert hasattr(with_trend.module_, "trend") and not hasattr(flat.module_, "trend")
    far = np.column_stack([np.full(2, -66.4), np.full(2, 18.2), [2019.0, 2020.0]])
    rise = np.diff(with_trend.prior_mean_at(far))[0]
    assert 0.3 < rise < 0.9, rise
    assert np.ptp(flat.prior_mean_at(far)) == 0.0
    rng = np.random.default_rng(9)
    Xf = np.column_stack([rng.uniform(-67.2, -65.6, 50), rng.uniform(17.9, 18.5, 50), np.full(50, 2021.875)])
    truth = 1.0 + 0.3 * np.sin(3 * Xf[:, 0]) * np.cos(4 * Xf[:, 1]) + 0.6 * (2021.875 - 2019)
    err_trend = np.abs(with_trend.predict(Xf).mean - truth).mean()
    err_flat = np.abs(flat.predict(Xf).mean - truth).mean()
    assert err_trend < 0.5 * err_flat, (err_trend, err_flat)


def test_a_space_time_model_saved_before_the_trend_loads_without_one(tmp_path):
    """A model.json written before ``time_trend`` existed has no such setting: it loads as a constant-mean model."""
    import json

    X, y = _data()
    model = make_model("vecchia", space_time="separable", time_trend=False, neighbors=10, **COMMON).fit(X, y)
    path = model.save(tmp_path / "old")
    meta = json.loads((path / "model.json").read_text())
    del meta["config"]["time_trend"]
    (path / "model.json").write_text(json.dumps(meta))
    back = load_model(path)
    assert back.config.time_trend is False and not hasattr(back.module_, "trend")
    np.testing.assert_array_equal(back.predict(X[:5]).mean, model.predict(X[:5]).mean)


@pytest.mark.parametrize("kind", ["separable", "gneiting"])
def test_likelihood_gradient_equals_the_dense_space_time_gradient(kind):
    """The closed-form Vecchia row gradient through the space-time kernel's autograd: at m = n - 1 it is the dense
    likelihood's gradient in every hyperparameter (time lengthscale, Gneiting's beta and the trend included)."""
    X, y = _data()
    model = _fit(X, y, kind)
    assert_vecchia_gradient_equals_dense(model)


@pytest.mark.parametrize("kind", ["separable", "gneiting"])
def test_dbknn_feature_screen_holds_in_space_time(kind):
    """The screen's closed form (dbknn_screen.py) needs the residual's covariance to scale with its outputscale and
    noise alone: true of the space-time kernels too, with the prior mean's time trend held fixed."""
    from gpcore.models import dbknn_screen as S

    X, y = _data(n=64)
    model = _fit(X, y, kind, name="dbk-nn", full=False, neighbors=9)
    base = {k: v.clone() for k, v in model.module_.state_dict().items()}
    lam, h, uu, ld, n = S.screen_sums(model)
    for a, c in [(0.4, 0.7), (1.5, 1.8)]:
        model.module_.load_state_dict(base)
        S.apply_scale(model, a, c)
        t = a * a / c
        d = 1.0 + t * lam
        closed = (-0.5 * n * np.log(2 * np.pi) - 0.5 * (ld + n * np.log(c)) - 0.5 * np.log(d).sum()
                  - (uu - t * (h / d).sum()) / (2 * c))
        assert closed == pytest.approx(model.log_likelihood().item(), rel=1e-10)


@pytest.mark.parametrize("kind", ["separable", "gneiting"])
def test_space_time_variances_start_at_one_and_a_tenth_not_the_semivariance(kind):
    """A space-time model's noise and outputscale start at 0.1 and 1 (auto settings), where the spatial model's
    start from the nearest predecessors' semivariance (docs/methods/spacetime.md: the nearest predecessor in the
    space-time metric is often the same place in another quarter); set values are kept."""
    X, y = _data(n=300)
    y = y + 3.0 * np.random.default_rng(9).normal(size=y.shape)  # noisy: the spatial start moves far from 0.1
    starts = {}
    for space_time, cols in (("none", slice(0, 2)), (kind, slice(0, 3))):
        model = make_model("vecchia", neighbors=8, space_time=space_time, dtype="float64", device="cpu")
        model.d_ = cols.stop
        model._set_scalers(X[:, cols], y)
        mod = model._build(cols.stop, model.scale_x(X[:, cols]), model.scale_y(y))
        starts[space_time] = (mod.noise.item(), mod.outputscale.item())
    assert starts[kind] == pytest.approx((0.1, 1.0), rel=1e-6)
    assert abs(starts["none"][0] - 0.1) > 0.1  # the spatial model did move its start (not a vacuous comparison)
    model = make_model("vecchia", neighbors=8, space_time=kind, dtype="float64", device="cpu", noise_init=0.3,
                       outputscale_init=2.0)
    model.d_ = 3
    model._set_scalers(X, y)
    mod = model._build(3, model.scale_x(X), model.scale_y(y))
    assert (mod.noise.item(), mod.outputscale.item()) == pytest.approx((0.3, 2.0), rel=1e-6)
