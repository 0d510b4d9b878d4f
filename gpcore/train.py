"""The one training loop (mini-batch and full-batch) shared by every model.

AdamW over the model's parameter groups (weight decay on the backbone only), seeded batch
order, validation NLL after every epoch, early stopping with patience, best-checkpoint
restore, a per-epoch callback that may cancel, and an optional wall-clock budget.

The loss is accumulated on the device and read back once per epoch, so the hot loop has no
host-device synchronisation.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch

from gpcore.models.linalg import gaussian_nll


@dataclass
class Progress:
    """What the callback receives after each epoch (metrics in standardised target units).

    ``val_nll`` is the mean Gaussian NLL of the validation targets in the caller's units
    (standardised NLL + log of the target scale), ``None`` without a validation set.
    """

    epoch: int
    epochs: int
    step: int
    loss: float
    val_nll: float | None
    val_rmse: float | None
    best_val_nll: float | None
    best_epoch: int
    elapsed: float
    improved: bool

    def to_dict(self) -> dict:
        return asdict(self)


class _Cancelled(Exception):
    pass


@torch.no_grad()
def validation_metrics(model, Xs, ys, Xv, yv) -> tuple[float, float]:
    """Validation NLL and RMSE in the caller's target units."""
    if model.needs_finalize:
        model.finalize(Xs, ys)
    mean, var_f = model.predict_scaled(Xv)
    var_y = var_f + model._noise_s()
    nll = gaussian_nll(yv, mean, var_y).mean().item() + math.log(model.y_std_)
    rmse = (yv - mean).pow(2).mean().sqrt().item() * model.y_std_
    return nll, rmse


def iterate_batches(n: int, batch_size: int, generator: torch.Generator, device) -> list[torch.Tensor]:
    """A seeded random permutation of ``range(n)`` cut into batches (last one may be smaller)."""
    perm = torch.randperm(n, generator=generator).to(device)
    return list(torch.split(perm, batch_size))


def train(model, Xs, ys, Xv=None, yv=None, callback=None):
    """Optimise ``model.module_`` in place. Returns ``(history, info)``.

    Parameters
    ----------
    model : GPModel with ``module_`` built.
    Xs, ys : ``n x d`` and ``(n,)`` scaled training tensors on the model's device.
    Xv, yv : optional validation tensors (early stopping on validation NLL).
    callback : optional ``callback(Progress) -> bool | None``; ``False`` cancels.
    """
    cfg = model.config
    module = model.module_
    opt = torch.optim.AdamW(model._param_groups(cfg.weight_decay), lr=cfg.lr)
    n = Xs.shape[0]
    full = model.full_batch or cfg.batch_size >= n
    gen = torch.Generator().manual_seed(cfg.seed)
    has_val = Xv is not None and Xv.shape[0] > 0
    best_metric, best_epoch, best_state = math.inf, 0, None
    history: list[dict] = []
    stale = 0
    step = 0
    cancelled = False
    stopped_early = False
    diverged = False
    t0 = time.perf_counter()
    for epoch in range(1, cfg.epochs + 1):
        module.train()
        model._on_epoch_start(epoch)
        total = torch.zeros((), device=Xs.device, dtype=torch.float64)
        if full:
            batches = [None]
        else:
            batches = iterate_batches(n, cfg.batch_size, gen, Xs.device)
        for idx in batches:
            xb, yb = (Xs, ys) if idx is None else (Xs[idx], ys[idx])
            opt.zero_grad(set_to_none=True)
            loss = model._step(xb, yb, n)
            opt.step()
            total += loss.double()
            step += 1
        epoch_loss = (total / len(batches)).item()
        if not math.isfinite(epoch_loss):
            if best_state is None:
                raise FloatingPointError(
                    f"training loss became {epoch_loss} in epoch {epoch} before any valid checkpoint; "
                    "lower the learning rate (lr) or use dtype='float64'"
                )
            diverged = True
            break
        if has_val:
            val_nll, val_rmse = validation_metrics(model, Xs, ys, Xv, yv)
            metric = val_nll
        else:
            val_nll = val_rmse = None
            metric = epoch_loss
        improved = metric < best_metric - 1e-7 or best_state is None
        if improved:
            best_metric, best_epoch, stale = metric, epoch, 0
            best_state = {k: v.detach().clone() for k, v in module.state_dict().items()}
        else:
            stale += 1
        prog = Progress(
            epoch=epoch,
            epochs=cfg.epochs,
            step=step,
            loss=epoch_loss,
            val_nll=val_nll,
            val_rmse=val_rmse,
            best_val_nll=best_metric if has_val else None,
            best_epoch=best_epoch,
            elapsed=time.perf_counter() - t0,
            improved=improved,
        )
        history.append(prog.to_dict())
        if callback is not None and callback(prog) is False:
            cancelled = True
            break
        if has_val and stale >= cfg.patience:
            stopped_early = True
            break
        if cfg.max_seconds and time.perf_counter() - t0 > cfg.max_seconds:
            break
    if best_state is not None and (has_val or diverged):
        module.load_state_dict(best_state)
    info = {
        "epochs_run": len(history),
        "best_epoch": best_epoch,
        "best_val_nll": best_metric if has_val else None,
        "cancelled": cancelled,
        "stopped_early": stopped_early,
        "diverged": diverged,
        "train_seconds": time.perf_counter() - t0,
        "steps": step,
    }
    return history, info
