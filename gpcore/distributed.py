"""Distributed training across processes and machines (``torchrun`` + DistributedDataParallel).

Launch any mini-batch model on N processes of one machine, or across machines::

    torchrun --nproc_per_node=4 -m gpcore fit --data FILE --y COL --model dbk --out RUN --distributed

Inside, :func:`init_distributed` reads torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``) and picks the backend from the device the models train on: NCCL
when that is a CUDA GPU (each process takes GPU ``LOCAL_RANK``), gloo on CPUs -- also on a machine with GPUs when
the run asks for ``device="cpu"``. :func:`session` activates the
context; while it is active, the training loop (:func:`gpcore.models.training.train`, called by
``GPModel.fit``) trains across all processes. Every process must make the same ``fit`` call; only rank 0
should write files. Method and measurements: docs/scaling.md.

Layering: the process-group primitives the models need (the current context, :func:`gpcore.comm.batch_max`,
:func:`gpcore.comm.reduce_stats_`, :func:`gpcore.comm.local_grad_scale`) live in :mod:`gpcore.comm`, below
the models; this module builds on it. The loop does not import this module either: it asks the current
context for its step strategy (:meth:`DistContext.training_steps`, a :class:`DistributedSteps`), so the
dependency points from here down to the models, never back.

Global-batch semantics (what "the same model as single-process training" means)
-------------------------------------------------------------------------------
With data replicated on every rank (``GPModel.fit``), the trainer draws the *same* seeded
permutation as a single process, cuts it into the same global batches of ``batch_size`` and gives
rank ``k`` the strided shard ``batch[k::W]`` (what ``DistributedSampler`` does over an epoch). Each
rank computes the model's ordinary per-point loss ``L_k = mean_{i in B_k} l_i + G`` (``G`` = the
global terms such as ``KL / n`` with the *full* training size ``n``) and back-propagates
``W * (b_k / b) * L_k``; DDP averages gradients over the ``W`` ranks, so the update is the
gradient of ``sum_k (b_k / b) L_k = mean_{i in B} l_i + G`` -- exactly the single-process loss on
the global batch ``B`` (the global terms are counted once because ``sum_k b_k / b = 1``). This
holds for every loss that is a mean of per-point terms plus global terms (DBK-dPPGP, SVGP, PPGP,
SV-DKL, PP-DKL, SOLVE-GP) with no change to the model, up to floating-point summation order.

Two kinds of loss need more than this, and the models use the collectives of :mod:`gpcore.comm`:

* **In-batch reductions** such as the dPPGP trace term's ``k_b = max_{j in B} ||phi_j||^2``:
  :func:`~gpcore.comm.batch_max` returns the maximum over the *global* batch (an all-gather of the per-rank
  maxima). Its gradient flows only to the rank that owns the arg-max (the lowest rank on a tie),
  which receives the sum over ranks of the upstream gradients (an all-reduce in the backward), so
  the parameter gradient equals the single-process one. Outside a distributed step it is
  ``t.max()``.
* **Full-batch statistics** such as exact DBK-MML's ``A = Phi^T Phi``, ``Phi^T y``, ``Phi^T 1``:
  :func:`~gpcore.comm.reduce_stats_` all-reduces (sums) them in place, and gradient contributions computed from
  a rank's own rows are multiplied by :func:`~gpcore.comm.local_grad_scale` because the trainer averages
  gradients over ranks. Full-batch models declare support with ``distributed_full_batch = True``
  and are stepped through their own ``_step`` with a manual gradient all-reduce (no DDP wrapper,
  since the two-pass step calls ``backward`` several times).

* **Sums of per-point terms needing their neighbours' rows** (the Vecchia likelihood of ``vecchia``, ``dbk-nn``;
  ``distributed_own_share = True``): every rank gets all the rows, computes the chunks :func:`~gpcore.comm.own_chunks`
  gives it, and one all-reduce *sums* the loss shares and gradients, so every optimiser step and every L-BFGS
  closure evaluation is identical on all ranks (:meth:`DistributedSteps._own_share_step`; docs/scaling.md).

Losses that couple all pairs of points of a batch (SoftKI's batch marginal likelihood, ``b x b``)
cannot be split this way: each rank uses its shard (``b / W`` points) as its batch and the update
is the weighted average of the ``W`` shard gradients -- single-process SoftKI with batch size
``b / W`` and gradient accumulation over ``W`` batches. Models that need all the data per step and
have no statistics to reduce (exact GP, CaGP) refuse to train distributed.

Data that does not fit one process: :func:`gpcore.run.sharded.fit_sharded` trains on per-rank shards (each rank
passes only its own rows, e.g. read lazily with :mod:`gpcore.data.parquet_stream`), with global
input/target scalers from all-reduced moments. Full-batch statistics are then exact; mini-batches
are drawn per rank (a rank-seeded permutation of its rows cut into ``ceil(n / batch_size)``
batches per epoch), which matches single-process training in distribution, not batch by batch. Models whose
terms need all the rows (``distributed_own_share``: ``vecchia``, ``dbk-nn``) refuse per-rank shards.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gpcore.comm import activate, comm_device, current, reduce_gradients, step_scope
from gpcore.errors import ConfigError

__all__ = [
    "DistContext",
    "barrier",
    "current",
    "init_distributed",
    "session",
    "shutdown",
]


@dataclass
class DistContext:
    """Who this process is in a distributed job, and how to talk to the others.

    Attributes
    ----------
    rank, world_size, local_rank : torchrun's ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``.
    backend : ``"nccl"`` or ``"gloo"``.
    device : the device this process trains on (``cuda:LOCAL_RANK`` with NCCL, else CPU).
    group : process group used by the model-level reductions (:func:`gpcore.comm.batch_max`,
        :func:`gpcore.comm.reduce_stats_`); separate from DDP's so their collectives never interleave.
    sharded : the data handed to ``fit`` is this rank's shard (:func:`gpcore.run.sharded.fit_sharded`), not a copy
        of the full training set.
    """

    rank: int
    world_size: int
    local_rank: int = 0
    backend: str = "gloo"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    group: Any = None
    sharded: bool = False
    # set by the trainer around one optimisation step
    in_step: bool = False
    empty_shard: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def data_is_shard(self) -> bool:
        """Whether the data a model is looking at right now is this rank's part of a larger set."""
        return self.world_size > 1 and (self.in_step or self.sharded)

    def training_steps(self, model, Xs: torch.Tensor, ys: torch.Tensor, ws: torch.Tensor | None = None):
        """The step strategy :func:`gpcore.models.training.train` uses on this rank (:class:`DistributedSteps`).

        The loop finds it on the current context (:func:`gpcore.comm.current`), so it never imports this module.
        """
        check_supported(model)
        if self.sharded and getattr(model, "distributed_own_share", False):
            raise ConfigError(
                f"{model.registry_name} needs every training row on every rank (its neighbour sets cross any split of "
                "the rows); train it with the data replicated (GPModel.fit inside a session), not fit_sharded"
            )
        n = Xs.shape[0]
        probe = (Xs[:8], ys[:8], n) if n > 0 else None
        cfg = model.config
        return DistributedSteps(model, self, n, cfg.batch_size, model.full_batch, cfg.seed, probe,
                                None if ws is None else ws[:8])


