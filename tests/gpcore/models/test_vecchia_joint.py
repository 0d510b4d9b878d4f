"""The joint posterior of ``vecchia`` and ``dbk-nn`` (gpcore/models/vecchia_joint.py, docs/decide.md) against the dense
float64 exact GP with the same hyperparameters: covariances, areal variances and joint samples; and
``model.posterior_cov`` on every model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpcore import decide, make_model
from gpcore.posterior import JointPosterior, VecchiaJointPosterior, joint_posterior

N = 90
TINY_DBK = dict(dbk_epochs=3, dbk_rank=8, dbk_hidden=8, feature_check=False)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    X = rng.uniform(0, 1, (N, 2))
    y = np.sin(5 * X[:, 0]) + np.cos(3 * X[:, 1]) + 0.1 * rng.standard_normal(N)
    w = rng.integers(1, 6, N).astype(float)
    Xs = rng.uniform(-0.1, 1.1, (30, 2))  # some new places outside the data: wide, correlated errors
    return X, y, w, Xs


def fit(name, data, *, weighted=False, full=True, **kw):
    X, y, w, _ = data
    extra = TINY_DBK if name == "dbk-nn" else {}
    if full:  # every point conditions on all its predecessors: the exact GP
        kw = dict(neighbors=N - 1, pred_neighbors=N, joint_neighbors=100, **kw)
    return make_model(name, epochs=3, dtype="float64", device="cpu", **extra, **kw).fit(
        X, y, weights=w if weighted else None)


def dense_posterior(model, data):
    """Exact GP posterior ``(mean, cov)`` at the new places, from the model's prior kernel, noise and mean."""
    X, y, w, Xs = data
    K = model.kernel(np.vstack([X, Xs]))
    noise = model.noise_variance if not model.weighted else model.nugget_variance + model.measurement_noise_variance / w
    Kxx = K[:N, :N] + np.diag(np.broadcast_to(noise, (N,)))
    Kxs, Kss = K[:N, N:], K[N:, N:]
    mean = model.prior_mean + Kxs.T @ np.linalg.solve(Kxx, y - model.prior_mean)
    return mean, Kss - Kxs.T @ np.linalg.solve(Kxx, Kxs)


@pytest.mark.parametrize("name,weighted", [("vecchia", False), ("vecchia", True), ("dbk-nn", False),
                                           ("dbk-nn", True)])
def test_all_neighbours_give_the_exact_joint_posterior(data, name, weighted):
    model = fit(name, data, weighted=weighted)
    Xs = data[3]
    mean, cov = dense_posterior(model, data)
    C = model.posterior_cov(Xs)
    np.testing.assert_allclose(C, cov, rtol=1e-6, atol=1e-9 * np.abs(cov).max())
    np.testing.assert_allclose(model.posterior_cov(Xs[:7], Xs[4:12]), cov[:7, 4:12], rtol=1e-6,
                               atol=1e-9 * np.abs(cov).max())
    joint = model.joint_s(model.scale_x(Xs))
    np.testing.assert_allclose(joint.mean * model.y_std_ + model.y_mean_, mean, rtol=1e-7, atol=1e-9)
    # areal sums: mean and variance of w^T f against the dense w^T mu, w^T Sigma w
    jp = joint_posterior(model)
    assert isinstance(jp, VecchiaJointPosterior)
    groups = [(np.arange(10), np.full(10, 0.1)), (np.array([3, 17, 29]), np.array([0.5, 0.25, 0.25]))]
    m_a, v_a = jp.linear(Xs, groups)
    for g, (idx, wg) in enumerate(groups):
        assert m_a[g] == pytest.approx(wg @ mean[idx], rel=1e-7)
        assert v_a[g] == pytest.approx(wg @ cov[np.ix_(idx, idx)] @ wg, rel=1e-6)
    # its diagonal is the marginal prediction's latent variance (both exact here)
    np.testing.assert_allclose(np.diag(C), model.predict(Xs).var_f, rtol=1e-6)


@pytest.mark.parametrize("name", ["vecchia", "dbk-nn"])
def test_the_factor_and_predictions_do_not_depend_on_the_chunk_size(data, name):
    """The joint factor and the marginal predictions are built in chunks of places (``prediction_chunk``: at most 128
    on the CPU); chunks of 4, which put the padded first rows (fewer than ``m_p`` earlier places) in several chunks,
    give the same numbers as one chunk."""
    import dataclasses

    model = fit(name, data, full=False, neighbors=10, joint_neighbors=6, weighted=True)
    Xs = model.scale_x(data[3])
    assert model.config.prediction_chunk("cpu") == min(model.config.chunk_size, 128)
    assert model.config.prediction_chunk("cuda") == model.config.chunk_size
    one = model.joint_s(Xs)
    p_one = model.predict(data[3])
    model.config = dataclasses.replace(model.config, chunk_size=4)
    model.forget_joint()
    assert model.config.prediction_chunk("cpu") == 4
    four = model.joint_s(Xs)
    assert four is not one
    p_four = model.predict(data[3])
    np.testing.assert_allclose(four.d, one.d, rtol=1e-12)
    np.testing.assert_allclose(four.mean, one.mean, rtol=1e-12)
    np.testing.assert_allclose((four.U - one.U).toarray(), 0.0, atol=1e-12)
    np.testing.assert_allclose(p_four.mean, p_one.mean, rtol=1e-12)
    np.testing.assert_allclose(p_four.var_f, p_one.var_f, rtol=1e-12)


