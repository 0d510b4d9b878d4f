"""dbk-nn: DBK features + Vecchia residual. Exact at m = n - 1 against the dense float64 GP with kernel
``a^2 phi phi^T + k_r`` (likelihood and predictions, with and without weights), the two-pass gradient
against autograd of the one-pass likelihood, the gap limit of the variance, and the shared battery."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.linalg import cho_factor, cho_solve
from scipy.stats import multivariate_normal

from gpcore import InputError, make_model
from tests.gpcore.models.battery import ModelBattery
from tests.gpcore.models.test_exact import _np_kernel

SMALL = {"dbk_rank": 8, "dbk_hidden": 8, "dbk_blocks": 1, "dbk_epochs": 3, "dbk_batch_size": 32, "epochs": 2,
         "dtype": "float64", "device": "cpu"}


def _data(n=60, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 10, size=(n, 2))
    y = 5 + np.sin(X[:, 0]) * X[:, 1] + 0.3 * rng.normal(size=n)
    return X, y


def _set_hypers(model):
    with torch.no_grad():
        mod = model.module_
        mod.raw_ell.copy_(torch.tensor([-0.7, 0.2], dtype=torch.float64))
        mod.raw_outputscale.fill_(-0.5)
        mod.raw_noise.fill_(-2.0)
        mod.mu0.fill_(0.3)
        mod.raw_fscale.fill_(0.8)


def _dense_parts(model, X):
    """Phi (caller rows), a, residual kernel hyperparameters in caller units."""
    phi = model.module_.dbk.features(model.scale_x(X)).detach().numpy()
    a2 = model.feature_scale**2 * model.y_std_**2
    ell = model.module_.lengthscale.detach().numpy() * model.x_span_ / 2.0
    os_ = model.module_.outputscale.item() * model.y_std_**2
    return phi, a2, ell, os_


@pytest.mark.parametrize("weighted", [False, True])
def test_full_neighbour_sets_equal_the_dense_hybrid_gp(weighted):
    X, y = _data()
    n = X.shape[0]
    w = np.random.default_rng(1).integers(1, 15, size=n).astype(float) if weighted else None
    model = make_model("dbk-nn", neighbors=n - 1, pred_neighbors=n, **SMALL).fit(X, y, weights=w)
    _set_hypers(model)
    ws = None if w is None else model._to_tensor(w)
    model.finalize(model.scale_x(X), model.scale_y(y), ws)
    phi, a2, ell, os_ = _dense_parts(model, X)
    if weighted:
        noise = model.nugget_variance + model.measurement_noise_variance / w
    else:
        noise = np.full(n, model.noise_variance)
    Kf = a2 * phi @ phi.T + _np_kernel(model.config.kernel, X, X, ell, os_)
    K = Kf + np.diag(noise)
    mu0 = model.prior_mean
    ll = model.log_likelihood(ws).item() - n * np.log(model.y_std_)
    assert ll == pytest.approx(multivariate_normal.logpdf(y, mean=np.full(n, mu0), cov=K), rel=1e-9)
    Xt = np.random.default_rng(7).uniform(-2, 12, size=(25, 2))  # some outside the data
    phit = model.module_.dbk.features(model.scale_x(Xt)).detach().numpy()
    Ks = a2 * phit @ phi.T + _np_kernel(model.config.kernel, Xt, X, ell, os_)
    kss = a2 * (phit**2).sum(1) + os_
    c = cho_factor(K, lower=True)
    p = model.predict(Xt)
    np.testing.assert_allclose(p.mean, mu0 + Ks @ cho_solve(c, y - mu0), rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(p.var_f, kss - np.einsum("ij,ji->i", Ks, cho_solve(c, Ks.T)), rtol=1e-7, atol=1e-8)
    # the kernel the slice shows is the same prior
    np.testing.assert_allclose(model.kernel(Xt, X), Ks, rtol=1e-8, atol=1e-10)


_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (docs/benchmarks/gpu.md)")


@pytest.mark.parametrize(("joint", "weighted", "device"), [(False, False, "cpu"), (False, True, "cpu"),
                                                           (True, False, "cpu"),
                                                           pytest.param(False, True, "cuda", marks=_CUDA)])
def test_two_pass_gradient_equals_autograd_of_the_likelihood(joint, weighted, device):
    """Frozen features: the second pass differentiates only the Vecchia rows, ``a`` and the centred targets against
    the first-order surrogate (``linalg.row_products``, sparse on the CPU, gathered on a GPU); joint: it pushes the
    adjoints through the features too. Both equal autograd."""
    X, y = _data(n=90, seed=2)
    w = np.random.default_rng(3).integers(1, 15, size=len(y)).astype(float) if weighted else None
    model = make_model("dbk-nn", neighbors=7, chunk_size=16, **{**SMALL, "device": device}).fit(X, y, weights=w)
    _set_hypers(model)
    model._set_joint(joint)
    params = [p for g in model._param_groups(0.0) for p in g["params"]]
    assert (len(params) > 5) if joint else (len(params) == 5 + weighted)  # joint: also the feature map; weighted: tau^2
    mod = model.module_
    n = mod.X_train.shape[0]
    ws = None if w is None else model._to_tensor(w)
    for p in params:
        p.grad = None
    loss = model._step(mod.X_train, mod.y_train, n, ws)
    two_pass = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    model._phi_cache = None
    ref = -model.log_likelihood(ws) / n
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)
    for a, b in zip(two_pass, (p.grad for p in params), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_variance_returns_to_the_prior_inside_a_gap():
    """Far from all measurements the residual is unconditioned: var_f = a^2 |F^T phi|^2 + k_r(x, x),
    strictly above what the DBK features alone give, and the mean is the DBK part's."""
    X, y = _data(n=120, seed=3)
    keep = ~((X[:, 0] > 3) & (X[:, 0] < 7) & (X[:, 1] > 3) & (X[:, 1] < 7))  # a 4 x 4 hole in the middle
    model = make_model("dbk-nn", neighbors=10, **SMALL).fit(X[keep], y[keep])
    with torch.no_grad():
        model.module_.raw_ell.fill_(-4.0)  # residual correlation length << the hole
    model.finalize(model.scale_x(X[keep]), model.scale_y(y[keep]))
    p = model.predict(np.array([[5.0, 5.0]]))
    mod = model.module_
    phi = model._phi_of(model.scale_x(np.array([[5.0, 5.0]])))
    a = mod.fscale.double()
    feat_var = (a * phi @ mod.post_F.double()).pow(2).sum().item()
    prior = mod.outputscale.item()
    assert p.var_f[0] / model.y_std_**2 == pytest.approx(feat_var + prior, rel=1e-9)
    mean_dbk = mod.mu0.item() + (a * phi @ mod.post_m.double()).item()
    assert (p.mean[0] - model.y_mean_) / model.y_std_ == pytest.approx(mean_dbk, rel=1e-9, abs=1e-12)


