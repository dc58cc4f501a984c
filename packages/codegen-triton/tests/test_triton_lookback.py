"""One-pass look-back scans (ember.codegen.triton.lookback): which kernels get the
plan, what their source and launch contract say, and, in Triton's interpreter, their
values over several launches on one workspace (each launch's words tagged apart from
the last's) and the look-back helper itself on published words set up by hand.

The interpreter runs programs one after another, in ticket order: each tile's
predecessors have all published their inclusive prefixes before it looks back, so the
kernel runs never wait. The helper cases publish words as concurrent tiles would
leave them (aggregates only, over more than one window; an inclusive prefix with
older words behind it) and check what the look-back combines. The waiting itself
runs on a GPU (tests/cuda/test_gpu_scans.py).

As in test_triton_split, the interpreter runs in a subprocess (`TRITON_INTERPRET=1`
must be set before Triton is imported), which prints one JSON record per case.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from triton_cases import fused_kernels, interpret, load_function, randn, report

from ember.codegen.triton import render_kernel
from ember.codegen.triton.kernel import TritonKernel
from ember.codegen.triton.lookback import WINDOW
from ember.codegen.triton.plan import LOOKBACK_SCAN, LOOPED_SCAN, config_menu, plan_kernel


def _rendered(fn: Any, *args: torch.Tensor, **options: Any) -> TritonKernel:
    (kernel,) = fused_kernels(fn, *args)
    return render_kernel(kernel, **options)


def test_long_float32_carried_rows_scan_with_look_back() -> None:
    # bfloat16 is carried in float32 on every device (float32 itself only on CUDA)
    rendered = _rendered(lambda x: x.cumsum(1), randn(3, 40000, dtype=torch.bfloat16))
    assert rendered.kind == LOOKBACK_SCAN
    assert rendered.workspace == 1
    assert rendered.grid.describe() == "cdiv(3, XBLOCK) * cdiv(40000, RBLOCK)"
    source = rendered.source
    signature = "(a0_ptr, a1_ptr, workspace_ptr, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr)"
    assert signature in source
    assert 'ticket = tl.atomic_add(workspace_ptr, 1, sem="relaxed")' in source
    assert "for roffset" not in source  # one tile a program
    # the aggregate is published before the tile's scan, the carry waited for after it
    order = [
        "ember_lookback_publish(a1_words",
        "tl.cumsum(a1_x, 1)",
        "a1_carry = ember_lookback_sum(",
    ]
    positions = [source.index(text) for text in order]
    assert positions == sorted(positions)
    assert all(c.block("XBLOCK") == 1 for c in rendered.configs)


def test_products_logsumexps_and_two_scans_share_the_workspace() -> None:
    x = randn(2, 40000, dtype=torch.float16)
    rendered = _rendered(lambda x: (x.cumsum(1), x.cumprod(1)), x)
    assert rendered.kind == LOOKBACK_SCAN and rendered.workspace == 2
    assert "a2_words = workspace_ptr + 1 + 1 * programs" in rendered.source
    assert "tl.cumprod(a1_x, 1)" in rendered.source or "tl.cumprod(a2_x, 1)" in rendered.source
    rendered = _rendered(lambda x: torch.logcumsumexp(x, 1), x)
    assert rendered.kind == LOOKBACK_SCAN
    assert "a1_carry = ember_lookback_logsumexp(" in rendered.source
    assert "tl.reduce(tl.where(take, value, identity), 0, ember_logaddexp_combine)" in (
        rendered.source
    )


@pytest.mark.parametrize(
    "fn, x",
    [
        (lambda x: x.cumsum(1), randn(3, 40000, dtype=torch.float64)),  # 64-bit carry
        (lambda x: x.cumsum(1), torch.randint(0, 9, (3, 40000))),  # int64
        (lambda x: x.cumsum(1), randn(64, 40000, dtype=torch.bfloat16)),  # many rows
        (lambda x: x.cumsum(1), randn(3, 20000, dtype=torch.bfloat16)),  # short
        (lambda x: torch.cummax(x, 1), randn(3, 40000, dtype=torch.bfloat16)),
    ],
)
def test_other_scans_keep_their_plans(fn: Any, x: torch.Tensor) -> None:
    (kernel,) = fused_kernels(fn, x)
    assert plan_kernel(kernel).kind != LOOKBACK_SCAN
    assert render_kernel(kernel).workspace == 0


def test_forced_looped_form_is_not_a_look_back() -> None:
    rendered = _rendered(
        lambda x: x.cumsum(1), randn(3, 40000, dtype=torch.bfloat16), reduction="looped"
    )
    assert rendered.kind == LOOPED_SCAN and rendered.workspace == 0


# -- in the interpreter ---------------------------------------------------------------

# name -> (function, input): rows no tile divides (33001), a middle dimension, both
# scans of a kernel, a product
KERNEL_CASES: dict[str, tuple[Any, Any]] = {
    "cumsum_row": (lambda x: x.cumsum(0), lambda: randn(33001, dtype=torch.bfloat16)),
    "cumsum_rows": (lambda x: x.cumsum(1), lambda: randn(2, 40000, dtype=torch.float16)),
    "cumsum_middle": (lambda x: x.cumsum(1), lambda: randn(2, 33001, 3, dtype=torch.bfloat16)),
    "cumsum_cumprod": (
        lambda x: (x.cumsum(0), x.cumprod(0)),
        lambda: (1 + randn(40000) * 1e-3).to(torch.float16),
    ),
}
LAUNCHES = 3


def run_kernel_case(name: str) -> dict[str, Any]:
    """Launch the case's one kernel LAUNCHES times on one workspace under each config,
    checking each launch's values against float64's within float32's rounding."""
    torch.manual_seed(0)
    fn, make = KERNEL_CASES[name]
    x = make()
    (kernel,) = fused_kernels(fn, x)
    rendered = render_kernel(kernel)
    assert rendered.kind == LOOKBACK_SCAN
    expected = fn(x.double())
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    directory = Path(tempfile.mkdtemp())
    jit = load_function(rendered.source, rendered.function_name, directory)
    tags = []
    for config in config_menu(kernel, plan_kernel(kernel)):
        programs = rendered.launch_grid(config, {})[0]
        workspace = torch.zeros(1 + rendered.workspace * programs, dtype=torch.int64)
        for _ in range(LAUNCHES):
            outputs = [torch.full(e.shape, float("nan"), dtype=x.dtype) for e in expected]
            jit[(programs,)](x, *outputs, workspace, **dict(config.blocks))
            for got, want in zip(outputs, expected, strict=True):
                # float32 sums rounded once to the stored type
                scale = want.abs().max().item()
                error = (got.double() - want).abs().max().item()
                assert error <= scale * 2**-7, (config, error, scale)
        assert int(workspace[0]) == LAUNCHES * programs  # one ticket per program
        tags.append(sorted({int(w) >> 34 for w in workspace[1:]}))
    # every word was published in the last launch (tag LAUNCHES - 1)
    assert all(t == [LAUNCHES - 1] for t in tags), tags
    return {"case": name, "ok": True}


