"""The cross-validated latent scale of the Vecchia family (gpcore/models/vecchia_cv.py, docs/calibration.md): the
held-out predictions against the dense float64 exact GP on the other folds' rows, the folds, the conformal scale
against its definition, and the scale carried through every latent variance and covariance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpcore import make_model
from gpcore.data.splits import block_ids
from gpcore.models import vecchia_cv as cv
from gpcore.posterior import joint_posterior
from gpcore.run.config import RunConfig
from gpcore.run.pipeline import cv_settings, run_model_settings

N = 80
TINY_DBK = dict(dbk_epochs=3, dbk_rank=8, dbk_hidden=8)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    X = np.column_stack([rng.uniform(-66.4, -66.0, N), rng.uniform(18.2, 18.45, N)])  # lon, lat: about 40 x 28 km
    y = np.sin(12 * X[:, 0]) + np.cos(15 * X[:, 1]) + 0.2 * rng.standard_normal(N)
    w = rng.integers(1, 6, N).astype(float)
    return X, y, w


def fit(name, data, *, weighted=False, full=True, **kw):
    X, y, w = data
    extra = dict(TINY_DBK, feature_check=False) if name == "dbk-nn" else {}
    if full:  # every point conditions on all its predecessors; predictions on every training point: the exact GP
        kw = dict(neighbors=N - 1, pred_neighbors=N, joint_neighbors=100, **kw)
    return make_model(name, epochs=3, dtype="float64", device="cpu", **extra, **kw).fit(
        X, y, weights=w if weighted else None)


def held_out_reference(model, data, folds_caller):
    """Residual and latent variance of each row predicted by the dense exact GP (the model's kernel, noise and mean)
    from the rows of the other folds."""
    X, y, w = data
    K = model.kernel(X)
    noise = np.broadcast_to(model.noise_variance if not model.weighted else
                            model.nugget_variance + model.measurement_noise_variance / w, (N,))
    r, v = np.empty(N), np.empty(N)
    for k in np.unique(folds_caller):
        o, t = folds_caller == k, folds_caller != k
        A = K[np.ix_(t, t)] + np.diag(noise[t])
        Kto = K[np.ix_(t, o)]
        r[o] = y[o] - (model.prior_mean + Kto.T @ np.linalg.solve(A, y[t] - model.prior_mean))
        v[o] = np.diag(K[np.ix_(o, o)]) - np.einsum("ij,ij->j", Kto, np.linalg.solve(A, Kto))
    return r, v, noise


@pytest.mark.parametrize("kind", ["rows", "blocks"])
@pytest.mark.parametrize("weighted", [False, True])
def test_held_out_predictions_are_the_exact_gps_on_the_other_folds(data, kind, weighted):
    model = fit("vecchia", data, weighted=weighted)
    folds = cv.fold_ids(model, kind, 10.0, seed=3)
    r, v, s = cv.cv_residuals(model, folds)
    caller = np.empty(N, dtype=int)
    caller[model.module_.order.numpy()] = folds  # fold of each caller row
    r_ref, v_ref, s_ref = held_out_reference(model, data, caller)
    order = model.module_.order.numpy()
    np.testing.assert_allclose(r, r_ref[order], rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(v, v_ref[order], rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(s, s_ref[order], rtol=1e-12)
    assert model._tree is None or model._tree.n == N  # the full index is back
    np.testing.assert_allclose(model.predict(data[0]).var_f, fit("vecchia", data, weighted=weighted)
                               .predict(data[0]).var_f, rtol=1e-10)


def test_folds_hold_out_rows_or_whole_blocks(data):
    model = fit("vecchia", data)
    rows = cv.fold_ids(model, "rows", 10.0, seed=0)
    assert np.bincount(rows, minlength=cv.FOLDS).tolist() == [N // cv.FOLDS] * cv.FOLDS
    X = cv.caller_inputs(model)
    np.testing.assert_allclose(X, data[0][model.module_.order.numpy()], atol=1e-9)
    blocks = cv.fold_ids(model, "blocks", 5.0, seed=0)
    ids = block_ids(X[:, 0], X[:, 1], 5.0)
    assert len(np.unique(ids)) > cv.FOLDS
    for b in np.unique(ids):
        assert len(np.unique(blocks[ids == b])) == 1  # a block is never split between folds
    assert len(np.unique(blocks)) == cv.FOLDS
    assert not np.array_equal(blocks, cv.fold_ids(model, "blocks", 5.0, seed=1))  # seeded


def test_conformal_scale_is_the_conformal_quantile_of_the_row_thresholds():
    rng = np.random.default_rng(0)
    n = 500
    v, s = rng.uniform(0.1, 1.0, n), rng.uniform(0.05, 0.5, n)
    r = rng.standard_normal(n) * np.sqrt(0.6 * v + s)
    c = cv.conformal_scale(r, v, s)
    covered = lambda scale: int(np.sum(np.abs(r) <= cv.Z * np.sqrt(scale * v + s)))  # noqa: E731
    k = math.ceil((n + 1) * 0.95)
    assert covered(c * (1 + 1e-9)) >= k and covered(c * (1 - 1e-6)) < k
    assert 0.3 < c < 1.0  # the errors' latent part is 0.6 of the model's
    # a row the noise alone covers needs no scale; an uncovered row without latent variance can never be covered
    assert cv.conformal_scale(np.array([0.0, 0.0]), np.array([1.0, 1.0]), np.array([1.0, 1.0])) == 0.0
    assert cv.conformal_scale(np.full(20, 5.0), np.zeros(20), np.ones(20)) == math.inf


@pytest.mark.parametrize("name", ["vecchia", "dbk-nn"])
def test_the_scale_multiplies_every_latent_variance_and_covariance(data, name):
    X, y, w = data
    kw = dict(full=False, neighbors=8, joint_neighbors=6)  # dbk-nn: no feature check, so its low-rank part is on
    plain = fit(name, data, weighted=True, **kw)
    cal = fit(name, data, weighted=True, cv_calibration="blocks", cv_block_km=5.0, **kw)
    assert name == "vecchia" or cal.module_.features_on
    info = cal.train_info_["cv_calibration"]
    c = info["scale"]
    assert info["folds"] == "blocks" and info["rows"] == N and info["coverage_after"] >= 0.95
    assert abs(c - 1) > 0.02 and c == cv.latent_scale(cal) and cv.latent_scale(plain) == 1.0
    Xn = X[:12] + 0.003
    p0, p1 = plain.predict(Xn, weights=w[:12]), cal.predict(Xn, weights=w[:12])
    np.testing.assert_allclose(p1.mean, p0.mean, rtol=1e-12)
    np.testing.assert_allclose(p1.var_f, c * p0.var_f, rtol=1e-10)
    np.testing.assert_allclose(p1.var_y - p1.var_f, p0.var_y - p0.var_f, rtol=1e-10)  # the noise is as fitted
    np.testing.assert_allclose(cal.posterior_cov(Xn), c * plain.posterior_cov(Xn), rtol=1e-9, atol=1e-14)
    groups = [(np.arange(6), np.full(6, 1 / 6)), (np.arange(4, 12), np.full(8, 1 / 8))]
    m0, v0 = joint_posterior(plain).linear(Xn, groups)
    m1, v1 = joint_posterior(cal).linear(Xn, groups)
    np.testing.assert_allclose(m1, m0, rtol=1e-12)
    np.testing.assert_allclose(v1, c * v0, rtol=1e-9)
    s0, s1 = joint_posterior(plain).sample(Xn, 3, seed=4), joint_posterior(cal).sample(Xn, 3, seed=4)
    mean = joint_posterior(plain).joint_s(plain.scale_x(Xn)).mean * plain.y_std_ + plain.y_mean_
    np.testing.assert_allclose(s1 - mean, math.sqrt(c) * (s0 - mean), rtol=1e-9, atol=1e-12)


def test_every_reader_applies_a_record_by_the_same_check(data):
    """``applied`` decides whether a record scales the latent variance; the model's variances, a run's metrics before
    calibration (and the app's note: tests/app/test_modelinfo.py) follow it: a record from held-out rows counts, one
    with nothing held out or a malformed scale does not."""
    from gpcore.run.pipeline import uncalibrated_var_y

    good = {"folds": "rows", "k": 10, "rows": 40, "scale": 0.5, "coverage_before": 0.99, "coverage_after": 0.95}
    model = fit("vecchia", data, full=False, neighbors=8)
    Xn = data[0][:5] + 0.01
    base = model.predict(Xn)
    for record, counts in ((good, True), ({**good, "rows": 0, "scale": 1.0}, False), ({**good, "scale": "0.5"}, False),
                           ({**good, "scale": True}, False), ({**good, "scale": float("nan")}, False),
                           ({"folds": "rows"}, False), (None, False)):
        info = {} if record is None else {"cv_calibration": record}
        assert (cv.applied(info) is not None) == counts, record
        model.train_info_.pop("cv_calibration", None)
        model.train_info_.update(info)
        model.forget_joint()
        pred = model.predict(Xn)
        c = 0.5 if counts else 1.0
        assert cv.latent_scale(model) == c
        np.testing.assert_allclose(pred.var_f, c * base.var_f, rtol=1e-12)
        raw = uncalibrated_var_y(model, pred)
        assert (raw is not None) == counts
        if counts:
            np.testing.assert_allclose(raw, base.var_y, rtol=1e-12)
    assert cv.applied(None) is None and cv.applied({"cv_calibration": [1]}) is None


def test_the_scale_survives_save_and_load(data, tmp_path):
    model = fit("vecchia", data, full=False, neighbors=8, cv_calibration="rows")
    model.save(tmp_path / "m")
    from gpcore.models.io import load_model

    again = load_model(tmp_path / "m")
    assert cv.latent_scale(again) == cv.latent_scale(model) != 1.0
    np.testing.assert_allclose(again.predict(data[0][:5]).var_f, model.predict(data[0][:5]).var_f, rtol=1e-12)


def test_a_run_picks_the_folds_by_its_split():
    from gpcore.models import model_spec
    from gpcore.run.pipeline import prepare

    vec, svgp = model_spec("vecchia").cls, model_spec("svgp").cls

    def run(**kw):
        return RunConfig(data="sample:synthetic", y="download_mbps", **kw)

    shape = {"noise_shape": "two_component"}  # the skewed noise, fitted on the same folds
    assert cv_settings(run(), vec) == {"cv_calibration": "rows", **shape}
    assert cv_settings(run(split="block", block_km=7.5), vec) == {"cv_calibration": "blocks", "cv_block_km": 7.5,
                                                                  **shape}
    assert cv_settings(run(split="block"), svgp) == {}
    assert cv_settings(run(split="block"), vec, "group") == {} and cv_settings(run(), vec, "global") == {}
    assert cv_settings(run(time_input=True), vec) == {}
    assert cv_settings(run(split="forecast", test_period="2023Q4", time="quarter"), vec) == {}
    cfg = run(model="dbk-nn", split="block", settings={"cv_calibration": "none"})
    off = run_model_settings(cfg, prepare(cfg))
    assert off["cv_calibration"] == "none" and "noise_shape" not in off  # the user's setting wins; no shape without it
    cfg = run(model="dbk-nn", split="block", settings={"noise_shape": "gaussian"})
    assert run_model_settings(cfg, prepare(cfg))["noise_shape"] == "gaussian"
    cfg = run(model="dbk-nn", split="block", block_km=5.0)
    assert run_model_settings(cfg, prepare(cfg))["cv_block_km"] == 5.0
    cfg = run(model="vecchia", strata="county_metro", settings={"recalibrate": "group"})  # the user asked for it
    assert "cv_calibration" not in run_model_settings(cfg, prepare(cfg))


def test_it_does_not_stack_on_a_validation_recalibration(data):
    from gpcore.errors import ConfigError

    X, y, _ = data
    with pytest.raises(ConfigError, match="set one of them to 'none'"):
        make_model("vecchia", cv_calibration="rows", recalibrate="global").fit(X[:60], y[:60], X[60:], y[60:])


def test_rows_all_in_one_block_leave_the_scale_at_one(data):
    X, y, _ = data
    model = make_model("vecchia", cv_calibration="blocks", cv_block_km=500.0, epochs=2, neighbors=8).fit(X, y)
    info = model.train_info_["cv_calibration"]
    assert info["rows"] == 0 and info["scale"] == 1.0 and info["coverage_before"] is None


def test_the_grid_search_gives_the_same_held_out_predictions(data, monkeypatch):
    """On a GPU the neighbour index is the grid search (gpcore/models/grid_search.py); forced on the CPU here."""
    from gpcore.models import neighbors

    model = fit("vecchia", data, full=False, neighbors=8)
    folds = cv.fold_ids(model, "blocks", 5.0, seed=2)
    kd = cv.cv_residuals(model, folds)
    monkeypatch.setattr(neighbors, "SEARCH", "grid")
    assert neighbors.NearestIndex(np.zeros((3, 2))).grid is not None  # the fold's index is the grid search now
    grid = cv.cv_residuals(model, folds)
    for a, b in zip(kd, grid, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_count_bins_are_the_metrics_bins():
    from gpcore.metrics import WEIGHT_BINS, weight_bins

    w = np.array([0.5, 1.0, 1.5, 2.0, 4.0, 4.01, 16.0, 17.0, 300.0])
    labels = np.array([f"tests {WEIGHT_BINS[k][0]}" for k in cv.count_bins(w)])
    np.testing.assert_array_equal(labels, weight_bins(w, "tests"))


def test_count_scales_are_the_mondrian_conformal_quantiles():
    from gpcore.models.noise_shape import NoiseShape

    shape = NoiseShape(latent_scale=0.8, c1=0.3, c2=1.8, pi=0.25, offset=-0.9)
    rng = np.random.default_rng(7)
    w = np.repeat([1.0, 3.0, 8.0, 30.0], [1500, 1200, 900, 150])
    n = w.size
    v, s = rng.uniform(0.005, 0.05, n), 0.4 / w
    q_true = np.array([0.8, 1.0, 1.3, 1.6])[cv.count_bins(w)]  # each bin's noise wider or narrower than s says
    slow = rng.random(n) < shape.pi
    sq = np.sqrt(s * q_true)
    e = np.where(slow, shape.offset * sq + np.sqrt(shape.c2) * sq * rng.standard_normal(n),
                 shape.first_offset() * sq + np.sqrt(shape.c1) * sq * rng.standard_normal(n))
    r = np.sqrt(shape.latent_scale * v) * rng.standard_normal(n) + e
    scales, rows = cv.count_scales(shape, r, v, s, w)
    assert rows == [1500, 1200, 900, 150]
    assert scales[3] == 1.0  # fewer than MIN_BIN_ROWS held-out rows: no scale of its own
    np.testing.assert_allclose(scales[:3], [0.8, 1.0, 1.3], rtol=0.12)
    for k in range(3):  # the ceil((n + 1) 0.95)-th row of the bin sits on the edge of its interval
        sel = cv.count_bins(w) == k
        need = math.ceil((sel.sum() + 1) * 0.95)

        def inside(q, sel=sel):
            lo, hi = shape.interval(0.95, shape.latent_scale * v[sel], s[sel] * q)
            return int(np.sum((r[sel] >= lo) & (r[sel] <= hi)))

        assert inside(scales[k]) >= need > inside(scales[k] * (1 - 1e-6))
    assert cv.noise_multiplier({"cv_calibration": {"rows": 10, "scale": 1.0}}, w, n) == 1.0
    rec = {"cv_calibration": {"rows": 10, "scale": 1.0, "count_scales": {"scales": scales}}}
    np.testing.assert_array_equal(cv.noise_multiplier(rec, w, n), np.asarray(scales)[cv.count_bins(w)])
    assert cv.noise_multiplier(rec, None, 3) == scales[0]  # no weights: one measurement
    for bad in (scales[:3], [*scales[:3], "1"], [*scales[:3], -1.0], [*scales[:3], float("nan")], {"1": 1.0}):
        broken = {"cv_calibration": {"rows": 10, "scale": 1.0, "count_scales": {"scales": bad}}}
        assert cv.recorded_count_scales(broken) is None and cv.noise_multiplier(broken, w, n) == 1.0
