"""Split reductions rendered for Triton: the partial and the final kernel's tiles, and
both run in Triton's interpreter (every config on the menu, `config_menu`) against
eager.

`TRITON_INTERPRET=1` must be set before Triton is imported and must not leak into
other tests, so the kernels run in a subprocess (`python test_triton_split.py`) that
prints one JSON line per case.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from triton_cases import interpret, report, run_schedule

from ember.codegen.triton import COLUMN_XBLOCK, TRITON_CHOICES, plan_kernel, render_kernel
from ember.codegen.triton.plan import config_menu
from ember.graphpasses import ember_decompositions
from ember.ir import LoweringOptions, Program, lower_graph
from ember.scheduler import DeviceChoices, Schedule, schedule_program

# Small thresholds, so that test-sized tensors split (TRITON_CHOICES's need 10**5+).
SMALL = DeviceChoices(split_workers=16, split_column_width=4, split_min_chunk=8)


def _bias_grad(h: torch.Tensor, gy: torch.Tensor, w: torch.Tensor) -> Any:
    # ReLU's backward (GELU's needs libdevice, which the interpreter lacks)
    g = torch.ops.aten.threshold_backward(gy, h, 0.0)
    return g @ w, g.sum(0)


def _qkv_bias_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
    # [B, H, T, D] gradients read as one [B*T, 3*H*D] matrix: columns contiguous in
    # runs of H*D (non-affine), tiled [columns x rows] (plan._outer_contiguous); every
    # config on the menu runs
    stacked = torch.stack([q, k, v]).permute(1, 3, 0, 2, 4)
    return stacked.reshape(q.shape[0] * q.shape[2], -1).sum(0)


CASES: dict[str, tuple[Callable[..., Any], list[tuple[int, ...]], torch.dtype]] = {
    "sum_cols": (lambda x: x.sum(0), [(96, 24)], torch.float32),
    "sum_cols_bf16": (lambda x: x.sum(0), [(128, 24)], torch.bfloat16),
    "sum_rows": (lambda x: x.sum(-1), [(3, 320)], torch.float32),
    "sum_all": (lambda x: x.sum(), [(40, 24)], torch.float32),
    "max_cols_epilogue": (lambda x: x.amax(0) * 2 + 1, [(64, 12)], torch.float32),
    "any_all": (lambda x: ((x > 2).any(0), (x > -2.5).all(-1)), [(96, 8)], torch.float32),
    "bias_grad": (_bias_grad, [(64, 16), (64, 16), (16, 8)], torch.float32),
    "qkv_bias_grad": (_qkv_bias_grad, [(4, 2, 16, 8)] * 3, torch.float32),
}


def _schedule(name: str) -> tuple[Program, Schedule, list[torch.Tensor]]:
    fn, shapes, dtype = CASES[name]
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    gm = make_fx(fn, decomposition_table=ember_decompositions())(*args)
    program = lower_graph(gm, options=LoweringOptions(loops=True))
    return program, schedule_program(program, SMALL), args


def test_column_partial_is_an_outputs_by_rows_tile() -> None:
    _, schedule, _ = _schedule("sum_cols")
    partial, final = schedule.kernels
    for kernel in (partial, final):
        rendered = render_kernel(kernel)
        assert rendered.kind in ("persistent_reduction", "looped_reduction")
        plan = plan_kernel(kernel)
        assert [a.name for a in plan.axes] == ["x", "r"]  # block [outputs, rows]
        # the first config is a tile of outputs: all 24 (a power of two at least) and
        # at most COLUMN_XBLOCK wide
        assert 32 <= rendered.configs[0].block("XBLOCK") <= COLUMN_XBLOCK
    # chunks x outputs partial values, loads contiguous along the outputs (x)
    assert "tl.arange(0, XBLOCK)[:, None]" in render_kernel(partial).source


def test_triton_choices_split_a_large_column_sum_only() -> None:
    assert TRITON_CHOICES.reduction_chunks(4096, 32768, 32768, column=True) == 32
    assert TRITON_CHOICES.reduction_chunks(32768, 4096, 4096, column=False) == 1
    assert TRITON_CHOICES.reduction_chunks(4096, 512, 512, column=True) == 2
    assert TRITON_CHOICES.reduction_chunks(16, 64, 64, column=False) == 1


def test_large_pointwise_kernels_offer_more_elements_per_thread() -> None:
    from ember.codegen.triton.plan import LARGE_POINTWISE

    small, large = _pointwise(1 << 12), _pointwise(LARGE_POINTWISE)
    assert len(config_menu(small, plan_kernel(small))) == 4
    menu = config_menu(large, plan_kernel(large))
    assert len(menu) == 6
    assert any(c.block("XBLOCK") // (32 * c.num_warps) == 16 for c in menu)
    # 8 MiB of float32 traffic: timed with three configs, 4, 8 and 16 elements a thread
    timed = render_kernel(large).configs
    assert timed[0] == menu[0]
    assert sorted(c.block("XBLOCK") // (32 * c.num_warps) for c in timed) == [4, 8, 16]
    assert render_kernel(small).configs == config_menu(small, plan_kernel(small))[:1]


def _pointwise(numel: int) -> Any:
    x = torch.empty(numel)
    gm = make_fx(lambda t: torch.nn.functional.gelu(t), decomposition_table=ember_decompositions())(
        x
    )
    program = lower_graph(gm, options=LoweringOptions(loops=True))
    (kernel,) = schedule_program(program, TRITON_CHOICES).kernels
    return kernel


# -- running the kernels in the interpreter ----------------------------------------------


def run_case(name: str) -> dict[str, Any]:
    fn, _, dtype = CASES[name]
    program, schedule, args = _schedule(name)
    partials = [n.name for n in schedule.program.nodes if n.name.endswith("_partial")]
    expected = fn(*[a.clone() for a in args])
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    tolerance = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {}
    configs = max(len(config_menu(k, plan_kernel(k))) for k in schedule.kernels)
    for config in range(configs):
        actual = run_schedule(program, schedule, [a.clone() for a in args], config)
        for a, e in zip(actual, expected, strict=True):
            torch.testing.assert_close(a, e, **tolerance)
    return {"case": name, "ok": True, "partials": len(partials), "kernels": len(schedule.kernels)}


@pytest.fixture(scope="module")
def interpreted() -> dict[str, dict[str, Any]]:
    return interpret(__file__, list(CASES))


@pytest.mark.parametrize("case", list(CASES))
def test_split_kernels_match_eager_in_the_interpreter(
    case: str, interpreted: dict[str, dict[str, Any]]
) -> None:
    record = interpreted.get(case)
    assert record is not None, f"case {case} did not report"
    assert record["ok"], record.get("error")
    if case == "qkv_bias_grad":
        # whole: the scheduler's split sees only affine column loads (this one's are
        # contiguous in runs); it runs here for its [columns x rows] tiles
        from ember.codegen.triton.plan import _outer_contiguous

        assert record["kernels"] == 1
        assert all(_outer_contiguous(k) for k in _schedule(case)[1].kernels)
        return
    assert record["partials"] >= 1
    # the bias gradient: the pointwise gradient is stored by the partial kernel
    assert record["kernels"] == 1 + record["partials"] + (case == "any_all")


if __name__ == "__main__":
    report(run_case, sys.argv[1:])
