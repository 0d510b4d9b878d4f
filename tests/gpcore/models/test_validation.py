"""Validation rows into the weight posterior of the feature models (gpcore/models/validation.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpcore import make_model
from gpcore.models.validation import condition_weights, upper_factor

pytestmark = pytest.mark.usefixtures("float64_default")  # tests/gpcore/models/conftest.py


def _data(n=90, seed=2):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 3, size=(n, 2))
    y = 3.0 + np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.2 * rng.normal(size=n)
    w = rng.integers(1, 6, size=n).astype(float)
    return X[:60], y[:60], w[:60], X[60:], y[60:], w[60:]


SMALL = {"dtype": "float64", "device": "cpu", "seed": 0}


@pytest.mark.parametrize("weighted", [False, True])
def test_dbk_exact_posterior_given_training_then_validation_rows_is_the_posterior_given_both(weighted):
    """DBK's exact objective: q(w) is the exact posterior given the training rows, so Bayes' rule with the validation
    rows must give the exact posterior given both (the model's own finalize on all rows, same hyperparameters)."""
    Xt, yt, wt, Xv, yv, wv = _data()
    kw = {"weights": wt, "val_weights": wv} if weighted else {}
    m = make_model("dbk", objective="mml", rank=8, hidden=8, epochs=4, lr=1e-2, condition_on_validation=True,
                   **SMALL).fit(Xt, yt, Xv, yv, **kw)
    assert m.train_info_["validation_in_posterior"] == len(Xv)
    Xte = np.random.default_rng(5).uniform(-2, 3, size=(25, 2))
    got = m.predict(Xte)
    Xa, ya = np.r_[Xt, Xv], np.r_[yt, yv]
    m.finalize(m.scale_x(Xa), m.scale_y(ya), m._to_tensor(np.r_[wt, wv]) if weighted else None)
    ref = m.predict(Xte)
    np.testing.assert_allclose(got.mean, ref.mean, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(got.var_f, ref.var_f, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("name", ["svgp", "dbk"])
def test_update_is_gaussian_conditioning_in_observation_space(name):
    """The r-space update equals the n-space Gaussian conditioning of w ~ N(m, S) on y_v = mu0 + Phi w + e,
    e ~ N(0, D), D = noise + the latent variance outside the weights (SVGP's residual)."""
    Xt, yt, _, Xv, yv, _ = _data(seed=4)
    settings = {"num_inducing": 10, "epochs": 6, "batch_size": 16} if name == "svgp" else {"rank": 6, "hidden": 8,
                                                                                          "epochs": 4}
    m = make_model(name, condition_on_validation=False, **settings, **SMALL).fit(Xt, yt, Xv, yv)
    assert "validation_in_posterior" not in m.train_info_
    Xs, ys = m.scale_x(Xv), m.scale_y(yv)
    feats, mu, F = m._weight_posterior()
    Phi, S = feats(Xs).double(), (F @ F.T).double()
    mean, var_f = m.predict_scaled(Xs)
    D = torch.diag(var_f - ((Phi @ F) ** 2).sum(1) + m.module_.noise.double())
    K = Phi @ S @ Phi.T + D
    gain = S @ Phi.T @ torch.linalg.inv(K)
    m_ref = mu.double() + gain @ (ys - mean)
    S_ref = S - gain @ Phi @ S
    m_new, S_new = condition_weights(m, Xs, ys)
    torch.testing.assert_close(m_new, m_ref, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(S_new, S_ref, rtol=1e-7, atol=1e-10)
    # written back, the model predicts with the new posterior
    m._set_weight_posterior(m_new, S_new)
    _, mu2, F2 = m._weight_posterior()
    torch.testing.assert_close(mu2.double(), m_new)
    torch.testing.assert_close((F2 @ F2.T).double(), S_new, rtol=1e-8, atol=1e-10)


def test_upper_factor():
    A = torch.randn(7, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    S = A @ A.T + 0.1 * torch.eye(7, dtype=torch.float64)
    U = upper_factor(S)
    assert torch.equal(U, torch.triu(U))
    torch.testing.assert_close(U @ U.T, S)