@pytest.mark.timeout(120)  # a lost error would leave the caller waiting
def test_a_failed_search_of_earlier_places_reaches_the_caller(data, monkeypatch):
    """The earlier places are searched on another thread: its error is raised in the caller's, not a hang."""
    import gpcore.models.neighbors as nb

    model = fit("vecchia", data, full=False, neighbors=10)

    def broken(*args, **kwargs):
        raise MemoryError("no room for the neighbours")

    monkeypatch.setattr(nb, "ordered_neighbors", broken)
    with pytest.raises(MemoryError, match="no room"):
        model.joint_s(model.scale_x(data[3]))


def test_samples_have_the_posterior_covariance(data):
    """The empirical covariance of joint samples is within Monte-Carlo error of ``posterior_cov`` (m < n too)."""
    model = fit("dbk-nn", data, full=False, neighbors=10)
    Xs = data[3][:12]
    C = model.posterior_cov(Xs)
    S = joint_posterior(model).sample(Xs, 20_000, seed=5)
    emp = np.cov(S.T)
    sd = np.sqrt(np.outer(np.diag(C), np.diag(C)))
    # the sample covariance's standard error is about sqrt((C_ij^2 + C_ii C_jj) / n) <= sd * sqrt(2 / n)
    assert np.all(np.abs(emp - C) < 5 * sd * np.sqrt(2 / 20_000))
    assert np.abs(S.mean(0) - joint_posterior(model).linear(Xs, [([i], [1.0]) for i in range(12)])[0]).max() < (
        5 * np.sqrt(np.diag(C)).max() / np.sqrt(20_000))
    # seeded
    np.testing.assert_array_equal(joint_posterior(model).sample(Xs, 3, seed=1), joint_posterior(model).sample(Xs, 3,
                                                                                                               seed=1))


def test_areal_variance_approaches_the_exact_one_as_m_grows(data):
    """With fewer neighbours the joint factor is an approximation; the areal variance's error shrinks as the new
    places condition on more of each other, and vanishes with all of them."""
    # all training neighbours: the error comes from m_p alone. Fixed starting variances: the fall is monotone at these
    # m_p for these hyperparameters, not for every set (from the semivariance's start, 2 and 6 gave 0.47 and 0.59 %)
    model = fit("vecchia", data, noise_init=0.1, outputscale_init=1.0)
    Xs = data[3]
    _, cov = dense_posterior(model, data)
    w = np.full(len(Xs), 1.0 / len(Xs))
    exact = w @ cov @ w
    errors = []
    for m_p in (0, 2, 6, 29):
        joint = model.joint_s(model.scale_x(Xs), m_pred=m_p)
        errors.append(abs(joint.linear(w[:, None])[1][0] * model.y_std_**2 - exact) / exact)
    assert errors[0] > 0.2, "independent given the data: far too small an areal variance"
    assert errors[0] > errors[1] > errors[2] and errors[3] < 1e-6, errors


def test_posterior_cov_of_feature_models_is_their_joint_posterior(data):
    X, y, _, Xs = data
    for name, kw in (("svgp", dict(num_inducing=16)), ("dbk-mml", dict(rank=8, hidden=8)), ("exact", {})):
        model = make_model(name, epochs=3, dtype="float64", device="cpu", **kw).fit(X, y)
        C = model.posterior_cov(Xs, Xs[:4])
        np.testing.assert_allclose(C, JointPosterior(model).cov(Xs, Xs[:4]), rtol=1e-12)
        np.testing.assert_allclose(np.diag(model.posterior_cov(Xs)), model.predict(Xs).var_f, rtol=1e-6, atol=1e-12)
    exact = make_model("exact", epochs=3, dtype="float64", device="cpu").fit(X, y)
    _, cov = dense_posterior(exact, data)
    np.testing.assert_allclose(exact.posterior_cov(Xs), cov, rtol=1e-6, atol=1e-10)


def test_decisions_work_for_the_vecchia_family(data):
    """areas, plausible maps and suggestions run for vecchia and dbk-nn (the Decide page no longer hides them)."""
    X = data[3]
    for name in ("vecchia", "dbk-nn"):
        model = fit(name, data, full=False, neighbors=10)
        labels = np.where(X[:, 0] < 0.5, "W", "E").astype(object)
        tab = decide.area_posteriors(model, X, labels, samples=4)
        assert list(tab["area"]) == ["E", "W"] and (tab["sd_t"] > 0).all()
        assert decide.plausible_maps(model, X, 3).shape == (3, len(X))
        res = decide.suggest(model, X, None, k=3)
        assert res.engine == "vecchia" and len(set(res.index.tolist())) == 3
        assert res.mean_var_after < res.mean_var_before


