"""Where the reduction schedule goes in rendered C++ (no compiler here): every
reduction loop over outer points is `schedule(EMBER_REDUCTION_SCHEDULE)` (`runtime`
unless the macro is defined), right after the `ember::ReductionSchedule` that sets
it; loops that run on one thread, and other kernels' loops, carry neither."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.codegen.cpp import PRELUDE, render_kernels
from ember.graphpasses import ember_decompositions
from ember.ir import LoweringOptions, lower_graph
from ember.scheduler import schedule_program

SCOPE = "const ember::ReductionSchedule ember_schedule;"
PRAGMA = "#pragma omp parallel for schedule(EMBER_REDUCTION_SCHEDULE)"


def source_of(fn: Callable[..., Any], *args: Any, symbolic: bool = False) -> str:
    mode = "symbolic" if symbolic else "real"
    gm = make_fx(fn, decomposition_table=ember_decompositions(), tracing_mode=mode)(*args)
    kernels = schedule_program(lower_graph(gm, options=LoweringOptions(loops=True))).kernels
    return render_kernels(kernels).source.removeprefix(PRELUDE)


@pytest.mark.parametrize(
    ("name", "fn", "shape"),
    [
        ("rows", lambda x: x.sum(-1), (512, 256)),
        ("softmax", lambda x: x.softmax(-1), (512, 256)),
        ("var", lambda x: x.var(-1), (512, 256)),
        ("columns", lambda x: x.sum(0), (256, 4096)),
    ],
)
def test_each_parallel_reduction_loop_sets_its_schedule_first(
    name: str, fn: Callable[..., Any], shape: tuple[int, ...]
) -> None:
    lines = [line.strip() for line in source_of(fn, torch.randn(shape)).splitlines()]
    pragmas = [k for k, line in enumerate(lines) if line.startswith(PRAGMA)]
    assert pragmas, name
    assert all(lines[k - 1] == SCOPE for k in pragmas), name
    assert sum(line == SCOPE for line in lines) == len(pragmas)


def test_a_symbolic_loop_keeps_its_run_time_if() -> None:
    lines = source_of(lambda x: x.sum(-1), torch.randn(512, 256), symbolic=True).splitlines()
    k = next(k for k, line in enumerate(lines) if PRAGMA in line)
    assert " if(" in lines[k] and lines[k - 1].strip() == SCOPE


def test_loops_on_one_thread_and_other_kernels_carry_no_schedule() -> None:
    small = source_of(lambda x: x.sum(-1), torch.randn(8, 16))
    assert "omp parallel for" not in small and SCOPE not in small
    pointwise = source_of(lambda x: x.exp() + 1, torch.randn(512, 256))
    assert "omp parallel for" in pointwise
    assert "EMBER_REDUCTION_SCHEDULE" not in pointwise and SCOPE not in pointwise


def test_the_prelude_reads_the_run_time_schedule_by_default() -> None:
    assert "#define EMBER_REDUCTION_SCHEDULE runtime" in PRELUDE
    assert "struct ReductionSchedule" in PRELUDE and "omp_set_schedule" in PRELUDE
