"""Matmul templates (ember.scheduler.epilogue): which consumers fuse into a matrix
product as its epilogue, which do not, and that the fused schedule still computes
eager's values (through the scheduler's interpreter)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ember.ir import Program
from ember.scheduler import (
    DEFAULT_CHOICES,
    ExternCall,
    FusedKernel,
    Schedule,
    matmul_operands,
    matmul_roles,
    run_schedule,
    schedule_program,
)

TEMPLATES = dataclasses.replace(DEFAULT_CHOICES, matmul_templates=True, matmul_epilogues=True)


Lower = Callable[..., Program]  # the `lower` fixture (conftest.py)


def _schedule(
    lower: Lower, fn: Callable[..., Any], *args: torch.Tensor, **options: Any
) -> Schedule:
    choices = dataclasses.replace(TEMPLATES, **options)
    return schedule_program(lower(fn, *args), choices)


def _matmul_calls(schedule: Schedule) -> list[str]:
    return [
        s.node.op.__name__
        for s in schedule.steps
        if isinstance(s, ExternCall) and s.node.op.__name__.split(".")[0] in ("mm", "addmm", "bmm")
    ]


def _templates(schedule: Schedule) -> list[FusedKernel]:
    return [k for k in schedule.kernels if k.matmul is not None]


def _check_values(schedule: Schedule, fn: Callable[..., Any], *args: torch.Tensor) -> None:
    expected = fn(*args)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    actual = run_schedule(schedule, list(args))
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def _linear_gelu_residual(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor
) -> Any:
    return F.gelu(F.linear(x, w, b)) + r


def _transposed_result(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor) -> Any:
    return (x @ w).t() + r


def test_a_transposed_result_is_stored_transposed_by_the_epilogue(lower: Lower) -> None:
    """Lowering gives `(x @ w).t() + r` a column-major layout, so the add reads the
    product at the point it computes: it fuses, and stores through its strides."""
    args = (torch.randn(37, 53), torch.randn(53, 29), torch.randn(29, 37))
    schedule = _schedule(lower, _transposed_result, *args)
    (kernel,) = _templates(schedule)
    assert len(kernel.members) == 2
    _check_values(schedule, _transposed_result, *args)


def test_linear_bias_activation_and_residual_fuse_into_one_template(lower: Lower) -> None:
    args = (torch.randn(37, 53), torch.randn(29, 53), torch.randn(29), torch.randn(37, 29))
    schedule = _schedule(lower, _linear_gelu_residual, *args)
    assert _matmul_calls(schedule) == []
    (kernel,) = schedule.kernels
    assert kernel.matmul is not None and not kernel.matmul.tf32
    assert kernel.name.startswith("k0_mm_addmm_gelu_add")
    product, result = kernel.members
    assert not product.stored  # read only by its epilogue
    assert result.stored and result.kind == "pointwise"
    operands = matmul_operands(product.body)
    assert operands is not None
    a, b = operands
    roles = matmul_roles(product.body, len(kernel.ranges))
    assert roles is not None
    # the weight is read transposed in place: stride 53 along N, 1 along K
    assert b.index.coeff(roles.n) == 53 and b.index.coeff(roles.k) == 1
    assert a.index.coeff(roles.m) == 53
    _check_values(schedule, _linear_gelu_residual, *args)


def test_off_unless_the_codegen_renders_templates(lower: Lower) -> None:
    args = (torch.randn(37, 53), torch.randn(29, 53), torch.randn(29), torch.randn(37, 29))
    cpp_like = _schedule(lower, _linear_gelu_residual, *args, matmul_templates=False)
    not_asked = _schedule(lower, _linear_gelu_residual, *args, matmul_epilogues=False)
    for schedule in (cpp_like, not_asked):
        assert _matmul_calls(schedule) == ["addmm.default"]
        assert _templates(schedule) == []


def test_tf32_choice_reaches_the_kernel(lower: Lower) -> None:
    args = (torch.randn(37, 53), torch.randn(29, 53), torch.randn(29), torch.randn(37, 29))
    (kernel,) = _schedule(lower, _linear_gelu_residual, *args, matmul_tf32=True).kernels
    assert kernel.matmul is not None and kernel.matmul.tf32


def _transposed_read(x: torch.Tensor, w: torch.Tensor) -> Any:
    y = x @ w
    return y + y.t()  # reads the product at (m, n) and at (n, m)


def _shifted_read(x: torch.Tensor, w: torch.Tensor) -> Any:
    y = x @ w
    return y[1:] - y[:-1]


def _reduction_reader(x: torch.Tensor, w: torch.Tensor) -> Any:
    return (x @ w).sum(-1)


def test_illegal_consumers_leave_the_call_to_atens(lower: Lower) -> None:
    """A consumer reading the product at another point (transposed, shifted) or
    reducing it cannot be its epilogue; with nothing fused the call stays cuBLAS's."""
    x, w = torch.randn(37, 53), torch.randn(53, 29)
    cases = [
        (_transposed_read, (x, torch.randn(53, 37))),
        (_shifted_read, (x, w)),
        (_reduction_reader, (x, w)),
    ]
    for fn, args in cases:
        schedule = _schedule(lower, fn, *args)
        assert _matmul_calls(schedule) == ["mm.default"], fn.__name__
        assert _templates(schedule) == [], fn.__name__
        _check_values(schedule, fn, *args)