# ---------------------------------------------------------------- every labelled row in the posterior


@pytest.mark.parametrize("name,weighted", [("vecchia", False), ("vecchia", True), ("dbk-nn", False),
                                           ("dbk-nn", True)])
def test_validation_rows_join_the_posterior_without_a_refit(data, name, weighted):
    """After training, the validation rows join the conditioning set (``condition_on_validation``, the default):
    hyperparameters unchanged, and with every neighbour the posterior is the exact GP's conditioned on training
    and validation rows together; the same fit without it conditions on the training rows only."""
    X, y, w, Xs = data
    tr, va = np.arange(70), np.arange(70, N)
    extra = TINY_DBK if name == "dbk-nn" else {}
    kw = dict(neighbors=N - 1, pred_neighbors=N, joint_neighbors=100, epochs=3, dtype="float64", device="cpu", **extra)
    wkw = {"weights": w[tr], "val_weights": w[va]} if weighted else {}
    both = make_model(name, **kw).fit(X[tr], y[tr], X[va], y[va], **wkw)
    only = make_model(name, condition_on_validation=False, **kw).fit(X[tr], y[tr], X[va], y[va], **wkw)
    assert both.train_info_["conditioned_on"] == {"training": 70, "validation": N - 70}
    assert "conditioned_on" not in only.train_info_
    for a, b in zip(both.module_.parameters(), only.module_.parameters(), strict=True):
        assert torch.equal(a, b), "no refit"

    def exact(model, rows):
        K = model.kernel(np.vstack([X[rows], Xs]))
        k = len(rows)
        noise = (model.nugget_variance + model.measurement_noise_variance / w[rows]) if weighted else \
            np.full(k, model.noise_variance)
        Kxx, Kxs = K[:k, :k] + np.diag(noise), K[:k, k:]
        mean = model.prior_mean + Kxs.T @ np.linalg.solve(Kxx, y[rows] - model.prior_mean)
        return mean, K[k:, k:] - Kxs.T @ np.linalg.solve(Kxx, Kxs)

    for model, rows in ((both, np.arange(N)), (only, tr)):
        mean, cov = exact(model, rows)
        pred = model.predict(Xs)
        np.testing.assert_allclose(pred.mean, mean, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(pred.var_f, np.diag(cov), rtol=1e-6)
        np.testing.assert_allclose(model.posterior_cov(Xs), cov, rtol=1e-6, atol=1e-9 * np.abs(cov).max())
    assert (both.predict(X[va]).var_f < only.predict(X[va]).var_f).all()


def test_conditioning_survives_save_and_load(data, tmp_path):
    from gpcore.models import load_model

    X, y, w, Xs = data
    model = make_model("dbk-nn", neighbors=8, epochs=3, dtype="float64", device="cpu", **TINY_DBK).fit(
        X[:70], y[:70], X[70:], y[70:])
    back = load_model(model.save(tmp_path / "m"))
    assert back.module_.X_train.shape[0] == N and back.train_info_["conditioned_on"]["validation"] == N - 70
    np.testing.assert_array_equal(back.predict(Xs).mean, model.predict(Xs).mean)
    np.testing.assert_allclose(back.posterior_cov(Xs[:5]), model.posterior_cov(Xs[:5]), rtol=1e-12)


def test_condition_on_checks_its_input(data):
    from gpcore import InputError

    X, y, w, _ = data
    model = fit("vecchia", data, full=False, neighbors=8)
    with pytest.raises(InputError, match="without weights"):
        model.condition_on(X[:3], y[:3], weights=w[:3])
    weighted = fit("vecchia", data, weighted=True, full=False, neighbors=8)
    with pytest.raises(InputError, match="pass the new rows' weights"):
        weighted.condition_on(X[:3], y[:3])
    n0 = model.module_.X_train.shape[0]
    model.condition_on(X[:0], y[:0])
    assert model.module_.X_train.shape[0] == n0


def test_recalibration_comes_before_the_validation_rows_join(data):
    """Rows in the posterior cannot recalibrate it (they would score their own data): ``recalibrate`` after the
    fit is refused, ``fit(recalibrate=...)`` recalibrates first and then conditions."""
    from gpcore import InputError

    X, y, _, Xs = data
    model = make_model("vecchia", neighbors=8, epochs=3, dtype="float64", device="cpu").fit(X[:70], y[:70], X[70:],
                                                                                          y[70:])
    with pytest.raises(InputError, match="already conditions on its validation rows"):
        model.recalibrate(X[70:], y[70:])
    recal = make_model("vecchia", neighbors=8, epochs=3, recalibrate="global", dtype="float64", device="cpu").fit(
        X[:70], y[:70], X[70:], y[70:])
    plain = make_model("vecchia", neighbors=8, epochs=3, condition_on_validation=False, dtype="float64",
                       device="cpu").fit(X[:70], y[:70], X[70:], y[70:])
    assert recal.recal_["global"] == pytest.approx(plain.recalibrate(X[70:], y[70:], kind="global")["global"])
    assert recal.train_info_["conditioned_on"]["validation"] == N - 70
