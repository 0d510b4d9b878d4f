"""Hyperparameters from a subset of the likelihood terms (gpcore.models.terms): the seeded subset, the objective as
the scaled sum of exactly its terms (values and gradients against the per-point terms, padded rows included), the
hybrid's sums for dbk-nn, and the posterior afterwards over every row."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpcore import make_model
from gpcore.models import terms as terms_mod
from gpcore.models import training
from gpcore.models.terms import Terms, current_terms, objective_rows, subsampled, term_count
from tests.gpcore.models.test_dbknn import SMALL, _data, _set_hypers


def test_the_subset_is_seeded_sorted_and_only_below_n():
    assert objective_rows(100, 0, 0, "cpu") is None
    assert objective_rows(100, 100, 0, "cpu") is None
    assert objective_rows(100, 250, 0, "cpu") is None
    rows = objective_rows(1000, 250, 3, "cpu")
    assert rows.shape == (250,) and bool((rows[1:] > rows[:-1]).all())
    assert 0 <= int(rows[0]) and int(rows[-1]) < 1000
    assert torch.equal(rows, objective_rows(1000, 250, 3, "cpu"))
    assert not torch.equal(rows, objective_rows(1000, 250, 4, "cpu"))


def test_term_count_takes_the_fraction_between_the_floor_and_likelihood_points():
    assert term_count(42_671, 250_000, 1.0) == 42_671  # fraction 1: min(likelihood_points, n), as before it
    assert term_count(300, 60, 1.0) == 60
    assert term_count(42_671, 250_000, 0.5) == 21_336  # ceil(n / 2)
    assert term_count(30_000, 250_000, 0.5) == 20_000  # never below MIN_FRACTION_TERMS ...
    assert term_count(15_000, 250_000, 0.5) == 15_000  # ... nor above n
    assert term_count(1_000_000, 250_000, 0.5) == 250_000  # nor above likelihood_points
    assert term_count(1_000_000, 0, 0.5) == 1_000_000  # 0 = every term


def test_dbknn_fits_on_half_the_terms_and_vecchia_on_all(monkeypatch):
    monkeypatch.setattr(terms_mod, "MIN_FRACTION_TERMS", 10)
    X, y = _data(n=90, seed=2)
    kw = {"neighbors": 7, "chunk_size": 16}
    for name, settings, k in (("dbk-nn", SMALL, 45), ("vecchia", {"epochs": 2}, 90)):
        model = make_model(name, **kw, **settings).fit(X, y)
        with subsampled(model, 90) as t:
            assert t.k == k and current_terms(model) is t
        assert current_terms(model).k == 90  # every term afterwards


def test_chunks_cover_the_subset_once_with_each_chunks_first_row():
    rows = objective_rows(1000, 250, 0, "cpu")
    t = Terms(1000, rows)
    chunks = list(t.chunks(64, "cpu"))
    assert torch.equal(torch.cat([idx for idx, _ in chunks]), rows)
    assert [first for _, first in chunks] == [int(rows[i]) for i in range(0, 250, 64)]
    assert t.scale == 4.0 and t.k == 250
    everything = Terms(300)
    assert torch.equal(torch.cat([idx for idx, _ in everything.chunks(64, "cpu")]), torch.arange(300))
    assert everything.scale == 1.0


def _params(model):
    return [p for p in model.module_.parameters() if p.requires_grad]


def _grads(model, loss_fn):
    for p in _params(model):
        p.grad = None
    loss = loss_fn()
    return loss, [p.grad.clone() for p in _params(model)]


@pytest.mark.parametrize("rows", ["seeded", "padded"])
def test_vecchia_objective_is_the_scaled_sum_of_its_subsets_terms(rows):
    X, y = _data(n=400, seed=3)
    model = make_model("vecchia", neighbors=10, chunk_size=32, epochs=2, dtype="float64", device="cpu").fit(X, y)
    mod = model.module_
    n = mod.X_train.shape[0]
    full = model.log_likelihood().item()
    k = 100
    with training.config_changed(model, likelihood_points=k), subsampled(model, n) as t:
        if rows == "padded":  # rows whose neighbour sets are padded (the first m) and the rest
            t = model._terms = Terms(n, torch.tensor([0, 3, 9, *range(50, 400, 3)][:k]))
        assert current_terms(model) is t and t.rows is not None and int(t.rows[0]) < 10
        ll = model.log_likelihood()
        per_point = model.vecchia_terms()
        assert ll.item() == pytest.approx(per_point[t.rows].sum().item() * n / k, rel=1e-12)
        assert abs(ll.item() - full) > 1e-6 * abs(full)  # the subset's sum, not every row's
        step_loss, step_grads = _grads(model, lambda: model._step(mod.X_train, mod.y_train, n))

        def reference():
            loss = -(model.vecchia_terms()[t.rows].sum() * (n / k)) / n
            loss.backward()
            return loss

        ref_loss, ref_grads = _grads(model, reference)
    assert step_loss.item() == pytest.approx(ref_loss.item(), rel=1e-12)
    for a, b in zip(step_grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
    assert current_terms(model).rows is None and model.log_likelihood().item() == full  # every term again


def test_a_fit_below_likelihood_points_is_the_fit_with_every_term():
    X, y = _data(n=300, seed=4)
    kw = {"neighbors": 8, "epochs": 4, "dtype": "float64", "device": "cpu"}
    a = make_model("vecchia", likelihood_points=0, **kw).fit(X[:250], y[:250], X[250:], y[250:])
    b = make_model("vecchia", likelihood_points=300, **kw).fit(X[:250], y[:250], X[250:], y[250:])
    c = make_model("vecchia", likelihood_points=60, **kw).fit(X[:250], y[:250], X[250:], y[250:])
    for name, p in a.module_.named_parameters():
        assert torch.equal(p, dict(b.module_.named_parameters())[name]), name
    assert not torch.equal(a.module_.raw_ell, c.module_.raw_ell)  # the subset changes the objective


def test_dbknn_sums_over_a_subset_are_its_rows_sums_scaled():
    X, y = _data(n=300, seed=5)
    model = make_model("dbk-nn", neighbors=7, chunk_size=16, feature_check=False, **SMALL).fit(X, y)
    _set_hypers(model)
    n = model.module_.X_train.shape[0]
    Phi = model._phi_train()
    U, u, ld = model._chunk_terms(torch.arange(n), 0, Phi)
    model._terms = Terms(n, objective_rows(n, 75, 0, "cpu"))
    try:
        r, s = model._terms.rows, n / 75
        S, c, uu, lds = model._stats(Phi)
    finally:
        model._terms = None
    torch.testing.assert_close(S, U[r].T @ U[r] * s, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(c, U[r].T @ u[r] * s, rtol=1e-11, atol=1e-11)
    assert uu.item() == pytest.approx((u[r] @ u[r]).item() * s, rel=1e-11)
    assert lds.item() == pytest.approx(ld[r].sum().item() * s, rel=1e-11)


def test_dbknn_posterior_after_a_subset_fit_uses_every_row():
    """The fit's steps remember the subset's sums (memo.py); the posterior after the fit must not reuse them."""
    X, y = _data(n=300, seed=6)
    model = make_model("dbk-nn", neighbors=7, chunk_size=16, feature_check=False, likelihood_points=90,
                       **SMALL).fit(X[:260], y[:260], X[260:], y[260:])
    assert model.features_used
    mod = model.module_
    S, c, _, _ = model._stats(model._phi_train())  # every row: no fitting subset now
    w_hat = torch.linalg.solve(torch.eye(S.shape[0], dtype=S.dtype) + S, c)
    torch.testing.assert_close(mod.post_m.double(), w_hat, rtol=1e-8, atol=1e-10)
    assert np.isfinite(model.predict(X[260:]).var_y).all()


def test_the_screen_takes_every_row_inside_a_subset_fit():
    """The screen is one pass and decides whether the hybrid is fitted: it sums every row, unbiased."""
    from gpcore.models.dbknn_screen import screen_sums

    X, y = _data(n=300, seed=7)
    model = make_model("dbk-nn", neighbors=7, chunk_size=16, feature_check=False, **SMALL).fit(X, y)
    n = model.module_.X_train.shape[0]
    ref = screen_sums(model)
    with training.config_changed(model, likelihood_points=75), subsampled(model, n) as t:
        got = screen_sums(model)
        assert current_terms(model) is t and t.rows is not None  # the fit's subset is back
    for a, b in zip(ref, got, strict=True):
        np.testing.assert_array_equal(a, b)
