"""2-d depthwise convolutions and their backward lowered to loops (ember.ir.depthwise),
run by the reference interpreter against eager: strides, padding, dilation, odd sizes,
bias or none, channels-last and contiguous inputs, float32 and bfloat16, every
`output_mask` of the backward; and every other convolution (groups 1, grouped with
several channels per group, transposed), or a depthwise one on a device type the
options keep as ATen calls, still an ATen call."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ir_helpers import flatten, lower  # type: ignore[import-not-found]

from ember.ir import ExternKernel, Pointwise, Reduction, run_program

aten = torch.ops.aten
G = torch.Generator().manual_seed(0)


def _convolutions(program: Any) -> list[str]:
    """The program's ATen calls that convolve."""
    return [
        str(n.op)
        for n in program.nodes
        if isinstance(n, ExternKernel) and "convolution" in str(n.op)
    ]


def _conv(
    stride: int, pad: int, dilation: int, groups: int, bias: torch.Tensor | None
) -> Callable[..., Any]:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, bias, stride=stride, padding=pad, dilation=dilation, groups=groups)

    return fn


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    return (
        {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    )


FORWARD = [
    # (input shape, kernel, stride, padding, dilation)
    ((2, 6, 9, 11), (3, 3), 1, 1, 1),
    ((2, 6, 9, 11), (3, 3), 2, 1, 1),
    ((1, 5, 7, 10), (3, 3), 1, 0, 1),
    ((2, 4, 13, 9), (5, 5), 2, 2, 1),
    ((2, 3, 11, 12), (3, 3), 1, 2, 2),
    ((1, 7, 15, 8), (3, 5), 3, 1, 1),
]


@pytest.mark.parametrize(
    "case", FORWARD, ids=lambda c: "x".join(map(str, c[0])) + f"_k{c[1][0]}s{c[2]}p{c[3]}d{c[4]}"
)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_forward_matches_eager(
    case: Any, bias: bool, channels_last: bool, dtype: torch.dtype
) -> None:
    shape, kernel, stride, pad, dilation = case
    channels = shape[1]
    x = torch.randn(shape, generator=G).to(dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    w = torch.randn(channels, 1, *kernel, generator=G).to(dtype)
    b = torch.randn(channels, generator=G).to(dtype) if bias else None
    fn = _conv(stride, pad, dilation, channels, b)
    program = lower(fn, x, w)
    assert _convolutions(program) == []
    # pointwise: no reduction over the window
    assert not [n for n in program.nodes if isinstance(getattr(n, "loop", None), Reduction)]
    assert [n for n in program.nodes if isinstance(getattr(n, "loop", None), Pointwise)]
    (got,) = flatten(run_program(program, [x, w], seed=0))
    want = fn(x, w)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, **_tolerance(dtype))


def _backward(
    stride: int, pad: int, dilation: int, channels: int, mask: tuple[bool, bool, bool]
) -> Callable[..., Any]:
    def fn(grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> Any:
        return aten.convolution_backward(
            grad, x, w, [channels] if mask[2] else None, [stride] * 2, [pad] * 2,
            [dilation] * 2, False, [0, 0], channels, list(mask),
        )  # fmt: skip

    return fn


BACKWARD = [
    ((2, 6, 9, 11), (3, 3), 1, 1, 1),
    ((2, 6, 9, 11), (3, 3), 2, 1, 1),
    ((2, 4, 13, 9), (5, 5), 2, 2, 1),
    ((2, 3, 11, 12), (3, 3), 1, 2, 2),
    ((1, 5, 10, 7), (3, 3), 3, 0, 2),
]


@pytest.mark.parametrize("case", BACKWARD, ids=lambda c: f"k{c[1][0]}s{c[2]}p{c[3]}d{c[4]}")
@pytest.mark.parametrize("mask", list(itertools.product([False, True], repeat=3))[1:], ids=str)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_backward_matches_eager(
    case: Any, mask: tuple[bool, bool, bool], channels_last: bool
) -> None:
    shape, kernel, stride, pad, dilation = case
    channels = shape[1]
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(shape, generator=G).to(memory_format=fmt)
    w = torch.randn(channels, 1, *kernel, generator=G)
    out = F.conv2d(x, w, stride=stride, padding=pad, dilation=dilation, groups=channels)
    grad = torch.randn(out.shape, generator=G).to(memory_format=fmt)
    fn = _backward(stride, pad, dilation, channels, mask)
    program = lower(fn, grad, x, w)
    assert _convolutions(program) == []
    got = run_program(program, [grad, x, w], seed=0)
    want = fn(grad, x, w)
    for asked, g, e in zip(mask, got, want, strict=True):
        if not asked:
            assert g is None  # eager's CPU kernel may compute it anyway
            continue
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


def test_backward_bfloat16_accumulates_in_float32() -> None:
    x = torch.randn(2, 8, 12, 12, generator=G).bfloat16()
    w = torch.randn(8, 1, 3, 3, generator=G).bfloat16()
    grad = torch.randn(2, 8, 12, 12, generator=G).bfloat16()
    fn = _backward(1, 1, 1, 8, (True, True, True))
    program = lower(fn, grad, x, w)
    assert _convolutions(program) == []
    got = run_program(program, [grad, x, w], seed=0)
    reference = fn(grad.double(), x.double(), w.double())
    for g, r in zip(got, reference, strict=True):
        assert g.dtype == torch.bfloat16
        # one rounding of the float32 sum: within bfloat16's half ulp of float64
        torch.testing.assert_close(g.double(), r, rtol=8e-3, atol=1e-2)


@pytest.mark.parametrize(
    ("channels", "out", "groups", "kernel"),
    [(4, 4, 1, 3), (4, 4, 2, 3), (4, 8, 4, 3)],
    ids=["groups1", "groups2", "multiplier2"],
)
def test_other_convolutions_stay_aten_calls(
    channels: int, out: int, groups: int, kernel: int
) -> None:
    x = torch.randn(2, channels, 8, 8, generator=G)
    w = torch.randn(out, channels // groups, kernel, kernel, generator=G)
    program = lower(_conv(1, 1, 1, groups, None), x, w)
    assert _convolutions(program) == ["aten.convolution.default"]
    grad = torch.randn(2, out, 8, 8, generator=G)

    def backward(grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> Any:
        return aten.convolution_backward(
            grad, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], groups, [True, True, False]
        )

    assert _convolutions(lower(backward, grad, x, w)) == ["aten.convolution_backward.default"]


def test_transposed_depthwise_stays_an_aten_call() -> None:
    x = torch.randn(2, 4, 8, 8, generator=G)
    w = torch.randn(4, 1, 3, 3, generator=G)
    program = lower(lambda x, w: F.conv_transpose2d(x, w, groups=4), x, w)
    assert _convolutions(program) == ["aten.convolution.default"]


def test_a_bias_of_another_dtype_stays_the_aten_call_that_raises() -> None:
    """Eager's convolution raises for a bias whose dtype is not the input's (its meta
    function does not check): the lowering leaves it to that call."""
    x = torch.randn(2, 4, 8, 8, generator=G).bfloat16()
    w = torch.randn(4, 1, 3, 3, generator=G).bfloat16()
    b = torch.randn(4, generator=G)

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
        return aten.convolution(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 4)

    assert _convolutions(lower(fn, x, w, b, mode="fake")) == ["aten.convolution.default"]
    assert _convolutions(lower(fn, x, w, b.bfloat16())) == []


def test_device_types_kept_as_aten_calls() -> None:
    """`LoweringOptions.extern_depthwise` keeps the depthwise convolutions of its
    device types ATen calls, forward and backward."""
    x = torch.randn(2, 4, 8, 8, generator=G)
    w = torch.randn(4, 1, 3, 3, generator=G)
    fn = _conv(1, 1, 1, 4, None)
    assert _convolutions(lower(fn, x, w)) == []
    assert _convolutions(lower(fn, x, w, extern_depthwise=("cuda",))) == []
    assert _convolutions(lower(fn, x, w, extern_depthwise=("cpu",))) == ["aten.convolution.default"]
    backward = _backward(1, 1, 1, 4, (True, True, False))
    grad = torch.randn(2, 4, 8, 8, generator=G)
    kept = lower(backward, grad, x, w, extern_depthwise=("cpu",))
    assert _convolutions(kept) == ["aten.convolution_backward.default"]
