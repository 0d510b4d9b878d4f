"""The two-component noise shape (gpcore.models.noise_shape) against dense float64 references: densities, CDF,
quantiles and CRPS by numerical integration, the likelihood's gradient by finite differences, the fit on data drawn
from a known shape, the conformal stretch, and its use by metrics, models, runs and decisions."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.integrate import quad
from scipy.optimize import brentq, check_grad
from scipy.stats import norm

from gpcore import metrics as M
from gpcore.errors import ConfigError
from gpcore.models import noise_shape as ns

SHAPE = ns.NoiseShape(latent_scale=0.7, c1=1.3, c2=0.05, pi=0.3, offset=0.8)


def mixture_pdf(x, shape, var_f, s):
    """The mixture density written out with scipy.stats, independent of the module's code."""
    a = -shape.pi * shape.offset / (1 - shape.pi)  # the first component's offset: the noise has mean 0
    return ((1 - shape.pi) * norm.pdf(x, a * np.sqrt(s), np.sqrt(var_f + shape.c1 * s))
            + shape.pi * norm.pdf(x, shape.offset * np.sqrt(s), np.sqrt(var_f + shape.c2 * s)))


def draw(shape, n, seed=0):
    rng = np.random.default_rng(seed)
    v, s = rng.uniform(0.01, 0.3, n), rng.uniform(0.05, 0.5, n)
    slow = rng.random(n) < shape.pi
    a = -shape.pi * shape.offset / (1 - shape.pi)
    e = np.where(slow, shape.offset * np.sqrt(s) + np.sqrt(shape.c2 * s) * rng.standard_normal(n),
                 a * np.sqrt(s) + np.sqrt(shape.c1 * s) * rng.standard_normal(n))
    return np.sqrt(shape.latent_scale * v) * rng.standard_normal(n) + e, v, s


@pytest.mark.parametrize("var_f,s", [(0.2, 0.3), (0.01, 0.5), (1.0, 0.02)])
def test_density_cdf_quantile_crps_match_integrals(var_f, s):
    lo, hi = -30.0, 30.0
    assert quad(lambda x: mixture_pdf(x, SHAPE, var_f, s), lo, hi, limit=200)[0] == pytest.approx(1.0, abs=1e-9)
    # the noise has mean 0 (the posterior mean stays the mean of a new observation) and variance noise_factor() s
    assert quad(lambda x: x * mixture_pdf(x, SHAPE, var_f, s), lo, hi, limit=200)[0] == pytest.approx(0.0, abs=1e-9)
    assert quad(lambda x: x * x * mixture_pdf(x, SHAPE, var_f, s), lo, hi, limit=200)[0] == pytest.approx(
        var_f + SHAPE.noise_factor() * s, rel=1e-9)
    for x in (-1.7, -0.2, 0.0, 0.4, 1.1):
        assert float(np.exp(SHAPE.logpdf(x, var_f, s))) == pytest.approx(mixture_pdf(x, SHAPE, var_f, s), rel=1e-12)
        cdf = quad(lambda t: mixture_pdf(t, SHAPE, var_f, s), lo, x, limit=200, points=[0.0])[0]
        assert float(SHAPE.cdf(x, var_f, s)) == pytest.approx(cdf, abs=1e-9)
        # CRPS = int (F(t) - 1[t >= x])^2 dt
        crps = (quad(lambda t: float(SHAPE.cdf(t, var_f, s)) ** 2, lo, x, limit=200)[0]
                + quad(lambda t: (1 - float(SHAPE.cdf(t, var_f, s))) ** 2, x, hi, limit=200)[0])
        assert float(SHAPE.crps(x, var_f, s)) == pytest.approx(crps, abs=1e-8)
    for p in (0.025, 0.3, 0.5, 0.975):
        ref = brentq(lambda t, p=p: float(SHAPE.cdf(t, var_f, s)) - p, -20, 20, xtol=1e-14)
        assert float(SHAPE.quantile(p, var_f, s)) == pytest.approx(ref, abs=1e-10)


def test_without_a_second_component_it_is_the_gaussian():
    g = ns.NoiseShape(latent_scale=1.0, c1=1.0, c2=0.4, pi=0.0, offset=3.0)
    rng = np.random.default_rng(1)
    mean, var_f, s = rng.normal(size=50), rng.uniform(0.1, 1, 50), rng.uniform(0.1, 1, 50)
    y = mean + rng.normal(size=50)
    var_y = var_f + s
    kw = {"shape": g, "var_f": var_f}
    assert M.nll(mean, var_y, y, **kw) == pytest.approx(M.nll(mean, var_y, y), rel=1e-12)
    assert M.crps(mean, var_y, y, **kw) == pytest.approx(M.crps(mean, var_y, y), rel=1e-10)
    np.testing.assert_allclose(M.interval_width(var_y, **kw), M.interval_width(var_y), rtol=1e-10)
    assert M.interval_score(mean, var_y, y, **kw) == pytest.approx(M.interval_score(mean, var_y, y), rel=1e-9)


