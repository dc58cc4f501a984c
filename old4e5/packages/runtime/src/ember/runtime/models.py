"""Small built-in models for `ember demo` and the tests: a transformer block and an MLP.

They are written with plain torch modules, as users write models, so that compiling
them exercises the same graphs real models produce.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class SelfAttention(nn.Module):
    """Multi-head self-attention written out by hand (softmax(q k^T / sqrt(d)) v)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        head_dim = dim // self.heads
        q, k, v = self.qkv(x).split(dim, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, head_dim).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)
        out = scores.softmax(dim=-1) @ v
        merged: torch.Tensor = self.proj(out.transpose(1, 2).reshape(batch, seq, dim))
        return merged


class TransformerBlock(nn.Module):
    """Pre-norm transformer block: attention and a GELU MLP, each with a residual."""

    def __init__(self, dim: int = 64, heads: int = 4, hidden: int = 256) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        mlp_out: torch.Tensor = self.mlp(self.norm2(x))
        return x + mlp_out


class MLP(nn.Module):
    """A three-layer MLP with SiLU activations."""

    def __init__(self, dim: int = 256, hidden: int = 512, out: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden),
            nn.SiLU(),
            nn.Linear(hidden, hidden),
            nn.SiLU(),
            nn.Linear(hidden, out),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out