def test_joint_stage_is_kept_only_when_it_helps_on_validation():
    X, y = _data(n=160, seed=4)
    model = make_model("dbk-nn", neighbors=8, train_mode="joint", joint_epochs=3, feature_check=False, **SMALL)
    model.fit(X[:120], y[:120], X[120:], y[120:])
    info = model.train_info_
    assert info["joint"]["epochs_run"] >= 1
    stages = {h["stage"] for h in model.history_}
    assert stages == {"residual", "joint"}
    residual_best = min(h["val_nll"] for h in model.history_ if h["stage"] == "residual")
    # the model kept scores no worse than the residual stage's best on the validation split
    pred = model.predict(X[120:])
    nll = np.mean(0.5 * np.log(2 * np.pi * pred.var_y) + (y[120:] - pred.mean) ** 2 / (2 * pred.var_y))
    assert nll <= residual_best + 1e-9
    assert info["joint"]["kept"] == (info["joint"]["best_val_nll"] < residual_best)


def _val_nll(model, X, y, w=None):
    pred = model.predict(X, weights=w)
    return float(np.mean(0.5 * np.log(2 * np.pi * pred.var_y) + (y - pred.mean) ** 2 / (2 * pred.var_y)))


CHECKED = {**SMALL, "epochs": 6, "dbk_epochs": 10}


def _checked_fit(weighted=False, **settings):
    rng = np.random.default_rng(5)
    X = rng.uniform(0, 10, size=(200, 2))
    y = 5 + np.sin(X[:, 0]) * X[:, 1] + 0.1 * rng.normal(size=200)
    w = rng.integers(1, 9, size=200).astype(float) if weighted else None
    model = make_model("dbk-nn", neighbors=8, **{**CHECKED, **settings})
    wkw = {} if w is None else {"weights": w[:150], "val_weights": w[150:]}
    return model.fit(X[:150], y[:150], X[150:], y[150:], **wkw), X, y, w


