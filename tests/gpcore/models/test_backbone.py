"""The backbone's factored first block equals the plain modules (values and gradients, float64)."""

from __future__ import annotations

import pytest
import torch

from gpcore.models.backbone import ResNetBackbone


def _randomised(d, h, blocks, seed=0):
    torch.manual_seed(seed)
    g = ResNetBackbone(d, h, blocks).double()
    with torch.no_grad():  # move LayerNorm off its identity init so gamma and beta matter
        for p in g.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return g


@pytest.mark.parametrize("d,h,blocks", [(2, 16, 2), (3, 64, 1), (2, 8, 3)])
def test_factored_first_block_equals_reference_forward_and_gradients(d, h, blocks):
    g = _randomised(d, h, blocks)
    assert g.factor_first
    x = torch.rand(50, d, dtype=torch.float64) * 4 - 2
    w = torch.randn(50, h, dtype=torch.float64)
    out = g(x)
    ref = g.reference_forward(x)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad((out * w).sum(), list(g.parameters()))
    grads_ref = torch.autograd.grad((ref * w).sum(), list(g.parameters()))
    for (name, _), a, b in zip(g.named_parameters(), grads, grads_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11, msg=f"gradient of {name}")


def test_wide_inputs_and_no_blocks_use_the_plain_path():
    assert not ResNetBackbone(8, 16).factor_first
    assert not ResNetBackbone(2, 16, blocks=0).factor_first
    g = _randomised(2, 16, 0)
    x = torch.rand(7, 2, dtype=torch.float64)
    torch.testing.assert_close(g(x), g.reference_forward(x))


def test_state_dict_names_are_those_of_the_plain_modules():
    names = set(ResNetBackbone(2, 16).state_dict())
    assert {"inp.weight", "blocks.0.norm.weight", "blocks.0.lin1.weight", "blocks.1.lin2.bias", "norm.bias"} <= names


def test_float32_inference_path_matches_the_plain_modules():
    """No-grad float32 on CPU takes the fused oneDNN linear when available; same numbers to fp32 rounding."""
    import gpcore.models.backbone as bb

    g = _randomised(2, 64, 2).float()
    x = torch.rand(300, 2) * 2 - 1
    with torch.no_grad():
        fast = g(x)
        ref = g.reference_forward(x)
    torch.testing.assert_close(fast, ref, rtol=2e-5, atol=2e-6)
    lin = torch.nn.Linear(64, 32)
    a = torch.randn(50, 64)
    with torch.no_grad():
        torch.testing.assert_close(bb.linear_act(a, lin, "silu"), torch.nn.functional.silu(lin(a)), rtol=2e-5,
                                   atol=2e-6)
        torch.testing.assert_close(bb.linear_act(a, lin), lin(a), rtol=2e-5, atol=2e-6)


def test_fused_linear_falls_back_to_the_plain_path_when_the_kernel_fails(monkeypatch):
    import gpcore.models.backbone as bb

    def broken(*args):
        raise RuntimeError("no oneDNN here")

    monkeypatch.setattr(bb, "_ONEDNN_LINEAR", broken)
    lin = torch.nn.Linear(8, 4)
    a = torch.randn(5, 8)
    with torch.no_grad():
        out = bb.linear_act(a, lin, "silu")
    torch.testing.assert_close(out, torch.nn.functional.silu(lin(a)))
    assert bb._ONEDNN_LINEAR is False  # not retried
    # with autograd the plain modules are used (the fused kernel has no backward)
    monkeypatch.setattr(bb, "_ONEDNN_LINEAR", broken)
    a.requires_grad_(True)
    bb.linear_act(a, lin, "silu").sum().backward()
    assert a.grad is not None and bb._ONEDNN_LINEAR is broken
