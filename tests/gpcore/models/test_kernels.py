"""The fused group kernel (``gpcore.models.kernels.group_kernel``) against the plain kernel and autograd."""

import pytest
import torch

from gpcore.models.kernels import KERNEL_NAMES, group_kernel, stationary_sqdist


def _dense(name, X, ell, os_):
    """The kernel matrix of one group by direct differences (the matmul form of ``stationary`` loses ~1e-8 at
    r = 0 for Matérn-1/2 to cancellation)."""
    d2 = (((X[:, None, :] - X[None, :, :]) / ell) ** 2).sum(-1)
    return stationary_sqdist(name, d2, os_)


def _groups(seed=0, b=7, k=9, d=2):
    g = torch.Generator().manual_seed(seed)
    Xg = torch.rand(b, k, d, generator=g, dtype=torch.float64)
    Xg[:, 4] = Xg[:, 3]  # duplicate points: distance 0 off the diagonal
    return Xg


@pytest.mark.parametrize("name", KERNEL_NAMES)
@pytest.mark.parametrize("ard", [False, True])
def test_group_kernel_equals_dense_kernel_and_its_autograd(name, ard):
    Xg = _groups()
    ell0 = torch.tensor([0.31, 0.57] if ard else [0.4], dtype=torch.float64)
    os0 = torch.tensor(1.7, dtype=torch.float64)
    G = torch.randn(Xg.shape[0], Xg.shape[1], Xg.shape[1], generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64)

    ell, os_ = ell0.clone().requires_grad_(), os0.clone().requires_grad_()
    ref = torch.stack([_dense(name, x, ell, os_) for x in Xg])
    g_ref = torch.autograd.grad((ref * G).sum(), [ell, os_])

    ell, os_ = ell0.clone().requires_grad_(), os0.clone().requires_grad_()
    C = group_kernel(name, Xg, ell, os_)
    g = torch.autograd.grad((C * G).sum(), [ell, os_])

    torch.testing.assert_close(C, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(g, g_ref, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_group_kernel_gradcheck():
    Xg = _groups(b=3, k=5)
    ell = torch.tensor([0.5, 0.8], dtype=torch.float64, requires_grad=True)
    os_ = torch.tensor(1.2, dtype=torch.float64, requires_grad=True)
    for name in KERNEL_NAMES:
        assert torch.autograd.gradcheck(lambda e, o, n=name: group_kernel(n, Xg + 0.01 * torch.arange(5.)[:, None],
                                                                         e, o), (ell, os_))


def test_group_kernel_rejects_unknown_kernel():
    with pytest.raises(ValueError, match="unknown kernel"):
        group_kernel("cauchy", _groups(), torch.tensor([0.3]), torch.tensor(1.0))


@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_group_kernel_without_graph_is_the_same(name):
    Xg = _groups(seed=3)
    ell, os_ = torch.tensor([0.45, 0.2], dtype=torch.float64), torch.tensor(0.8, dtype=torch.float64)
    with torch.no_grad():
        C = group_kernel(name, Xg, ell, os_)
    ref = torch.stack([_dense(name, x, ell, os_) for x in Xg])
    torch.testing.assert_close(C, ref, rtol=1e-12, atol=1e-12)
