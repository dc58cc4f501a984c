"""Triton kernels end to end: every kernel type, run and compared with the IR
interpreter (`ember.ir.run_program`) and with eager.

On the CPU the kernels run in Triton's interpreter. `TRITON_INTERPRET=1` must be set
before kernels are defined and must not leak into other tests, so the CPU cases run
in one subprocess per module (`python test_triton_kernels.py case ...`), which prints
one JSON line per case; each test asserts on its case's line. The `cuda` tests run the
same cases in-process on a GPU.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from triton_harness import interpret, lower_for_triton, report, run_with_triton

from ember.ir import run_program
from ember.scheduler import (
    DEFAULT_CHOICES,
    DeviceChoices,
)

Case = tuple[Callable[..., Any], Callable[[str], list[Any]], dict[str, Any]]


def _args(
    *shapes: tuple[int, ...], dtype: torch.dtype = torch.float32
) -> Callable[[str], list[Any]]:
    def make(device: str) -> list[Any]:
        g = torch.Generator().manual_seed(0)
        return [
            torch.randn(s, generator=g, dtype=torch.float32).to(dtype).to(device) for s in shapes
        ]

    return make


def _softmax_mix(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
    y = torch.softmax(x, -1)
    return ((x + y) * w + b).relu(), y.sum(0)


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    var, mean = torch.var_mean(x, -1, correction=0, keepdim=True)
    return (x - mean) * torch.rsqrt(var + 1e-5) * w + b


def _embedding(device: str) -> list[Any]:
    g = torch.Generator().manual_seed(0)
    table = torch.randn(10, 24, generator=g)
    return [table.to(device), torch.tensor([3, 0, 9, 3, 7]).to(device)]


def _gather(device: str) -> list[Any]:
    g = torch.Generator().manual_seed(0)
    table = torch.randn(10, 6, generator=g)
    return [table.to(device), torch.tensor([[3, -1, 9], [0, -10, 2]]).to(device)]


def _index_add(device: str) -> list[Any]:
    g = torch.Generator().manual_seed(0)
    x, v = torch.randn(10, 8, generator=g), torch.randn(4, 8, generator=g)
    return [x.to(device), torch.tensor([1, 7, 1, 0]).to(device), v.to(device)]


def _bags(device: str) -> list[Any]:
    """A table with a NaN (its row comes first in bag 1, later in bag 3), 13 indices in
    four bags (bag 2 empty) and a weight per index."""
    g = torch.Generator().manual_seed(0)
    table = torch.randn(10, 6, generator=g)
    table[7, 2] = float("nan")
    indices = torch.tensor([3, 0, 9, 7, 1, 3, 5, 2, 7, 3, 8, 0, 4])
    offsets, weights = torch.tensor([0, 3, 7, 7]), torch.randn(13, generator=g)
    return [t.to(device) for t in (table, indices, offsets, weights)]


def _embedding_bags(t: torch.Tensor, i: torch.Tensor, o: torch.Tensor, w: torch.Tensor) -> Any:
    bag = torch.nn.functional.embedding_bag
    return (
        bag(i, t, o, mode="sum", per_sample_weights=w),
        bag(i, t, o, mode="mean", padding_idx=3),
        bag(i, t, o, mode="max", padding_idx=5),
    )


def _volume_grid(device: str) -> list[Any]:
    """A volume and a grid reaching past its faces; on the CPU with a NaN and an
    infinity. Eager's CUDA kernel samples such a point where its CPU kernel (and
    ember, on every device: ember.ir.sampling) reads nothing, so the GPU case, which
    compares with eager on the GPU, leaves it out."""
    g = torch.Generator().manual_seed(0)
    volume, grid = torch.randn(2, 3, 4, 5, 6, generator=g), torch.randn(2, 3, 2, 4, 3, generator=g)
    grid = grid * 1.5
    if torch.device(device).type == "cpu":
        grid[0, 0, 0, 0] = torch.tensor([float("nan"), 0.5, float("inf")])
    return [volume.to(device), grid.to(device)]


def _grid_samples(x: torch.Tensor, g: torch.Tensor) -> Any:
    sample = torch.nn.functional.grid_sample
    return (
        sample(x, g, align_corners=False),
        sample(x, g, mode="nearest", padding_mode="border", align_corners=True),
        sample(x, g, padding_mode="reflection", align_corners=False),
    )


def _images(device: str) -> list[Any]:
    """An image batch and a channels-last one."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 3, 13, 17, generator=g), torch.randn(1, 4, 9, 6, generator=g)
    return [x.to(device), y.to(memory_format=torch.channels_last).to(device)]


