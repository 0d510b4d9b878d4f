"""Fixtures shared by the model tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def float64_default():
    """Dense oracles in float64; torch's default dtype is restored afterwards so other modules see theirs."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)