@pytest.mark.parametrize("weighted", [False, True])
def test_feature_check_drops_features_that_validate_worse_than_the_residual_alone(weighted, monkeypatch):
    """The check refits the residual GP alone and keeps the features only when they lower the validation
    NLL. Here the hybrid is made to lose (its best validation NLL reported as inf: on this small smooth field the
    two are close and which wins depends on the optimiser); the residual alone is kept, and the model kept scores
    exactly its validation NLL (weighted: with its nugget refitted too)."""
    import gpcore.models.training as T

    real = T.train

    def hybrid_loses(model, *args, **kw):
        history, info = real(model, *args, **kw)
        if getattr(model.module_, "features_on", False) and hasattr(model.module_, "dbk"):  # stage 2, not stage 1
            info = {**info, "best_val_nll": float("inf")}
        return history, info

    monkeypatch.setattr(T, "train", hybrid_loses)
    # scored on the validation rows: the posterior before they join its conditioning set
    model, X, y, w = _checked_fit(weighted, condition_on_validation=False, feature_screen=False)
    check = model.train_info_["feature_check"]
    assert model.weighted == weighted
    assert {h["stage"] for h in model.history_} == {"residual", "residual only"}
    assert check["residual_only"] < check["with_features"]
    assert not check["kept"] and not model.features_used
    assert _val_nll(model, X[150:], y[150:], None if w is None else w[150:]) == pytest.approx(check["residual_only"],
                                                                                         rel=1e-9)
    assert model.train_info_["best_val_nll"] == check["residual_only"]


def test_feature_check_fits_the_residual_first_and_starts_the_hybrid_from_it(monkeypatch):
    """The residual alone is fitted first; the hybrid starts from its residual hyperparameters (its best state) and,
    when the residual alone validates worse (forced here by reporting its best validation NLL as inf), the hybrid
    is kept and scores exactly its own best validation NLL."""
    import gpcore.models.training as T

    real = T.train
    seen = []
    names = ("raw_ell", "raw_outputscale", "raw_noise", "mu0")

    def residual_alone_loses(model, *args, **kw):
        mod = model.module_
        if hasattr(mod, "dbk") and mod.features_on:  # the hybrid's start
            seen.append(("hybrid start", {k: getattr(mod, k).detach().clone() for k in names}))
        history, info = real(model, *args, **kw)
        if hasattr(mod, "dbk") and not mod.features_on:  # dbk-nn's residual alone (not stage 1's DBK)
            seen.append(("alone end", {k: getattr(mod, k).detach().clone() for k in names}))
            info = {**info, "best_val_nll": float("inf")}
        return history, info

    monkeypatch.setattr(T, "train", residual_alone_loses)
    model, X, y, _ = _checked_fit(condition_on_validation=False, feature_screen=False)
    assert [s for s, _ in seen] == ["alone end", "hybrid start"]
    for k in names:
        assert torch.equal(seen[0][1][k], seen[1][1][k]), k
    check = model.train_info_["feature_check"]
    assert check["kept"] and model.features_used
    assert [h["stage"] for h in model.history_][0] == "residual only"
    assert _val_nll(model, X[150:], y[150:]) == pytest.approx(check["with_features"], rel=1e-9)


def test_without_features_the_model_is_its_residual_vecchia_gp():
    """a = 0 (features dropped): likelihood, predictions and kernel equal vecchia's with the same residual
    hyperparameters (float64), and the dropped state survives save / load."""
    X, y = _data(n=80, seed=6)
    model = make_model("dbk-nn", neighbors=10, pred_neighbors=12, **SMALL).fit(X, y)
    _set_hypers(model)
    model.module_.features_on = False
    model.finalize(model.scale_x(X), model.scale_y(y))
    ref = make_model("vecchia", neighbors=10, pred_neighbors=12, epochs=1, dtype="float64", device="cpu").fit(X, y)
    with torch.no_grad():
        for name in ("raw_ell", "raw_outputscale", "raw_noise", "mu0"):
            getattr(ref.module_, name).copy_(getattr(model.module_, name))
    ref.finalize(ref.scale_x(X), ref.scale_y(y))
    assert model.log_likelihood().item() == pytest.approx(ref.log_likelihood().item(), rel=1e-10)
    Xq = np.random.default_rng(7).uniform(-2, 12, size=(25, 2))
    p, q = model.predict(Xq), ref.predict(Xq)
    np.testing.assert_allclose(p.mean, q.mean, rtol=1e-10)
    np.testing.assert_allclose(p.var_f, q.var_f, rtol=1e-10)
    np.testing.assert_allclose(model.kernel(Xq[:5], X[:7]), ref.kernel(Xq[:5], X[:7]), rtol=1e-10)


