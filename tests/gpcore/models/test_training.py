"""The trainer's L-BFGS step (gpcore/models/training.py): each point is evaluated once, the path is torch's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpcore import make_model
from gpcore.models import training


def _rosenbrock_step(x, points):
    def step():
        points.append(x.detach().clone())
        loss = (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2
        loss.backward()
        return loss.detach()

    return step


def _lbfgs(x):
    return torch.optim.LBFGS([x], lr=1.0, max_iter=1, max_eval=25, history_size=10,
                             line_search_fn="strong_wolfe", tolerance_grad=1e-12, tolerance_change=1e-15)


def test_lbfgs_step_follows_torchs_path_without_evaluating_a_point_twice():
    x = torch.tensor([-1.2, 1.0], dtype=torch.float64, requires_grad=True)
    opt, points = _lbfgs(x), []
    losses = [float(training._lbfgs_step(opt, _rosenbrock_step(x, points), x.device)) for _ in range(30)]

    # reference: torch's L-BFGS with a plain closure, which re-evaluates the point each iteration starts from
    x_ref = torch.tensor([-1.2, 1.0], dtype=torch.float64, requires_grad=True)
    opt_ref, ref_points = _lbfgs(x_ref), []
    step_ref = _rosenbrock_step(x_ref, ref_points)

    def closure():
        opt_ref.zero_grad()
        return step_ref()

    ref_losses = [float(opt_ref.step(closure)) for _ in range(30)]
    assert losses == ref_losses
    assert torch.equal(x.detach(), x_ref.detach())
    assert losses[-1] < 1e-3 * losses[0]  # it did optimise
    distinct = {tuple(p.tolist()) for p in points}
    assert len(distinct) == len(points)  # no point evaluated twice
    assert len(points) <= len(ref_points) - 29  # each of iterations 2..30 saved its first evaluation


def test_a_changed_point_is_evaluated_again():
    """Parameters moved between iterations (a checkpoint restored, a hand edit) are never served from memory."""
    x = torch.tensor([-1.2, 1.0], dtype=torch.float64, requires_grad=True)
    opt, points = _lbfgs(x), []
    step = _rosenbrock_step(x, points)
    training._lbfgs_step(opt, step, x.device)
    with torch.no_grad():
        x.add_(1e-3)
    moved = x.detach().clone()
    n = len(points)
    loss = training._lbfgs_step(opt, step, x.device)
    assert torch.equal(points[n], moved)
    assert float(loss) == (1 - moved[0].item()) ** 2 + 100 * (moved[1].item() - moved[0].item() ** 2) ** 2


def test_vecchia_fit_evaluates_each_point_of_its_path_once():
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, size=(300, 2))
    y = np.sin(4 * X[:, 0]) + 0.1 * rng.normal(size=300)
    model = make_model("vecchia", neighbors=8, epochs=8, seed=0)
    seen = []
    original = type(model)._step

    def counting_step(self, xb, yb, n, wb=None):
        seen.append(tuple(p.detach().double().sum().item() for p in self.module_.parameters()))
        return original(self, xb, yb, n, wb)

    type(model)._step = counting_step
    try:
        model.fit(X, y)
    finally:
        type(model)._step = original
    assert model.train_info_["epochs_run"] >= 3
    assert len(seen) == len(set(seen))


def _fit_with_scripted_validation(monkeypatch, val_nlls, spreads=None, **settings):
    """A small vecchia fit (Adam: no L-BFGS convergence stop) whose validation NLL per epoch is ``val_nlls``; the
    50 validation rows' NLLs are that mean plus ``spreads[epoch]`` times one fixed zero-mean, unit-sd pattern."""
    rng = np.random.default_rng(1)
    X = rng.uniform(0, 1, size=(200, 2))
    y = np.sin(4 * X[:, 0]) + 0.1 * rng.normal(size=200)
    z = torch.tensor(rng.normal(size=50), dtype=torch.float64)
    z = (z - z.mean()) / z.std()
    script = iter(zip(val_nlls, spreads or [0.0] * len(val_nlls), strict=True))

    def scripted(*args, rows=False, **kwargs):
        nll, spread = next(script)
        return (nll, 0.0, nll + spread * z) if rows else (nll, 0.0)

    monkeypatch.setattr(training, "validation_metrics", scripted)
    model = make_model("vecchia", neighbors=5, optimizer="adam", epochs=len(val_nlls), seed=0, **settings)
    model.fit(X[:150], y[:150], X[150:], y[150:])
    return model.train_info_


