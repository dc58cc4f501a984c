"""Rendering behaviour: the op table covers the ops protocol, unsupported things fail
clearly, plans and configs follow the kernel's shape, sources are valid Python."""

from __future__ import annotations

import ast
import math
import re
from dataclasses import replace

import pytest
import sympy
import torch
from triton_cases import fused_kernels, randn

from ember.codegen.triton import (
    TRITON_OPS,
    UNSUPPORTED,
    LaunchConfig,
    UnsupportedKernelError,
    plan_kernel,
    render_kernel,
)
from ember.ir import Op
from ember.ir.ops import OP_NAMES


def test_every_op_is_rendered_or_listed_unsupported() -> None:
    assert set(TRITON_OPS) | set(UNSUPPORTED) == OP_NAMES
    assert not set(TRITON_OPS) & set(UNSUPPORTED)
    for name, (floating, integral) in TRITON_OPS.items():
        assert floating or integral, name
        for template in (floating, integral):
            assert template is None or "\n" not in template


def test_unsupported_op_names_op_and_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(UNSUPPORTED, "hypot", "no rendering (for the test)")
    kernel = fused_kernels(lambda x: torch.exp(x) + 1, randn(8))[0]
    member = kernel.members[0]
    body = Op("hypot", (member.body, member.body), torch.float32)
    broken = replace(kernel, members=(replace(member, body=body),))
    with pytest.raises(UnsupportedKernelError, match=r"hypot") as info:
        render_kernel(broken)
    assert "for the test" in str(info.value) and kernel.name in str(info.value)


def test_special_function_helpers_are_emitted_with_their_callees() -> None:
    """K0 renders to ember's helper, which brings the Chebyshev series it sums, the
    i0e it calls for x <= 2, and the libdevice import (sqrt); the module parses."""

    kernel = fused_kernels(lambda x: torch.exp(x) + 1, randn(8))[0]
    member = kernel.members[0]
    body = Op("special_modified_bessel_k0", (member.body,), torch.float32)
    source = render_kernel(replace(kernel, members=(replace(member, body=body),))).source
    for helper in ("ember_k0", "ember_k0_small", "ember_i0e", "ember_cheb_k0_large"):
        assert f"def {helper}(" in source
    assert source.index("def ember_i0e(") < source.index("def ember_k0_small(")
    assert "from triton.language.extra import libdevice" in source
    assert "def ember_cheb_i1_small(" not in source
    ast.parse(source)


def _combining_scatter(reduce: str, dtype: torch.dtype) -> str:
    """The sources of the scatter kernels combining `reduce` into `dtype` elements."""
    x = torch.ones(10, 8).to(dtype)
    v = torch.ones(3, 8).to(dtype)
    kernels = fused_kernels(
        lambda x, i, v: x.index_reduce(0, i, v, reduce), x, torch.tensor([1, 1, 4]), v
    )
    combining = [k for k in kernels if any(m.scatter_reduce for m in k.members)]
    assert combining
    return "".join(render_kernel(k).source for k in combining)


@pytest.mark.parametrize(
    ("reduce", "dtype", "call"),
    [
        ("prod", torch.float32, "ember_scatter_cas(a0_ptr, "),
        ("prod", torch.int64, "tl.int64)"),
        ("prod", torch.bfloat16, "'prod', tl.bfloat16, tl.uint16)"),
        ("amax", torch.float16, "'max', tl.float16, tl.uint16)"),
        ("amin", torch.float32, "'min', tl.int32)"),  # Triton's float atomics lose NaN
        ("amin", torch.float64, "'min', tl.int64)"),
        ("prod", torch.int8, "'prod', tl.int8, tl.uint8)"),
        ("amax", torch.int32, "tl.atomic_max(a0_ptr"),
        ("mean", torch.bfloat16, "tl.atomic_add(a0_ptr"),
    ],
)
def test_combining_scatters_use_atomics_or_the_swap_loop(
    reduce: str, dtype: torch.dtype, call: str
) -> None:
    source = _combining_scatter(reduce, dtype)
    assert call in source
    atomics = re.search(r"tl\.atomic_(add|max|min)\(", source) is not None
    assert ("def ember_scatter_cas" in source) != atomics
    ast.parse(source)


