"""The one training loop (mini-batch and full-batch) shared by every model.

AdamW over the model's parameter groups (weight decay on the backbone only) — or, for full-batch
models whose config sets ``optimizer="lbfgs"``, one L-BFGS iteration (strong-Wolfe line search) per
epoch — seeded batch order, validation NLL after every epoch, early stopping with patience, best-checkpoint
restore, a per-epoch callback that may cancel, and an optional wall-clock budget.

The loss is accumulated on the device and read back once per epoch, so the hot loop has no
host-device synchronisation.

Weighted fits (``GPModel.fit(weights=...)``): each step passes its batch's weights to the model's
``_step(xb, yb, n, wb)`` / ``_loss`` (the likelihood turns them into per-row noise ``tau^2 + sigma^2 / w``),
and the validation NLL scores each validation row with its own weight.

The loop lives in the models package so that ``GPModel.fit`` needs nothing above it. Inside a
:func:`gpcore.distributed.session` with more than one process the same loop trains across ranks
(DistributedDataParallel for mini-batch losses, a gradient all-reduce for full-batch ones, and for models whose
terms each rank shares out itself -- ``vecchia``, ``dbk-nn`` -- a sum of loss and gradient over ranks at every step
and every L-BFGS closure evaluation; see :mod:`gpcore.distributed` for the global-batch semantics and
docs/scaling.md): the loop takes the current context from
:func:`gpcore.comm.current` and asks it for a step strategy, ``ctx.training_steps(model, Xs, ys, ws)``
(duck-typed; :class:`gpcore.distributed.DistributedSteps` is the one in use), with ``n_global``, ``W``,
``full``, ``ctx.is_main``, ``epoch_batches``, ``step``, ``reduce_epoch_total``, ``validation_metrics``,
``agree`` and ``close``. Rank 0 runs the callback and decides cancellation and the time budget for
everyone; every rank returns the same history.

:class:`Performance` switches on what is safe by default: the fused AdamW kernel on every device
(the same update as the reference loop in one pass over the parameters; timings in docs/benchmarks/) and,
on CUDA, TF32 matmuls in the backbone's forward only; bf16 autocast of the backbone and
``torch.compile`` are opt-in on CUDA (``GPCORE_BACKBONE_PRECISION=bf16``, ``GPCORE_COMPILE=1``).
Cholesky factors, QR and the small ``r x r`` solves are never touched by these switches.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from dataclasses import asdict, dataclass, replace

import torch

from gpcore import comm
from gpcore.errors import TrainingError
from gpcore.models.linalg import gaussian_nll
from gpcore.models.memo import PointMemo


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
def validation_metrics(model, Xs, ys, Xv, yv, ws=None, wv=None, rows=False) -> tuple:
    """Validation NLL and RMSE in the caller's target units (weighted fits: each row's own noise).

    ``rows=True`` also returns each validation row's NLL (scaled units), for the paired comparison of two
    checkpoints (:func:`paired_se`)."""
    if model.needs_finalize:
        model.finalize(Xs, ys, ws)
    mean, var_f = model.predict_scaled(Xv)
    var_y = var_f + model.likelihood.variance(wv)  # sigma^2, or tau^2 + sigma^2 / w_v per validation row
    per_row = gaussian_nll(yv, mean, var_y)
    nll = per_row.mean().item() + math.log(model.y_std_)
    rmse = (yv - mean).pow(2).mean().sqrt().item() * model.y_std_
    return (nll, rmse, per_row.detach()) if rows else (nll, rmse)


def paired_se(rows: torch.Tensor, ref_rows: torch.Tensor, dist_steps=None) -> float:
    """Standard error of the mean per-row NLL difference between two checkpoints on the same validation rows
    (distributed: every rank's rows; the same value on every rank)."""
    d = (rows - ref_rows).double()
    sums = torch.stack([d.sum(), d.pow(2).sum(), torch.tensor(float(d.numel()), dtype=torch.float64, device=d.device)])
    if dist_steps is not None:
        sums = dist_steps.reduce_epoch_total(sums)
    s, s2, n = (float(v) for v in sums.cpu())
    n = max(n, 1.0)
    return math.sqrt(max(s2 / n - (s / n) ** 2, 0.0) / max(n - 1.0, 1.0))


def iterate_batches(n: int, batch_size: int, generator: torch.Generator, device) -> list[torch.Tensor]:
    """A seeded random permutation of ``range(n)`` cut into batches (last one may be smaller)."""
    perm = torch.randperm(n, generator=generator).to(device)
    return list(torch.split(perm, batch_size))


@dataclass
class Performance:
    """Speed switches for one training run (only ``fused_adam`` applies on CPU).

    Attributes
    ----------
    backbone_precision : ``"fp32"``, ``"tf32"`` (TF32 tensor-core matmuls in the backbone's forward
        pass only) or ``"bf16"`` (autocast the backbone's forward to bfloat16; its output is cast
        back to the working dtype before the expansion layer / kernel).
    fused_adam : use the fused AdamW kernel (CUDA, and CPU from torch 2.4; else the reference loop).
    compile : ``torch.compile`` the backbone in place (parameter names are unchanged).
    """

    backbone_precision: str = "fp32"
    fused_adam: bool = False
    compile: bool = False

    @classmethod
    def for_model(cls, model) -> Performance:
        """Defaults for ``model``'s device and dtype, overridable by environment variables.

        ``GPCORE_BACKBONE_PRECISION`` (fp32 | tf32 | bf16; default tf32 on CUDA with float32),
        ``GPCORE_FUSED_ADAM`` (1/0; default 1), ``GPCORE_COMPILE`` (1/0; default 0).
        """
        cuda = model.device.type == "cuda"
        f32 = model.dtype == torch.float32
        prec = os.environ.get("GPCORE_BACKBONE_PRECISION", "tf32" if (cuda and f32) else "fp32").lower()
        if prec not in ("fp32", "tf32", "bf16"):
            prec = "fp32"
        if not cuda or not f32:
            prec = "fp32"
        fused = os.environ.get("GPCORE_FUSED_ADAM", "1") not in ("0", "false", "no")
        comp = cuda and os.environ.get("GPCORE_COMPILE", "0") in ("1", "true", "yes")
        return cls(prec, fused, comp)


def _precision_forward(orig, device_type: str, mode: str, out_dtype: torch.dtype, *args, **kwargs):
    if mode == "bf16":
        with torch.autocast(device_type=device_type, dtype=torch.bfloat16):
            out = orig(*args, **kwargs)
        return out.to(out_dtype)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return orig(*args, **kwargs)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def _apply_performance(model, perf: Performance):
    """Install the backbone switches; returns an undo function (state-dict names never change)."""
    backbone = getattr(model.module_, "backbone", None)
    undo = []
    if backbone is not None and perf.backbone_precision in ("tf32", "bf16"):
        orig = backbone.forward
        backbone.forward = functools.partial(
            _precision_forward, orig, model.device.type, perf.backbone_precision, model.dtype
        )
        undo.append(lambda: backbone.__dict__.pop("forward", None))
    if backbone is not None and perf.compile:
        backbone.compile()
        undo.append(lambda: setattr(backbone, "_compiled_call_impl", None))

    def restore():
        for f in reversed(undo):
            f()

    return restore


def _make_optimizer(model, cfg, perf: Performance):
    if getattr(cfg, "optimizer", "adam") == "lbfgs":
        # full-batch models only (their config offers the setting): one L-BFGS iteration per epoch, each with a
        # strong-Wolfe line search from a unit step; the curvature history carries over between epochs
        params = [p for g in model._param_groups(0.0) for p in g["params"]]
        return torch.optim.LBFGS(params, lr=1.0, max_iter=1, max_eval=25, history_size=cfg.lbfgs_history,
                                 line_search_fn="strong_wolfe", tolerance_grad=1e-9, tolerance_change=1e-12)
    groups = model._param_groups(cfg.weight_decay)
    if perf.fused_adam:
        try:
            return torch.optim.AdamW(groups, lr=cfg.lr, fused=True)
        except (RuntimeError, TypeError, ValueError):
            pass
    return torch.optim.AdamW(groups, lr=cfg.lr)


def staged(callback, offset: int, total: int | None = None):
    """The caller's per-epoch callback with one epoch count across a multi-stage fit (earlier stages' epochs first:
    ``offset``; ``total``: all stages' epochs)."""
    if callback is None:
        return None

    def inner(progress):
        changes = {"epoch": progress.epoch + offset}
        if total is not None:
            changes["epochs"] = total
        return callback(replace(progress, **changes))

    return inner


@contextlib.contextmanager
def config_changed(model, **changes):
    """``model.config`` with ``changes`` inside the block (a stage's own settings), restored after it."""
    base = model.config
    model.config = base.replace(**changes)
    try:
        yield
    finally:
        model.config = base


def _lbfgs_step(opt, step, device):
    """One L-BFGS iteration (its line search calls ``step()`` -- ``model._step`` on the full batch, or in a
    distributed job the strategy's step returning the loss summed over ranks -- as the closure); returns the
    loss at the start of the iteration. A trial point whose loss is not finite (or whose factorisation fails)
    returns a huge finite loss with a zero gradient, which the line search rejects by shrinking the step
    (an infinite value would turn its cubic interpolation into NaN). Distributed, every closure evaluation
    all-reduces loss and gradient, so every rank's line search sees the same values and takes the same step."""

    params = [p for g in opt.param_groups for p in g["params"]]
    seen = opt.__dict__.get("_ua_evaluations") or PointMemo(0)  # the previous iteration's (loss, gradients)
    memo = opt.__dict__["_ua_evaluations"] = PointMemo(size=opt.defaults["max_eval"] + 1)

    def evaluate():
        opt.zero_grad(set_to_none=False)
        try:
            loss = step()
            ok = bool(torch.isfinite(loss))
        except torch.linalg.LinAlgError:
            loss, ok = torch.zeros((), dtype=torch.float64, device=device), False
        if not ok:
            for p in params:
                if p.grad is not None:
                    p.grad.zero_()
            return torch.full_like(loss, 1e30)
        return loss

    def closure():
        # torch's L-BFGS starts every iteration by evaluating the closure at the point its previous line search
        # ended on, which that search has already evaluated: a full-batch Vecchia pass, half of all passes with
        # one iteration per epoch. The same point (bit for bit) returns the stored loss and gradients instead.
        hit = seen.get(tuple(params))
        if hit is not None:
            old_loss, old_grads = hit
            for p, g in zip(params, old_grads, strict=True):
                if g is None:
                    p.grad = None
                elif p.grad is None:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)
            seen.clear()
            return old_loss
        loss = evaluate()
        memo.put(tuple(params), (loss.detach(), [None if p.grad is None else p.grad.detach().clone() for p in params]))
        return loss

    return opt.step(closure).detach()


