"""The ResNet backbone ``g: R^d -> R^h`` shared by DBK and the deep-kernel models (docs/methods/dbk.md §2.2).

``z0 = W_in x + b_in``; two pre-norm residual blocks ``z + W2 SiLU(W1 LN(z) + b1) + b2`` with
inner width ``h`` and no dropout; output ``SiLU(LN(z))``.

Low-dimensional inputs (``d`` much smaller than ``h``, e.g. lon/lat) use an exact factorisation of
the first block's ``W1 LN(z0)``: ``z0`` lies in a ``d``-dimensional affine subspace, so

    W1 LN(z0) + b1 = (x M + v) / sigma(z0) + w,
    M = W_c^T diag(gamma) W1^T (d x h),  v = W1 diag(gamma) b_c,  w = W1 beta + b1,

with ``W_c = W_in - mean_rows(W_in)``, ``b_c = b_in - mean(b_in)`` (the centring of LayerNorm) and
``sigma = sqrt(var(z0) + eps)``. That replaces one ``b x h x h`` matmul per batch (and its two
gradient products) by ``d x h x h`` work that does not grow with the batch. The parameters and
the state dict are those of the plain modules; the result equals the unfactored forward to
rounding (tests/gpcore/models/test_backbone.py).
"""

from __future__ import annotations

import torch
from torch import nn

#: oneDNN's fused linear (+ activation) kernel, resolved on first use; ``False`` when unavailable
_ONEDNN_LINEAR = None


def _onednn_linear():
    global _ONEDNN_LINEAR
    if _ONEDNN_LINEAR is None:
        try:
            _ONEDNN_LINEAR = torch.ops.mkldnn._linear_pointwise if torch.backends.mkldnn.is_available() else False
        except (AttributeError, RuntimeError):
            _ONEDNN_LINEAR = False
    return _ONEDNN_LINEAR


def linear_act(x: torch.Tensor, lin: nn.Linear, act: str | None = None) -> torch.Tensor:
    """``act(lin(x))`` with ``act`` in ``(None, "silu")``.

    For CPU float32 inference (no autograd) this is one oneDNN call with the bias and SiLU fused
    into the matmul: no ``b x out`` bias copy and no separate activation pass. The kernel is the
    one ``torch.compile`` uses for CPU linears (``torch.ops.mkldnn._linear_pointwise``, a private
    op): when it is missing or fails, the plain ``nn.Linear`` path is used from then on. Both agree
    to float32 rounding (tests).
    """
    if not torch.is_grad_enabled() and x.device.type == "cpu" and x.dtype == torch.float32:
        op = _onednn_linear()
        if op:
            try:
                return op(x.contiguous(), lin.weight, lin.bias, "swish" if act == "silu" else "none", [], "")
            except RuntimeError:
                global _ONEDNN_LINEAR
                _ONEDNN_LINEAR = False
    out = lin(x)
    return nn.functional.silu(out, inplace=not torch.is_grad_enabled()) if act == "silu" else out


class ResidualBlock(nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.norm = nn.LayerNorm(h)
        self.lin1 = nn.Linear(h, h)
        self.lin2 = nn.Linear(h, h)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z + linear_act(linear_act(self.norm(z), self.lin1, "silu"), self.lin2)


class ResNetBackbone(nn.Module):
    """``n x d`` -> ``n x h`` feature extractor (Gorishniy-style ResNet, 2 blocks by default)."""

    #: use the factored first block when ``d * FACTOR_RATIO <= h``
    FACTOR_RATIO = 4

    def __init__(self, d: int, h: int, blocks: int = 2):
        super().__init__()
        self.inp = nn.Linear(d, h)
        self.blocks = nn.ModuleList(ResidualBlock(h) for _ in range(blocks))
        self.norm = nn.LayerNorm(h)
        self.factor_first = len(self.blocks) > 0 and d * self.FACTOR_RATIO <= h

    def _first_block(self, x: torch.Tensor) -> torch.Tensor:
        """``blocks[0](inp(x))`` through the factorisation of the module docstring."""
        blk = self.blocks[0]
        W, b = self.inp.weight, self.inp.bias  # h x d, h
        z0 = nn.functional.linear(x, W, b)
        zc = z0 - z0.mean(-1, keepdim=True)  # two passes: ~10x faster than torch.var_mean on CPU
        inv_sigma = torch.rsqrt(zc.square().mean(-1, keepdim=True) + blk.norm.eps)
        W1g = blk.lin1.weight * blk.norm.weight  # W1 diag(gamma), h x h
        M = W1g @ (W - W.mean(0))  # h x d
        v = W1g @ (b - b.mean())
        w = blk.lin1.weight @ blk.norm.bias + blk.lin1.bias
        pre = torch.addmm(v, x, M.transpose(0, 1)) * inv_sigma + w
        return z0 + linear_act(nn.functional.silu(pre, inplace=not torch.is_grad_enabled()), blk.lin2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.factor_first:
            z = self._first_block(x)
            rest = self.blocks[1:]
        else:
            z = self.inp(x)
            rest = self.blocks
        for block in rest:
            z = block(z)
        return nn.functional.silu(self.norm(z))

    def reference_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The unfactored forward with plain modules (the definition; used by the tests)."""
        z = self.inp(x)
        for block in self.blocks:
            z = z + block.lin2(nn.functional.silu(block.lin1(block.norm(z))))
        return nn.functional.silu(self.norm(z))
