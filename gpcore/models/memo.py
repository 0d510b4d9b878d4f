"""Values remembered with the exact point they were computed at.

torch's L-BFGS re-applies the same update to reach the point its line search accepted, so that point equals, bit for
bit, one it has evaluated. Two users: :func:`gpcore.models.training._lbfgs_step` returns the stored loss and gradients
when the next iteration starts there, and ``dbk-nn``'s posterior after an iteration (validation, every epoch) reuses
the sums over all training rows its step took there (docs/methods/dbknn.md). A point that differs in any bit is a
miss."""

from __future__ import annotations

import torch


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


class PointMemo:
    """The last ``size`` (point, value) pairs; a point is a tuple of tensors (copied) and plain values."""

    def __init__(self, size: int = 4):
        self.size = size
        self.entries: list[tuple[tuple, object]] = []

    @staticmethod
    def _copy(point) -> tuple:
        return tuple(t.detach().clone() if isinstance(t, torch.Tensor) else t for t in point)

    def put(self, point, value) -> None:
        self.entries = [*self.entries[-(self.size - 1):], (self._copy(point), value)] if self.size > 0 else []

    def get(self, point):
        """The value stored with exactly ``point`` (same length, every item equal), newest first; else None."""
        for key, value in reversed(self.entries):
            if len(key) == len(point) and all(_same(a, b) for a, b in zip(key, point, strict=True)):
                return value
        return None

    def clear(self) -> None:
        self.entries = []
