"""Built-in benchmark blocks: the building blocks of real models, each alone.

Each block isolates one pattern a compiler must handle well: matmuls with pointwise
epilogues (MLP), a whole transformer block, attention through PyTorch's fused kernel,
chains of softmax and layer norm (memory-bound reductions, where fusion pays most), and
a conv/batch-norm/activation block. The MLP and transformer block are the ones
`ember demo` uses (`ember.runtime.models`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """Multi-head self-attention through `scaled_dot_product_attention` (causal)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, dim // self.heads).unbind(2)
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        result: torch.Tensor = self.out(attended.transpose(1, 2).reshape(batch, seq, dim))
        return result


class SoftmaxChain(nn.Module):
    """Scale, mask, softmax, then a second softmax over another axis: pure memory traffic."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = x * 0.125 + torch.arange(x.shape[-1], device=x.device, dtype=x.dtype) * 1e-3
        first = torch.softmax(scores, dim=-1)
        return torch.log_softmax(first * x, dim=-2) + first


class LayerNormChain(nn.Module):
    """Residual adds and layer norms in a row, as between transformer sublayers."""

    def __init__(self, dim: int, depth: int = 4) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(depth))
        self.scales = nn.Parameter(torch.linspace(0.5, 1.5, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm in self.norms:
            x = x + F.gelu(norm(x)) * self.scales
        return x


class CNNBlock(nn.Module):
    """A ResNet basic block: conv, batch norm, ReLU, conv, batch norm, residual, ReLU."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)