def test_likelihood_gradient_matches_finite_differences():
    r, v, s = draw(SHAPE, 500)
    for theta in (np.array([-0.3, 0.2, -2.0, -0.5, 0.7]), np.array([0.4, -1.0, 0.5, -3.0, -2.5])):
        err = check_grad(lambda t: ns._negloglik(t, r, v, s)[0], lambda t: ns._negloglik(t, r, v, s)[1], theta)
        assert err < 1e-5 * max(1.0, float(np.abs(ns._negloglik(theta, r, v, s)[1]).max()))


def test_fit_recovers_a_known_shape():
    r, v, s = draw(SHAPE, 40_000)
    fitted, loglik = ns.fit(r, v, s)
    assert loglik >= float(SHAPE.logpdf(r, SHAPE.latent_scale * v, s).mean()) - 1e-9  # the maximum is at least there
    assert fitted.pi == pytest.approx(SHAPE.pi, abs=0.03)
    assert fitted.offset == pytest.approx(SHAPE.offset, abs=0.06)
    assert fitted.c1 == pytest.approx(SHAPE.c1, rel=0.08)
    assert fitted.latent_scale == pytest.approx(SHAPE.latent_scale, rel=0.12)
    swapped = ns.NoiseShape(SHAPE.latent_scale, SHAPE.c2, SHAPE.c1, 1 - SHAPE.pi, SHAPE.first_offset())
    np.testing.assert_allclose(swapped.logpdf(r[:50], v[:50], s[:50]), SHAPE.logpdf(r[:50], v[:50], s[:50]))
    assert swapped.canonical().offset == pytest.approx(SHAPE.offset) and swapped.canonical().pi == pytest.approx(0.3)
    with pytest.raises(ValueError, match="at least 10"):
        ns.fit(r[:5], v[:5], s[:5])


def test_stretch_and_conformal_coverage():
    r, v, s = draw(SHAPE, 3001, seed=3)
    k = 1.37
    x = 0.3
    assert float(SHAPE.stretched(k).logpdf(k * x, k * k * 0.2, 0.4 * 1.0)) == pytest.approx(
        float(SHAPE.logpdf(x, 0.2, 0.4)) - math.log(k), rel=1e-12)
    wide = SHAPE.stretched(1.4)  # over-covers: the stretch brings it back to the split-conformal share
    k = ns.conformal_stretch(wide, r, v, s)
    final = wide.stretched(k)
    lo, hi = final.interval(0.95, final.latent_scale * v, s)
    inside = int(np.sum((r >= lo) & (r <= hi)))
    assert inside == math.ceil(3002 * 0.95) or inside == math.ceil(3002 * 0.95) - 1  # the k-th row on the edge
    assert k < 1.0


def test_record_and_table_columns():
    assert ns.NoiseShape.from_dict(SHAPE.to_dict()) == SHAPE
    assert ns.NoiseShape.from_dict({"latent_scale": 1.0}) is None
    assert ns.NoiseShape.from_dict({**SHAPE.to_dict(), "pi": 1.5}) is None
    with pytest.raises(ValueError):
        ns.NoiseShape(latent_scale=float("nan"), c1=1, c2=1, pi=0.1, offset=0)
    table = pd.DataFrame({"y": [1.0, 2.0]}).assign(**SHAPE.columns())
    assert ns.of_rows(table) == SHAPE
    assert ns.of_rows(pd.DataFrame({"y": [1.0]})) is None
    gaussian_rows = pd.DataFrame({"y": [1.0]}).assign(**{c: np.nan for c in ns.COLUMNS})
    assert ns.of_rows(gaussian_rows) is None
    with pytest.raises(ValueError, match="several noise shapes"):
        ns.of_rows(pd.concat([table, gaussian_rows], ignore_index=True))


