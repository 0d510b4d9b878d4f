"""Per-observation weights (issue 14): noise variance ``tau^2 + sigma^2 / w_i`` in every model family.

Each model's weighted objective / posterior with fixed hyperparameters against a dense float64 GP with
the diagonal noise ``D = diag(tau^2 + sigma^2 / w)`` (``tau^2``, ``sigma^2`` read from the module's raw
parameters here, not through the model's helpers); weights all 1 against the unweighted model with
noise ``tau^2 + sigma^2``; an old saved (unweighted) run loads and reproduces its stored predictions.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal

from gpcore import InputError, load_model, make_model
from gpcore.models.cagp_linalg import CaGPPosterior, DenseActions, elbo_loss
from gpcore.models.linalg import inv_softplus
from gpcore.models.softki_linalg import batch_solve, exact_batch_logp, softmax_weights

SMALL = {
    "dbk-silu": dict(rank=8, hidden=8),
    "dbk-rbf": dict(rank=8, hidden=6),
    "dbk-mml": dict(rank=8, hidden=8),
    "svgp": dict(num_inducing=8),
    "ppgp": dict(num_inducing=8),
    "sv-dkl": dict(num_inducing=8, hidden=8),
    "pp-dkl": dict(num_inducing=8, hidden=8),
    "softki": dict(num_inducing=8, mll="exact"),
    "solvegp": dict(num_inducing=6, num_orthogonal=6),
    "cagp": dict(num_actions=8),
    "cagp-cg": dict(num_actions=8),
    "exact": {},
}


pytestmark = pytest.mark.usefixtures("float64_default")  # tests/gpcore/models/conftest.py


def _data(n=48, seed=2):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2.0, 3.0, size=(n, 2))
    w = rng.integers(1, 30, size=n).astype(float)
    y = 3.0 + np.sin(2.0 * X[:, 0]) + 0.3 * X[:, 1] + rng.normal(size=n) * np.sqrt(0.01 + 0.2 / w)
    return X, y, w


def _fit(name, weights=True, epochs=3, **kw):
    X, y, w = _data()
    settings = {"epochs": epochs, "batch_size": 16, "lr": 1e-2, "dtype": "float64", "device": "cpu",
                **SMALL[name], **kw}
    model = make_model(name, **settings)
    model.fit(X[:36], y[:36], X[36:], y[36:], weights=w[:36] if weights else None,
              val_weights=w[36:] if weights else None)
    return model, X[:36], y[:36], w[:36]


def _diag_noise(model, w) -> torch.Tensor:
    """``tau^2 + sigma^2 / w`` straight from the module's raw parameters (standardised units)."""
    mod = model.module_
    tau2 = torch.nn.functional.softplus(mod.raw_nugget.detach()).double()
    return tau2 + model._noise_s().detach().double() / torch.as_tensor(w, dtype=torch.float64)


def _dense_gp(Kxx, Ksx, kss, D, yc):
    """Dense posterior of f with prior covariance K and noise D (mean without the prior mean)."""
    S = Kxx + torch.diag(D)
    mean = Ksx @ torch.linalg.solve(S, yc)
    var = kss - (Ksx * torch.linalg.solve(S, Ksx.T).T).sum(1)
    return mean, var


def _scaled(model, X, y, w):
    return model.scale_x(X), model.scale_y(y), torch.as_tensor(w, dtype=torch.float64)


