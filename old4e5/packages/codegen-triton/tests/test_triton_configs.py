"""How many launch configs a kernel gets: its guess alone when it moves little memory
(a few microseconds whatever the config), a short, spread-out list when it is large."""

from __future__ import annotations

import torch
from triton_cases import fused_kernels, randn

from ember.codegen.triton import LaunchConfig, plan_kernel, render_kernel
from ember.codegen.triton.plan import (
    MAX_TUNED,
    SMALL_TRAFFIC,
    _spread,
    config_menu,
    traffic_bytes,
)


def _empty(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def test_small_kernels_get_their_guess_only() -> None:
    kernels = [
        *fused_kernels(lambda x: torch.nn.functional.gelu(x), randn(1000)),
        *fused_kernels(lambda x: torch.softmax(x, -1), randn(64, 100)),
        *fused_kernels(lambda x: x.t().contiguous() * 2, randn(128, 96)),
        *fused_kernels(lambda x: x.sum(0), randn(5000, 64)),
    ]
    for kernel in kernels:
        assert traffic_bytes(kernel) < SMALL_TRAFFIC
        menu = config_menu(kernel, plan_kernel(kernel))
        assert len(menu) > 1
        assert render_kernel(kernel).configs == menu[:1]


def test_large_kernels_get_a_short_spread_out_list() -> None:
    kernels = [
        *fused_kernels(lambda x: torch.nn.functional.gelu(x), _empty(4096, 2048)),
        *fused_kernels(lambda x: torch.softmax(x.float(), -1), _empty(4096, 2048)),
        *fused_kernels(lambda x: x.t().contiguous() * 2, _empty(2048, 2048)),
        *fused_kernels(lambda x: torch.softmax(x, -1), _empty(512, 20000)),
    ]
    kinds = set()
    for kernel in kernels:
        assert traffic_bytes(kernel) >= SMALL_TRAFFIC
        menu = config_menu(kernel, plan_kernel(kernel))
        rendered = render_kernel(kernel)
        configs = rendered.configs
        kinds.add(rendered.kind)
        assert 2 <= len(configs) <= MAX_TUNED < len(menu), (rendered.kind, configs)
        assert configs[0] == menu[0]  # the guess stays first
        assert [c for c in menu if c in configs] == list(configs)  # in menu order
    assert kinds == {"pointwise", "persistent_reduction", "pointwise_2d", "looped_reduction"}


def test_traffic_counts_each_access_over_the_variables_it_uses() -> None:
    (kernel,) = fused_kernels(lambda x, b: x + b, randn(1024, 512), randn(512))
    # x read and the result written (1024 * 512 floats each), the bias once per column
    assert traffic_bytes(kernel) == 2 * 1024 * 512 * 4 + 512 * 4
    (sums,) = fused_kernels(lambda x: x.sum(-1), _empty(256, 4096, dtype=torch.float32))
    # the rows read once, one float written per row
    assert traffic_bytes(sums) == 256 * 4096 * 4 + 256 * 4


def test_size_symbols_count_as_large() -> None:
    (kernel,) = fused_kernels(lambda x: x * 2, randn(6, 4), dynamic=True)
    assert traffic_bytes(kernel) >= SMALL_TRAFFIC  # guessed 4096 x 4096
    assert len(render_kernel(kernel).configs) > 1


def test_spread_keeps_the_guess_then_the_farthest() -> None:
    def c(block: int, warps: int) -> LaunchConfig:
        return LaunchConfig((("XBLOCK", block),), warps)

    menu = (c(1024, 4), c(512, 4), c(2048, 8), c(256, 2), c(2048, 4), c(4096, 8))
    assert _spread(menu, 3) == (c(1024, 4), c(256, 2), c(4096, 8))
    assert _spread(menu, 1) == (c(1024, 4),)
    assert _spread(menu[:2], 3) == menu[:2]