def train(model, Xs, ys, Xv=None, yv=None, callback=None, *, ws=None, wv=None):
    """Optimise ``model.module_`` in place. Returns ``(history, info)``.

    Parameters
    ----------
    model : GPModel with ``module_`` built.
    Xs, ys : ``n x d`` and ``(n,)`` scaled training tensors on the model's device (in a sharded
        distributed session: this rank's rows).
    Xv, yv : optional validation tensors (early stopping on validation NLL).
    callback : optional ``callback(Progress) -> bool | None``; ``False`` cancels. Distributed:
        called on rank 0 only.
    ws, wv : per-observation weights of the training / validation rows (weighted fits only); each
        step passes its batch's weights to the model's ``_step``.
    """
    cfg = model.config
    module = model.module_
    perf = Performance.for_model(model)
    restore = _apply_performance(model, perf)
    try:
        dctx = comm.current()
        dist_steps = None
        n = Xs.shape[0]
        full = model.full_batch or cfg.batch_size >= n
        if dctx is not None and dctx.world_size > 1:
            dist_steps = dctx.training_steps(model, Xs, ys, ws)
            n = dist_steps.n_global
            full = model.full_batch or cfg.batch_size >= n
            dist_steps.full = full
            if model.full_batch and n < dctx.world_size:
                raise ValueError(f"{n} training points cannot be split over {dctx.world_size} processes")
        opt = _make_optimizer(model, cfg, perf)
        return _loop(model, module, opt, cfg, Xs, ys, Xv, yv, callback, n, full, dist_steps, ws, wv)
    finally:
        restore()