def test_dropped_features_survive_save_and_load(tmp_path):
    X, y = _data(n=80, seed=8)
    model = make_model("dbk-nn", neighbors=10, **SMALL).fit(X, y)
    model.module_.features_on = False
    model.finalize(model.scale_x(X), model.scale_y(y))
    before = model.predict(X[:9])
    from gpcore import load_model

    loaded = load_model(model.save(tmp_path / "m"))
    assert loaded.features_used is False
    after = loaded.predict(X[:9])
    np.testing.assert_allclose(after.mean, before.mean, rtol=1e-12)
    np.testing.assert_allclose(after.var_y, before.var_y, rtol=1e-12)


def test_no_feature_form():
    from gpcore.posterior import JointPosterior

    X, y = _data()
    model = make_model("dbk-nn", neighbors=5, **SMALL).fit(X, y)
    with pytest.raises(InputError, match="no feature form"):
        JointPosterior(model)


class TestDBKNNBattery(ModelBattery):
    name = "dbk-nn"
    # the battery scores the validation rows against the trainer: the posterior before they join it
    settings = {k: v for k, v in SMALL.items() if k not in ("dtype", "device")} | {"neighbors": 8, "epochs": 4,
                                                                                   "condition_on_validation": False}


@pytest.mark.parametrize("gain, min_improvement, kept", [(5e-4, 1e-3, False), (2e-3, 1e-3, True), (5e-4, 0.0, True)])
def test_feature_check_keeps_the_features_only_on_a_gain_above_min_improvement(monkeypatch, gain, min_improvement,
                                                                                kept):
    """A hybrid that validates better than the residual alone by less than ``min_improvement`` is a tie the
    validation cannot see: the residual alone (the simpler model) is kept."""
    import gpcore.models.training as T

    real = T.train

    def scripted(model, *args, **kw):
        history, info = real(model, *args, **kw)
        if hasattr(model.module_, "dbk"):  # dbk-nn's residual alone, then its hybrid
            info = {**info, "best_val_nll": 1.0 - (gain if model.module_.features_on else 0.0)}
        return history, info

    monkeypatch.setattr(T, "train", scripted)
    model, *_ = _checked_fit(condition_on_validation=False, min_improvement=min_improvement, feature_screen=False)
    check = model.train_info_["feature_check"]
    assert check["kept"] is kept and model.features_used is kept


def test_stage_two_after_the_feature_check_stops_on_hybrid_patience(monkeypatch):
    """The residual-only fit stops on ``patience``, the hybrid started at its optimum on ``hybrid_patience``: with a
    validation NLL that never improves after each stage's first epoch, they run 1 + 3 and 1 + 2 epochs."""
    from gpcore.models import training
    from gpcore.models.dbknn import DBKNN

    original = training.validation_metrics
    seen = {}

    def scripted(model, *args, **kwargs):
        if not isinstance(model, DBKNN):  # stage 1, the DBK: its own metrics
            return original(model, *args, **kwargs)
        stage = "hybrid" if model.module_.features_on else "residual only"
        seen[stage] = seen.get(stage, 0) + 1
        nll = 1.0 if seen[stage] == 1 else 1.5
        return (nll, 0.0, torch.full((len(args[3]),), nll)) if kwargs.get("rows") else (nll, 0.0)

    monkeypatch.setattr(training, "validation_metrics", scripted)
    X, y = _data(120)
    model = make_model("dbk-nn", **{**SMALL, "epochs": 20, "optimizer": "adam", "patience": 3,
                                    "hybrid_patience": 2, "feature_screen": False})
    model.fit(X[:100], y[:100], X[100:], y[100:])
    stages = [h["stage"] for h in model.history_]
    assert stages.count("residual only") == 4
    assert stages.count("residual") == 3
    assert seen == {"residual only": 4, "hybrid": 3}