@contextlib.contextmanager
def session(ctx: DistContext | None, sharded: bool | None = None) -> Iterator[DistContext | None]:
    """Activate ``ctx`` so that ``GPModel.fit`` (:func:`gpcore.models.training.train`) trains across ranks."""
    prev_sharded = ctx.sharded if ctx is not None else None
    if ctx is not None and sharded is not None:
        ctx.sharded = sharded
    try:
        with activate(ctx):
            yield ctx
    finally:
        if ctx is not None:
            ctx.sharded = prev_sharded
            ctx.in_step = False
            ctx.empty_shard = False


# --------------------------------------------------------------------------------------------
# process groups
# --------------------------------------------------------------------------------------------


def auto_backend(device: str | torch.device = "auto") -> str:
    """``"nccl"`` when the models train on a CUDA GPU (``device`` as models take it: ``"auto"`` is the GPU when
    there is one) and NCCL is available, else ``"gloo"``: CPU tensors cannot travel over NCCL."""
    import torch.distributed as dist

    from gpcore.device import resolve_device

    if resolve_device(device).type == "cuda" and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def launched_by_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def init_distributed(backend: str = "auto", timeout_s: float = 1800.0, device: str | torch.device = "auto"
                     ) -> DistContext:
    """Join the job torchrun started (reads ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_*``).

    ``backend="auto"`` picks NCCL when ``device`` (the models' device setting) is a GPU (and binds this process to
    GPU ``LOCAL_RANK``) and gloo when it is the CPU. Reuses an already initialised default group. Raises
    :class:`ConfigError` when the process was not started by torchrun.
    """
    import torch.distributed as dist

    if not dist.is_available():
        raise ConfigError("this PyTorch build has no torch.distributed; install a standard build")
    if not dist.is_initialized():
        if not launched_by_torchrun():
            raise ConfigError(
                "--distributed needs the environment torchrun sets up (RANK, WORLD_SIZE, MASTER_ADDR, ...); "
                "launch with: torchrun --nproc_per_node=N -m gpcore fit ... --distributed"
            )
        backend = auto_backend(device) if backend == "auto" else backend
        if torch.cuda.is_available():  # one GPU per process; models on device "auto" use it
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    backend = dist.get_backend()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if backend == "nccl":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    group = dist.new_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    return DistContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        backend=backend,
        device=device,
        group=group,
    )