def _loop(model, module, opt, cfg, Xs, ys, Xv, yv, callback, n, full, dist_steps, ws=None, wv=None):
    gen = torch.Generator().manual_seed(cfg.seed)
    main = dist_steps is None or dist_steps.ctx.is_main
    if dist_steps is None:
        has_val = Xv is not None and Xv.shape[0] > 0
    else:
        has_val = Xv is not None
    best_metric, best_epoch, best_state = math.inf, 0, None  # the kept checkpoint
    lowest, low_rows = math.inf, None  # the lowest metric seen, and its per-row validation NLLs
    tol = cfg.min_improvement
    paired = has_val and tol > 0
    history: list[dict] = []
    stale = 0
    anchor = math.inf  # the validation NLL at the last improvement by more than min_improvement
    step = 0
    cancelled = False
    stopped_early = False
    diverged = False
    t0 = time.perf_counter()
    for epoch in range(1, cfg.epochs + 1):
        module.train()
        model._on_epoch_start(epoch)
        total = torch.zeros((), device=Xs.device, dtype=torch.float64)
        if dist_steps is not None:
            batches = dist_steps.epoch_batches(Xs.device)
            lbfgs = isinstance(opt, torch.optim.LBFGS)
            for idx, b_local, b_global in batches:
                if lbfgs:  # the closure returns the loss summed over ranks
                    loss = _lbfgs_step(opt, functools.partial(dist_steps.step, Xs, ys, idx, b_local, b_global, n, ws,
                                                              global_loss=True), Xs.device)
                else:
                    opt.zero_grad(set_to_none=True)
                    loss = dist_steps.step(Xs, ys, idx, b_local, b_global, n, ws)
                    opt.step()
                total += loss.double()
                step += 1
            if not lbfgs:
                total = dist_steps.reduce_epoch_total(total)
        else:
            if full:
                batches = [None]
            else:
                batches = iterate_batches(n, cfg.batch_size, gen, Xs.device)
            for idx in batches:
                xb, yb = (Xs, ys) if idx is None else (Xs[idx], ys[idx])
                wb = None if ws is None else (ws if idx is None else ws[idx])
                if isinstance(opt, torch.optim.LBFGS):
                    loss = _lbfgs_step(opt, functools.partial(model._step, xb, yb, n, wb), xb.device)
                else:
                    opt.zero_grad(set_to_none=True)
                    loss = model._step(xb, yb, n, wb)
                    opt.step()
                total += loss.double()
                step += 1
        epoch_loss = (total / len(batches)).item()
        lbfgs_converged = (isinstance(opt, torch.optim.LBFGS) and bool(history)
                           and abs(history[-1]["loss"] - epoch_loss) <= cfg.lbfgs_tolerance * max(1.0, abs(epoch_loss)))
        if not math.isfinite(epoch_loss):
            if best_state is None:
                raise TrainingError(
                    f"training loss became {epoch_loss} in epoch {epoch} before any valid checkpoint; "
                    "lower the learning rate (lr) or use dtype='float64'"
                )
            diverged = True
            break
        if has_val:
            if dist_steps is not None:
                res = dist_steps.validation_metrics(Xs, ys, Xv, yv, ws, wv, rows=paired)
            else:
                res = validation_metrics(model, Xs, ys, Xv, yv, ws, wv, rows=paired)
            val_nll, val_rmse = res[0], res[1]
            metric = val_nll
        else:
            val_nll = val_rmse = None
            metric = epoch_loss
        # a NaN/inf metric never counts as an improvement: the checkpoint kept is always a finite model.
        # With min_improvement > 0 a later epoch replaces the kept one when the validation rows cannot tell it from
        # the lowest: its NLL above the lowest by at most min_improvement or two paired standard errors; it is
        # further along the training objective (docs/methods/common.md#stopping-and-the-kept-checkpoint).
        finite = math.isfinite(metric)
        new_low = finite and metric < lowest - 1e-7
        improved = finite and (new_low or best_state is None)
        if paired and finite and not improved:
            improved = metric - lowest <= max(tol, 2.0 * paired_se(res[2], low_rows, dist_steps))
        if improved and metric <= lowest:
            lowest, low_rows = metric, (res[2] if paired else None)
        if improved:
            best_metric, best_epoch = metric, epoch
            best_state = {k: v.detach().clone() for k, v in module.state_dict().items()}
        if new_low and metric < anchor - tol:
            anchor, stale = metric, 0
        else:  # no gain, or gains that sum to less than min_improvement since the anchor: patience runs
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
        stop_cb = main and callback is not None and callback(prog) is False
        out_of_time = bool(cfg.max_seconds) and time.perf_counter() - t0 > cfg.max_seconds
        if dist_steps is not None:
            stop_cb, out_of_time = dist_steps.agree(stop_cb, out_of_time)
        if stop_cb:
            cancelled = True
            break
        if (has_val and stale >= cfg.patience) or lbfgs_converged:  # L-BFGS: no progress in a whole iteration
            stopped_early = True
            break
        if out_of_time:
            break
    if best_state is None:
        raise TrainingError(
            f"training produced no finite model: the validation NLL was not finite in any of {len(history)} epoch(s); "
            "lower the learning rate (lr) or use dtype='float64'; no run was written"
        )
    if has_val or diverged:
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
    if dist_steps is not None:
        info["world_size"] = dist_steps.W
        dist_steps.close()
    return history, info
