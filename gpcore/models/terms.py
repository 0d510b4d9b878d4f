"""Which training points' likelihood terms a Vecchia-type objective sums (docs/methods/vecchia.md, "Hyperparameters
from a subset of the terms").

The Vecchia log-likelihood is a sum of one term per ordered training point, ``log p(y_i | y_N(i))``. Above
``likelihood_points`` training points (or, with ``likelihood_fraction`` below 1, that fraction of them but at least
:data:`MIN_FRACTION_TERMS`: :func:`term_count`) the hyperparameters are fitted on a fixed, seeded random subset ``K`` of
``k`` of those terms, each with its full-data neighbour set, scaled by ``n / k``: an unbiased estimate of the
sum whose maximiser is consistent, its sampling error ``O(1 / sqrt(k))`` far below what a test NLL can see at the
sizes where it applies (the subsampled Vecchia likelihood of Cao, Guinness, Genton & Katzfuss 2022, JMLR 23,
whose mini-batches this fixes to one batch so that L-BFGS sees a deterministic objective). The posterior
afterwards conditions on every row, as without the subset.

``dbk-nn``'s hybrid likelihood is not a sum of per-point terms: its sums ``U^T U``, ``U^T u``, ``|u|^2`` and
``sum log Dv`` are, and are estimated the same way; the quadratic form in ``U^T u`` then carries the estimate's own
variance, at most ``(n / k - 1) / 2`` nats per feature direction and nearly flat in the hyperparameters once the
features are well determined (docs/methods/dbknn.md, "Likelihood").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from gpcore.comm import own_chunks

#: the fewest terms a fraction (``likelihood_fraction``) cuts a fit to: below it a subset saves seconds and costs
#: accuracy (docs/methods/dbknn.md, "Likelihood")
MIN_FRACTION_TERMS = 20_000


def term_count(n: int, points: int, fraction: float = 1.0) -> int:
    """How many of ``n`` terms a fit sums: ``min(points, max(MIN_FRACTION_TERMS, ceil(fraction n)))``, at most ``n``;
    ``points = 0``: all ``n``. With ``fraction = 1`` that is ``min(points, n)``."""
    if points <= 0:
        return n
    return min(n, points, max(MIN_FRACTION_TERMS, int(np.ceil(fraction * n))))


def objective_rows(n: int, k: int, seed: int, device) -> torch.Tensor | None:
    """Sorted ordered-row indices of the terms the objective sums: ``None`` (all ``n``) unless ``0 < k < n``; a
    seeded draw, so every rank of a distributed fit draws the same rows."""
    if k <= 0 or k >= n:
        return None
    rows = np.sort(np.random.default_rng([seed, n, k]).choice(n, size=k, replace=False))
    return torch.as_tensor(rows, dtype=torch.long, device=device)


class Terms:
    """The objective's terms: all ``n`` ordered rows, or the subset ``rows``; :meth:`chunks` yields this rank's
    chunks of them as ``(indices, first index)`` and :attr:`scale` is ``n / k``."""

    def __init__(self, n: int, rows: torch.Tensor | None = None):
        self.n, self.rows = n, rows
        self.k = n if rows is None else int(rows.shape[0])
        self.scale = n / self.k if self.k else 1.0
        self._first = None if rows is None else rows.cpu().numpy()  # host copy: no sync per chunk

    def weigh(self, x):
        """``x`` (a sum over this object's terms) as an estimate of the sum over all ``n``: times ``n / k`` for a
        subset, ``x`` itself otherwise (bit for bit)."""
        return x if self.rows is None else x * self.scale

    def chunks(self, chunk: int, device, own: bool = True) -> Iterator[tuple[torch.Tensor, int]]:
        """This rank's chunks (:func:`gpcore.comm.own_chunks` over the ``k`` terms); ``own=False``: all of them."""
        for i in own_chunks(self.k, chunk) if own else range(0, self.k, chunk):
            j = min(i + chunk, self.k)
            if self.rows is None:
                yield torch.arange(i, j, device=device), i
            else:
                yield self.rows[i:j], int(self._first[i])


@contextmanager
def subsampled(model, n: int):
    """While fitting: the model's objective sums the terms of :func:`term_count` rows (at most ``likelihood_points``,
    module docstring); afterwards every term again (the posterior, the saved model)."""
    cfg = model.config
    k = term_count(n, cfg.likelihood_points, cfg.likelihood_fraction)
    rows = objective_rows(n, k, cfg.seed, model.module_.X_train.device)
    model._terms = Terms(n, rows)
    try:
        yield model._terms
    finally:
        model._terms = None


@contextmanager
def every_term(model):
    """Inside a fit: every row's terms for a while (``dbk-nn``'s one-pass screen, docs/methods/dbknn.md)."""
    saved, model._terms = getattr(model, "_terms", None), None
    try:
        yield
    finally:
        model._terms = saved


def current_terms(model) -> Terms:
    """The terms the model's objective sums now: the fitting subset, or all ordered training rows."""
    terms = getattr(model, "_terms", None)
    return terms if terms is not None else Terms(model.module_.X_train.shape[0])