def shutdown() -> None:
    """Leave the process group (no-op when none is initialised)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier(ctx: DistContext | None = None) -> None:
    import torch.distributed as dist

    ctx = ctx or current()
    if ctx is None or ctx.world_size == 1:
        return
    if ctx.backend == "nccl":
        dist.barrier(group=ctx.group, device_ids=[ctx.device.index])
    else:
        dist.barrier(group=ctx.group)


# --------------------------------------------------------------------------------------------
# trainer support
# --------------------------------------------------------------------------------------------


class _LossModule(nn.Module):
    """Adapter so DDP sees ``model.module_``'s parameters and a forward returning the loss."""

    def __init__(self, model):
        super().__init__()
        self.inner = model.module_
        self._model = [model]  # not registered as a submodule

    def forward(self, xb, yb, n, wb=None):
        return self._model[0]._loss(xb, yb, n, wb)


def check_supported(model) -> None:
    """Raise :class:`ConfigError` for a model that cannot train distributed."""
    if model.full_batch and not getattr(model, "distributed_full_batch", False):
        raise ConfigError(
            f"{model.registry_name} trains on all the data at every step and has no distributed form; "
            "drop --distributed (or use a mini-batch model such as dbk, svgp, softki or solvegp, or vecchia)"
        )


def broadcast_module(module: nn.Module, ctx: DistContext) -> None:
    """Copy rank 0's parameters and buffers to every rank."""
    import torch.distributed as dist

    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            if ctx.backend == "nccl" or t.device.type == "cpu":
                dist.broadcast(t.data, src=0, group=ctx.group)
            else:  # pragma: no cover - gloo with CUDA tensors
                tmp = t.data.cpu()
                dist.broadcast(tmp, src=0, group=ctx.group)
                t.data.copy_(tmp)


def average_gradients(params: list[torch.Tensor], ctx: DistContext) -> None:
    """All-reduce the mean of the gradients of ``params`` over ranks (one flat buffer)."""
    reduce_gradients(params, ctx, average=True)