@pytest.mark.parametrize("weighted", [False, True])
def test_the_posterior_after_each_iteration_reuses_the_steps_sums_and_the_fit_is_unchanged(weighted, monkeypatch):
    """The validation after each L-BFGS iteration needs the hybrid's sums at the accepted point, which the line
    search has just computed: with the memo the fit makes fewer passes over the rows and ends bit for bit where
    the fit without it (a memo of size 0) ends."""
    from gpcore.models import dbknn, memo

    passes = {"n": 0}
    original = dbknn.DBKNN._stats

    def counted(self, *args, **kwargs):
        passes["n"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(dbknn.DBKNN, "_stats", counted)
    runs = {}
    for size in (4, 0):
        monkeypatch.setattr(dbknn, "PointMemo", lambda size=size: memo.PointMemo(size))
        passes["n"] = 0
        model, X, y, w = _checked_fit(weighted, feature_check=False)
        pred = model.predict(X[150:], weights=None if w is None else w[150:])
        runs[size] = (passes["n"], model.train_info_["best_val_nll"], pred.mean, pred.var_y,
                      model.module_.post_m.clone())
    with_memo, without = runs[4], runs[0]
    assert with_memo[0] < without[0]
    assert with_memo[1] == without[1]
    np.testing.assert_array_equal(with_memo[2], without[2])
    np.testing.assert_array_equal(with_memo[3], without[3])
    assert torch.equal(with_memo[4], without[4])


# ---------------------------------------------------------------- the feature screen (dbknn_screen.py)
def _screen_ll(a, c, lam, h, uu, ld, n):
    """The restricted hybrid log-likelihood at ``(a, c)``, not maximised over ``c`` (dbknn_screen's docstring)."""
    t = a * a / c
    d = 1.0 + t * lam
    return (-0.5 * n * np.log(2 * np.pi) - 0.5 * (ld + n * np.log(c)) - 0.5 * np.log(d).sum()
            - (uu - t * (h / d).sum()) / (2 * c))


@pytest.mark.parametrize("weighted", [False, True])
def test_the_screens_closed_form_is_the_hybrid_likelihood_of_its_family(weighted):
    """One pass gives the hybrid log-likelihood of every ``(a, c)``: the features at scale ``a`` and the residual's
    outputscale, noise and nugget times ``c``. Against the model's own chunked likelihood, float64; and ``c(t)``
    maximises it for each ``t``."""
    from gpcore.models import dbknn_screen as S

    X, y = _data(n=90, seed=3)
    w = np.random.default_rng(2).integers(1, 9, size=90).astype(float) if weighted else None
    model = make_model("dbk-nn", neighbors=7, chunk_size=16, **SMALL).fit(X, y, weights=w)
    _set_hypers(model)
    ws = None if w is None else model._to_tensor(w)
    model.finalize(model.scale_x(X), model.scale_y(y), ws)
    base = {k: v.clone() for k, v in model.module_.state_dict().items()}
    lam, h, uu, ld, n = S.screen_sums(model, ws)
    assert n == 90 and (lam >= 0).all()
    for a, c in [(0.3, 1.0), (1.7, 0.6), (0.05, 2.5)]:
        model.module_.load_state_dict(base)
        S.apply_scale(model, a, c)
        ref = model.log_likelihood(ws).item()
        assert _screen_ll(a, c, lam, h, uu, ld, n) == pytest.approx(ref, rel=1e-10)
        t = a * a / c
        best, c_t = S.profile_loglik(t, lam, h, uu, ld, n)
        assert best == pytest.approx(_screen_ll(np.sqrt(t * c_t), c_t, lam, h, uu, ld, n), rel=1e-12)
        for f in (0.9, 1.1):
            assert best > _screen_ll(np.sqrt(t * c_t * f), c_t * f, lam, h, uu, ld, n)
    a, c, ll = S.best_scale(lam, h, uu, ld, n)
    assert ll >= S.profile_loglik(0.0, lam, h, uu, ld, n)[0]
    for t in (1e-4, 1e-2, 1.0, 1e2):
        assert ll >= S.profile_loglik(t, lam, h, uu, ld, n)[0] - 1e-9


@pytest.mark.parametrize("a, gain, se, hybrid", [(0.5, -np.inf, 0.0, False), (0.5, np.inf, 0.0, True),
                                                 (0.0, np.inf, 0.0, False), (0.5, 1e-3, 2e-3, False),
                                                 (0.5, 3e-3, 2e-3, True)])
def test_the_hybrid_is_fitted_only_when_the_screen_validates_better_and_starts_there(monkeypatch, a, gain, se, hybrid):
    """No validation gain at the residual's shape, one inside a paired standard error (``screen_se`` = 1), or one with
    ``a = 0`` (the residual rescaled, no features): no hybrid fit, the features are dropped and the check reports the
    screen's NLL. A gain above one SE with ``a > 0``: the hybrid starts at the screen's point (its ``a`` and scaled
    residual)."""
    import gpcore.models.training as T
    from gpcore.models import dbknn, dbknn_screen

    real_screen, real_train = dbknn.screen_features, T.train
    seen = {}

    def scripted(model, *args, **kw):
        out = real_screen(model, *args, **kw)
        dbknn_screen.apply_scale(model, a, 1.0)  # the scale this case scripts, at the screen's residual scale
        seen["after screen"] = {k: v.detach().clone() for k, v in model.module_.state_dict().items()}
        seen["val"] = out["residual_val_nll"] - gain
        return {**out, "a": a, "val_nll": seen["val"], "gain_se": se}

    def watched(model, *args, **kw):
        if hasattr(model.module_, "dbk") and model.module_.features_on:
            seen["hybrid start"] = {k: v.detach().clone() for k, v in model.module_.state_dict().items()}
        return real_train(model, *args, **kw)

    monkeypatch.setattr(dbknn, "screen_features", scripted)
    monkeypatch.setattr(T, "train", watched)
    model, *_ = _checked_fit(condition_on_validation=False)
    check, val = model.train_info_["feature_check"], seen["val"]
    stages = {h["stage"] for h in model.history_}
    assert check["hybrid_fitted"] is hybrid and ("residual" in stages) is hybrid
    assert check["screen"]["a"] == a and check["screen"]["c"] > 0
    if hybrid:
        for k, v in seen["after screen"].items():
            assert torch.equal(v, seen["hybrid start"][k]), k
    else:
        assert "hybrid start" not in seen
        assert check["with_features"] == val and not check["kept"] and not model.features_used


@pytest.mark.parametrize("weighted", [False, True])
def test_the_screens_gate_compares_per_row_with_the_residual_fit(weighted):
    """The screen's reference is the residual fit itself (its kept validation NLL), and ``gain_se`` is the standard
    error of the mean per-row NLL difference between the screen's point and that fit, recomputed here in float64."""
    from gpcore.models import dbknn_screen as S
    from gpcore.models import training as T

    model, X, y, w = _checked_fit(weighted, condition_on_validation=False, screen_se=1e9)  # gate shut: no hybrid
    check = model.train_info_["feature_check"]
    sc = check["screen"]
    assert not check["hybrid_fitted"] and not model.features_used
    assert sc["residual_val_nll"] == pytest.approx(check["residual_only"], abs=1e-10)
    Xs, ys, Xv, yv = model.scale_x(X[:150]), model.scale_y(y[:150]), model.scale_x(X[150:]), model.scale_y(y[150:])
    ws, wv = (None, None) if w is None else (model._to_tensor(w[:150]), model._to_tensor(w[150:]))
    nll0, _, rows0 = T.validation_metrics(model, Xs, ys, Xv, yv, ws, wv, rows=True)  # the residual fit, kept
    model.module_.features_on = True
    S.apply_scale(model, sc["a"], sc["c"])  # the screen's point, from the residual fit's state
    nll1, _, rows1 = T.validation_metrics(model, Xs, ys, Xv, yv, ws, wv, rows=True)
    d = (rows1 - rows0).numpy()
    assert nll0 == pytest.approx(sc["residual_val_nll"], abs=1e-12) and nll1 == pytest.approx(sc["val_nll"], abs=1e-12)
    assert sc["gain_se"] == pytest.approx(d.std(ddof=1) / np.sqrt(d.size), rel=1e-9) and sc["gain_se"] > 0
