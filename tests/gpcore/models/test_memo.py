"""PointMemo: values come back only for exactly the point they were stored with (gpcore/models/memo.py)."""

from __future__ import annotations

import torch

from gpcore.models.memo import PointMemo


def test_a_value_comes_back_for_the_same_point_and_not_for_a_point_one_ulp_away():
    a = torch.tensor([0.1, 0.2], dtype=torch.float64)
    memo = PointMemo()
    memo.put((a, None, 5), "v")
    assert memo.get((a.clone(), None, 5)) == "v"
    assert memo.get((torch.nextafter(a, torch.full_like(a, 1.0)), None, 5)) is None
    assert memo.get((a, None, 6)) is None  # a plain item differs
    assert memo.get((a.float(), None, 5)) is None  # same values, other dtype
    assert memo.get((a, torch.ones(2), 5)) is None  # a tensor where None was
    assert memo.get((a,)) is None  # another length


def test_the_stored_point_is_a_copy_and_only_the_last_size_entries_stay():
    a = torch.zeros(3)
    memo = PointMemo(size=2)
    memo.put((a,), 1)
    a += 1.0  # the caller moves its parameters in place after storing
    assert memo.get((a,)) is None and memo.get((torch.zeros(3),)) == 1
    memo.put((torch.ones(1),), 2)
    memo.put((torch.full((1,), 2.0),), 3)
    assert memo.get((torch.zeros(3),)) is None  # pushed out
    assert memo.get((torch.ones(1),)) == 2 and memo.get((torch.full((1,), 2.0),)) == 3
    memo.clear()
    assert memo.get((torch.ones(1),)) is None
    off = PointMemo(size=0)
    off.put((torch.ones(1),), 1)
    assert off.get((torch.ones(1),)) is None