def test_metrics_score_the_mixture():
    r, v, s = draw(SHAPE, 4000, seed=5)
    var_f = SHAPE.latent_scale * v
    mean = np.linspace(-1, 1, r.size)
    y = mean + r
    var_y = var_f + SHAPE.noise_factor() * s
    kw = {"shape": SHAPE, "var_f": var_f}
    lo, hi = SHAPE.interval(0.95, var_f, s)
    inside = (r >= lo) & (r <= hi)
    assert M.nll(mean, var_y, y, **kw) == pytest.approx(-np.mean(np.log(mixture_pdf(r, SHAPE, var_f, s))), rel=1e-10)
    assert M.coverage(mean, var_y, y, **kw) == pytest.approx(inside.mean())
    groups = np.where(np.arange(r.size) % 3 == 0, "a", "b")
    table = M.evaluate_groups(mean, var_y, y, groups, **kw).set_index("group")
    assert table.loc["a", "coverage"] == pytest.approx(inside[groups == "a"].mean())
    weights = np.where(np.arange(r.size) % 2 == 0, 1.0, 20.0)
    bins = M.evaluate_weight_bins(mean, var_y, y, weights, "tests", **kw).set_index("group")
    many = weights > 16
    assert bins.loc["tests >16", "nll"] == pytest.approx(
        -np.mean(np.log(mixture_pdf(r[many], SHAPE, var_f[many], s[many]))), rel=1e-10)
    band = M.coverage_band(mean, var_y, y, **kw)
    assert band["coverage"] == pytest.approx(inside.mean())
    # the true shape scores better than the Gaussian of the same variance: the reason it exists
    assert M.nll(mean, var_y, y, **kw) < M.nll(mean, var_y, y) - 0.02
    with pytest.raises(ValueError, match="var_f"):
        M.nll(mean, var_y, y, shape=SHAPE)


def skewed_field(n=1400, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, (n, 2))
    f = np.sin(3 * X[:, 0]) + np.cos(2 * X[:, 1])
    e = np.where(rng.random(n) < 0.12, -0.9 + 0.2 * rng.standard_normal(n), 0.15 * rng.standard_normal(n))
    return X, f + e


def test_vecchia_fits_and_predicts_with_the_shape(tmp_path):
    from gpcore import load_model, make_model

    X, y = skewed_field()
    m = make_model("vecchia", cv_calibration="rows", noise_shape="two_component", epochs=25, seed=0)
    m.fit(X[:900], y[:900], X[900:1100], y[900:1100])
    info = m.train_info_["cv_calibration"]
    shape = m.noise_shape()
    assert shape == ns.NoiseShape.from_dict(info["noise_shape"]) and info["scale"] == shape.latent_scale
    assert info["coverage_after"] == pytest.approx(0.95, abs=0.01)  # the conformal stretch, on 1,100 rows
    pred = m.predict(X[1100:])
    assert pred.shape == shape
    np.testing.assert_allclose(pred.noise(), m.noise_variance, rtol=1e-9)
    lo, hi = pred.interval(0.95)
    rlo, rhi = shape.interval(0.95, pred.var_f, m.noise_variance)
    np.testing.assert_allclose(lo, pred.mean + rlo)
    np.testing.assert_allclose(hi, pred.mean + rhi)
    t = pred.mean[:5] - 0.3
    np.testing.assert_allclose(pred.subset(slice(0, 5)).cdf(t),
                               shape.cdf(t - pred.mean[:5], pred.var_f[:5], m.noise_variance))
    # the latent posterior is Gaussian, scaled by the shape's c
    llo, lhi = pred.interval(0.95, latent=True)
    np.testing.assert_allclose(lhi - pred.mean, 1.959963984540054 * np.sqrt(pred.var_f))
    # better held-out NLL than the Gaussian latent scale on the same skewed errors
    g = make_model("vecchia", cv_calibration="rows", epochs=25, seed=0).fit(X[:900], y[:900], X[900:1100],
                                                                           y[900:1100])
    gp = g.predict(X[1100:])
    yt = y[1100:]
    assert M.nll(pred.mean, pred.var_y, yt, shape=shape, var_f=pred.var_f) < M.nll(gp.mean, gp.var_y, yt) - 0.05
    m.save(tmp_path / "m")
    back = load_model(tmp_path / "m")
    assert back.noise_shape() == shape
    np.testing.assert_allclose(back.predict(X[1100:]).interval(0.95)[0], lo)


def test_noise_shape_needs_the_cross_validation():
    from gpcore import make_model

    X, y = skewed_field(300)
    with pytest.raises(ConfigError, match="cv_calibration"):
        make_model("vecchia", noise_shape="two_component", epochs=2).fit(X, y)


def test_exceedance_of_a_new_measurement_uses_the_shape():
    from gpcore import decide
    from gpcore.models import Prediction

    var_f = np.array([0.05, 0.2])
    s = np.array([0.3, 0.3])
    pred = Prediction(np.array([1.0, 2.0]), var_f, var_f + SHAPE.noise_factor() * s, SHAPE)
    ex = decide.exceedance(None, np.zeros((2, 2)), 1.5, pred=pred)
    np.testing.assert_allclose(ex.p_y, SHAPE.cdf(1.5 - pred.mean, var_f, s))
    np.testing.assert_allclose(ex.p_f, norm.cdf((1.5 - pred.mean) / np.sqrt(var_f)))
    grid = pd.DataFrame({"mean_t": pred.mean, "sd_t": pred.sd})
    back = decide.grid_prediction(grid, 0.3, shape=SHAPE)
    np.testing.assert_allclose(back.var_f, var_f)
    assert back.shape == SHAPE


