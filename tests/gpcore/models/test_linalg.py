"""Blocked triangular products against the dense ones (float64, values and gradients)."""

from __future__ import annotations

import pytest
import torch

from gpcore.models.linalg import triangular_row_sqnorm


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("b,r,block", [(37, 300, 64), (20, 130, 128), (9, 64, 128), (5, 256, 32)])
def test_triangular_row_sqnorm_equals_dense_values_and_gradients(lower, b, r, block):
    gen = torch.Generator().manual_seed(r + b)
    phi = torch.randn(b, r, dtype=torch.float64, generator=gen, requires_grad=True)
    A = torch.randn(r, r, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(b, dtype=torch.float64, generator=gen)
    F = torch.tril(A) if lower else torch.triu(A)
    v = triangular_row_sqnorm(phi, F, lower=lower, block=block)
    ref = (phi @ F).pow(2).sum(-1)
    torch.testing.assert_close(v, ref, rtol=1e-12, atol=1e-10)
    g = torch.autograd.grad((v * w).sum(), (phi, A))
    g_ref = torch.autograd.grad((ref * w).sum(), (phi, A))
    torch.testing.assert_close(g[0], g_ref[0], rtol=1e-11, atol=1e-10)
    torch.testing.assert_close(g[1], g_ref[1], rtol=1e-11, atol=1e-10)


def test_triangular_row_sqnorm_gradcheck():
    phi = torch.randn(4, 10, dtype=torch.float64, requires_grad=True)
    F = torch.tril(torch.randn(10, 10, dtype=torch.float64)).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda p, f: triangular_row_sqnorm(p, f, True, 3), (phi, F))
    U = torch.triu(torch.randn(10, 10, dtype=torch.float64)).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda p, f: triangular_row_sqnorm(p, f, False, 4), (phi, U))
