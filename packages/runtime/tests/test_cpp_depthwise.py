"""Compiled C++ kernels of depthwise convolutions (forward, and the backward under every
`output_mask`) against the IR interpreter and eager (cases: depthwise_cases), and the
convolution fused with the pointwise ops around it into one kernel."""

from __future__ import annotations

from typing import Any

import pytest
from cpp_harness import Case, case_fixtures, check_case
from depthwise_cases import CASES, tolerance
from torch.fx.experimental.proxy_tensor import make_fx

from ember.graphpasses import ember_decompositions
from ember.ir import LoweringOptions, lower_graph
from ember.scheduler import DEFAULT_CHOICES, ExternCall, schedule_program

TABLE = {name: (fn, tuple(make("cpu")), False) for name, (fn, make) in CASES.items()}

# the IR patch (see `cpp_harness.exact_evaluate`), the traced cases, one compiled unit
_exact_ir_evaluation, traced, compiled = case_fixtures(TABLE, "cpp-depthwise-cache")


def _interpreter(output: Any) -> tuple[float, float]:
    # the same sums in the same order; a C++ compiler may contract a multiply-add
    return (1e-5, 1e-5) if output.dtype.is_floating_point else (0.0, 0.0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_matches_interpreter_and_eager(
    name: str, traced: dict[str, Case], compiled: dict[str, Any]
) -> None:
    case = traced[name]
    assert case.kernels, "the case should produce fused kernels"
    check_case(case, compiled, tolerance=_interpreter, eager_tolerance=tolerance)


def test_no_convolution_calls_and_fused_kernels(traced: dict[str, Case]) -> None:
    """No case calls an ATen convolution. In `fused` the convolution and the scale
    after it are one kernel; the scale and ReLU before it, which each output reads
    nine times, are stored first where shared values are not recomputed (the CPU's
    default) and computed in the convolution's kernel where they are (CUDA's)."""
    for name, case in traced.items():
        calls = [
            str(s.node.op) for s in case.schedule.steps
            if isinstance(s, ExternCall) and "convolution" in str(s.node.op)
        ]  # fmt: skip
        assert calls == [], name
    producer, conv = traced["fused"].kernels
    assert "convolution" not in producer.origins
    assert {"convolution", "mul_1"} <= set(conv.origins)
    case = traced["fused"]
    gm = make_fx(case.fn, decomposition_table=ember_decompositions())(*case.args)
    program = lower_graph(gm, options=LoweringOptions(loops=True, recompute_shared=True))
    (kernel,) = schedule_program(program, DEFAULT_CHOICES).kernels
    assert {"relu", "convolution", "mul_1"} <= set(kernel.origins)
