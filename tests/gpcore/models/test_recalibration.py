"""Variance recalibration on the validation split (issue 14 part 2): ``recalibrate="none" | "global" | "group"``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpcore import ConfigError, InputError, load_model, make_model


def _two_strata(n, seed):
    """1-D inputs; stratum 'a' (x < 0) has noise sd 0.1, stratum 'b' (x >= 0) noise sd 0.6."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2.0, 2.0, size=(n, 1))
    g = np.where(X[:, 0] < 0, "a", "b")
    sd = np.where(g == "a", 0.1, 0.6)
    y = np.sin(2.0 * X[:, 0]) + sd * rng.normal(size=n)
    return X, y, g


def _cover(pred, y):
    return np.abs(y - pred.mean) <= 1.959963984540054 * np.sqrt(pred.var_y)


@pytest.fixture(scope="module")
def problem():
    Xtr, ytr, gtr = _two_strata(200, 0)
    # the conformal quantile's own sampling noise (~ sqrt(.95 .05 / n_val) per stratum) must be small next
    # to the test split's binomial SE the assertion allows, so the validation split is the larger one
    Xv, yv, gv = _two_strata(4000, 1)
    Xte, yte, gte = _two_strata(1000, 2)
    return Xtr, ytr, gtr, Xv, yv, gv, Xte, yte, gte


@pytest.fixture(scope="module")
def fitted(problem):
    Xtr, ytr, gtr, Xv, yv, gv, *_ = problem
    return make_model("exact", epochs=60, lr=0.05, dtype="float64", device="cpu", recalibrate="group").fit(
        Xtr, ytr, Xv, yv, groups=gtr, val_groups=gv)


def test_group_recalibration_covers_95_percent_in_both_strata(fitted, problem):
    """One noise level over-covers the quiet stratum and under-covers the noisy one; per-stratum scales
    fitted on the validation split bring both within two binomial standard errors of 95 %."""
    *_, Xte, yte, gte = problem
    cal = fitted.predict(Xte, groups=gte)
    before = cal.var_y / fitted.variance_scale(len(yte), gte)
    for label in ("a", "b"):
        sel = gte == label
        se = math.sqrt(0.95 * 0.05 / sel.sum())
        cov_raw = np.mean(np.abs(yte[sel] - cal.mean[sel]) <= 1.959963984540054 * np.sqrt(before[sel]))
        cov = _cover(cal, yte)[sel].mean()
        assert abs(cov_raw - 0.95) > 2 * se, f"stratum {label} was calibrated already ({cov_raw:.3f})"
        assert abs(cov - 0.95) <= 2 * se, f"stratum {label}: recalibrated coverage {cov:.4f}"
    assert fitted.recal_["scales"]["a"] < 1.0 < fitted.recal_["scales"]["b"]


def test_scales_are_the_conformal_quantiles_of_the_validation_split_only(fitted, problem):
    *_, Xv, yv, gv, Xte, yte, gte = problem
    state = fitted.recal_
    fitted.recal_ = None
    try:
        pv = fitted.predict(Xv)
    finally:
        fitted.recal_ = state
    z = np.abs(yv - pv.mean) / np.sqrt(pv.var_y)
    for label in ("a", "b"):
        zg = np.sort(z[gv == label])
        q = zg[math.ceil((len(zg) + 1) * 0.95) - 1]
        assert state["scales"][label] == pytest.approx((q / 1.959963984540054) ** 2, rel=1e-12)
        assert state["counts"][label] == int((gv == label).sum())
    assert state["n"] == len(yv)  # fitted on the validation rows, nothing else
    # refitting the recalibration with the test rows in hand changes nothing unless they are passed
    again = fitted.recalibrate(Xv, yv, val_groups=gv)
    assert again == state


def test_global_none_unknown_groups_and_persistence(fitted, problem, tmp_path):
    Xtr, ytr, gtr, Xv, yv, gv, Xte, yte, gte = problem
    base = dict(epochs=60, lr=0.05, dtype="float64", device="cpu")
    none = make_model("exact", **base).fit(Xtr, ytr, Xv, yv)
    glob = make_model("exact", recalibrate="global", **base).fit(Xtr, ytr, Xv, yv)
    assert none.recal_ is None
    p0, pg = none.predict(Xte[:50]), glob.predict(Xte[:50], groups=gte[:50])
    np.testing.assert_array_equal(p0.var_f, pg.var_f)
    np.testing.assert_allclose(pg.var_y, p0.var_y * glob.recal_["global"], rtol=1e-12)
    # a stratum the validation split did not have, and rows without groups, get the global scale
    s = fitted.variance_scale(3, ["a", "zz", "b"])
    assert s[1] == fitted.recal_["global"] and s[0] == fitted.recal_["scales"]["a"]
    assert fitted.variance_scale(3) == fitted.recal_["global"]
    loaded = load_model(fitted.save(tmp_path / "m"))
    assert loaded.recal_ == fitted.recal_
    np.testing.assert_allclose(loaded.predict(Xte[:20], groups=gte[:20]).var_y,
                               fitted.predict(Xte[:20], groups=gte[:20]).var_y, rtol=1e-12)


def test_small_strata_fall_back_to_the_global_scale(problem):
    Xtr, ytr, gtr, Xv, yv, gv, *_ = problem
    gv = gv.astype(object)  # room for a longer label
    gv[:5] = "tiny"
    m = make_model("exact", epochs=5, dtype="float64", device="cpu", recalibrate="group").fit(
        Xtr, ytr, Xv, yv, val_groups=gv)
    assert "tiny" not in m.recal_["scales"] and m.recal_["counts"]["tiny"] == 5
    assert m.variance_scale(1, ["tiny"])[0] == m.recal_["global"]


def test_recalibration_errors_are_clear(problem):
    Xtr, ytr, gtr, Xv, yv, gv, *_ = problem
    with pytest.raises(InputError, match="validation split"):
        make_model("exact", epochs=2, recalibrate="global").fit(Xtr, ytr)
    with pytest.raises(InputError, match="val_groups"):
        make_model("exact", epochs=2, recalibrate="group").fit(Xtr, ytr, Xv, yv)
    with pytest.raises(InputError, match="must match"):
        make_model("exact", epochs=2, recalibrate="group").fit(Xtr, ytr, Xv, yv, val_groups=gv[:-1])
    with pytest.raises(ConfigError, match="allowed values"):
        make_model("exact", recalibrate="per-stratum")
