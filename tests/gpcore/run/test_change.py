"""The change posterior (gpcore/run/change.py, docs/methods/spacetime.md "The change posterior") against a dense
float64 oracle built in numpy from the model's own prior kernel, noise and mean (for dbk-nn the kernel
a^2 phi phi^T + k_r, its features kept): with every point conditioning on all its predecessors (m = n - 1) the
change variance, by either route (vecchia's pairs on one set of responses, or the chunked joint factor), equals the
exact GP's var(f(x, t2) - f(x, t1)) = v1 + v2 - 2 c12, the mean its mean difference, and p_increase =
Phi(mean / sd); the independent-marginals variance v1 + v2 is not it. Calibration of P(change > 0) on drawn fields:
benchmarks/bench_change.py. The change averaged over the hyperparameters' draws is the mixture of the draws'
changes, each one of the above at its own hyperparameters."""

from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import norm

from gpcore import make_model
from gpcore.models import vecchia_hyper
from gpcore.run import rundir
from gpcore.run.change import (
    change_moments,
    change_posterior,
    change_table,
    mixture_quantile,
    p_increase,
    run_change_table,
)

QUARTERS = 2019.125 + 0.25 * np.arange(4)


def _data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    lon, lat = rng.uniform(-67.2, -65.6, n), rng.uniform(17.9, 18.5, n)
    t = rng.choice(QUARTERS, n)
    y = 1.3 + 0.3 * np.sin(3 * lon) * np.cos(4 * lat) + 0.2 * (t - 2019) + 0.05 * rng.normal(size=n)
    return np.column_stack([lon, lat, t]), y


def _cells(n=23, seed=7):
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.uniform(-67.3, -65.5, n), rng.uniform(17.85, 18.55, n)])


#: dbk-nn with a tiny feature network that is kept (its joint posterior has the low-rank feature part)
DBK_SMALL = {"dbk_rank": 8, "dbk_hidden": 8, "dbk_blocks": 1, "dbk_epochs": 2, "dbk_batch_size": 32,
             "feature_check": False}


def _fit(kind: str, name: str = "vecchia"):
    X, y = _data()
    n = len(y)
    extra = DBK_SMALL if name == "dbk-nn" else {}
    model = make_model(name, space_time=kind, dtype="float64", device="cpu", epochs=1, neighbors=n - 1,
                       pred_neighbors=n, joint_neighbors=400, **extra).fit(X, y)
    with torch.no_grad():  # hyperparameters away from their initial values
        model.module_.raw_ell_t.fill_(2.0)  # ell_t ~ 0.8 years: quarters correlated
        model.module_.raw_noise.fill_(-2.0)
        if name == "dbk-nn":
            model.module_.raw_fscale.fill_(0.8)
    model.finalize(model.scale_x(X), model.scale_y(y))
    if name == "dbk-nn":
        assert model.module_.features_on
    return model, X, y


def _dense_change(model, X, y, cells, t1, t2):
    """Exact GP posterior of f(x, t2) - f(x, t1) from the dense covariance (numpy, float64)."""
    Z = np.vstack([np.column_stack([cells, np.full(len(cells), t)]) for t in (t1, t2)])
    K = model.kernel(X) + model.noise_variance * np.eye(len(y))
    Kzx, Kzz = model.kernel(Z, X), model.kernel(Z)
    mean = model.prior_mean_at(Z) + Kzx @ np.linalg.solve(K, y - model.prior_mean_at(X))  # mu0 + b t
    S = Kzz - Kzx @ np.linalg.solve(K, Kzx.T)
    c = len(cells)
    v1, v2, c12 = np.diag(S)[:c], np.diag(S)[c:], S[np.arange(c), c + np.arange(c)]
    return mean[c:] - mean[:c], v1 + v2 - 2 * c12, v1 + v2


@pytest.mark.parametrize(("name", "kind"), [("vecchia", "separable"), ("vecchia", "gneiting"),
                                           ("dbk-nn", "separable")])