def test_gains_below_min_improvement_run_out_patience_and_the_best_state_is_kept(monkeypatch):
    # gains after epoch 2 sum to 0.0009 < 1e-3 within 5 epochs: stop after epoch 7, keep epoch 7 (the best)
    nlls = [1.0, 0.9, 0.8998, 0.8996, 0.8994, 0.8992, 0.8991, 0.5, 0.4, 0.3]
    info = _fit_with_scripted_validation(monkeypatch, nlls, patience=5, min_improvement=1e-3)
    assert info["epochs_run"] == 7
    assert info["best_epoch"] == 7 and info["best_val_nll"] == 0.8991
    # without a threshold every gain resets patience: all 10 epochs run
    info = _fit_with_scripted_validation(monkeypatch, nlls, patience=5, min_improvement=0.0)
    assert info["epochs_run"] == 10 and info["best_val_nll"] == 0.3


def test_small_gains_that_add_up_to_min_improvement_reset_patience(monkeypatch):
    # 0.0004 per epoch: the sum passes 1e-3 at epoch 5 (anchor 0.9 -> 0.8988), so patience restarts there
    nlls = [1.0, 0.9, 0.8996, 0.8992, 0.8988, 0.8988, 0.8988, 0.8988, 0.8988, 0.8988, 0.1]
    info = _fit_with_scripted_validation(monkeypatch, nlls, patience=5, min_improvement=1e-3)
    assert info["epochs_run"] == 10
    # epochs 6-10 tie the lowest: the validation cannot tell them from epoch 5, so the latest is kept
    assert info["best_epoch"] == 10 and info["best_val_nll"] == 0.8988


def test_a_later_state_the_validation_cannot_tell_from_the_best_is_kept(monkeypatch):
    """0.05 nats above the lowest, epoch 3+ replaces it only when that is within two paired standard errors of the
    per-row differences (spread 0.5 on 50 rows: 2 SE = 0.14) and not when the rows agree (spread 0.1: 0.029)."""
    nlls = [1.0, 0.9, 0.95, 0.95, 0.95]
    info = _fit_with_scripted_validation(monkeypatch, nlls, [0.0, 0.0, 0.5, 0.5, 0.5], patience=10,
                                         min_improvement=1e-3)
    assert info["best_epoch"] == 5 and info["best_val_nll"] == 0.95
    info = _fit_with_scripted_validation(monkeypatch, nlls, [0.0, 0.0, 0.1, 0.1, 0.1], patience=10,
                                         min_improvement=1e-3)
    assert info["best_epoch"] == 2 and info["best_val_nll"] == 0.9
    # min_improvement = 0 (the default of every model but vecchia and dbk-nn): the lowest validation NLL is kept
    info = _fit_with_scripted_validation(monkeypatch, nlls, [0.0, 0.0, 0.5, 0.5, 0.5], patience=10,
                                         min_improvement=0.0)
    assert info["best_epoch"] == 2


def test_paired_se_is_the_standard_error_of_the_mean_difference():
    rng = np.random.default_rng(3)
    a, b = torch.tensor(rng.normal(size=40)), torch.tensor(rng.normal(size=40))
    d = (a - b).numpy()
    assert training.paired_se(a, b) == pytest.approx(d.std(ddof=1) / np.sqrt(40), rel=1e-12)
