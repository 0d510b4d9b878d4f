"""Training on per-rank shards and distributed runs, on top of :mod:`gpcore.distributed`.

:func:`fit_sharded` is ``model.fit`` where every rank passes only its own rows (data that does not
fit one process); :func:`execute_run_distributed` is :func:`gpcore.run.pipeline.execute_run` under torchrun
(``python -m gpcore fit ... --distributed``). They live here, above the trainer, the models and the
runs, so :mod:`gpcore.distributed` (the collectives the trainer and the models use) imports none of
them and the package has no import cycle.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from gpcore.comm import comm_device as _comm_device
from gpcore.distributed import (
    DistContext,
    broadcast_module,
    check_supported,
    current,
    init_distributed,
    session,
    shutdown,
)
from gpcore.errors import ConfigError, InputError
from gpcore.models import as_1d_float, as_2d_float, as_weights, make_model
from gpcore.models.training import train
from gpcore.run.pipeline import execute_run, prepare, run_model_settings

# --------------------------------------------------------------------------------------------
# fitting on per-rank shards
# --------------------------------------------------------------------------------------------


def _global_scalers(ctx: DistContext, X: np.ndarray, y: np.ndarray):
    """Training bounds, target mean and (population) sd over all ranks' rows."""
    import torch.distributed as dist

    d = X.shape[1]
    dev = _comm_device(ctx)
    big = np.finfo(np.float64).max
    lo = torch.tensor(X.min(axis=0) if len(X) else np.full(d, big), dtype=torch.float64, device=dev)
    hi = torch.tensor(X.max(axis=0) if len(X) else np.full(d, -big), dtype=torch.float64, device=dev)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=ctx.group)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=ctx.group)
    s = torch.tensor([float(y.sum()), float(len(y))], dtype=torch.float64, device=dev)
    dist.all_reduce(s, op=dist.ReduceOp.SUM, group=ctx.group)
    n = int(s[1].item())
    mean = float(s[0]) / max(n, 1)
    ss = torch.tensor([float(((y - mean) ** 2).sum())], dtype=torch.float64, device=dev)
    dist.all_reduce(ss, op=dist.ReduceOp.SUM, group=ctx.group)
    sd = math.sqrt(float(ss[0]) / max(n, 1))
    return lo.cpu().numpy(), hi.cpu().numpy(), mean, sd, n


def fit_sharded(model, X, y, X_val=None, y_val=None, callback: Callable | None = None, ctx: DistContext | None = None,
                *, weights=None, val_weights=None):
    """``model.fit`` where every rank passes only *its own* rows (``X``, ``y``; optional validation rows).

    Scalers come from all-reduced moments, so every rank scales identically; the initial
    parameters are rank 0's. Full-batch statistics (exact DBK-MML) are exact over all rows.
    Returns the fitted model (identical on every rank). The callback runs on rank 0 only.
    ``weights`` / ``val_weights``: this rank's rows' per-observation weights (as in ``GPModel.fit``).
    """
    ctx = ctx or current()
    if ctx is None:
        raise ConfigError("fit_sharded needs a distributed context: ctx = init_distributed()")
    X = as_2d_float(X, "X")
    y = as_1d_float(y, X.shape[0], "y")
    if X.shape[0] == 0:
        raise InputError(f"rank {ctx.rank} got no training rows; give every rank at least one row")
    if X_val is None or y_val is None:
        X_val, y_val = np.empty((0, X.shape[1])), np.empty(0)
    X_val = as_2d_float(X_val, "X_val", d=X.shape[1]).reshape(-1, X.shape[1])
    y_val = as_1d_float(y_val, X_val.shape[0], "y_val")
    w = None if weights is None else as_weights(weights, X.shape[0], "weights")
    wv = None
    if w is not None:
        wv = as_weights(np.ones(0) if val_weights is None else val_weights, X_val.shape[0], "val_weights")
    torch.manual_seed(model.config.seed)
    np.random.seed(model.config.seed)
    lo, hi, mean, sd, n = _global_scalers(ctx, X, y)
    if n < 2:
        raise InputError(f"need at least 2 training points over all ranks, got {n}")
    span = np.where(hi - lo > 0, hi - lo, 1.0)
    model.d_ = X.shape[1]
    model.n_train_ = n
    model.x_lo_, model.x_span_ = lo, span
    model.y_mean_ = mean
    model.y_std_ = sd if sd > 0 else 1.0
    Xs, ys = model.scale_x(X), model.scale_y(y)
    import torch.distributed as dist

    nv = torch.tensor([float(len(y_val))], dtype=torch.float64, device=_comm_device(ctx))
    dist.all_reduce(nv, group=ctx.group)  # every rank must agree on whether there is validation data
    Xv, yv = (model.scale_x(X_val), model.scale_y(y_val)) if nv.item() > 0 else (None, None)
    model.module_ = model._build(model.d_, Xs, ys).to(device=model.device, dtype=model.dtype)
    ws = wvs = None
    if w is not None:
        model._add_nugget()
        ws = model._to_tensor(w)
        wvs = model._to_tensor(wv) if Xv is not None else None
    broadcast_module(model.module_, ctx)
    import time

    t0 = time.perf_counter()
    with session(ctx, sharded=True):
        model.history_, model.train_info_ = train(model, Xs, ys, Xv, yv, callback, ws=ws, wv=wvs)
        model.finalize(Xs, ys, ws)
    model.train_info_["fit_seconds"] = time.perf_counter() - t0
    model.train_info_["world_size"] = ctx.world_size
    model.fitted_ = True
    return model


# --------------------------------------------------------------------------------------------
# runs (``python -m gpcore fit ... --distributed``)
# --------------------------------------------------------------------------------------------


def execute_run_distributed(cfg, out_dir, callback=None, log=None, overwrite: bool = False):
    """:func:`gpcore.run.pipeline.execute_run` under torchrun: every rank loads the data and trains its shard
    of each global batch; rank 0 alone evaluates, predicts the grid and writes the run directory.

    Returns the run directory on rank 0 and ``None`` on the other ranks. The non-zero ranks make
    the same ``fit`` call as ``execute_run`` (training rows, validation rows, model settings).
    """
    ctx = init_distributed(device=cfg.model_settings().get("device", "auto"))  # gloo for a CPU run on a GPU box
    try:
        prep = prepare(cfg)
        with session(ctx):
            if ctx.is_main:
                if log is not None:
                    log(f"distributed training: {ctx.world_size} processes, backend {ctx.backend}")
                return execute_run(cfg, out_dir, callback=callback, prepared=prep, log=log, overwrite=overwrite)
            model = make_model(cfg.model, **run_model_settings(cfg, prep))
            check_supported(model)
            w, st = prep.weights, prep.strata
            model.fit(
                prep.X[prep.train_idx],
                prep.y[prep.train_idx],
                prep.X[prep.val_idx],
                prep.y[prep.val_idx],
                **({} if w is None else {"weights": w[prep.train_idx], "val_weights": w[prep.val_idx]}),
                **({} if st is None else {"groups": st[prep.train_idx], "val_groups": st[prep.val_idx]}),
            )
            return None
    finally:
        shutdown()
