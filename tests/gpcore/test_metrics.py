"""Metrics against scipy / numerical integration (docs/metrics.md §7.2)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, stats

from gpcore import metrics as M


def test_crps_closed_form_equals_numerical_integration():
    rng = np.random.default_rng(0)
    for _ in range(5):
        mu, sd, y = rng.normal(), rng.uniform(0.2, 2), rng.normal(scale=2)

        def integrand(t, mu=mu, sd=sd, y=y):
            return (stats.norm.cdf(t, mu, sd) - (t >= y)) ** 2

        num = integrate.quad(integrand, -np.inf, y, limit=200)[0] + integrate.quad(integrand, y, np.inf, limit=200)[0]
        assert M.crps([mu], [sd**2], [y]) == pytest.approx(num, abs=1e-6)


def test_crps_limits_and_reference_values():
    assert M.crps([0.0], [1e-14], [1.7]) == pytest.approx(1.7, rel=1e-6)
    assert M.crps([0.0], [4.0], [0.0]) == pytest.approx(0.233695 * 2, rel=1e-5)
    assert M.nll([0.0], [1.0], [0.0]) == pytest.approx(0.918939, abs=1e-6)
    np.testing.assert_allclose(M.interval_width([1.0, 4.0]), [3.919928, 7.839856], rtol=1e-6)
    assert M.z_value(0.95) == pytest.approx(stats.norm.ppf(0.975))


def test_metrics_match_scipy_and_counting():
    rng = np.random.default_rng(1)
    mean, sd = rng.normal(size=500), rng.uniform(0.5, 2, size=500)
    y = mean + sd * rng.normal(size=500)
    assert M.nll(mean, sd**2, y) == pytest.approx(-np.mean(stats.norm.logpdf(y, mean, sd)), rel=1e-12)
    lo, hi = stats.norm.interval(0.9, mean, sd)
    assert M.coverage(mean, sd**2, y, 0.9) == np.mean((y >= lo) & (y <= hi))
    assert M.mae(mean, y) == pytest.approx(np.mean(np.abs(y - mean)))
    assert M.rmse(mean, y) == pytest.approx(np.sqrt(np.mean((y - mean) ** 2)))


def test_statistical_limits_with_the_true_distribution():
    rng = np.random.default_rng(2)
    n, sd = 200_000, 1.7
    y = 0.5 + sd * rng.normal(size=n)
    mean, var = np.full(n, 0.5), np.full(n, sd**2)
    assert M.coverage(mean, var, y) == pytest.approx(0.95, abs=0.003)
    assert M.nll(mean, var, y) == pytest.approx(0.5 * np.log(2 * np.pi * np.e * sd**2), abs=0.01)
    assert M.crps(mean, var, y) == pytest.approx(sd / np.sqrt(np.pi), rel=0.01)
    cal = M.calibration_curve(mean, var, y)
    np.testing.assert_allclose(cal.observed, cal.nominal, atol=0.005)


def test_grouped_metrics_combine_to_overall_and_unit_conversion():
    rng = np.random.default_rng(3)
    n = 300
    mean, var = rng.normal(size=n), rng.uniform(0.1, 1, size=n)
    y = mean + np.sqrt(var) * rng.normal(size=n)
    groups = np.where(rng.uniform(size=n) < 0.3, "rural", "urban")
    t = M.evaluate_groups(mean, var, y, groups).set_index("group")
    w = t.loc[["rural", "urban"], "n"] / n
    assert (w * t.loc[["rural", "urban"], "mae"]).sum() == pytest.approx(t.loc["all", "mae"])
    assert (w * t.loc[["rural", "urban"], "coverage"]).sum() == pytest.approx(t.loc["all", "coverage"])
    # standardised-space metrics converted with the target scale equal metrics computed directly
    s, m0 = 0.37, 1.4
    direct = M.evaluate(m0 + s * mean, s**2 * var, m0 + s * y)
    std = M.evaluate(mean, var, y)
    assert direct["mae"] == pytest.approx(std["mae"] * s)
    assert direct["crps"] == pytest.approx(std["crps"] * s)
    assert direct["pi_width_mean"] == pytest.approx(std["pi_width_mean"] * s)
    assert direct["nll"] == pytest.approx(std["nll"] + np.log(s))
    assert direct["coverage"] == std["coverage"]


def test_metric_input_errors():
    with pytest.raises(ValueError, match="equal length"):
        M.mae([1, 2], [1])
    with pytest.raises(ValueError, match="level"):
        M.coverage([0], [1], [0], level=1.5)


def test_weight_bins_and_per_bin_metrics():
    from gpcore.metrics import coverage_se, evaluate, evaluate_weight_bins, weight_bins

    w = np.array([1, 1, 2, 4, 5, 16, 17, 300, 0.5, 3.5])
    assert list(weight_bins(w, "tests")) == [
        "tests 1", "tests 1", "tests 2-4", "tests 2-4", "tests 5-16", "tests 5-16", "tests >16", "tests >16",
        "tests 1", "tests 2-4",
    ]
    rng = np.random.default_rng(0)
    mean, y = rng.normal(size=10), rng.normal(size=10)
    var = rng.uniform(0.5, 2.0, size=10)
    t = evaluate_weight_bins(mean, var, y, w, "tests")
    assert list(t["group"]) == ["tests 1", "tests 2-4", "tests 5-16", "tests >16"]
    sel = np.array([0, 0, 1, 1, 0, 0, 0, 0, 0, 1], bool)
    assert t.iloc[1]["nll"] == pytest.approx(evaluate(mean[sel], var[sel], y[sel])["nll"], rel=1e-12)
    assert list(evaluate_weight_bins(mean[:2], var[:2], y[:2], w[:2], "w")["group"]) == ["w 1"]
    assert coverage_se(1900) == pytest.approx(0.005, rel=1e-12)


def test_interval_score_direct_formula_and_quantile_loss_identity():
    """Against the Gneiting & Raftery (2007) formula on scipy's interval, and the identity
    IS_a(l, u; y) = (2 / a) [rho_{a/2}(y - l) + rho_{1-a/2}(y - u)] with the pinball loss rho."""
    rng = np.random.default_rng(4)
    n = 400
    mean, sd = rng.normal(size=n), rng.uniform(0.2, 2.0, size=n)
    y = mean + 1.5 * sd * rng.standard_t(3, size=n)  # many points outside the interval on both sides
    for level in (0.95, 0.8, 0.5):
        a = 1 - level
        lo, hi = stats.norm.interval(level, mean, sd)
        assert ((y < lo).sum() > 10) and ((y > hi).sum() > 10)
        direct = (hi - lo) + (2 / a) * (lo - y) * (y < lo) + (2 / a) * (y - hi) * (y > hi)

        def pinball(r, tau):
            return r * (tau - (r < 0))

        via_quantiles = (2 / a) * (pinball(y - lo, a / 2) + pinball(y - hi, 1 - a / 2))
        np.testing.assert_allclose(direct, via_quantiles, rtol=1e-12, atol=1e-12)
        assert M.interval_score(mean, sd**2, y, level) == pytest.approx(direct.mean(), rel=1e-12)
    # a point inside scores the width alone; one outside adds 2/a times its distance to the nearer end
    assert M.interval_score([0.0], [1.0], [0.3]) == pytest.approx(2 * 1.959963984540054, rel=1e-12)
    assert M.interval_score([0.0], [1.0], [3.0]) == pytest.approx(
        2 * 1.959963984540054 + 40 * (3 - 1.959963984540054), rel=1e-12)


def test_expected_interval_score_by_integration_is_minimal_at_the_true_quantiles():
    """E[IS] under the true N(mu, s^2), by numerical integration of the metric itself, equals the closed form
    2 z s + (4 / a) s [phi(z) - z (1 - Phi(z))] and is larger for intervals too narrow or too wide."""
    mu, s, a = 0.4, 1.3, 0.05
    z = stats.norm.ppf(1 - a / 2)

    def expected(scale):
        def f(t):
            return M.interval_score([mu], [(scale * s) ** 2], [t]) * stats.norm.pdf(t, mu, s)

        pts = [mu - z * scale * s, mu + z * scale * s]
        edges = ((-np.inf, pts[0]), (pts[0], pts[1]), (pts[1], np.inf))
        return sum(integrate.quad(f, lo, hi, limit=400)[0] for lo, hi in edges)

    closed = 2 * z * s + (4 / a) * s * (stats.norm.pdf(z) - z * stats.norm.sf(z))
    assert expected(1.0) == pytest.approx(closed, rel=1e-7)
    for scale in (0.7, 0.9, 1.1, 1.4):
        assert expected(scale) > expected(1.0) + 1e-4


def test_heaton_scores_are_the_single_metrics():
    rng = np.random.default_rng(5)
    mean, var = rng.normal(size=50), rng.uniform(0.1, 1, size=50)
    y = mean + rng.normal(size=50)
    h = M.heaton_scores(mean, var, y)
    assert h == {"mae": M.mae(mean, y), "rmspe": M.rmse(mean, y), "crps": M.crps(mean, var, y),
                 "interval_score": M.interval_score(mean, var, y), "coverage": M.coverage(mean, var, y)}
    assert M.rmspe(mean, y) == pytest.approx(np.sqrt(np.mean((y - mean) ** 2)), rel=1e-12)


def test_reliability_by_hand():
    p = [0.05, 0.15, 0.15, 0.95, 1.0]  # 1.0 falls in the last (closed) bin
    rel = M.reliability(p, [0, 1, 0, 1, 1])
    assert rel["lo"].tolist() == pytest.approx([0.0, 0.1, 0.9]) and rel["n"].tolist() == [1, 2, 2]
    np.testing.assert_allclose(rel["p_mean"], [0.05, 0.15, 0.975])
    np.testing.assert_allclose(rel["observed"], [0.0, 0.5, 1.0])
    se = np.array([np.sqrt(0.05 * 0.95), np.sqrt(2 * 0.15 * 0.85) / 2, np.sqrt(0.95 * 0.05) / 2])
    np.testing.assert_allclose(rel["se"], se)
    np.testing.assert_allclose(rel["z"], (rel["observed"] - rel["p_mean"]) / se)
    assert "se_groups" not in rel.columns
    assert M.reliability([0.0, 0.0], [0, 0])["z"].tolist() == [0.0]  # se = 0 and no miss: z = 0
    assert M.reliability([0.0, 0.0], [0, 1])["z"].tolist() == [np.inf]


def test_reliability_calibrated_miscalibrated_and_by_group():
    rng = np.random.default_rng(6)
    p = rng.uniform(size=100_000)
    calibrated = M.reliability(p, rng.uniform(size=p.size) < p)
    assert len(calibrated) == 10 and calibrated["z"].abs().max() < 3.5
    overconfident = M.reliability(p, rng.uniform(size=p.size) < 0.5 + 0.8 * (p - 0.5))
    assert (overconfident["z"].abs() > 5).sum() >= 6
    # 40 fields of 100 cells each, P = 0.5 everywhere, one shared outcome per field (24 of 40 rose): the binomial
    # SE treats the 4,000 cells as independent, the SE by group sees 40 draws
    g = np.repeat(np.arange(40), 100)
    rel = M.reliability(np.full(4000, 0.5), np.repeat(np.arange(40) < 24, 100), groups=g)
    assert rel["observed"].item() == pytest.approx(0.6)
    assert rel["se"].item() == pytest.approx(0.5 / np.sqrt(4000))
    assert rel["se_groups"].item() == pytest.approx(np.sqrt(40 * 50.0**2) / 4000)
    assert rel["z"].item() > 12 and rel["z_groups"].item() == pytest.approx(0.1 / (np.sqrt(40) * 50 / 4000))


def test_reliability_equal_count_bins_are_the_sorted_forecasts_groups():
    rng = np.random.default_rng(7)
    p = rng.beta(0.5, 0.5, size=1003)  # crowded near 0 and 1: equal-width bins would hold very different counts
    p[:40] = 0.5  # ties: kept in input order
    e = rng.uniform(size=p.size) < p
    g = rng.integers(0, 30, size=p.size)
    rel = M.reliability(p, e, bins=10, groups=g, by="count")
    assert rel["n"].sum() == p.size and rel["n"].max() - rel["n"].min() <= 1
    order = np.argsort(p, kind="stable")
    for b in range(10):  # reference: the forecast of rank r in group floor(10 r / n)
        idx = order[(np.arange(p.size) * 10 // p.size) == b]
        r = rel.iloc[b]
        assert r["n"] == idx.size and r["lo"] == p[idx].min() and r["hi"] == p[idx].max()
        assert r["p_mean"] == pytest.approx(p[idx].mean()) and r["observed"] == pytest.approx(e[idx].mean())
        assert r["se"] == pytest.approx(np.sqrt(np.sum(p[idx] * (1 - p[idx]))) / idx.size)
        res = np.bincount(g[idx], weights=e[idx] - p[idx])
        assert r["se_groups"] == pytest.approx(np.sqrt(np.sum(res**2)) / idx.size)
    assert (np.diff(rel["lo"]) >= 0).all() and (rel["hi"].to_numpy()[:-1] <= rel["lo"].to_numpy()[1:]).all()
    width = M.reliability(p, e, bins=10)
    assert width["n"].max() > 2 * width["n"].min()  # the two binnings differ on this forecast
    with pytest.raises(ValueError, match="by must be"):
        M.reliability(p, e, by="quantile")


def test_reliability_input_errors():
    with pytest.raises(ValueError, match="lie in"):
        M.reliability([0.2, 1.2, np.nan], [0, 1, 1])
    with pytest.raises(ValueError, match="equal length"):
        M.reliability([0.2, 0.3], [0])
    with pytest.raises(ValueError, match="groups has 1 labels"):
        M.reliability([0.2, 0.3], [0, 1], groups=["a"])
    with pytest.raises(ValueError, match="bins"):
        M.reliability([0.2], [0], bins=0)


def test_warped_scores_identity_map_equals_the_gaussian_scores():
    rng = np.random.default_rng(3)
    mean, var = rng.normal(size=500), rng.uniform(0.2, 2.0, 500)
    y = mean + np.sqrt(var) * rng.standard_t(4, 500)
    s = M.warped_scores(mean, var, y, lambda u: u, lambda v: v, lambda u: np.zeros_like(u))
    assert s["nll"] == pytest.approx(M.nll(mean, var, y), rel=1e-12)
    assert s["coverage"] == M.coverage(mean, var, y)
    assert s["crps"] == pytest.approx(M.crps(mean, var, y), rel=1e-4)


def test_warped_scores_of_a_box_cox_gaussian_equal_the_density_and_crps_by_integration():
    """A Gaussian on the Box-Cox scale z = (10^(lam u) - 1) / lam of log10 data u: the NLL on the u scale is the
    change-of-variables density, and the CRPS equals integral (F(x) - 1{x >= u})^2 dx over u's own scale."""
    lam, ln10 = 0.3, np.log(10.0)

    def to_model(u):
        return (10 ** (lam * u) - 1) / lam

    def from_model(z):
        return np.log10(np.maximum(lam * z + 1, 1e-300)) / lam

    def log_slope(u):
        return lam * u * ln10 + np.log(ln10)

    mean, var, u = np.array([3.0, 5.0]), np.array([0.8, 2.5]), np.array([1.2, 0.4])
    s = M.warped_scores(mean, var, u, to_model, from_model, log_slope, quantiles=4000)
    dens = [stats.norm.pdf(to_model(ui), m, np.sqrt(v)) * 10 ** (lam * ui) * ln10
            for m, v, ui in zip(mean, var, u, strict=True)]
    assert s["nll"] == pytest.approx(-np.mean(np.log(dens)), rel=1e-12)

    def crps_by_integration(m, v, ui):
        def cdf(x):
            return stats.norm.cdf(to_model(x), m, np.sqrt(v))

        lo = -1 / lam / 2  # below it F is ~0 for these means
        return (integrate.quad(lambda x: cdf(x) ** 2, lo, ui, limit=200)[0]
                + integrate.quad(lambda x: (1 - cdf(x)) ** 2, ui, 6.0, limit=200)[0])

    ref = [crps_by_integration(m, v, ui) for m, v, ui in zip(mean, var, u, strict=True)]
    assert s["crps"] == pytest.approx(np.mean(ref), rel=2e-4)
    lower, upper = from_model(mean - M.Z95 * np.sqrt(var)), from_model(mean + M.Z95 * np.sqrt(var))
    assert s["coverage"] == np.mean((u >= lower) & (u <= upper))


