"""The ResNet backbone ``g: R^d -> R^h`` shared by DBK and the deep-kernel models (ALGORITHMS.md 2.2).

``z0 = W_in x + b_in``; two pre-norm residual blocks ``z + W2 SiLU(W1 LN(z) + b1) + b2`` with
inner width ``h`` and no dropout; output ``SiLU(LN(z))``.
"""

from __future__ import annotations

import torch
from torch import nn


class ResidualBlock(nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.norm = nn.LayerNorm(h)
        self.lin1 = nn.Linear(h, h)
        self.lin2 = nn.Linear(h, h)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z + self.lin2(nn.functional.silu(self.lin1(self.norm(z))))


class ResNetBackbone(nn.Module):
    """``n x d`` -> ``n x h`` feature extractor (Gorishniy-style ResNet, 2 blocks by default)."""

    def __init__(self, d: int, h: int, blocks: int = 2):
        super().__init__()
        self.inp = nn.Linear(d, h)
        self.blocks = nn.ModuleList(ResidualBlock(h) for _ in range(blocks))
        self.norm = nn.LayerNorm(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.inp(x)
        for block in self.blocks:
            z = block(z)
        return nn.functional.silu(self.norm(z))
