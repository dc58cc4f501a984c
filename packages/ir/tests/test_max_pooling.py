"""Max pooling lowered by the IR on every torch version (no torch decomposition): 3-d
windows and adaptive 3-d windows with eager's indices, and the backward of every max
pool as a gather, run by the reference interpreter against eager: NaN (the last one
in a window wins, as eager's kernels take each NaN they meet), windows of -inf in
the padding (the first position inside the input), ties (the first maximum),
dilation, ceil mode, empty and channels-last inputs, bfloat16."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ir_helpers import check, computed, lower, trace  # type: ignore[import-not-found]

from ember.ir import ExternKernel, Reduction, Scatter, run_program

aten = torch.ops.aten
G = torch.Generator().manual_seed(0)


def _volume() -> torch.Tensor:
    """[2, 3, 5, 7, 6] with NaN pairs, -inf corners and ties."""
    x = torch.randn(2, 3, 5, 7, 6, generator=G)
    x[0, 0, :2, :3, :3] = float("-inf")  # whole windows of -inf, some in the padding
    x[0, 1, 1, 2, 2] = x[0, 1, 2, 3, 3] = float("nan")  # two NaNs in one window
    x[1, 2] = x[1, 2].round()  # ties
    return x


def _pool_externs(program: Any) -> list[str]:
    """ATen calls of the program that pool (a stored result may leave as a view)."""
    return [str(n.op) for n in program.nodes if isinstance(n, ExternKernel) and "pool" in str(n.op)]


def _whole(fn: Callable[..., Any], *args: Any) -> set[str]:
    """The ATen ops `fn` traces to with ember's table."""
    return {str(n.target) for n in trace(fn, *args).graph.nodes if n.op == "call_function"}


def test_max_pool3d_is_lowered_whole_and_matches_eager_indices() -> None:
    x = _volume()
    small = lambda x: F.max_pool3d(x, 2, 2, 1, return_indices=True)  # noqa: E731
    assert "aten.max_pool3d_with_indices.default" in _whole(small, x)
    program = check(small, x, rtol=0, atol=0)
    assert not _pool_externs(program)
    assert not any(isinstance(b.loop, Reduction) for b in computed(program))  # unrolled
    large = check(lambda x: F.max_pool3d(x, 3, 1, 1, return_indices=True), x, rtol=0, atol=0)
    assert any(isinstance(b.loop, Reduction) for b in computed(large))  # 27 taps
    dilated = dict(dilation=(2, 1, 2), ceil_mode=True, return_indices=True)
    check(lambda x: F.max_pool3d(x, (2, 3, 2), (1, 2, 2), (1, 1, 0), **dilated), x, rtol=0, atol=0)
    check(lambda x: F.max_pool3d(x, 2, return_indices=True), x[:0], rtol=0, atol=0)
    unbatched = x[0].clone()
    check(lambda x: F.max_pool3d(x, 2, 1, 1, return_indices=True), unbatched, rtol=0, atol=0)
    last = x.contiguous(memory_format=torch.channels_last_3d)
    check(lambda x: F.max_pool3d(x, 3, 2, 1, return_indices=True), last, rtol=0, atol=0)
    check(lambda x: F.max_pool3d(x, 3, 1, 1, return_indices=True), x.bfloat16(), rtol=0, atol=0)


@pytest.mark.parametrize("kernel", [2, 5], ids=["unrolled", "reduction"])
def test_max_pool2d_edge_windows_match_eager(kernel: int) -> None:
    """Windows of -inf whose first taps are padding, and dilated windows with no tap
    inside the input: eager's index is the window's first position past the padding
    (for the latter outside the input). Two NaNs in a window: the last one."""
    x = torch.randn(2, 2, 9, 8, generator=G)
    x[0, 0, :4, :4] = float("-inf")
    x[1, 1, 2, 2] = x[1, 1, 3, 4] = float("nan")
    pad = kernel // 2
    check(lambda x: F.max_pool2d(x, kernel, 1, pad, return_indices=True), x, rtol=0, atol=0)
    check(lambda x: F.max_pool2d(x, kernel, 2, pad, dilation=(3, 2), return_indices=True),
          x, rtol=0, atol=0)  # fmt: skip
    if kernel == 2:  # windows wholly in the padding (no larger kernel has them)
        check(lambda x: F.max_pool2d(x, 2, 1, 1, dilation=5, return_indices=True),
              x[..., :4, :4], rtol=0, atol=0)  # fmt: skip


def test_adaptive_max_pool3d_matches_eager() -> None:
    x = _volume()
    fn = lambda x: F.adaptive_max_pool3d(x, (3, 2, 4), return_indices=True)  # noqa: E731
    assert "aten.adaptive_max_pool3d.default" in _whole(fn, x)
    program = check(fn, x, rtol=0, atol=0)
    assert not _pool_externs(program)
    check(lambda x: F.adaptive_max_pool3d(x, (9, 3, 11), return_indices=True), x, rtol=0, atol=0)
    check(lambda x: F.adaptive_max_pool3d(x, 1, return_indices=True), x.bfloat16(), rtol=0, atol=0)
    check(
        lambda x: F.adaptive_max_pool2d(x, (4, 3), return_indices=True),
        x[0, 1].clone(),
        rtol=0,
        atol=0,
    )