def test_coverage_band_binomial_and_by_group_against_the_formulas():
    """Two binomial SEs are 2 sqrt(0.95 * 0.05 / n); by group 2 sqrt(sum_g r_g^2) / n with r_g the group's sum of
    (inside - 0.95), computed here by a loop; a group whose rows all fall inside or all outside widens the band."""
    from gpcore.metrics import Z95, coverage, coverage_band

    rng = np.random.default_rng(11)
    n = 600
    mean, var = rng.normal(size=n), rng.uniform(0.3, 2.0, size=n)
    g = np.repeat(np.arange(30), 20)
    shift = np.repeat(rng.normal(0, 1.2, size=30), 20)  # one error per group: rows of a group share it
    y = mean + np.sqrt(var) * (0.5 * rng.normal(size=n) + shift)
    b = coverage_band(mean, var, y, groups=g)
    inside = np.abs(y - mean) <= Z95 * np.sqrt(var)
    assert b["coverage"] == pytest.approx(coverage(mean, var, y), abs=0)
    assert b["two_se"] == pytest.approx(2 * np.sqrt(0.95 * 0.05 / n), rel=1e-12)
    r = np.array([np.sum(inside[g == k] - 0.95) for k in range(30)])
    assert b["two_se_groups"] == pytest.approx(2 * np.sqrt(np.sum(r**2)) / n, rel=1e-12)
    assert b["two_se_groups"] > 2 * b["two_se"], "shared errors within a group widen the band"
    assert np.isnan(coverage_band(mean, var, y)["two_se_groups"])
    assert np.isnan(coverage_band([], [], [])["coverage"])
