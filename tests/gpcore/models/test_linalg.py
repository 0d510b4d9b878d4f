"""Blocked triangular products and sparse row combinations against the dense ones (float64, values and gradients)."""

from __future__ import annotations

import pytest
import torch

from gpcore.models.linalg import combine_rows, triangular_row_sqnorm


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


@pytest.mark.parametrize("repeats", [False, True])
def test_combine_rows_equals_the_gathered_product_values_and_gradients(repeats):
    """dbk-nn's ``U = B Phi`` by sparse kernels: the einsum over the gathered rows, gradients in both inputs;
    repeated columns in a row (the clamped padding of a Vecchia group) add up."""
    gen = torch.Generator().manual_seed(7)
    n, b, k, p = 50, 13, 6, 9
    G = torch.randint(0, n, (b, k), generator=gen)
    if repeats:
        G[:4, :3] = 0
    ell = torch.randn(b, k, dtype=torch.float64, generator=gen, requires_grad=True)
    Phi = torch.randn(n, p, dtype=torch.float64, generator=gen, requires_grad=True)
    g_out = torch.randn(b, p, dtype=torch.float64, generator=gen)
    out = combine_rows(ell, G, Phi)
    ref = torch.einsum("bk,bkp->bp", ell, Phi[G])
    torch.testing.assert_close(out, ref, rtol=1e-13, atol=1e-13)
    g = torch.autograd.grad((out * g_out).sum(), (ell, Phi))
    g_ref = torch.autograd.grad((ref * g_out).sum(), (ell, Phi))
    torch.testing.assert_close(g[0], g_ref[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g[1], g_ref[1], rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda e, f: combine_rows(e, G, f), (ell, Phi))