def _antialiased(x: torch.Tensor, y: torch.Tensor) -> Any:
    resize = torch.nn.functional.interpolate
    return (
        resize(x, size=(5, 7), mode="bilinear", antialias=True),
        resize(x, scale_factor=(1.5, 0.4), mode="bicubic", antialias=True),
        resize(x, size=(4, 17), mode="bilinear", antialias=True, align_corners=True),
        resize(y, size=(4, 11), mode="bicubic", antialias=True),
    )


def _views(device: str) -> list[Any]:
    """Rows 1-3 and 3-5 of one base, at storage offsets 18 and 54. (Contiguous rows:
    the cases are traced without Dynamo, whose guards would also hold a view's row
    stride to the traced one.)"""
    base = torch.randn(9, 18, generator=torch.Generator().manual_seed(0)).to(device)
    return [base[1:4], base[3:6]]


def _same_layout(a: Any) -> Any:
    """A copy of `a` with its strides at its storage offset (clone() would start it at
    offset 0, and the offset is what some cases test)."""
    if not isinstance(a, torch.Tensor):
        return a
    count = a.untyped_storage().nbytes() // a.element_size()
    storage = a.detach().as_strided((count,), (1,), 0).clone()
    return storage.as_strided(a.shape, a.stride(), a.storage_offset())


def _nan_rows(device: str) -> list[Any]:
    x = torch.randn(6, 40, generator=torch.Generator().manual_seed(0))
    x[1, 5] = float("nan")
    x[2, 7] = x[2, 30] = x[2].max() + 1  # a tie: the first index wins
    return [x.to(device)]


def _softmax_edges(device: str) -> list[Any]:
    """Columns for a looped log_softmax over dim 0: ordinary, with -inf entries, one
    NaN, all -inf (eager's result is NaN), and a max that keeps growing down the rows
    (the online sum is rescaled at every step)."""
    x = torch.randn(300, 6, generator=torch.Generator().manual_seed(0))
    x[::3, 1] = float("-inf")
    x[17, 2] = float("nan")
    x[:, 3] = float("-inf")
    x[:, 4] = torch.linspace(-30.0, 30.0, 300)
    return [x.to(device)]


def _channels_last(device: str) -> list[Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 5, 6, generator=g).to(memory_format=torch.channels_last)
    return [x.to(device), torch.randn(8, 1, 1, generator=g).to(device)]


def _pool_input(device: str) -> list[Any]:
    x = torch.randn(2, 3, 9, 8, generator=torch.Generator().manual_seed(0))
    x[0, 0, :3, :3] = float("-inf")
    x[0, 1, 4, 4] = float("nan")
    x[1, 2, 2:6, 2:6] = 1.5  # ties: the first maximum wins
    return [x.to(device)]


def _volume_input(device: str) -> list[Any]:
    x = torch.randn(2, 2, 5, 7, 6, generator=torch.Generator().manual_seed(0))
    x[0, 0, :2, :3, :3] = float("-inf")  # windows of -inf, first taps in the padding
    x[0, 1, 1, 2, 2] = x[0, 1, 2, 3, 3] = float("nan")  # the last NaN wins
    x[1, 1] = x[1, 1].round()  # ties: the first maximum wins
    return [x.to(device)]