LOOKBACK_PROBE = """
import triton
import triton.language as tl
{helpers}

@triton.jit
def probe(words_ptr, out_ptr, tile, segment, tag):
    carry = ember_lookback_sum(words_ptr, tile, segment, tag, tl.full([], 0.0, tl.float32),
                               {window})
    tl.store(out_ptr, carry)
"""


def _word(tag: int, status: int, value: float) -> int:
    bits = int(torch.tensor(value, dtype=torch.float32).view(torch.int32)) & 0xFFFFFFFF
    return ((tag << 2 | status) << 32) | bits


def run_helper_case(name: str) -> dict[str, Any]:
    """`ember_lookback_sum` of tile 300 (segment 290 of its row) over words set by hand."""
    from ember.codegen.triton.helpers import helper_source

    helpers = helper_source({"ember_lookback_sum"})
    source = LOOKBACK_PROBE.format(helpers=helpers, window=WINDOW)
    probe = load_function(source, "probe", Path(tempfile.mkdtemp()))
    tile, segment, tag = 300, 290, 5
    words = torch.zeros(400, dtype=torch.int64)
    first = tile - segment
    if name == "aggregates_over_windows":
        # every tile before published its aggregate only; the row's first its prefix
        for t in range(first, tile):
            words[t] = _word(tag, 1, float(t))
        words[first] = _word(tag, 2, 1000.0)
        want = 1000.0 + sum(range(first + 1, tile))
    elif name == "nearest_inclusive_prefix":
        # older words behind an inclusive prefix are never read: the last launch's
        # words, zeros, another row's
        words[: tile - 3] = _word(tag - 1, 2, 9e9)
        words[tile - 3] = _word(tag, 2, 7.0)
        words[tile - 2] = _word(tag, 1, 0.5)
        words[tile - 1] = _word(tag, 1, 0.25)
        want = 7.75
    elif name == "first_tile_of_a_row":
        words[:tile] = _word(tag, 2, 9e9)
        probe[(1,)](words, out := torch.zeros(1), tile, 0, tag << 2)
        assert float(out) == 0.0
        return {"case": name, "ok": True}
    else:
        raise KeyError(name)
    out = torch.zeros(1)
    probe[(1,)](words, out, tile, segment, tag << 2)
    assert float(out) == pytest.approx(want, rel=1e-6), (float(out), want)
    return {"case": name, "ok": True}


HELPER_CASES = ["aggregates_over_windows", "nearest_inclusive_prefix", "first_tile_of_a_row"]


def run_case(name: str) -> dict[str, Any]:
    return run_kernel_case(name) if name in KERNEL_CASES else run_helper_case(name)


@pytest.fixture(scope="module")
def interpreted() -> dict[str, dict[str, Any]]:
    return interpret(__file__, [*KERNEL_CASES, *HELPER_CASES], processes=2)


@pytest.mark.parametrize("case", [*KERNEL_CASES, *HELPER_CASES])
def test_look_back_in_the_interpreter(case: str, interpreted: dict[str, dict[str, Any]]) -> None:
    record = interpreted.get(case)
    assert record is not None, f"case {case} did not report"
    assert record["ok"], record.get("error")


if __name__ == "__main__":
    report(run_case, sys.argv[1:])