def _kept_and_fused(x: torch.Tensor, w: torch.Tensor) -> Any:
    y = x @ w
    return torch.tanh(y), y.sum(0)


def test_product_read_elsewhere_is_stored_by_the_template(lower: Lower) -> None:
    args = (torch.randn(37, 53), torch.randn(53, 29))
    schedule = _schedule(lower, _kept_and_fused, *args)
    (template,) = _templates(schedule)
    product = template.members[0]
    assert product.stored  # the column sum runs in a kernel of its own
    assert len(template.members) == 2 and template.members[1].stored
    assert len(schedule.kernels) == 2
    _check_values(schedule, _kept_and_fused, *args)


def _plain_mm(x: torch.Tensor, w: torch.Tensor) -> Any:
    return x @ w


def _bmm_scale(a: torch.Tensor, b: torch.Tensor) -> Any:
    return torch.bmm(a, b) * 0.125


def test_plain_mm_stays_an_aten_call_and_bmm_fuses_with_a_batch_role(lower: Lower) -> None:
    x, w = torch.randn(37, 53), torch.randn(53, 29)
    assert _matmul_calls(_schedule(lower, _plain_mm, x, w)) == ["mm.default"]
    args = (torch.randn(3, 37, 53), torch.randn(3, 53, 29))
    schedule = _schedule(lower, _bmm_scale, *args)
    (kernel,) = _templates(schedule)
    roles = matmul_roles(kernel.members[0].body, len(kernel.ranges))
    assert roles is not None and roles.batch is not None
    _check_values(schedule, _bmm_scale, *args)


def test_degenerate_and_integer_matmuls_are_left_alone(lower: Lower) -> None:
    row = (torch.randn(1, 53), torch.randn(29, 53), torch.randn(29), torch.randn(1, 29))
    assert _matmul_calls(_schedule(lower, _linear_gelu_residual, *row)) == ["addmm.default"]
    ints = (torch.randint(0, 5, (37, 53)), torch.randint(0, 5, (53, 29)))
    assert _matmul_calls(_schedule(lower, lambda a, b: (a @ b) + 1, *ints)) == ["mm.default"]


def test_dynamic_rows_fuse(lower: Lower) -> None:
    args = (torch.randn(37, 53), torch.randn(29, 53), torch.randn(29), torch.randn(37, 29))
    program = lower(_linear_gelu_residual, *args, symbolic=True)
    schedule = schedule_program(program, TEMPLATES)
    (kernel,) = schedule.kernels
    assert kernel.matmul is not None
    assert kernel.size_arguments()  # M is a size symbol
    _check_values(schedule, _linear_gelu_residual, *args)