def test_a_weighted_fit_scales_the_noise_per_tests_count_bin(tmp_path):
    import torch

    from gpcore import load_model, make_model
    from gpcore.models import vecchia_cv
    from gpcore.run.decisions import stored_prediction
    from gpcore.run.pipeline import uncalibrated_var_y

    rng = np.random.default_rng(3)
    n = 1600
    X = rng.uniform(-1, 1, (n, 2))
    w = rng.choice([1.0, 3.0, 8.0, 30.0], n)
    # skewed errors whose spread is not tau^2 + sigma^2 / w in the count: wide at 3 and 30 tests, narrow at 1 and 8
    e = np.where(rng.random(n) < 0.15, -0.6 + 0.15 * rng.standard_normal(n), 0.1 + 0.12 * rng.standard_normal(n))
    y = np.sin(3 * X[:, 0]) + np.cos(2 * X[:, 1]) + e * np.where((w == 3) | (w == 30), 1.0, 0.5)
    m = make_model("vecchia", cv_calibration="rows", noise_shape="two_component", epochs=25, seed=0)
    m.fit(X[:1100], y[:1100], X[1100:1300], y[1100:1300], weights=w[:1100], val_weights=w[1100:1300])
    info = m.train_info_["cv_calibration"]
    rec = info["count_scales"]
    assert rec["bins"] == ["1", "2-4", "5-16", ">16"] and sum(rec["rows"]) == info["rows"] == 1300
    assert rec["scales"][0] < rec["scales"][1] and rec["scales"][2] < rec["scales"][3]
    Xt, wt = X[1300:], w[1300:]
    pred = m.predict(Xt, weights=wt)
    with torch.no_grad():
        base = m.likelihood.observation_noise(wt, wt.size, m.y_std_**2, "vecchia")
    noise = base * np.asarray(rec["scales"])[vecchia_cv.count_bins(wt)]
    np.testing.assert_allclose(m.observation_noise(wt, wt.size), noise, rtol=1e-12)
    np.testing.assert_allclose(pred.noise(), noise, rtol=1e-9)  # what the shape's intervals and scores read
    # a run's "(no recalibration)" rows: the Gaussian before any of it, no latent scale and no count scales
    np.testing.assert_allclose(uncalibrated_var_y(m, pred, None, wt), pred.var_f / info["scale"] + base, rtol=1e-9)
    assert m.observation_noise() == pytest.approx(m.noise_variance * rec["scales"][0], rel=1e-6)  # one measurement
    # a stored grid (weights None) reads its latent variance back with the same noise
    grid_pred = m.predict(Xt[:20])
    grid = pd.DataFrame({"mean_t": grid_pred.mean, "sd_t": grid_pred.sd})
    np.testing.assert_allclose(stored_prediction(m, grid).var_f, grid_pred.var_f, rtol=1e-8, atol=1e-12)
    # held-out bins of the test rows: the per-bin scale covers each better than one scale for every count
    one = make_model("vecchia", cv_calibration="rows", noise_shape="two_component", epochs=25, seed=0)
    one.fit(X[:1100], y[:1100], X[1100:1300], y[1100:1300], weights=w[:1100], val_weights=w[1100:1300])
    one.train_info_["cv_calibration"].pop("count_scales")
    p1 = one.predict(Xt, weights=wt)
    yt = y[1300:]
    lo, hi = pred.interval(0.95)
    lo1, hi1 = p1.interval(0.95)
    gap = [abs(np.mean((yt[b] >= lo[b]) & (yt[b] <= hi[b])) - 0.95) for b in (wt == 1, wt == 30)]
    gap1 = [abs(np.mean((yt[b] >= lo1[b]) & (yt[b] <= hi1[b])) - 0.95) for b in (wt == 1, wt == 30)]
    assert max(gap) < max(gap1)
    m.save(tmp_path / "m")
    np.testing.assert_allclose(load_model(tmp_path / "m").predict(Xt, weights=wt).var_y, pred.var_y, rtol=1e-12)
    unweighted = make_model("vecchia", cv_calibration="rows", noise_shape="two_component", epochs=5, seed=0)
    unweighted.fit(X[:300], y[:300])
    assert "count_scales" not in unweighted.train_info_["cv_calibration"] and unweighted.noise_multiplier(None, 1) == 1
