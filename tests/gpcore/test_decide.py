"""Decisions (gpcore/decide.py) against dense float64 oracles and brute force."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import shapely
import torch
from scipy.stats import norm

from gpcore import InputError, make_model
from gpcore.decide import (
    area_posteriors,
    assign_areas,
    exceedance,
    haversine_km,
    model_threshold,
    plausible_maps,
    suggest,
    undecided_mask,
)
from gpcore.posterior import JointPosterior


def lonlat_data(n=90, seed=0):
    """Points in a 0.6 x 0.4 degree box around Puerto Rico-like coordinates; y = log10 of a speed."""
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.uniform(-66.6, -66.0, n), rng.uniform(18.1, 18.5, n)])
    y = 1.4 + 0.4 * np.sin(8 * X[:, 0]) + 0.3 * np.cos(9 * X[:, 1]) + 0.1 * rng.normal(size=n)
    return X, y


SETTINGS = {
    "dbk-mml": dict(rank=10, hidden=8, epochs=5),
    "dbk": dict(rank=10, hidden=8, epochs=3),
    "svgp": dict(num_inducing=6, epochs=3),
    "exact": dict(epochs=5),
    "vecchia": dict(epochs=3, neighbors=10),
}
_CACHE: dict = {}


@pytest.fixture(scope="module")
def data():
    X, y = lonlat_data()
    grid = np.stack(np.meshgrid(np.linspace(-66.58, -66.02, 9), np.linspace(18.12, 18.48, 6)), -1).reshape(-1, 2)
    return X[:60], y[:60], grid


def fitted(name, data):
    if name not in _CACHE:
        _CACHE[name] = make_model(name, dtype="float64", device="cpu", seed=0, **SETTINGS[name]).fit(data[0], data[1])
    return _CACHE[name]


# ------------------------------------------------------------------------------------- exceedance


def test_exceedance_original_units_equals_model_space_through_transform(data):
    model = fitted("dbk-mml", data)
    grid = data[2]
    pred = model.predict(grid)
    e = exceedance(model, grid, 35.0, units="original", transform="log10")
    np.testing.assert_allclose(e.threshold_model, np.log10(35.0))
    np.testing.assert_allclose(e.p_f, norm.cdf((np.log10(35.0) - pred.mean) / np.sqrt(pred.var_f)), rtol=1e-10)
    np.testing.assert_allclose(e.p_y, norm.cdf((np.log10(35.0) - pred.mean) / np.sqrt(pred.var_y)), rtol=1e-10)
    e_model = exceedance(model, grid, np.log10(35.0), units="model")
    np.testing.assert_allclose(e.p_f, e_model.p_f, rtol=1e-12)
    above = exceedance(model, grid, 35.0, units="original", transform="log10", direction="above")
    np.testing.assert_allclose(above.p_f, 1 - e.p_f, rtol=1e-12)
    assert (np.abs(e.p_y - 0.5) <= np.abs(e.p_f - 0.5) + 1e-12).all()  # the noise makes y less certain


def test_thresholds_are_checked():
    with pytest.raises(InputError, match="must be > 0"):
        model_threshold(0.0, "original", "log10")
    with pytest.raises(InputError, match="units"):
        model_threshold(1.0, "mbps")
    assert model_threshold(100.0, "original", "log") == pytest.approx(np.log(100.0))
    np.testing.assert_array_equal(undecided_mask([0.1, 0.2, 0.5, 0.8, 0.9]), [False, False, True, False, False])


# ------------------------------------------------------------------------------------- areas


def test_assign_areas_point_in_polygon():
    import geopandas as gpd

    polys = gpd.GeoDataFrame({"NAME": ["west", "east"]},
                             geometry=[shapely.box(0, 0, 1, 1), shapely.box(1, 0, 2, 1)], crs=4326)
    lab = assign_areas([0.5, 1.5, 3.0, 0.2], [0.5, 0.5, 0.5, 0.9], polys)
    assert list(lab) == ["west", "east", None, "west"]


@pytest.mark.parametrize("name", ["dbk-mml", "svgp"])
def test_area_posteriors_match_dense_oracle(name, data):
    model = fitted(name, data)
    grid = data[2]
    rng = np.random.default_rng(1)
    labels = np.array(["a"] * 20 + ["b"] * 20 + [None] * 14, dtype=object)
    rng.shuffle(labels)
    weights = rng.uniform(0.5, 2.0, len(grid))
    out = area_posteriors(model, grid, labels, weights=weights, threshold=30.0, units="original",
                          transform="log10", measurements=["a", "a", "b", None])
    Sigma = JointPosterior(model).cov(grid)
    mean = model.predict(grid).mean
    for _, row in out.iterrows():
        idx = np.flatnonzero(labels == row["area"])
        w = weights[idx] / weights[idx].sum()
        m, v = w @ mean[idx], w @ Sigma[np.ix_(idx, idx)] @ w
        assert row["cells"] == idx.size
        np.testing.assert_allclose(row["mean_t"], m, rtol=1e-9)
        np.testing.assert_allclose(row["sd_t"], np.sqrt(v), rtol=1e-7)
        np.testing.assert_allclose(row["p_below"], norm.cdf((np.log10(30.0) - m) / np.sqrt(v)), rtol=1e-6)
        np.testing.assert_allclose(row["mean"], 10**m, rtol=1e-9)  # geometric mean in Mbps
        np.testing.assert_allclose(row["upper_t"] - row["lower_t"], 2 * 1.959963984540054 * np.sqrt(v), rtol=1e-7)
    assert out["measurements"].tolist() == [2, 1]


def test_area_arithmetic_mean_by_samples(data):
    """Original-units arithmetic mean: E[sum w 10^f] = sum w 10^(m + var ln10 / 2), within Monte-Carlo error."""
    model = fitted("dbk-mml", data)
    grid = data[2]
    labels = np.array(["x"] * len(grid), dtype=object)
    out = area_posteriors(model, grid, labels, transform="log10", samples=4000, seed=2, threshold=25.0,
                          units="original")
    jp = JointPosterior(model)
    mean, var = jp.marginals(grid)
    w = np.full(len(grid), 1 / len(grid))
    exact = w @ (10 ** (mean + 0.5 * var * np.log(10)))
    assert out["samples"].iloc[0] == 4000
    S = 10 ** jp.sample(grid, 4000, seed=2)
    se = (S @ w).std() / np.sqrt(4000)
    assert abs(out["mean_arith"].iloc[0] - exact) < 5 * se
    assert out["lower_arith"].iloc[0] < out["mean_arith"].iloc[0] < out["upper_arith"].iloc[0]
    assert 0.0 <= out["p_below_arith"].iloc[0] <= 1.0


def test_area_weights_are_checked(data):
    model = fitted("dbk", data)
    grid = data[2]
    with pytest.raises(InputError, match=">= 0"):
        area_posteriors(model, grid, ["a"] * len(grid), weights=-np.ones(len(grid)))


def test_plausible_maps_seeded(data):
    model = fitted("dbk", data)
    a = plausible_maps(model, data[2], 4, seed=5)
    assert a.shape == (4, len(data[2]))
    np.testing.assert_array_equal(a, plausible_maps(model, data[2], 4, seed=5))


# ------------------------------------------------------------------------------------- suggestions


def brute_force_reductions(model, candidates, targets, wt=None):
    """Exact reduction of the weighted mean variance of f over targets for each candidate (dense)."""
    jp = JointPosterior(model)
    C = jp.cov(targets, candidates)
    vc = np.diag(jp.cov(candidates))
    wt = np.full(len(targets), 1 / len(targets)) if wt is None else wt
    return (wt[:, None] * C**2).sum(0) / (vc + model.noise_variance)


@pytest.mark.parametrize("name,engine", [("dbk", "features"), ("dbk", "dense"), ("svgp", "auto"),
                                         ("exact", "auto")])
def test_first_pick_is_brute_force_argmax(name, engine, data):
    model = fitted(name, data)
    grid = data[2]
    targets = grid[::2]
    red = brute_force_reductions(model, grid, targets)
    res = suggest(model, grid, targets, k=3, engine=engine)
    assert res.index[0] == int(np.argmax(red))
    np.testing.assert_allclose(res.reduction[0], red.max(), rtol=1e-7)
    assert res.engine == ("dense" if engine == "auto" else engine)
    assert len(set(res.index.tolist())) == 3
    assert np.all(np.diff(res.reduction) <= 1e-12 + 1e-9 * res.reduction[0])  # submodular: shrinking gains


def test_engines_agree_without_residual(data):
    model = fitted("dbk-mml", data)
    grid = data[2]
    a = suggest(model, grid, k=5, engine="features")
    b = suggest(model, grid, k=5, engine="dense")
    np.testing.assert_array_equal(a.index, b.index)
    np.testing.assert_allclose(a.reduction, b.reduction, rtol=1e-7)
    np.testing.assert_allclose(a.var_after_targets, b.var_after_targets, rtol=1e-6, atol=1e-12)


def test_update_equals_refit_dbk_mml(data):
    """After picks, the weight posterior equals the exact posterior refit with the sites added (eq. 10)."""
    model = fitted("dbk-mml", data)
    Xtr, ytr, grid = data
    res = suggest(model, grid, k=2, engine="features")
    refit = copy.deepcopy(model)
    X_aug = np.vstack([Xtr, grid[res.index]])
    y_aug = np.concatenate([ytr, np.zeros(2)])  # the covariance does not depend on the values
    refit.finalize(refit.scale_x(X_aug), refit.scale_y(y_aug))
    U = refit.module_.post_U.double()
    np.testing.assert_allclose(res.weight_cov.numpy(), (U @ U.T).numpy(), rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(res.var_after_candidates, refit.predict(grid).var_f, rtol=1e-6, atol=1e-12)


def test_update_equals_refit_exact_gp(data):
    """Exact GP: the variance after the picks equals the exact GP refit with them (hyperparameters fixed)."""
    model = fitted("exact", data)
    Xtr, ytr, grid = data
    res = suggest(model, grid, grid[::3], k=3)
    refit = copy.deepcopy(model)
    X_aug = np.vstack([Xtr, grid[res.index]])
    y_aug = np.concatenate([ytr, np.zeros(3)])
    with torch.no_grad():
        refit._finalize(refit.scale_x(X_aug), refit.scale_y(y_aug))
    np.testing.assert_allclose(res.var_after_targets, refit.predict(grid[::3]).var_f, rtol=1e-6, atol=1e-10)
    np.testing.assert_allclose(res.var_after_candidates, refit.predict(grid).var_f, rtol=1e-6, atol=1e-10)
    assert res.mean_var_after < res.mean_var_before


def test_features_engine_with_residual_approximates_exact(data):
    """SVGP in the features engine: the residual enters through random pathwise features, so the reductions
    approach the exact ones (here within 10 % with D = 4000), while ignoring the residual is far off."""
    from gpcore.models.linalg import inv_softplus

    model = copy.deepcopy(fitted("svgp", data))
    with torch.no_grad():  # lengthscales below the inducing spacing: the residual carries most of the variance
        model.module_.raw_ell.fill_(inv_softplus(0.2))
    grid = data[2]
    exact = suggest(model, grid, k=1, engine="dense")
    approx = suggest(model, grid, k=1, engine="features", residual_features=4000, seed=1)
    red = brute_force_reductions(model, grid, grid)
    np.testing.assert_allclose(approx.reduction[0], exact.reduction[0], rtol=0.1)
    assert red[approx.index[0]] > 0.9 * red.max()
    jp = JointPosterior(model)
    P = jp.features(grid) @ jp.factor * model.y_std_
    C = (P @ P.T).numpy()  # weight part only
    no_resid = (C**2).mean(0) / (np.diag(C) + model.noise_variance)
    assert no_resid.max() < 0.7 * red.max()


def test_min_spacing(data):
    model = fitted("dbk", data)
    grid = data[2]
    res = suggest(model, grid, k=4, min_km=15.0)
    P = grid[res.index]
    d = haversine_km(P[:, None, 0], P[:, None, 1], P[None, :, 0], P[None, :, 1])
    assert (d[~np.eye(len(P), dtype=bool)] >= 15.0).all()
    with pytest.raises(InputError, match="k=0"):
        suggest(model, grid, k=0)


def test_vecchia_engine_takes_known_marginals_instead_of_predicting(data, monkeypatch):
    """A run's stored marginals (``pred`` / ``target_pred``) give the same picks and variances as predicting them,
    and nothing is predicted; bad ones are refused by name."""
    model = copy.deepcopy(fitted("vecchia", data))
    grid = data[2]
    targets = grid[::2]
    want = {"some": suggest(model, grid, targets, k=4), "all": suggest(model, grid, None, k=4)}
    pred, target_pred = model.predict(grid), model.predict(targets)

    def refuse(*a, **k):
        raise AssertionError("predicted again")
    monkeypatch.setattr(model, "predict_scaled", refuse)
    got = {"some": suggest(model, grid, targets, k=4, pred=pred, target_pred=target_pred),
           "all": suggest(model, grid, None, k=4, pred=pred)}
    for key, g in got.items():
        w = want[key]
        assert g.engine == "vecchia"
        np.testing.assert_array_equal(g.index, w.index)
        np.testing.assert_allclose(g.reduction, w.reduction, rtol=1e-9)
        np.testing.assert_allclose(g.var_after_targets, w.var_after_targets, rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(g.var_after_candidates, w.var_after_candidates, rtol=1e-9, atol=1e-15)
        assert g.mean_var_before == pytest.approx(w.mean_var_before, rel=1e-12)
    with pytest.raises(AssertionError, match="predicted again"):  # targets' marginals unknown: predicted
        suggest(model, grid, targets, k=2, pred=pred)
    with pytest.raises(InputError, match="pred: var_f must be 54"):
        suggest(model, grid, targets, k=2, pred=target_pred, target_pred=target_pred)
    bad = copy.deepcopy(target_pred)
    bad.var_f[0] = -1.0
    with pytest.raises(InputError, match="target_pred: var_f must be 27 finite non-negative"):
        suggest(model, grid, targets, k=2, pred=pred, target_pred=bad)


def test_joint_caveat_names_predictive_objectives(data):
    from gpcore.decide import joint_caveat

    assert "dppgp" in joint_caveat(fitted("dbk", data))
    assert joint_caveat(fitted("dbk-mml", data)) is None
    assert joint_caveat(fitted("svgp", data)) is None
    assert joint_caveat(fitted("exact", data)) is None


def test_exceedance_from_stored_grid_marginals(data):
    """A run's grid stores mean_t and the predictive sd_t; the map from them equals the one from the model."""
    from gpcore.decide import grid_prediction

    model = fitted("svgp", data)
    grid = data[2]
    pred = model.predict(grid)
    stored = grid_prediction({"mean_t": pred.mean, "sd_t": pred.sd}, model.noise_variance)
    a = exceedance(model, grid, 1.3, pred=stored)
    b = exceedance(model, grid, 1.3)
    np.testing.assert_allclose(a.p_f, b.p_f, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(a.p_y, b.p_y, rtol=1e-12)
