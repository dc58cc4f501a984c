"""Compiled C++ kernels of index_reduce, scatter_reduce's mean, put, masked_scatter,
as_strided_scatter, frexp, bilinear, max_pool2d's backward, embedding_bag,
grid_sampler_3d and antialiased resampling against the IR interpreter and eager:
duplicate indices, bfloat16, empty inputs, and eager's error for an index out of
range. One compile for all the cases."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from cpp_harness import Case, case_fixtures, check_case

aten = torch.ops.aten
G = torch.Generator().manual_seed(0)
X = torch.randn(40, 7, generator=G)
SRC = torch.randn(60, 7, generator=G)
DUPS = torch.randint(0, 40, (60,), generator=G)  # ~20 rows of 40 hit more than once
MASK = torch.rand(40, 7, generator=G) > 0.4
POOLED = F.max_pool2d(torch.randn(2, 3, 9, 9, generator=G), 3, 2, 1, return_indices=True)


BAG_TABLE = torch.randn(30, 7, generator=G)
BAG_TABLE[4, 2] = float("nan")
BAG_IDS = torch.randint(0, 30, (90,), generator=G)
BAG_OFFSETS = torch.tensor([0, 11, 11, 40, 41, 90])  # an empty bag inside and at the end
PAD = int(BAG_IDS[3])


def _bags(t: torch.Tensor, i: torch.Tensor, o: torch.Tensor, w: torch.Tensor) -> Any:
    """Every mode; the last offset closing the last bag; a padding row."""
    bag = F.embedding_bag
    return (
        bag(i, t, o, mode="sum", per_sample_weights=w),
        bag(i, t, o[:-1], mode="mean", padding_idx=PAD),
        bag(i, t, o, mode="max", include_last_offset=True),
        bag(i, t, o, mode="max", padding_idx=4),
    )


VOLUME = torch.randn(2, 3, 4, 5, 6, generator=G)
GRID = torch.randn(2, 3, 2, 4, 3, generator=G) * 1.5  # past the faces too
GRID.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")])


def _grid_samples(x: torch.Tensor, g: torch.Tensor) -> Any:
    """Every interpolation and padding mode (a NaN or infinite point samples nothing,
    or the border)."""
    return tuple(
        torch.grid_sampler_3d(x, g, mode, padding, align)
        for mode, padding, align in ((0, 0, False), (0, 1, True), (0, 2, False), (1, 2, True))
    )


def _pool_backward(g: torch.Tensor, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return aten.max_pool2d_with_indices_backward(g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, i)


# an image wide enough for window centers in the hundreds, where the rounding of a
# center moves its weights by 1e-5 (ember.ir.antialias)
IMAGE = torch.randn(1, 2, 60, 456, generator=G) * 3


def _antialiased(x: torch.Tensor) -> Any:
    resize = F.interpolate
    return (
        resize(x, size=(25, 270), mode="bilinear", antialias=True),
        resize(
            x.to(memory_format=torch.channels_last), size=(90, 130), mode="bicubic", antialias=True
        ),
        resize(x, scale_factor=(0.3, 0.7), mode="bilinear", antialias=True, align_corners=True),
    )


CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...], bool]] = {
    "index_reduce": (
        lambda x, i, s: (
            x.index_reduce(0, i, s, "mean"),
            x.index_reduce(0, i, s, "amax", include_self=False),
            x.index_reduce(0, i, s * 0.1 + 1, "prod"),
            x.index_reduce(1, i[:3] % 7, s[:40, :3], "amin"),
        ),
        (X, DUPS, SRC),
        False,
    ),
    "index_reduce_bf16": (
        lambda x, i, s: x.index_reduce(0, i, s, "mean", include_self=False),
        (X.bfloat16(), DUPS, SRC.bfloat16()),
        False,
    ),
    "scatter_mean": (
        lambda x, i, s: (
            x.scatter_reduce(0, i, s, "mean"),
            x.scatter_reduce(0, i, s, "mean", include_self=False),
        ),
        (X, DUPS[:42].view(6, 7), SRC[:6]),
        False,
    ),
    "put": (  # distinct positions (negative ones too) and repeated ones accumulated
        lambda x, i, d, s: (x.put(i - 280, s), x.put(d, s, accumulate=True)),
        (X, torch.randperm(280, generator=G)[:90].view(10, 9),
         torch.randint(0, 280, (90,), generator=G), torch.randn(90, generator=G)),
        False,
    ),
    "put_empty": (
        lambda x, i, s: x.put(i, s, accumulate=True),
        (X, torch.zeros(0, dtype=torch.int64), torch.zeros(0)),
        False,
    ),
    "masked_scatter": (
        lambda x, m, s: (x.masked_scatter(m, s), x.masked_scatter(m[3], s)),
        (X, MASK, torch.randn(300, generator=G)),
        False,
    ),
    "as_strided_scatter": (
        lambda x, s: x.as_strided_scatter(s, (5, 3), (14, 2), 3),
        (X, torch.randn(5, 3, generator=G)),
        False,
    ),
    "frexp": (
        lambda x: (torch.frexp(x * 1e30), torch.frexp(x * 1e-40), torch.frexp(x.bfloat16())),
        (X,),
        False,
    ),
    "bilinear": (
        lambda a, b, w: F.bilinear(a, b, w),
        (X[:9, :5].contiguous(), SRC[:9, :6].contiguous(), torch.randn(4, 5, 6, generator=G)),
        False,
    ),
    "embedding_bag": (_bags, (BAG_TABLE, BAG_IDS, BAG_OFFSETS, torch.randn(90, generator=G)),
                      False),
    "embedding_bag_bf16": (_bags, (BAG_TABLE.bfloat16(), BAG_IDS, BAG_OFFSETS,
                                   torch.randn(90, generator=G).bfloat16()), False),
    "grid_sampler_3d": (_grid_samples, (VOLUME, GRID), False),
    "grid_sampler_3d_bf16": (_grid_samples, (VOLUME.bfloat16(), GRID.bfloat16()), False),
    "upsample_antialias": (_antialiased, (IMAGE,), False),
    "pool_backward": (_pool_backward, (torch.randn_like(POOLED[0]), torch.randn(2, 3, 9, 9),
                                       POOLED[1]), False),
}  # fmt: skip


_exact_ir_evaluation, traced, compiled = case_fixtures(CASES, "cpp-scatter-cache")


@pytest.mark.parametrize("name", sorted(CASES))
def test_scatter_kernels_match_interpreter_and_eager(
    name: str, traced: dict[str, Case], compiled: dict[str, Any]
) -> None:
    case = traced[name]
    assert case.kernels
    assert not case.program.fallback_ops  # only views of results stay ATen calls

    def tolerance(output: torch.Tensor) -> tuple[float, float]:
        if name == "frexp" or not output.dtype.is_floating_point:
            return 0.0, 0.0
        return (1e-2, 1e-2) if output.dtype == torch.bfloat16 else (1e-5, 1e-5)

    check_case(case, compiled, tolerance=tolerance)