@pytest.mark.parametrize("chunk", [4, 256])
@pytest.mark.parametrize("via", ["auto", "joint"])  # auto: vecchia's pairs (vecchia_pairs), dbk-nn's joint factor
def test_change_variance_is_the_dense_joint_one_at_m_n_minus_1(name, kind, chunk, via):
    model, X, y = _fit(kind, name)
    cells = _cells()
    t1, t2 = 2019.375, 2020.125  # 2019Q2 -> 2020Q1: the later one beyond the data
    mean, var = change_moments(model, cells, t1, t2, chunk=chunk, via=via)
    d_mean, d_var, indep = _dense_change(model, X, y, cells, t1, t2)
    np.testing.assert_allclose(mean, d_mean, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(var, d_var, rtol=1e-6, atol=1e-10)
    assert np.all(indep > 1.02 * d_var), "the covariance term matters: two independent marginals overstate it"


def test_table_columns_interval_and_p_increase_at_the_fitted_hyperparameters():
    model, X, y = _fit("separable")
    cells = _cells()
    import pandas as pd

    frame = pd.DataFrame({"cell_id": np.arange(100, 123), "lon": cells[:, 0], "lat": cells[:, 1]})
    t = change_table(model, frame, 2019.125, 2019.875, level=0.9, chunk=5, hyper_draws=0)
    assert t.attrs["hyper"] == "at the fitted hyperparameters"
    assert list(t.columns) == ["cell_id", "lon", "lat", "change_mean", "change_sd", "change_lo", "change_hi",
                               "p_increase"]
    assert t["cell_id"].tolist() == list(range(100, 123))
    np.testing.assert_allclose(t["p_increase"], norm.cdf(t["change_mean"] / t["change_sd"]))
    np.testing.assert_allclose(t["change_hi"] - t["change_mean"], norm.ppf(0.95) * t["change_sd"])
    np.testing.assert_allclose(t["change_mean"] - t["change_lo"], norm.ppf(0.95) * t["change_sd"])
    same = change_table(model, frame, 2019.125, 2019.125)
    assert np.allclose(same["change_mean"], 0) and np.allclose(same["change_sd"], 0, atol=1e-6)


def test_the_default_change_is_the_mixture_over_hyperparameter_draws_and_leaves_the_model_alone():
    model, X, y = _fit("separable")
    cells = _cells()
    t1, t2 = 2019.375, 2020.125
    before = {k: v.clone() for k, v in model.module_.state_dict().items()}
    c = change_posterior(model, cells, t1, t2, level=0.9, hyper_draws=5, seed=3)
    for k, v in model.module_.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert c.draws == 5 and "5 draws" in c.hyper
    # each draw: the exact GP's change at the draw's hyperparameters and GLS mean (m = n - 1)
    post = vecchia_hyper.hyper_posterior(model)
    parts = [_dense_change(m, X, y, cells, t1, t2)[:2] for m in vecchia_hyper.draws(model, 5, 3, post)]
    means, sds = np.stack([m for m, _ in parts], 1), np.sqrt(np.stack([v for _, v in parts], 1))
    assert np.ptp(sds, axis=1).min() > 1e-3, "the draws differ"
    np.testing.assert_allclose(c.p, norm.cdf(means / sds).mean(1), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(c.mean, means.mean(1), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(c.sd**2, (sds**2 + means**2).mean(1) - means.mean(1) ** 2, rtol=1e-6)
    for q, v in ((0.05, c.lo), (0.95, c.hi)):  # the mixture's quantiles
        np.testing.assert_allclose(norm.cdf((v[:, None] - means) / sds).mean(1), q, atol=1e-9)
    plug = change_posterior(model, cells, t1, t2, hyper_draws=0)
    assert not np.allclose(plug.p, c.p, atol=1e-3)


def test_a_model_without_a_hyperparameter_posterior_keeps_its_fitted_ones():
    model, X, y = _fit("separable", "dbk-nn")
    c = change_posterior(model, _cells(), 2019.375, 2020.125)
    mean, var = change_moments(model, _cells(), 2019.375, 2020.125)
    assert c.draws == 0 and "DBKNN has no hyperparameter posterior" in c.hyper
    np.testing.assert_allclose(c.p, p_increase(mean, var))
    np.testing.assert_allclose(c.hi, mean + norm.ppf(0.975) * np.sqrt(var))


def test_mixture_quantile_solves_the_mixture_cdf_and_is_exact_for_one_component():
    rng = np.random.default_rng(0)
    means, sds = rng.normal(size=(50, 7)), rng.uniform(0.05, 2.0, (50, 7))
    sds[0] = 0.0  # point masses: the quantile is one of them
    for q in (0.025, 0.5, 0.975):
        x = mixture_quantile(means, sds, q)
        np.testing.assert_allclose(norm.cdf((x[1:, None] - means[1:]) / sds[1:]).mean(1), q, atol=1e-10)
        assert np.min(np.abs(x[0] - means[0])) < 1e-9
    np.testing.assert_allclose(mixture_quantile(means[:, :1], sds[:, :1], 0.9),
                               means[:, 0] + norm.ppf(0.9) * sds[:, 0])


def test_p_increase_is_phi_of_mean_over_sd_and_the_sign_at_zero_variance():
    np.testing.assert_allclose(p_increase([0.1, -0.3, 0.0], [0.01, 0.09, 4.0]), norm.cdf([1.0, -1.0, 0.0]))
    assert p_increase([2.0, -1e-9, 0.0], [0.0, 0.0, 0.0]).tolist() == [1.0, 0.0, 0.5]


def test_a_failed_hyperparameter_posterior_falls_back_to_the_fitted_ones(monkeypatch):
    model, X, y = _fit("separable")

    def fail(model):
        raise torch.linalg.LinAlgError("cholesky: not positive-definite")

    monkeypatch.setattr(vecchia_hyper, "hyper_posterior", fail)
    c = change_posterior(model, _cells(), 2019.375, 2020.125)
    mean, var = change_moments(model, _cells(), 2019.375, 2020.125)
    assert c.draws == 0 and "averaging over the hyperparameters failed: cholesky" in c.hyper
    np.testing.assert_allclose(c.p, p_increase(mean, var))


def test_a_run_keeps_its_hyperparameter_posterior_for_the_next_change(tmp_path, monkeypatch):
    """run_change_table writes the posterior into the run folder after the first change; a fresh copy of the model
    (another process, another pair of quarters) reads it back instead of fitting REML again, with the same table."""
    model, X, y = _fit("separable")
    frame = pd.DataFrame(_cells(), columns=["lon", "lat"])
    first = run_change_table(tmp_path, model, frame, 2019.375, 2020.125, hyper_draws=4)
    stored = json.loads((tmp_path / rundir.HYPER).read_text())
    assert stored["mode"] == vecchia_hyper.hyper_posterior(model).mode.tolist()
    again = copy.deepcopy(model)
    again._hyper_cache = None  # as a model loaded in another process
    monkeypatch.setattr(vecchia_hyper, "_hyper_posterior", lambda *a: pytest.fail("REML fitted again"))
    second = run_change_table(tmp_path, again, frame, 2019.375, 2020.125, hyper_draws=4)
    pd.testing.assert_frame_equal(second, first)
    assert second.attrs["hyper"] == first.attrs["hyper"]
    other = run_change_table(tmp_path, again, frame, 2019.125, 2019.875, hyper_draws=4)  # another pair, same run
    assert not np.allclose(other["change_mean"], first["change_mean"])


def test_a_stale_or_damaged_stored_posterior_is_computed_again_and_replaced(tmp_path, monkeypatch):
    model, X, y = _fit("separable")
    frame = pd.DataFrame(_cells(), columns=["lon", "lat"])
    calls = []
    real = vecchia_hyper._hyper_posterior
    monkeypatch.setattr(vecchia_hyper, "_hyper_posterior", lambda *a: calls.append(1) or real(*a))
    (tmp_path / rundir.HYPER).write_text("{not json")
    run_change_table(tmp_path, model, frame, 2019.375, 2020.125, hyper_draws=2)
    assert len(calls) == 1 and vecchia_hyper.from_record(model, rundir.read_hyper(tmp_path)) is not None
    refit = copy.deepcopy(model)
    refit._hyper_cache = None
    with torch.no_grad():
        refit.module_.raw_noise.add_(0.3)  # the run's model refitted: the stored posterior is not its own
    run_change_table(tmp_path, refit, frame, 2019.375, 2020.125, hyper_draws=2)
    assert len(calls) == 2
    assert vecchia_hyper.from_record(refit, rundir.read_hyper(tmp_path)) is not None
    assert vecchia_hyper.from_record(model, rundir.read_hyper(tmp_path)) is None


def test_a_run_folder_that_cannot_be_written_still_gets_its_change(tmp_path):
    model, X, y = _fit("separable")
    frame = pd.DataFrame(_cells(), columns=["lon", "lat"])
    (tmp_path / "file").write_text("")
    not_a_folder = tmp_path / "file"  # writing inside it fails for every user, root included
    table = run_change_table(not_a_folder, model, frame, 2019.375, 2020.125, hyper_draws=2)
    pd.testing.assert_frame_equal(table, change_table(model, frame, 2019.375, 2020.125, hyper_draws=2))
    assert rundir.read_hyper(not_a_folder) is None and not rundir.write_hyper(not_a_folder, {"a": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
    plug = run_change_table(tmp_path, model, frame, 2019.375, 2020.125, hyper_draws=0)  # no draws: nothing kept
    assert plug.attrs["hyper"].startswith("at the fitted") and not (tmp_path / rundir.HYPER).exists()


def test_the_hyperparameter_draws_share_one_neighbour_search(monkeypatch):
    from gpcore.models.vecchia import VecchiaGP

    model, X, y = _fit("separable")
    cells = _cells()
    vecchia_hyper.hyper_posterior(model)
    expected = change_posterior(model, cells, 2019.375, 2020.125, hyper_draws=3)
    searched = []
    real = VecchiaGP._prediction_neighbors
    monkeypatch.setattr(VecchiaGP, "_prediction_neighbors", lambda self, *a, **k: searched.append(1) or real(self, *a,
                                                                                                              **k))
    c = change_posterior(model, cells, 2019.375, 2020.125, hyper_draws=3)
    assert len(searched) == 2  # each quarter's places once, not once per draw
    for a in ("mean", "sd", "lo", "hi", "p"):
        assert np.array_equal(getattr(c, a), getattr(expected, a)), a


def test_a_narrow_hyperparameter_posterior_takes_the_change_at_its_mode_alone(monkeypatch):
    """Where every sd of the hyperparameters' posterior is below NARROW_SD (large data sets) the change is the one at
    the REML mode: no draws. The small test model's posterior is wide, so by default it averages (the test above)."""
    from gpcore.run import change as change_mod

    model, X, y = _fit("separable")
    cells = _cells()
    post = vecchia_hyper.hyper_posterior(model)
    sd = np.sqrt(np.diag(post.cov)).max()
    assert sd > change_mod.NARROW_SD  # this posterior is wide: the default averages over draws
    monkeypatch.setattr(change_mod, "NARROW_SD", sd * 1.01)
    c = change_posterior(model, cells, 2019.375, 2020.125, level=0.9)
    mean, var = change_moments(vecchia_hyper.at_theta(model, post.mode), cells, 2019.375, 2020.125)
    assert c.draws == 1 and "REML mode" in c.hyper and "narrow" in c.hyper
    assert np.array_equal(c.mean, mean) and np.array_equal(c.p, p_increase(mean, var))
    np.testing.assert_allclose(c.hi, mean + norm.ppf(0.95) * np.sqrt(var))
    fitted = change_moments(model, cells, 2019.375, 2020.125)[0]
    assert not np.allclose(mean, fitted, atol=1e-4)  # the mode is not the fitted hyperparameters
    monkeypatch.setattr(change_mod, "NARROW_SD", sd * 0.99)
    assert change_posterior(model, cells, 2019.375, 2020.125, hyper_draws=3).draws == 3