def _max_pools_3d(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    F = torch.nn.functional
    return (
        *F.max_pool3d(x, 2, 2, 1, return_indices=True),
        *F.max_pool3d(x, 3, 1, 1, return_indices=True),
        *F.adaptive_max_pool3d(x, (2, 3, 4), return_indices=True),
    )


def _pool_gradients(device: str) -> list[Any]:
    """Output gradients and the indices of eager's forward: a 3x3 stride-2 2-d pool
    (four candidates per input, unrolled), a 3x3x3 stride-1 one (a reduction over 27),
    and an adaptive 3-d pool; inputs with ties, so windows share a maximum."""
    g = torch.Generator().manual_seed(0)
    F = torch.nn.functional
    x2 = torch.randn(2, 3, 9, 8, generator=g).round()
    x3 = torch.randn(2, 2, 5, 7, 6, generator=g).round()
    args: list[Any] = []
    for x, pooled in (
        (x2, F.max_pool2d(x2, 3, 2, 1, return_indices=True)),
        (x3, F.max_pool3d(x3, 3, 1, 1, return_indices=True)),
        (x3, F.adaptive_max_pool3d(x3, (2, 3, 4), return_indices=True)),
    ):
        out, indices = pooled
        args += [torch.randn(out.shape, generator=g), x, indices]
    return [a.to(device) for a in args]


def _max_pool_backwards(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
    aten = torch.ops.aten
    g2, x2, i2, g3, x3, i3, ga, xa, ia = args
    return (
        aten.max_pool2d_with_indices_backward(g2, x2, [3, 3], [2, 2], [1, 1], [1, 1], False, i2),
        aten.max_pool3d_with_indices_backward(
            g3, x3, [3] * 3, [1] * 3, [1] * 3, [1] * 3, False, i3
        ),
        aten.adaptive_max_pool3d_backward(ga, xa, ia),
    )


def _masked_scores(device: str) -> list[Any]:
    g = torch.Generator().manual_seed(0)
    scores, mask = torch.randn(2, 3, 8, 8, generator=g), torch.randn(2, 1, 1, 8, generator=g)
    mask[1, 0, 0, :] = float("-inf")  # every score of batch 1 masked
    return [scores.to(device), mask.to(device)]


def _safe_softmax(scores: torch.Tensor, mask: torch.Tensor) -> Any:
    a = scores + mask
    return torch.softmax(a, -1), (a == float("-inf")).logical_not().any(-1)


def _causal_safe_softmax(scores: torch.Tensor) -> Any:
    """BERT's attention on the GPU: math SDPA's safe softmax of scores masked by an
    index-built mask; the final where (all-masked rows give 0) is the softmax
    kernel's epilogue over a loop merged to [B*H*Q, K] (scheduler _space_map, partial)."""
    q = torch.arange(scores.shape[2], device=scores.device)[:, None]
    k = torch.arange(scores.shape[3], device=scores.device)[None, :]
    masked = torch.where(q >= k, scores, float("-inf"))
    return torch.ops.aten._safe_softmax(masked, -1)


def _two_batch_norm_backwards(*args: torch.Tensor) -> Any:
    dy, x1, w1, m1, s1, x2, w2, m2, s2 = args
    grads = []
    for x, w, m, s in ((x1, w1, m1, s1), (x2, w2, m2, s2)):
        grads += torch.ops.aten.native_batch_norm_backward.default(
            dy, x, w, None, None, m, s, True, 1e-5, [True, True, True]
        )
    return tuple(grads)


def _batch_norm_backward_args(device: str) -> list[Any]:
    g = torch.Generator().manual_seed(0)
    dy, x1, x2 = (
        (torch.randn(16, 6, 4, 4, generator=g) * 2 + 1).to(memory_format=torch.channels_last)
        for _ in range(3)
    )
    w1, w2, mean = (torch.randn(6, generator=g) for _ in range(3))
    invstd = torch.rand(6, generator=g) + 0.5
    return [t.to(device) for t in (dy, x1, w1, mean, invstd, x2, w2, mean, invstd)]


CASES: dict[str, Case] = {
    "safe_softmax_epilogue": (_causal_safe_softmax, _args((2, 3, 8, 8)), {"atol": 1e-6}),
    # a channels-last output iterated in storage order; an unrolled 3x3 max pool
    # with eager's indices; a broadcast-mask sum read back by a softmax as its
    # prologue (indices through floors and mods of the softmax's own index)
    "channels_last": (lambda x, b: torch.relu(x * 2.0 + b), _channels_last, {}),
    "max_pool_unrolled": (
        lambda x: torch.nn.functional.max_pool2d(x, 3, 2, 1, return_indices=True),
        _pool_input,
        {},
    ),
    # 3-d pooling: a 3x3x3 window as a reduction over three window dimensions (padded,
    # the count without padding), and adaptive windows of unequal sizes
    "avg_pool3d_window": (
        lambda x: (
            torch.nn.functional.avg_pool3d(x, 3, 2, 1, count_include_pad=False),
            torch.nn.functional.adaptive_avg_pool3d(x, (2, 3, 2)),
        ),
        _args((2, 3, 5, 7, 6)),
        {},
    ),
    # 3-d max pools with eager's indices (ember.ir.pooling): a 2x2x2 window unrolled,
    # a 3x3x3 one as max, argmax and last-NaN reductions, adaptive windows
    "max_pool3d": (_max_pools_3d, _volume_input, {"atol": 0, "rtol": 0}),
    # max pooling's backward as a gather (ember.ir.pool_gradients): unrolled
    # candidates, a reduction over 27 of them, adaptive windows
    "max_pool_backward": (_max_pool_backwards, _pool_gradients, {"atol": 1e-6}),
    # pdist: each output's row pair recovered from its index, then a reduction over
    # the columns through indirect loads of both rows
    "pdist": (lambda x: (torch.pdist(x), torch.pdist(x, 1.0)), _args((23, 5)), {}),
    # 3-d grid sampling: eight masked indirect loads per point (one for nearest), with
    # border and reflection padding
    "grid_sampler_3d": (_grid_samples, _volume_grid, {"atol": 1e-5}),
    # antialiased resampling (ember.ir.antialias): per-axis weight tables, then the
    # width and the height each a pointwise loop of masked indirect loads; downsampling
    # by non-integer factors, upsampling, align_corners, one axis alone, channels-last
    "upsample_antialias": (_antialiased, _images, {"atol": 1e-5}),
    "masked_softmax_prologue": (_safe_softmax, _masked_scores, {"atol": 1e-6}),
    "pointwise": (lambda x, y: (x * y + 1).sigmoid() - torch.tanh(x), _args((37, 5), (5,)), {}),
    "transpose": (lambda x: (x * 2).transpose(0, 1).contiguous(), _args((40, 24)), {}),
    "transpose3d": (lambda x: x.permute(0, 2, 1).contiguous() + 1, _args((3, 20, 33)), {}),
    # heads merged back ([B, H, S, D] -> [B, S, H*D], H*D = 36 not a power of two): the
    # codegen splits the merged variable into heads and head_dim (codegen.triton.regroup);
    # float32 throughout: the interpreter's bfloat16 rounding is not the GPU's
    "merge_heads": (
        lambda x: x.transpose(1, 2).reshape(2, 5, 36) * 2,
        _args((2, 3, 5, 12)),
        {"atol": 0, "rtol": 0},
    ),
    "sum_rows": (lambda x: x.sum(-1), _args((9, 300)), {}),
    "sum_cols": (lambda x: x.sum(0), _args((300, 9)), {}),
    "max_argmax": (lambda x: (x.amax(-1), x.argmax(-1), x.argmin(-1)), _nan_rows, {}),
    "welford": (_layer_norm, _args((6, 50), (50,), (50,)), {"atol": 1e-4}),
    "softmax": (_softmax_mix, _args((3, 5, 33), (33,), (33,)), {"atol": 1e-5}),
    "softmax_looped": (_softmax_mix, _args((3, 5, 33), (33,), (33,)), {"reduction": "looped"}),
    "welford_looped": (
        _layer_norm,
        _args((6, 50), (50,), (50,)),
        {"reduction": "looped", "atol": 1e-4},
    ),
    # rows that end in a partial block: the lanes of the last block see one element
    # fewer, so their counts differ (the update divides once per block, not per lane)
    "welford_looped_tail": (
        lambda x: torch.var_mean(x, -1, correction=0),
        lambda device: [
            (torch.randn(5, 301, generator=torch.Generator().manual_seed(2)) * 3 + 100).to(device)
        ],
        {"reduction": "looped", "atol": 1e-4, "rtol": 1e-5},
    ),
    "argmax_looped": (lambda x: x.argmax(-1), _nan_rows, {"reduction": "looped"}),
    # max and sum(exp(x - max)) in one online loop (ember.codegen.triton.reduction)
    "log_softmax_online": (
        lambda x: (torch.log_softmax(x * 2, 0), torch.softmax(x, 0)),
        _softmax_edges,
        {"reduction": "looped", "atol": 1e-5},
    ),
    "cat_pad": (
        lambda x, y: torch.nn.functional.pad(torch.cat([x, y], 1), (1, 2)) * 3,
        _args((4, 3), (4, 5)),
        {},
    ),
    "embedding": (lambda t, i: torch.nn.functional.embedding(i, t) * 2, _embedding, {}),
    "gather": (lambda t, i: t[i] + 1, _gather, {}),
    # embedding_bag: offsets counted into each position's bag (a scatter, then a scan),
    # rows scattered into their bags (add for sum and mean, max then min of positions)
    "embedding_bag": (_embedding_bags, _bags, {}),
    "index_add": (lambda x, i, v: x.index_add(0, i, v), _index_add, {}),
    "random": (
        lambda x: torch.ops.aten.native_dropout(x, 0.5, True)[0] + torch.rand_like(x),
        _args((7, 9)),
        {"seed": 1234, "eager": False},
    ),
    "bf16": (
        lambda x, w: (torch.softmax(x, -1) * w).to(torch.bfloat16),
        _args((5, 40), (40,), dtype=torch.bfloat16),
        {"atol": 1e-2, "rtol": 1e-2},
    ),
    "math": (
        lambda x: (
            torch.log1p(x.abs()) + torch.erf(x) + torch.floor(x * 3) % 2,
            torch.sqrt(x.abs()),
        ),
        _args((33,)),
        {"atol": 1e-5},
    ),
    # split reductions (small thresholds force them): a column sum with its prologue
    # and epilogue, a row max and a full sum, each a partial and a final kernel
    "split": (
        lambda x: ((x * 2).sum(0).relu(), x.amax(-1), x.sum()),
        _args((64, 24)),  # 6 column workers: halving the rows doubles them
        {
            "choices": DeviceChoices(split_workers=16, split_column_width=4, split_min_chunk=8),
            "atol": 1e-5,
        },
    ),
    # a training batch norm's statistics (per channel, channels-last) and a row
    # variance, split: Welford partials, then Chan's merge of the chunks
    "split_welford": (
        lambda x, y: (*torch.var_mean(x, (0, 2, 3), correction=0), torch.var(y, -1)),
        lambda device: [
            (torch.randn(16, 8, 6, 6, generator=torch.Generator().manual_seed(0)) + 20)
            .to(device)
            .to(memory_format=torch.channels_last),
            torch.randn(2, 384, generator=torch.Generator().manual_seed(1)).to(device) - 5,
        ],
        {
            "choices": DeviceChoices(split_workers=16, split_column_width=4, split_min_chunk=8),
            "atol": 1e-4,
            "rtol": 1e-4,
        },
    ),
    # batch norm's backward, lowered whole, twice on one gradient (a downsampling
    # block), split: one partial kernel for the four sums; the finals of both with their
    # weight and bias gradients in one kernel (reductions after pointwise members);
    # both input gradients in one
    "split_batch_norm_backward": (
        _two_batch_norm_backwards,
        _batch_norm_backward_args,
        {
            "choices": DeviceChoices(split_workers=16, split_column_width=4, split_min_chunk=8),
            "atol": 1e-4,
            "rtol": 1e-4,
        },
    ),
    "split_batch_norm_backward_looped": (
        _two_batch_norm_backwards,
        _batch_norm_backward_args,
        {
            "choices": DeviceChoices(split_workers=16, split_column_width=4, split_min_chunk=8),
            "reduction": "looped",
            "atol": 1e-4,
            "rtol": 1e-4,
        },
    ),
    # ember's special-function helpers (ember.codegen.triton.special) against eager, with
    # NaN, infinities, signed zeros, negatives and every branch boundary
    "special_functions": (
        lambda x: (
            torch.special.i0e(x),
            torch.special.i1e(x),
            torch.digamma(x),
            torch.special.modified_bessel_k0(x),
            torch.special.modified_bessel_k1(x),
            torch.special.scaled_modified_bessel_k0(x),
            torch.special.scaled_modified_bessel_k1(x),
        ),
        lambda device: [
            torch.cat(
                [
                    torch.tensor(
                        [
                            0.0,
                            -0.0,
                            float("inf"),
                            -float("inf"),
                            float("nan"),
                            1e-30,
                            2.0,
                            8.0,
                            -8.0,
                            10.0,
                            -3.0,
                            -2.5,
                            1e10,
                            -1e10,
                            100.0,
                            1e-6,
                        ]
                    ),
                    torch.linspace(-30, 30, 241),
                ]
            ).to(device)
        ],
        {"atol": 1e-6, "rtol": 2e-5},
    ),
    # the sign of a negated zero: 1 / -(+0.0) is -inf in eager (a unary minus rendered
    # as 0 - x gives +inf)
    "negated_zero": (
        lambda x: 1.0 / torch.neg(x),
        lambda device: [torch.tensor([0.0, -0.0, 2.0, -3.0]).to(device)],
        {},
    ),
    # a float remainder alone: its helper calls libdevice, which the kernel must import
    "float_remainder": (lambda x, y: torch.remainder(x, y), _args((9,), (9,)), {"atol": 1e-6}),
    # C's fmax/fmin: NaN only where both operands are NaN
    "fmax_fmin": (
        lambda x, y: (torch.fmax(x, y), torch.fmin(x, y)),
        lambda device: [
            torch.tensor([1.0, float("nan"), float("nan"), -2.0]).to(device),
            torch.tensor([float("nan"), 3.0, float("nan"), 5.0]).to(device),
        ],
        {"atol": 0, "rtol": 0},
    ),
    # storage offsets (ember.ir.layout's contract): compiled for contiguous inputs at
    # offset 0, run on views at other offsets, read and written in place
    "offset_read": (
        lambda x, y: (x * y).sum(-1) + 1,
        _args((3, 20), (3, 20)),
        {"dynamic": True, "resize": _views},
    ),
    "offset_write": (
        lambda x, y: (x.mul_(2), y.add_(x)),
        _args((3, 20), (3, 20)),
        {"dynamic": True, "resize": _views},
    ),
    # the IR interpreter cannot bind bare size symbols yet (ember.ir.symbolic.evaluate
    # returns a Python int from xreplace): dynamic cases compare with eager only
    "dynamic": (
        lambda x, w: torch.softmax(x * w, -1) + x.sum(0),
        _args((6, 20), (20,)),
        {"dynamic": True, "reference": False, "resize": _args((9, 13), (13,))},
    ),
}


def _compare(actual: Any, expected: Any, atol: float, rtol: float) -> None:
    if isinstance(expected, (list, tuple)):
        for a, e in zip(actual, expected, strict=True):
            _compare(a, e, atol, rtol)
        return
    torch.testing.assert_close(actual.cpu(), expected.cpu(), atol=atol, rtol=rtol, equal_nan=True)


def run_case(name: str, device: str) -> dict[str, Any]:
    fn, make_args, options = CASES[name]
    args = make_args(device)
    atol, rtol = options.get("atol", 1e-6), options.get("rtol", 1e-5)
    program, schedule = lower_for_triton(
        fn,
        [a.cpu() for a in args],
        options.get("dynamic", False),
        options.get("choices", DEFAULT_CHOICES),
    )
    seed = options.get("seed", 0)
    runs = [args] + ([options["resize"](device)] if "resize" in options else [])
    with tempfile.TemporaryDirectory() as cache:
        for run_args in runs:  # a second size runs the same kernels (no new program)
            actual, kinds = run_with_triton(
                program,
                schedule,
                [_same_layout(a) for a in run_args],
                seed=seed,
                cache_dir=Path(cache),
                reduction=options.get("reduction"),
            )
            if options.get("reference", True):
                copies = [_same_layout(a.cpu()) for a in run_args]
                reference = run_program(program, copies, seed=seed)
                _compare(actual, reference, atol, rtol)
            if options.get("eager", True):
                expected = fn(*[_same_layout(a) for a in run_args])
                expected = list(expected) if isinstance(expected, tuple) else [expected]
                _compare(actual, expected, max(atol, 1e-5), max(rtol, 1e-4))
    partials = sum(1 for n in schedule.program.nodes if n.name.endswith("_partial"))
    count = len(schedule.kernels)
    return {"case": name, "ok": True, "kinds": kinds, "partials": partials, "kernels": count}


# -- CPU: the interpreter, in a subprocess ----------------------------------------------


@pytest.fixture(scope="module")
def interpreter_results() -> dict[str, dict[str, Any]]:
    """Run every case in the interpreter: a few subprocesses, each with a share."""
    workers = max(1, min(4, os.cpu_count() or 1))
    return interpret(__file__, list(CASES), workers=workers)


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_in_interpreter(case: str, interpreter_results: dict[str, dict[str, Any]]) -> None:
    record = interpreter_results.get(case)
    assert record is not None, f"case {case} did not report"
    assert record["ok"], record.get("error")


def test_kernel_kinds_are_covered(interpreter_results: dict[str, dict[str, Any]]) -> None:
    kinds = {k for r in interpreter_results.values() for k in r.get("kinds", [])}
    expected = {"pointwise", "pointwise_2d", "persistent_reduction", "looped_reduction", "scatter"}
    assert expected <= kinds


def test_safe_softmax_where_is_the_softmax_epilogue(
    interpreter_results: dict[str, dict[str, Any]],
) -> None:
    """One kernel: the where over the merged [B*H*Q, K] loop maps onto the softmax's
    [B*H, Q] x [K] (BERT's second pass over its fp32 scores on the GPU)."""
    assert interpreter_results["safe_softmax_epilogue"]["kernels"] == 1


def test_split_case_splits(interpreter_results: dict[str, dict[str, Any]]) -> None:
    assert interpreter_results["split"]["partials"] == 2  # the column sum and the full sum
    assert interpreter_results["split_welford"]["partials"] == 2  # both Welfords
    for case in ("split_batch_norm_backward", "split_batch_norm_backward_looped"):
        # the four channel sums split; partials, finals, input gradients
        assert interpreter_results[case]["partials"] == 4
        assert interpreter_results[case]["kernels"] == 3


# -- launcher behaviour (no kernel runs) -------------------------------------------------


def test_identical_sources_share_one_module(tmp_path: Path) -> None:
    """Two kernels of one graph, with names of their own and the same source (the
    same softmax of two inputs), get a launcher each over one module: one jit
    function, so one set of compiled binaries."""
    from ember.runtime.triton_kernels import TritonLauncher, compile_triton_kernels

    x = torch.randn(8, 24)  # a size no other test in this process renders
    pair = [x, x.clone()]
    _, schedule = lower_for_triton(lambda a, b: (a.softmax(-1), b.softmax(-1)), pair, False)
    first, second = schedule.kernels
    assert first.name != second.name
    launchers = compile_triton_kernels(schedule.kernels, cache_dir=tmp_path)
    assert sorted(launchers) == sorted([first.name, second.name])
    one, two = (launchers[k.name] for k in (first, second))
    assert isinstance(one, TritonLauncher) and isinstance(two, TritonLauncher)
    assert one.module() is two.module() and one.fn is two.fn
    assert len(list((tmp_path / "triton").glob("*/*.py"))) == 1  # one cache entry


def test_launcher_checks_its_arguments(tmp_path: Path) -> None:
    from ember.runtime.triton_kernels import compile_triton_kernels

    _, schedule = lower_for_triton(lambda a: a * 2, [torch.randn(4)], False)
    (launcher,) = compile_triton_kernels(schedule.kernels, cache_dir=tmp_path).values()
    with pytest.raises(TypeError, match="takes 2 tensors"):
        launcher(torch.randn(4))


# -- CUDA -------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_on_gpu(case: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    assert run_case(case, "cuda")["ok"]


@pytest.mark.cuda
def test_compiles_go_on_after_returning_and_the_first_launch_waits(tmp_path: Path) -> None:
    """`compile_triton_kernels` returns while its kernels compile; the first launch
    waits for them (then launches what was compiled, not a second compile)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from ember.runtime import triton_kernels

    x = torch.randn(64, 256, device="cuda")
    _, schedule = lower_for_triton(lambda a: a * 3 + 1, [x], False)  # a CUDA kernel: precompiled
    (kernel,) = schedule.kernels
    assert kernel.device.type == "cuda" and not kernel.size_arguments()
    (launcher,) = triton_kernels.compile_triton_kernels([kernel], cache_dir=tmp_path).values()
    assert isinstance(launcher, triton_kernels.TritonLauncher)
    pending = launcher.pending
    assert pending is not None and not pending._finished
    out = torch.empty_like(x)
    launcher(*[out if name in kernel.outputs else x for name in kernel.buffer_arguments()])
    assert launcher.pending is None and pending._finished
    torch.testing.assert_close(out, x * 3 + 1)


@pytest.mark.cuda
def test_a_graph_reusing_a_kernel_still_compiling_waits_for_it(tmp_path: Path) -> None:
    """A second graph with the same kernel source (the same jit function) does not
    capture it again while the first graph's session loads it: its first launch
    waits for that session instead."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from ember.runtime import triton_kernels

    x = torch.randn(64, 256, device="cuda")
    _, schedule = lower_for_triton(lambda a: a * 5 - 2, [x], False)
    (kernel,) = schedule.kernels
    assert kernel.device.type == "cuda"
    (first,) = triton_kernels.compile_triton_kernels([kernel], cache_dir=tmp_path).values()
    (second,) = triton_kernels.compile_triton_kernels([kernel], cache_dir=tmp_path).values()
    assert isinstance(first, triton_kernels.TritonLauncher)
    assert isinstance(second, triton_kernels.TritonLauncher)
    assert first.pending is not None and second.pending is not None
    assert first.pending in second.pending._earlier
    owner = first.pending
    out = torch.empty_like(x)
    second(*[out if name in kernel.outputs else x for name in kernel.buffer_arguments()])
    assert owner._finished  # the second graph's first launch waited for the first's
    torch.testing.assert_close(out, x * 5 - 2)


if __name__ == "__main__":
    report(run_case, sys.argv[1:])
