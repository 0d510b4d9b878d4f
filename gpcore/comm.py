"""Process-group primitives the models use, below everything that trains or runs (imports nothing from gpcore).

A distributed job has one *context* per process: an object with ``rank``, ``world_size``, ``backend``,
``device``, ``group`` (the process group of the model-level collectives), ``sharded`` and the step flags
``in_step`` / ``empty_shard`` (:class:`gpcore.distributed.DistContext`). :func:`gpcore.distributed.session`
makes it current with :func:`activate`; the models read it through :func:`current` and the collectives
below, and the training loop (:mod:`gpcore.models.training`) asks it for its step strategy
(``ctx.training_steps(...)``), so neither the models nor the loop import :mod:`gpcore.distributed`.
Outside a session (single process) every function here is the plain single-process operation.

What the collectives mean for a model's loss (global-batch semantics): docs/scaling.md.

* :func:`batch_max` -- an in-batch maximum over the *global* batch (the dPPGP trace term's
  ``max_j ||phi_j||^2``), its gradient reaching only the rank that owns the arg-max;
* :func:`reduce_stats_` -- full-batch statistics (``Phi^T Phi``, ``Phi^T y``, ...) summed over ranks in place;
* :func:`local_grad_scale` -- the factor of gradient contributions a model computes from its own rows;
* :func:`reduce_gradients` -- the trainer's gradient all-reduce (mean for DDP-like steps, sum for own-share steps);
* :func:`own_chunks`, :func:`count_once` -- a model that holds all the rows but computes only its share of a sum of
  per-point terms (``vecchia``, ``dbk-nn``: ``distributed_own_share``; docs/scaling.md, "Vecchia and dbk-nn").
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

_CURRENT: Any = None


def current() -> Any:
    """The active distributed context (inside :func:`gpcore.distributed.session`), else ``None``."""
    return _CURRENT


@contextlib.contextmanager
def activate(ctx: Any) -> Iterator[Any]:
    """Make ``ctx`` the current context for the block (the previous one is restored after it)."""
    global _CURRENT
    prev, _CURRENT = _CURRENT, ctx
    try:
        yield ctx
    finally:
        _CURRENT = prev


def is_active() -> bool:
    """Whether a distributed session with more than one process is active."""
    return _CURRENT is not None and _CURRENT.world_size > 1


def world_size() -> int:
    return _CURRENT.world_size if _CURRENT is not None else 1


def rank() -> int:
    return _CURRENT.rank if _CURRENT is not None else 0


@contextlib.contextmanager
def step_scope(ctx, empty: bool = False):
    """Mark one optimisation step: the batch a model sees is this rank's shard of a global batch."""
    ctx.in_step, ctx.empty_shard = True, empty
    try:
        yield
    finally:
        ctx.in_step, ctx.empty_shard = False, False


def comm_device(ctx) -> torch.device:
    """Where ``ctx``'s collectives run: its GPU with NCCL, else the CPU."""
    return ctx.device if ctx.backend == "nccl" else torch.device("cpu")


class _GlobalMax(torch.autograd.Function):
    """Max over the global batch; gradient to the owning rank, summed over ranks."""

    @staticmethod
    def forward(fctx, local_max: torch.Tensor, dctx, exclude: bool):
        import torch.distributed as dist

        val = local_max.detach().reshape(1).clone()
        if exclude:
            val.fill_(-math.inf)
        parts = [torch.empty_like(val) for _ in range(dctx.world_size)]
        dist.all_gather(parts, val, group=dctx.group)
        allv = torch.cat(parts)
        owner = torch.argmax(allv)  # first (lowest-rank) maximum; stays on the device, no sync
        fctx.dctx = dctx
        fctx.save_for_backward(owner)
        return allv.max().reshape(local_max.shape).to(local_max.dtype)

    @staticmethod
    def backward(fctx, grad: torch.Tensor):
        import torch.distributed as dist

        (owner,) = fctx.saved_tensors
        dctx = fctx.dctx
        total = grad.detach().clone().contiguous()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=dctx.group)
        mine = (owner == dctx.rank).to(total.dtype)
        return total * mine, None, None


def batch_max(t: torch.Tensor) -> torch.Tensor:
    """Maximum of ``t`` over the *global* batch (a scalar).

    Single process, or outside a distributed training step: ``t.max()``. Inside one: the maximum
    over all ranks' shards of the global batch; the gradient reaches only the rank owning the
    arg-max (lowest rank on ties), which gets the upstream gradients of all ranks summed, so that
    the averaged parameter gradient equals the single-process gradient of ``max``.
    """
    ctx = _CURRENT
    local = t.max()
    if ctx is None or ctx.world_size == 1 or not ctx.in_step:
        return local
    return _GlobalMax.apply(local, ctx, ctx.empty_shard)