class DistributedSteps:
    """How :func:`gpcore.models.training.train` runs batches on one rank of a distributed job.

    Replicated data: each global batch (the single-process trainer's) is split ``batch[rank::W]``.
    Sharded data: each rank permutes its own rows (seeded by ``seed`` and rank) and cuts them into
    the same number of batches per epoch as a single process would have. Models with
    ``distributed_own_share`` get all the rows at every step and split their terms themselves
    (:meth:`_own_share_step`).
    """

    def __init__(self, model, ctx: DistContext, n_local: int, batch_size: int, full: bool, seed: int, probe=None,
                 probe_w: torch.Tensor | None = None):
        import torch.distributed as dist

        self._probe = probe  # (xb, yb, n): a few local rows to find unused parameters before wrapping in DDP
        self._probe_w = probe_w  # their weights (weighted fits)
        self.model = model
        self.ctx = ctx
        self.W = ctx.world_size
        self.full = full
        self.n_local = n_local
        dev = comm_device(ctx)
        if ctx.sharded:
            counts = torch.tensor([float(n_local)], dtype=torch.float64, device=dev)
            parts = [torch.empty_like(counts) for _ in range(self.W)]
            dist.all_gather(parts, counts, group=ctx.group)
            self.counts = [int(p.item()) for p in parts]
            self.n_global = sum(self.counts)
            self.steps = 1 if full else max(1, math.ceil(self.n_global / batch_size))
            self.gen = torch.Generator().manual_seed(seed * 1000003 + ctx.rank)
        else:
            self.counts = None
            self.n_global = n_local
            self.gen = torch.Generator().manual_seed(seed)
        self.batch_size = batch_size
        self.manual = model.full_batch  # full-batch models step themselves (two-pass statistics)
        # the model needs all the rows and computes its own share of the terms (vecchia, dbk-nn)
        self.own_share = self.manual and bool(getattr(model, "distributed_own_share", False))
        self.ddp = None
        if not self.manual:
            self.ddp = self._wrap_ddp()
        else:
            broadcast_module(model.module_, ctx)

    def _wrap_ddp(self):
        import inspect

        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapper = _LossModule(self.model)
        kwargs: dict = {"find_unused_parameters": self._has_unused_parameters()}
        if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
            kwargs["forward_sync_buffers"] = False  # buffers are prediction caches, not training state
        else:  # pragma: no cover - older torch
            kwargs["broadcast_buffers"] = False
        if self.ctx.backend == "nccl":
            kwargs["device_ids"] = [self.ctx.device.index]
        return DDP(wrapper, **kwargs)

    def _has_unused_parameters(self) -> bool:
        """Probe the loss once (RNG state restored) to see whether DDP must look for unused parameters."""
        import torch.distributed as dist

        model, ctx = self.model, self.ctx
        params = [p for p in model.module_.parameters() if p.requires_grad]
        if self._probe is None:
            return True
        xb, yb, n = self._probe
        cpu_state = torch.get_rng_state()
        cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        try:
            with step_scope(ctx):
                loss = model._loss(xb, yb, n, self._probe_w)
                grads = torch.autograd.grad(loss, params, allow_unused=True)
        finally:
            torch.set_rng_state(cpu_state)
            if cuda_state is not None:
                torch.cuda.set_rng_state_all(cuda_state)
        flag = torch.tensor([1.0 if any(g is None for g in grads) else 0.0], device=comm_device(ctx))
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=ctx.group)
        return bool(flag.item() > 0)

    # ----------------------------------------------------------------- batches
    def epoch_batches(self, device) -> list[tuple[torch.Tensor, int, int]]:
        """``(local_index, b_local, b_global)`` per step of the coming epoch."""
        if not self.ctx.sharded:
            if self.full:
                idx = torch.arange(self.n_local, device=device)
                if self.own_share:  # every rank all the rows; the model takes its share of the terms
                    return [(idx, self.n_local, self.n_local)]
                return [(idx[self.ctx.rank :: self.W], len(range(self.ctx.rank, self.n_local, self.W)), self.n_local)]
            perm = torch.randperm(self.n_local, generator=self.gen).to(device)
            out = []
            for gb in torch.split(perm, self.batch_size):
                b = gb.shape[0]
                out.append((gb[self.ctx.rank :: self.W], len(range(self.ctx.rank, b, self.W)), b))
            return out
        if self.full:
            return [(torch.arange(self.n_local, device=device), self.n_local, self.n_global)]
        perm = torch.randperm(self.n_local, generator=self.gen).to(device)
        sizes = [_split_sizes(c, self.steps) for c in self.counts]
        locs = torch.tensor_split(perm, self.steps)
        return [(locs[k], sizes[self.ctx.rank][k], sum(s[k] for s in sizes)) for k in range(self.steps)]

    # ----------------------------------------------------------------- one step
    def step(self, Xs, ys, local_idx, b_local: int, b_global: int, n: int, ws=None,
             global_loss: bool = False) -> torch.Tensor:
        """Forward + backward of this rank's shard; returns its share ``(b_k / b) L_k`` (detached), or with
        ``global_loss`` the loss summed over ranks (the same on every rank: what an L-BFGS closure returns).

        ``ws``: this rank's rows' weights (weighted fits); the loss gets those of the shard's rows."""
        if self.own_share:  # local_idx is all the rows (epoch_batches)
            return self._own_share_step(Xs, ys, n, ws, global_loss)
        empty = b_local == 0
        if empty:  # keep every rank in the collectives; contributes nothing
            xb, yb = Xs[:1], ys[:1]
        else:
            xb, yb = Xs[local_idx], ys[local_idx]
        wb = None if ws is None else (ws[:1] if empty else ws[local_idx])
        share = b_local / b_global
        with step_scope(self.ctx, empty=empty):
            if self.manual:
                loss = self.model._step(xb, yb, n, wb)
                average_gradients(list(self.model.module_.parameters()), self.ctx)
            else:
                loss = self.ddp(xb, yb, n, wb)
                (loss * (self.W * share)).backward()
                loss = loss.detach()
        if global_loss:
            return self.reduce_epoch_total(loss * share)
        return loss * share

    def _own_share_step(self, xb, yb, n: int, wb, global_loss: bool) -> torch.Tensor:
        """One step of a ``distributed_own_share`` model (docs/scaling.md, "Vecchia and dbk-nn"): ``model._step``
        computes this rank's chunks and returns its loss share; one all-reduce sums gradients, loss shares and a
        failure flag. A factorisation failing on any rank raises ``LinAlgError`` on every rank (zero gradients)."""
        params = [p for p in self.model.module_.parameters() if p.requires_grad]
        failed = 0.0
        with step_scope(self.ctx):
            try:
                share = self.model._step(xb, yb, n, wb).detach().to(torch.float64)
            except torch.linalg.LinAlgError:
                failed, share = 1.0, torch.zeros((), dtype=torch.float64, device=xb.device)
                for p in params:
                    p.grad = None
        extra = torch.stack([share.reshape(()), torch.tensor(failed, dtype=torch.float64, device=share.device)])
        total, n_failed = reduce_gradients(params, self.ctx, extra).unbind()
        if n_failed.item() > 0:
            for p in params:
                p.grad.zero_()
            raise torch.linalg.LinAlgError("a factorisation failed on one of the ranks (non-finite or far from "
                                           "positive-definite parameters)")
        return total if global_loss else share

    def reduce_epoch_total(self, total: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        buf = total.reshape(-1).to(comm_device(self.ctx))
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self.ctx.group)
        return buf.reshape(total.shape).to(total.device)

    # ----------------------------------------------------------------- epoch-level agreement
    def validation_metrics(self, Xs, ys, Xv, yv, ws=None, wv=None, rows=False) -> tuple:
        """Validation NLL / RMSE over all ranks' validation rows (replicated: the strided shard); ``rows=True``
        also returns this rank's per-row NLLs."""
        import torch.distributed as dist

        from gpcore.models.linalg import gaussian_nll

        model = self.model
        with torch.no_grad():
            if model.needs_finalize:  # own share (dbk-nn): its sums split over ranks like a step's
                with step_scope(self.ctx) if self.own_share else contextlib.nullcontext():
                    model.finalize(Xs, ys, ws)
            if not self.ctx.sharded:
                Xv, yv = Xv[self.ctx.rank :: self.W], yv[self.ctx.rank :: self.W]
                wv = None if wv is None else wv[self.ctx.rank :: self.W]
            mean, var_f = model.predict_scaled(Xv)
            var_y = var_f + model.likelihood.variance(wv)
            per_row = gaussian_nll(yv, mean, var_y)
            stats = torch.stack(
                [
                    per_row.double().sum(),
                    (yv - mean).double().pow(2).sum(),
                    torch.tensor(float(yv.shape[0]), dtype=torch.float64, device=mean.device),
                ]
            ).to(comm_device(self.ctx))
        dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=self.ctx.group)
        s_nll, s_se, cnt = (float(v) for v in stats.cpu())
        cnt = max(cnt, 1.0)
        out = (s_nll / cnt + math.log(model.y_std_), math.sqrt(s_se / cnt) * model.y_std_)
        return (*out, per_row) if rows else out

    def agree(self, *flags: bool) -> list[bool]:
        """Rank 0's flags (cancel, out of time, ...) on every rank."""
        import torch.distributed as dist

        buf = torch.tensor([1.0 if f else 0.0 for f in flags], dtype=torch.float64, device=comm_device(self.ctx))
        dist.broadcast(buf, src=0, group=self.ctx.group)
        return [bool(v > 0.5) for v in buf.cpu()]

    def close(self) -> None:
        self.ddp = None


def _split_sizes(n: int, k: int) -> list[int]:
    """Chunk sizes of ``torch.tensor_split`` of ``n`` items into ``k`` chunks."""
    q, r = divmod(n, k)
    return [q + 1 if i < r else q for i in range(k)]