# ------------------------------------------------------------------ exact posteriors: exact GP, DBK-MML
@pytest.mark.parametrize("name", ["exact", "dbk-mml"])
def test_weighted_posterior_and_evidence_equal_the_dense_gp_with_diagonal_noise(name):
    model, X, y, w = _fit(name)
    Xs, ys, ws = _scaled(model, X, y, w)
    Xt = model.scale_x(_data(20, seed=9)[0])
    D = _diag_noise(model, w)
    mu0 = float(model._prior_mean_s().detach())
    with torch.no_grad():
        K = model._kernel_s(Xs, Xs).double()
        Ksx = model._kernel_s(Xt, Xs).double()
        kss = model._kernel_diag_s(Xt).double()
        mean, var = model._predict_f(Xt)
    m_ref, v_ref = _dense_gp(K, Ksx, kss, D, ys - mu0)
    torch.testing.assert_close(mean.double(), mu0 + m_ref, rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(var.double(), v_ref, rtol=1e-7, atol=1e-9)
    with torch.no_grad():
        lml = model.log_marginal_likelihood(Xs, ys, ws).item()
    dense = multivariate_normal.logpdf(ys.numpy(), mean=np.full(len(ys), mu0), cov=(K + torch.diag(D)).numpy())
    assert lml == pytest.approx(dense, rel=1e-9)


def test_weighted_dbk_mml_two_pass_gradient_equals_autograd():
    model, X, y, w = _fit("dbk-mml")
    Xs, ys, ws = _scaled(model, X, y, w)
    params = [p for p in model.module_.parameters() if p.requires_grad]
    model.module_.zero_grad()
    (-model.log_marginal_likelihood(Xs, ys, ws) / len(ys)).backward()
    auto = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]
    model.module_.zero_grad()
    model.two_pass_step(Xs, ys, chunk=7, ws=ws)
    two = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]
    assert model.module_.raw_nugget.grad.abs().item() > 0
    for a, b in zip(auto, two, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


# ------------------------------------------------------------------ mini-batch objectives: dense forms
@pytest.mark.parametrize("basis", ["silu", "rbf"])
def test_weighted_dppgp_terms_equal_hand_computation(basis):
    model, X, y, w = _fit("dbk-silu" if basis == "silu" else "dbk-rbf", alpha=0.3)
    Xs, ys, ws = _scaled(model, X[:11], y[:11], w[:11])
    mod = model.module_
    t = model.dppgp_terms(Xs, ys, 500, ws)
    with torch.no_grad():
        phi = mod.features(Xs).numpy()
        L = mod.q_factor().numpy()
        m, mu0 = mod.m.numpy(), mod.mu0.item()
    d = _diag_noise(model, w[:11]).numpy()
    s2y = np.einsum("ij,jk,ik->i", phi, L @ L.T, phi) + d
    yv = ys.numpy()
    data = np.mean(0.5 * np.log(2 * np.pi * s2y) + (yv - mu0 - phi @ m) ** 2 / (2 * s2y))
    norms = (phi**2).sum(1)
    trace = np.mean((norms.max() - norms) / (2 * d))
    assert t["data"].item() == pytest.approx(data, rel=1e-10)
    assert t["trace"].item() == pytest.approx(trace, rel=1e-10)


@pytest.mark.parametrize("name", ["svgp", "ppgp", "sv-dkl"])
def test_weighted_svgp_ppgp_losses_equal_dense_forms(name):
    model, X, y, w = _fit(name)
    Xs, ys, ws = _scaled(model, X[:13], y[:13], w[:13])
    n = 300
    loss = model._loss(Xs, ys, n, ws).item()
    mod = model.module_
    with torch.no_grad():
        phi, corr = mod.features64(Xs)
        L = mod.q_factor().double()
        mu = mod.mu0.double() + phi @ mod.m.double()
        s2f = (phi @ L).pow(2).sum(-1) + corr
        kl = model.kl().item()
    d = _diag_noise(model, w[:13])
    yd = ys.double()
    if model.config.objective == "elbo":  # E_q log N(y_i; f_i, d_i) - KL / n
        data = 0.5 * torch.log(2 * np.pi * d) + ((yd - mu) ** 2 + s2f) / (2 * d)
        ref = data.mean().item() + kl / n
    else:  # PPGP: log N(y_i; mu_i, s2f_i + d_i), KL weighted by beta
        v = s2f + d
        ref = (0.5 * torch.log(2 * np.pi * v) + (yd - mu) ** 2 / (2 * v)).mean().item() + model.config.beta * kl / n
    assert loss == pytest.approx(ref, rel=1e-10)


def test_weighted_svgp_optimal_q_is_the_sgpr_posterior_with_diagonal_noise():
    model, X, y, w = _fit("svgp")
    Xs, ys, ws = _scaled(model, X, y, w)
    mod = model.module_
    model.set_q(*model.optimal_q(Xs, ys, ws))
    Xt = model.scale_x(_data(15, seed=5)[0])
    with torch.no_grad():
        phi, _ = mod.features64(Xs)
        phit, corrt = mod.features64(Xt)
        mean, var = model._predict_f(Xt)
    mu0 = mod.mu0.item()
    # SGPR with Q = Phi Phi^T and the Nystrom gap added back at the test points
    m_ref, v_ref = _dense_gp(phi @ phi.T, phit @ phi.T, (phit**2).sum(1), _diag_noise(model, w), ys - mu0)
    torch.testing.assert_close(mean, mu0 + m_ref, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(var, v_ref + corrt, rtol=1e-7, atol=1e-9)


def test_weighted_solvegp_loss_equals_the_dense_per_point_elbo():
    model, X, y, w = _fit("solvegp")
    Xs, ys, ws = _scaled(model, X[:10], y[:10], w[:10])
    n = 200
    loss = model._loss(Xs, ys, n, ws).item()
    with torch.no_grad():
        mu, s2f = model.marginals_dense(Xs)  # eqs. (33)-(34) by dense solves
        klu, klv = model.kl_terms()
    d = _diag_noise(model, w[:10])
    data = 0.5 * torch.log(2 * np.pi * d) + ((ys - mu) ** 2 + s2f) / (2 * d)
    assert loss == pytest.approx(data.mean().item() + (klu + klv).item() / n, rel=1e-9)


# ------------------------------------------------------------------ SoftKI
def test_weighted_softki_posterior_and_batch_objective_equal_the_dense_degenerate_gp():
    model, X, y, w = _fit("softki")
    Xs, ys, ws = _scaled(model, X, y, w)
    mod = model.module_
    Xt = model.scale_x(_data(15, seed=6)[0])
    sd = mod.x_scale.double()
    with torch.no_grad():
        Z = mod.Z.double()
        Kzz = mod.Kzz(torch.float64)
        W, Wt = softmax_weights(Xs / sd, Z / sd, model.config.tau), softmax_weights(Xt / sd, Z / sd, model.config.tau)
        mean, var = model._predict_f(Xt)
    D = _diag_noise(model, w)
    m_ref, v_ref = _dense_gp(W @ Kzz @ W.T, Wt @ Kzz @ W.T, ((Wt @ Kzz) * Wt).sum(1), D, ys)
    torch.testing.assert_close(mean, m_ref, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(var, v_ref, rtol=1e-6, atol=1e-9)
    Sig = W @ Kzz @ W.T + torch.diag(D)
    dense = multivariate_normal.logpdf(ys.numpy(), cov=Sig.numpy())
    assert exact_batch_logp(W, Kzz, D, ys).item() == pytest.approx(dense, rel=1e-10)
    rhs = torch.randn(len(ys), 3)
    for solver in ("woodbury", "dense"):
        torch.testing.assert_close(batch_solve(W, Kzz, D, rhs, solver), torch.linalg.solve(Sig, rhs), rtol=1e-8,
                                   atol=1e-10)
    loss = model._loss(Xs, ys, 100, ws).item()
    assert loss == pytest.approx(-dense / len(ys), rel=1e-10)


# ------------------------------------------------------------------ CaGP
def test_weighted_cagp_with_all_actions_is_the_exact_gp_and_its_posterior_is_the_dense_projection():
    model, X, y, w = _fit("cagp")
    Xs, ys, ws = _scaled(model, X, y, w)
    mod = model.module_
    n = len(ys)
    D = _diag_noise(model, w)
    mu0 = mod.mu0.double()
    with torch.no_grad():
        K = mod.kernel(Xs, Xs).double()
        full = DenseActions(torch.eye(n), Xs)
        dense = multivariate_normal.logpdf(ys.numpy(), mean=np.full(n, mu0.item()), cov=(K + torch.diag(D)).numpy())
        # i = n with full-rank S: the ELBO is the exact evidence with noise D
        assert elbo_loss(mod.kernel, full, ys, mu0, D).item() == pytest.approx(-dense, rel=1e-8)
        Xt = model.scale_x(_data(12, seed=8)[0])
        m_full, v_full = CaGPPosterior.fit(mod.kernel, full, ys, mu0, D).mean_var(Xt)
        m_ref, v_ref = _dense_gp(K, mod.kernel(Xt, Xs).double(), mod.kernel.diag(Xt).double(), D, ys - mu0)
        torch.testing.assert_close(m_full, mu0 + m_ref, rtol=1e-7, atol=1e-9)
        torch.testing.assert_close(v_full, v_ref, rtol=1e-7, atol=1e-9)
        # the fitted model's own (block-sparse) actions: mean k(x, X) S (S^T (K + D) S)^-1 S^T (y - mu0)
        S = mod.actions(Xs).dense(n).double()
        Ksx = mod.kernel(Xt, Xs).double()
        C = S @ torch.linalg.solve(S.T @ (K + torch.diag(D)) @ S, S.T)
        mean, var = model._predict_f(Xt)
        torch.testing.assert_close(mean, mu0 + Ksx @ C @ (ys - mu0), rtol=1e-7, atol=1e-9)
        torch.testing.assert_close(var, mod.kernel.diag(Xt).double() - ((Ksx @ C) * Ksx).sum(1), rtol=1e-7,
                                   atol=1e-9)


# ------------------------------------------------------------------ all-ones weights == unweighted
def _as_unweighted(model):
    """A copy of a weighted model without the nugget and with noise tau^2 + sigma^2 (same total)."""
    u = copy.deepcopy(model)
    mod = u.module_
    with torch.no_grad():
        total = float(model._noise_s() + torch.nn.functional.softplus(mod.raw_nugget))
    del mod.raw_nugget
    floor = getattr(mod, "noise_floor", 0.0)
    raw = mod.raw_noise if hasattr(mod, "raw_noise") else mod.kernel.raw_noise
    with torch.no_grad():
        raw.fill_(inv_softplus(total - floor))
    assert not u.weighted and float(u._noise_s().detach()) == pytest.approx(total, rel=1e-12)
    return u


@pytest.mark.parametrize("name", list(SMALL))
def test_all_ones_weights_equal_the_unweighted_model_with_the_same_total_noise(name):
    X, y, _ = _data()
    ones = np.ones(36)
    settings = {"epochs": 2, "batch_size": 16, "lr": 1e-2, "dtype": "float64", "device": "cpu", **SMALL[name]}
    model = make_model(name, **settings).fit(X[:36], y[:36], X[36:], y[36:], weights=ones, val_weights=ones[:12])
    u = _as_unweighted(model)
    Xs, ys = model.scale_x(X[:36]), model.scale_y(y[:36])
    Xt = X[36:]
    for m, ws in ((model, torch.ones(36)), (u, None)):
        m.finalize(Xs, ys, ws)
    idx = slice(None) if model.full_batch else slice(0, 16)
    losses = []
    for m, ws in ((model, torch.ones(36)), (u, None)):
        torch.manual_seed(11)
        losses.append(m._loss(Xs[idx], ys[idx], 36, None if ws is None else ws[idx]).item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-9)
    a, b = model.predict(Xt), u.predict(Xt)
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(a.var_y, b.var_y, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(model.predict(Xt, weights=np.ones(len(Xt))).var_y, a.var_y, rtol=1e-12)


# ------------------------------------------------------------------ API, persistence, errors
def test_predict_weights_give_the_noise_of_an_average_of_w_measurements(tmp_path):
    model, X, y, w = _fit("dbk-silu")
    Xt = _data(9, seed=3)[0]
    wt = np.arange(1.0, 10.0)
    p1, pw = model.predict(Xt), model.predict(Xt, weights=wt)
    tau2, s2 = model.nugget_variance, model.measurement_noise_variance
    assert tau2 > 0 and s2 > 0
    np.testing.assert_allclose(pw.var_f, p1.var_f, rtol=0)  # var_f does not depend on the weights
    np.testing.assert_allclose(pw.var_y - pw.var_f, tau2 + s2 / wt, rtol=1e-10)
    np.testing.assert_allclose(p1.var_y - p1.var_f, tau2 + s2, rtol=1e-10)  # None = one measurement
    assert model.noise_variance == pytest.approx(tau2 + s2, rel=1e-12)
    loaded = load_model(model.save(tmp_path / "m"))
    assert loaded.weighted and loaded.nugget_variance == model.nugget_variance
    np.testing.assert_allclose(loaded.predict(Xt, weights=wt).var_y, pw.var_y, rtol=1e-12)


def test_weighted_fit_learns_both_noise_parts_and_beats_one_noise_level():
    """Data made with noise 0.01 + 0.5 / w: the weighted exact GP learns both parts and scores better
    than the unweighted one on held-out points scored with their own weights."""
    rng = np.random.default_rng(0)
    n = 260
    X = rng.uniform(-2.0, 2.0, size=(n, 1))
    w = rng.choice([1.0, 2.0, 4.0, 16.0, 64.0], size=n)
    y = np.sin(2.0 * X[:, 0]) + rng.normal(size=n) * np.sqrt(0.01 + 0.5 / w)
    tr, te = slice(0, 200), slice(200, None)
    settings = dict(epochs=150, lr=0.05, dtype="float64", device="cpu")
    mw = make_model("exact", **settings).fit(X[tr], y[tr], weights=w[tr])
    mu = make_model("exact", **settings).fit(X[tr], y[tr])
    assert mw.measurement_noise_variance == pytest.approx(0.5, rel=0.35)
    assert mw.nugget_variance < 0.05

    def nll(p):
        return np.mean(0.5 * np.log(2 * np.pi * p.var_y) + (y[te] - p.mean) ** 2 / (2 * p.var_y))

    assert nll(mw.predict(X[te], weights=w[te])) < nll(mu.predict(X[te])) - 0.05


def test_weight_errors_are_clear():
    X, y, w = _data()
    m = make_model("dbk-silu", rank=4, hidden=4, epochs=1, dtype="float64", device="cpu")
    bad = w[:36].copy()
    bad[5] = 0.0
    with pytest.raises(InputError, match=r"weights has 1 value\(s\) <= 0 \(rows 5\)"):
        m.fit(X[:36], y[:36], weights=bad)
    bad[5] = np.nan
    with pytest.raises(InputError, match="NaN"):
        m.fit(X[:36], y[:36], weights=bad)
    with pytest.raises(InputError, match="must match"):
        m.fit(X[:36], y[:36], weights=w[:30])
    with pytest.raises(InputError, match="val_weights"):
        m.fit(X[:36], y[:36], X[36:], y[36:], weights=w[:36])
    with pytest.raises(InputError, match="without weights"):
        m.fit(X[:36], y[:36], X[36:], y[36:], val_weights=w[36:])
    unweighted = m.fit(X[:36], y[:36])
    with pytest.raises(InputError, match="fitted without weights"):
        unweighted.predict(X[:3], weights=np.ones(3))


def test_old_saved_run_model_loads_unweighted_and_reproduces_its_stored_predictions():
    import pandas as pd

    # the bundled dbk-rbf run as saved before weights existed (sample_data/runs at 5ffe465), kept as a fixture
    run = Path(__file__).resolve().parent / "data" / "old-dbk-rbf-run"
    model = load_model(run / "model")
    assert not model.weighted
    stored = pd.read_parquet(run / "test_predictions.parquet")
    pred = model.predict(stored[["lon", "lat"]].to_numpy(float))
    np.testing.assert_allclose(pred.mean, stored["mean"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pred.var_y, stored["var_y"], rtol=1e-5, atol=1e-6)
    assert model.noise_variance == model.measurement_noise_variance and model.nugget_variance == 0.0
