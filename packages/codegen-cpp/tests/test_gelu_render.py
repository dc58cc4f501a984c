"""GELU as one prelude call: the emitter writes float32 `aten.gelu` (the lowering's
`x * 0.5 * (1 + erf(x * sqrt(1/2)))`) as `ember::gelu(x)` and leaves every other
shape, dtype and the tanh form op by op."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.codegen.cpp import render_kernels
from ember.codegen.cpp.emitter import gelu_operand
from ember.graphpasses import ember_decompositions
from ember.ir import Const, Load, LoweringOptions, Op, lower_graph
from ember.ir.symbolic import index_var
from ember.scheduler import schedule_program


def _kernel_text(fn: Callable[..., Any], *args: torch.Tensor) -> str:
    """The rendered unit without its prelude (the prelude defines ember::gelu)."""
    gm = make_fx(fn, decomposition_table=ember_decompositions())(*args)
    kernels = schedule_program(lower_graph(gm, options=LoweringOptions(loops=True))).kernels
    source = render_kernels(kernels).source
    return source[source.index(f"void {kernels[0].name}(") :]


def test_float32_gelu_is_one_call() -> None:
    text = _kernel_text(lambda x: F.gelu(x) * 3, torch.randn(8, 64))
    assert text.count("ember::gelu(") == 1
    assert "ember::erf(" not in text  # the formula's inner ops are not emitted


def test_half_gelu_computes_in_float32_through_the_call() -> None:
    text = _kernel_text(F.gelu, torch.randn(8, 64).to(torch.bfloat16))
    assert "ember::gelu(" in text


def test_other_forms_stay_op_by_op() -> None:
    double = _kernel_text(F.gelu, torch.randn(8, 64, dtype=torch.float64))
    assert "ember::gelu(" not in double and "ember::erf(" in double
    tanh = _kernel_text(lambda x: F.gelu(x, approximate="tanh"), torch.randn(8, 64))
    assert "ember::gelu(" not in tanh and "ember::tanh(" in tanh
    # erf(x * c) * 0.5 with another constant, or of another operand, is not GELU
    near = _kernel_text(lambda x: x * 0.5 * (1 + torch.erf(x * 0.7)), torch.randn(8, 64))
    assert "ember::gelu(" not in near
    other = _kernel_text(
        lambda x, y: x * 0.5 * (1 + torch.erf(y * math.sqrt(0.5))),
        torch.randn(8, 64),
        torch.randn(8, 64),
    )
    assert "ember::gelu(" not in other


def test_gelu_operand_takes_either_argument_order() -> None:
    f32 = torch.float32
    x = Load("x", index_var("i", 0), f32)
    erf = Op("erf", (Op("mul", (Const(math.sqrt(0.5), f32), x), f32),), f32)
    one_plus = Op("add", (erf, Const(1.0, f32)), f32)
    half = Op("mul", (Const(0.5, f32), x), f32)
    assert gelu_operand(Op("mul", (one_plus, half), f32)) is x
    assert gelu_operand(Op("mul", (half, one_plus), f32)) is x
    assert gelu_operand(Op("mul", (half, erf), f32)) is None  # no 1 +