def _backward(dims: int, *args: Any) -> Callable[..., torch.Tensor]:
    op = (
        aten.max_pool2d_with_indices_backward
        if dims == 2
        else aten.max_pool3d_with_indices_backward
    )
    kernel, stride, pad, dilation, ceil = args
    return lambda g, x, i: op(g, x, kernel, stride, pad, dilation, ceil, i)


def _check_backward(
    dims: int, x: torch.Tensor, kernel: Any, stride: Any, pad: Any, dilation: Any, ceil: bool
) -> Any:
    """Check the backward against eager on the indices the forward gives; float32 to
    the last bit (the sum in eager's order) where the candidates are unrolled."""
    pool = F.max_pool2d if dims == 2 else F.max_pool3d
    out, indices = pool(x, kernel, stride, pad, dilation, ceil, return_indices=True)
    grad = torch.randn(out.shape, generator=G).to(x.dtype)
    full = [[v] * dims if isinstance(v, int) else v for v in (kernel, stride, pad, dilation)]
    fn = _backward(dims, *full, ceil)
    assert f"aten.max_pool{dims}d_with_indices_backward.default" in _whole(fn, grad, x, indices)
    program = lower(fn, grad, x, indices)
    (actual,) = run_program(program, [grad, x, indices])
    unrolled = not any(isinstance(b.loop, Reduction) for b in computed(program))
    if x.dtype == torch.bfloat16:  # summed in float32 and rounded once, as on CUDA
        expected = fn(grad.double(), x.double(), indices).bfloat16()
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    else:
        tol = 0 if unrolled else 1e-6
        torch.testing.assert_close(actual, fn(grad, x, indices), rtol=tol, atol=tol)
    assert not _pool_externs(program)
    assert not any(isinstance(b.loop, Scatter) for b in computed(program))
    return program


BACKWARD_CASES = {
    "3x3_stride2_pad1": (2, 3, 2, 1, 1, False),  # 2x2 candidates: unrolled
    "2x2_stride2": (2, 2, 2, 0, 1, False),  # one candidate per input
    "dilated_by_tap": (2, (3, 2), 1, 1, (3, 2), True),  # fewer taps than outputs
    "dilated_ceil": (2, 3, 2, 1, 2, True),
    "3d_unrolled": (3, 2, 2, 1, 1, True),
    "3d_reduction": (3, 3, 1, 1, 1, False),  # 27 candidates: a reduction
}


@pytest.mark.parametrize("case", list(BACKWARD_CASES))
def test_max_pool_backward_is_a_gather_matching_eager(case: str) -> None:
    dims, *args = BACKWARD_CASES[case]
    shape = (2, 3, 9, 8) if dims == 2 else (2, 2, 5, 7, 6)
    x = torch.randn(shape, generator=G).round()  # ties: overlapping windows share a max
    program = _check_backward(dims, x, *args)
    if case == "3d_reduction":
        assert any(isinstance(b.loop, Reduction) for b in computed(program))
    _check_backward(dims, x.bfloat16(), *args)
    _check_backward(dims, x[:0], *args)
    if dims == 2:
        _check_backward(dims, x.contiguous(memory_format=torch.channels_last), *args)


@pytest.mark.parametrize("dims", [2, 3])
def test_adaptive_max_pool_backward_is_a_gather_matching_eager(dims: int) -> None:
    pool, op = (
        (F.adaptive_max_pool2d, aten.adaptive_max_pool2d_backward)
        if dims == 2
        else (F.adaptive_max_pool3d, aten.adaptive_max_pool3d_backward)
    )
    x = torch.randn((2, 3, 7, 5, 6)[: 2 + dims], generator=G).round()
    for size in ((3, 2, 4)[:dims], (9, 11, 2)[:dims], 1):  # overlapping, wider, global
        out, indices = pool(x, size, return_indices=True)
        grad = torch.randn(out.shape, generator=G)
        program = check(lambda g, x, i: op(g, x, i), grad, x, indices, rtol=0, atol=0)
        assert not _pool_externs(program)
        assert not any(isinstance(b.loop, Scatter) for b in computed(program))


def test_training_through_max_pools_matches_eager_gradients() -> None:
    """A max pool's gradient through autograd (torch.func.grad): the backward ops
    reach the IR whole and equal eager's."""

    def loss(x: torch.Tensor) -> torch.Tensor:
        y = F.max_pool2d(torch.relu(x), 3, 2, 1) * 2
        z = F.max_pool3d(x.unsqueeze(1), 2, 1, 0)
        return y.square().sum() + z.sum()

    step = torch.func.grad(loss)
    x = torch.randn(2, 3, 9, 8, generator=G).round()
    ops = _whole(step, x)
    assert "aten.max_pool2d_with_indices_backward.default" in ops
    assert "aten.max_pool3d_with_indices_backward.default" in ops
    program = check(step, x, rtol=1e-6, atol=1e-6)
    assert not _pool_externs(program)