def test_a_combination_into_bools_is_refused_clearly() -> None:
    kernels = fused_kernels(
        lambda x, i, v: x.index_add(0, i, v), randn(10, 8), torch.tensor([1, 1]), randn(2, 8)
    )
    scatter = kernels[-1]
    first = scatter.members[0]
    bools = replace(first.layout, dtype=torch.bool)
    member = replace(first, scatter_reduce="max", layout=bools)
    with pytest.raises(UnsupportedKernelError, match=r"max of torch\.bool"):
        render_kernel(replace(scatter, members=(member,)))


def test_sources_parse_and_name_the_kernel() -> None:
    kernels = fused_kernels(
        lambda x, w: (torch.softmax(x, -1) * w, x.t().contiguous(), x.argmax(0)),
        randn(64, 48),
        randn(48),
    )
    for kernel in kernels:
        rendered = render_kernel(kernel)
        tree = ast.parse(rendered.source)
        functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        assert rendered.function_name in functions
        assert kernel.name.endswith(rendered.function_name)  # k3_red_sum -> red_sum
        assert rendered.buffer_arguments == kernel.buffer_arguments()
        assert rendered.configs


def test_plans_follow_the_kernel_shape() -> None:
    (softmax,) = fused_kernels(lambda x: torch.softmax(x, -1), randn(8, 4096))
    assert plan_kernel(softmax).kind == "persistent_reduction"
    (long_rows,) = fused_kernels(lambda x: torch.softmax(x, -1), randn(2, 20000))
    assert plan_kernel(long_rows).kind == "looped_reduction"
    (transpose,) = fused_kernels(lambda x: x.t().contiguous(), randn(64, 32))
    plan = plan_kernel(transpose)
    assert plan.kind == "pointwise_2d"
    # x (the fast block axis) runs along the store's contiguous variable
    x_axis = plan.axis("x")
    assert x_axis is not None and x_axis.ranges == (sympy.Integer(64),)


def test_index_width() -> None:
    (small,) = fused_kernels(lambda x: x + 1, randn(1024))
    assert plan_kernel(small).index_type == "tl.int32"
    (dynamic,) = fused_kernels(lambda x: x + 1, randn(6, 4), dynamic=True)
    assert plan_kernel(dynamic).index_type == "tl.int64"


def test_dynamic_sizes_are_arguments_not_specialised() -> None:
    (kernel,) = fused_kernels(lambda x: x * 2, randn(6, 4), dynamic=True)
    rendered = render_kernel(kernel)
    assert rendered.size_arguments == tuple(s.name for s in kernel.size_arguments())
    assert rendered.size_arguments
    assert "do_not_specialize" in rendered.source
    config = rendered.configs[0]
    sizes = dict.fromkeys(rendered.size_arguments, 100)
    blocks = config.block("XBLOCK")
    expected = -(
        -int(kernel.ranges[0].xreplace({s: 100 for s in kernel.ranges[0].free_symbols})) // blocks
    )
    assert rendered.grid(config, sizes) == (expected, 1, 1)


def test_grid_two_axes() -> None:
    (kernel,) = fused_kernels(lambda x: x.t().contiguous(), randn(100, 70))
    rendered = render_kernel(kernel)
    config = LaunchConfig((("YBLOCK", 32), ("XBLOCK", 64)), 4)
    # y: the 70 output rows in blocks of 32; x: the 100 contiguous columns in blocks of 64
    assert rendered.grid(config, {}) == (3 * 2, 1, 1)


def test_low_precision_computes_in_float32() -> None:
    (kernel,) = fused_kernels(lambda x: x * 3, randn(64, dtype=torch.float16))
    source = render_kernel(kernel).source
    assert ".to(tl.float32)" in source and "to(tl.float16)" in source


def test_scatter_and_mutation_are_not_idempotent() -> None:
    kernels = fused_kernels(
        lambda x, i, v: x.index_add(0, i, v), randn(10, 8), torch.tensor([1, 1]), randn(2, 8)
    )
    rendered = render_kernel(kernels[-1])
    assert rendered.kind == "scatter" and not rendered.idempotent
    assert render_kernel(kernels[0]).idempotent


