"""Saved model files: integer index buffers are stored narrow and come back as the module's dtype."""

from __future__ import annotations

import torch

from gpcore.models.io import _compact


def test_index_tensors_are_saved_in_the_narrowest_integer_type_that_holds_them():
    assert _compact(torch.tensor([-1, 32767])).dtype == torch.int16
    assert _compact(torch.tensor([-32769, 5])).dtype == torch.int32
    assert _compact(torch.tensor([-1, 32768])).dtype == torch.int32
    assert _compact(torch.tensor([0, 2**31])).dtype == torch.int64  # too wide for int32: kept
    assert _compact(torch.tensor([0.5, 2.0**40])).dtype == torch.float32  # floats untouched
    assert _compact(torch.zeros(0, dtype=torch.int64)).dtype == torch.int64
    big = torch.arange(-1, 70_000)
    assert torch.equal(_compact(big).to(torch.int64), big)
