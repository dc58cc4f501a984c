"""Depthwise convolution cases shared by the C++ and Triton kernel tests (test helper):
the forward and every `output_mask` of the backward, strides 1 to 3, padding 0 to 2,
dilation 2, odd sizes, bias or none, channels-last and contiguous, float32 and
bfloat16, and a batch norm and ReLU around the convolution that fuse with it.

Each case: name -> (function, inputs made on a device). A backward case returns only
the gradients its mask asks for (eager's CPU kernel computes some of the others
anyway, where the graph returns None)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

aten = torch.ops.aten


def _inputs(
    shape: tuple[int, ...],
    kernel: tuple[int, int],
    *,
    bias: bool = False,
    grad: tuple[int, ...] | None = None,
    channels_last: bool = False,
    dtype: torch.dtype = torch.float32,
) -> Callable[[str], list[torch.Tensor]]:
    def make(device: str) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        channels = shape[1]
        x = torch.randn(shape, generator=g).to(dtype).to(memory_format=fmt)
        w = torch.randn(channels, 1, *kernel, generator=g).to(dtype)
        made = [x, w]
        if bias:
            made.append(torch.randn(channels, generator=g).to(dtype))
        if grad is not None:
            made.insert(0, torch.randn(grad, generator=g).to(dtype).to(memory_format=fmt))
        return [t.to(device) for t in made]

    return make


def _forward(stride: int, pad: int, dilation: int, bias: bool = False) -> Callable[..., Any]:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, stride=stride, padding=pad, dilation=dilation, groups=x.shape[1])

    def with_bias(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, b, stride=stride, padding=pad, dilation=dilation, groups=x.shape[1])

    return with_bias if bias else fn


def _backward(stride: int, pad: int, dilation: int, mask: str) -> Callable[..., Any]:
    asked = [m == "1" for m in mask]

    def fn(grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
        channels = x.shape[1]
        results = aten.convolution_backward(
            grad, x, w, [channels] if asked[2] else None, [stride] * 2, [pad] * 2,
            [dilation] * 2, False, [0, 0], channels, asked,
        )  # fmt: skip
        return [r for r, a in zip(results, asked, strict=True) if a]

    return fn


def _fused(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """An inference batch norm folded to a scale, a ReLU, the convolution, another
    scale: one kernel."""
    y = torch.relu(x * scale.view(1, -1, 1, 1))
    return F.conv2d(y, w, padding=1, groups=x.shape[1]) * scale.view(1, -1, 1, 1)


def _fused_inputs(device: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [
        t.to(device)
        for t in (torch.randn(2, 6, 9, 9, generator=g), torch.randn(6, 1, 3, 3, generator=g),
                  torch.rand(6, generator=g) + 0.5)
    ]  # fmt: skip


CASES: dict[str, tuple[Callable[..., Any], Callable[[str], list[torch.Tensor]]]] = {
    "s1_p1": (_forward(1, 1, 1), _inputs((2, 6, 9, 11), (3, 3))),
    "s2_p1_bias": (_forward(2, 1, 1, True), _inputs((2, 6, 9, 11), (3, 3), bias=True)),
    "s1_p0_odd": (_forward(1, 0, 1), _inputs((1, 5, 7, 13), (3, 3))),
    "s2_p2_k5_nhwc": (_forward(2, 2, 1), _inputs((2, 8, 13, 9), (5, 5), channels_last=True)),
    "s1_p2_d2_bias_nhwc": (
        _forward(1, 2, 2, True),
        _inputs((2, 3, 11, 12), (3, 3), bias=True, channels_last=True),
    ),
    "s3_k3x5": (_forward(3, 1, 1), _inputs((1, 7, 15, 8), (3, 5))),
    "bf16_nhwc": (
        _forward(1, 1, 1, True),
        _inputs((2, 16, 10, 10), (3, 3), bias=True, channels_last=True, dtype=torch.bfloat16),
    ),
    "bf16_s2": (_forward(2, 1, 1), _inputs((2, 5, 9, 9), (3, 3), dtype=torch.bfloat16)),
    "fused": (_fused, _fused_inputs),
    # backward: mask "input weight bias"
    **{
        f"back_{mask}": (
            _backward(1, 1, 1, mask),
            _inputs((2, 6, 9, 11), (3, 3), grad=(2, 6, 9, 11)),
        )
        for mask in ("100", "010", "001", "110", "101", "011", "111")
    },
    "back_s2_111_nhwc": (
        _backward(2, 1, 1, "111"),
        _inputs((2, 6, 9, 11), (3, 3), grad=(2, 6, 5, 6), channels_last=True),
    ),
    "back_s2_p2_d2_110": (
        _backward(2, 2, 2, "110"),
        _inputs((2, 4, 12, 11), (3, 3), grad=(2, 4, 6, 6)),
    ),
    "back_k5_s2_111": (
        _backward(2, 2, 1, "111"),
        _inputs((1, 3, 13, 10), (5, 5), grad=(1, 3, 7, 5)),
    ),
    "back_bf16_111_nhwc": (
        _backward(1, 1, 1, "111"),
        _inputs(
            (2, 8, 10, 10), (3, 3), grad=(2, 8, 10, 10), channels_last=True, dtype=torch.bfloat16
        ),
    ),
}


def tolerance(output: torch.Tensor) -> tuple[float, float]:
    """(rtol, atol) against eager: float32 sums in another order (a weight's gradient
    sums a few hundred products); bfloat16, one rounding either way."""
    if output.dtype == torch.bfloat16:
        return 1.6e-2, 2e-2
    return 1e-4, 1e-4