def test_repeated_layers_render_to_one_source() -> None:
    """Buffers are named by position and functions without the kernel number, so the
    same computation on other buffers renders identically (the runtime compiles it
    once); the kernels keep their own names for the wrapper."""

    def two_layers(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.softmax((torch.softmax(x * 2.0, -1) @ w) * 2.0, -1) @ w

    first, second = fused_kernels(two_layers, randn(8, 64), randn(64, 64))
    assert first.name != second.name
    one, two = render_kernel(first), render_kernel(second)
    assert one.name == first.name and two.name == second.name
    assert one.source == two.source and one.function_name in one.source
    different = fused_kernels(
        lambda x, w: torch.softmax(x * 3.0, -1) @ w, randn(8, 64), randn(64, 64)
    )
    assert render_kernel(different[0]).source != one.source


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_literals_round_as_torch_stores_them(dtype: torch.dtype) -> None:
    """`round_to` (no tensors: kernels render under fake-tensor tracing) gives what a
    tensor of `dtype` holds, at ties, overflow, subnormals and double-rounding edges."""
    import random

    from ember.codegen.triton.printer import round_to

    rng = random.Random(7)
    values = [0.0, -0.0, 1e-45, 2.0**-25, 2.0**-25 * 1.0000001, 65519.99, 65520.0, 7e4,
              3.39e38, 1e39, -1e39, 1.0 + 2**-8, 1.0 + 2**-8 + 2**-30, 1.0 + 2**-11 + 2**-40,
              float("inf"), float("-inf")]  # fmt: skip
    values += [
        rng.choice([-1, 1]) * rng.random() * 2 ** rng.uniform(-140, 130) for _ in range(3000)
    ]
    for value in values:
        expected = float(torch.tensor(value, dtype=dtype).item())
        assert round_to(value, dtype) == expected, value
    assert math.isnan(round_to(float("nan"), dtype))


def test_a_column_sum_through_a_reshape_of_permuted_tensors_tiles_the_columns() -> None:
    """The bias gradient of a fused q, k, v projection sums three [B, T, H, D]
    gradients read as one [B*T, 3*H*D] matrix: each column index is contiguous in runs
    of H*D (floor divisions and remainders, not affine), and such a column sum must
    still get [columns x rows] tiles; vit_base's ran 2 to 8 columns by 512 rows."""
    from ember.codegen.triton.plan import _outer_contiguous

    def qkv_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # [B, H, T, D] gradients as the projection's [B*T, 3*H*D] output gradient
        stacked = torch.stack([q, k, v]).permute(1, 3, 0, 2, 4)  # [B, T, 3, H, D]
        return stacked.reshape(q.shape[0] * q.shape[2], -1).float()

    shapes = [(4, 2, 6, 8)] * 3
    kernels = fused_kernels(lambda *g: qkv_grad(*g).sum(0), *(randn(*s) for s in shapes))
    (column_sum,) = [k for k in kernels if k.reduction_ranges]
    assert _outer_contiguous(column_sum)
    # a row sum of the same reshape still reads along its rows
    kernels = fused_kernels(lambda *g: qkv_grad(*g).sum(1), *(randn(*s) for s in shapes))
    (row_sum,) = [k for k in kernels if k.reduction_ranges]
    assert not _outer_contiguous(row_sum)


def test_float_size_expressions_divide_in_float64() -> None:
    """Batch norm's `n / (n - 1)` and `1 / n` with a symbolic `n` (torch's IntTrueDiv
    and FloatTrueDiv) had no Triton form. Printed, each division divides float64
    values, as Python does: evaluated with torch standing in for Triton (sizes as
    int64 scalars, `tl.full` a float64 scalar), the values are Python's exactly."""
    from types import SimpleNamespace

    from torch.utils._sympy.functions import FloatTrueDiv, IntTrueDiv, ToFloat

    from ember.codegen.triton.printer import IndexPrinter

    s0, s1 = (sympy.Symbol(n, integer=True, positive=True) for n in ("s0", "s1"))
    n = IntTrueDiv(8 * s0 * (s1 - 2) ** 2, 8)
    exprs = [FloatTrueDiv(n, n - 1.0), FloatTrueDiv(sympy.Float(1.0), n), ToFloat(s0) * 0.5]
    exprs += [IntTrueDiv(s0, s1 + 1), n - 1.0]
    texts = [IndexPrinter()(e) for e in exprs]
    tl = SimpleNamespace(
        float64=torch.float64,
        full=lambda shape, value, dtype: torch.full(shape, value, dtype=dtype),
    )
    for b, h in ((4, 10), (3, 5), (7, 3)):
        count = 8 * b * (h - 2) ** 2 / 8
        expected = [count / (count - 1.0), 1.0 / count, b * 0.5, b / (h + 1), count - 1.0]
        sizes = {"s0": torch.tensor(b), "s1": torch.tensor(h), "tl": tl}
        got = [eval(text, {"__builtins__": {}}, sizes) for text in texts]
        assert all(v.dtype == torch.float64 for v in got), texts
        assert [v.item() for v in got] == expected
