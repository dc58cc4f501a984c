"""grid_sampler_3d lowered (ember.ir.sampling) and run by the interpreter: bit for bit
eager's CPU values in every interpolation and padding mode, for float32, float64 and
the half types (rounded op by op as eager's scalar kernel rounds), with grid points
past the faces, at infinity and NaN, and with size-1 dimensions; one pointwise
loop with a masked indirect load per corner."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from ir_helpers import computed, lower

from ember.ir import Load, Pointwise, loads, run_program

G = torch.Generator().manual_seed(0)


def _grid(batch: int) -> torch.Tensor:
    grid = torch.randn(batch, 3, 2, 4, 3, generator=G) * 3
    edges = [float("nan"), float("inf"), -float("inf"), 1.0, -1.0, 0.0, 0.5, -0.5, 7.25]
    grid.view(-1)[: len(edges)] = torch.tensor(edges)
    return grid


VOLUMES = {
    "volume": (torch.randn(2, 3, 4, 5, 6, generator=G), _grid(2)),
    "flat": (torch.randn(1, 2, 1, 3, 1, generator=G), _grid(1)),  # reflects onto one voxel
}
MODES = list(itertools.product((0, 1), (0, 1, 2), (False, True)))


def _sampler(mode: int, padding: int, align: bool) -> Callable[..., torch.Tensor]:
    return lambda x, g: torch.grid_sampler_3d(x, g, mode, padding, align)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("volume", sorted(VOLUMES))
def test_matches_eager_bit_for_bit(volume: str, dtype: torch.dtype) -> None:
    x, grid = (t.to(dtype) for t in VOLUMES[volume])
    for mode, padding, align in MODES:
        fn = _sampler(mode, padding, align)
        (got,) = run_program(lower(fn, x, grid), [x, grid], seed=0)
        torch.testing.assert_close(got, fn(x, grid), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize(("mode", "corners"), [("bilinear", 8), ("nearest", 1)])
def test_functional_form_is_one_pointwise_loop(mode: str, corners: int) -> None:
    """F.grid_sample of a volume reaches the IR as grid_sampler_3d: one loop reading
    the eight corners through masked indirect loads (one voxel for nearest)."""
    x, grid = VOLUMES["volume"]
    program = lower(lambda x, g: F.grid_sample(x, g, mode=mode, align_corners=False), x, grid)
    (buffer,) = computed(program)
    assert isinstance(buffer.loop, Pointwise)
    gathers = [n for n in loads(buffer.loop.body) if isinstance(n, Load) and n.indirect]
    assert len(gathers) == corners and all(n.mask is not None for n in gathers)