def reduce_stats_(*tensors: torch.Tensor, count: int | None = None) -> int | None:
    """Sum additive statistics over ranks, in place, when the data they were computed from is a shard.

    Call it on sums over rows (``Phi^T Phi``, ``Phi^T y``, ``y^T y``, ...) right after computing
    them from the rows a model was handed. ``count`` (the number of those rows) is summed too and
    returned (unchanged without an active distributed session). One all-reduce of one buffer.
    """
    ctx = _CURRENT
    if ctx is None or not ctx.data_is_shard:
        return count
    import torch.distributed as dist

    dev = comm_device(ctx)
    flat = [t.detach().reshape(-1).to(device=dev, dtype=torch.float64) for t in tensors]
    if count is not None:
        flat.append(torch.tensor([float(count) if not ctx.empty_shard else 0.0], dtype=torch.float64, device=dev))
    if ctx.empty_shard:
        flat = [torch.zeros_like(f) for f in flat[: len(tensors)]] + flat[len(tensors) :]
    buf = torch.cat(flat)
    dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=ctx.group)
    off = 0
    with torch.no_grad():
        for t in tensors:
            k = t.numel()
            t.copy_(buf[off : off + k].reshape(t.shape).to(device=t.device, dtype=t.dtype))
            off += k
    if count is not None:
        return int(round(float(buf[off].item())))
    return None


def reduce_gradients(params: list[torch.Tensor], ctx, extra: torch.Tensor | None = None,
                     average: bool = False) -> torch.Tensor | None:
    """All-reduce the gradients of ``params`` over ranks in one flat float64 buffer: their sum (``average``: their
    mean). ``extra`` (a float64 vector, e.g. a loss share and a failure flag) rides along and is returned summed."""
    import torch.distributed as dist

    params = [p for p in params if p.requires_grad]
    if not params and extra is None:
        return None
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    dev = grads[0].device if grads else extra.device
    parts = [g.reshape(-1).to(torch.float64) for g in grads]
    if extra is not None:
        parts.append(extra.reshape(-1).to(device=dev, dtype=torch.float64))
    buf = torch.cat(parts)
    if ctx.backend != "nccl" and dev.type != "cpu":  # pragma: no cover
        buf = buf.cpu()
    dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=ctx.group)
    buf = buf.to(dev)
    if average:
        buf = buf / ctx.world_size
    off = 0
    for p, g in zip(params, grads, strict=True):
        k = g.numel()
        p.grad = buf[off : off + k].reshape(g.shape).to(g.dtype)
        off += k
    return None if extra is None else buf[off:]


def local_grad_scale() -> float:
    """Factor for gradient contributions a model computes from its own rows (``W`` on a shard, else 1).

    The trainer *averages* gradients over ranks (like DDP); a contribution that must be *summed*
    over ranks (the second pass of the chunked exact-MML step) is therefore multiplied by ``W``.
    """
    ctx = _CURRENT
    return float(ctx.world_size) if ctx is not None and ctx.data_is_shard else 1.0


def splits_terms() -> bool:
    """Whether a model's per-point terms are split over ranks right now (inside a distributed step, W > 1)."""
    ctx = _CURRENT
    return ctx is not None and ctx.world_size > 1 and ctx.in_step


def own_chunks(n: int, chunk: int) -> range:
    """Starts of the chunks of ``n`` per-point terms (``range(0, n, chunk)``) that this rank computes.

    Outside a distributed step: all of them. Inside one: a contiguous ``1/W`` of the *single-process* chunks
    (``torch.tensor_split`` sizes), so every chunk is computed exactly as in one process (same batched
    Cholesky, same jitter decision) and only the order of the chunk sums differs. A rank may get none.
    """
    starts = range(0, n, chunk)
    if not splits_terms():
        return starts
    W, r = _CURRENT.world_size, _CURRENT.rank
    q, rem = divmod(len(starts), W)
    lo = r * q + min(r, rem)
    return starts[lo : lo + q + (1 if r < rem else 0)]


def count_once(t: torch.Tensor) -> torch.Tensor:
    """``t`` on rank 0 and zero elsewhere inside a distributed step, else ``t``: a global term of a loss whose
    ranks' shares are summed (the loss of the dbk-nn two-pass step, computed whole on every rank)."""
    if not splits_terms() or _CURRENT.rank == 0:
        return t
    return torch.zeros_like(t)
