"""Rendering tests (no compiler here): the ops table covers the protocol, golden
sources for a few kernels, signatures and metadata, clear errors, index printing.

Set EMBER_UPDATE_GOLDEN=1 to rewrite the golden files after an intended change."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from ember.codegen.cpp import (
    OP_FORMATS,
    PRELUDE,
    UNSUPPORTED_OPS,
    CppRenderError,
    render_kernel,
    render_kernels,
)
from ember.codegen.cpp.indexing import print_index
from ember.codegen.cpp.ops_table import render_op
from ember.codegen.cpp.special import OP_FUNCTIONS
from ember.graphpasses import ember_decompositions
from ember.ir import Layout, Load, LoweringOptions, Op, lower_graph
from ember.ir.ops import OP_NAMES
from ember.ir.symbolic import index_var, indirect_var
from ember.scheduler import POINTWISE, FusedKernel, KernelMember, schedule_program

GOLDEN = Path(__file__).parent / "golden"


def kernels_of(fn: Callable[..., Any], *args: Any, symbolic: bool = False) -> list[FusedKernel]:
    mode = "symbolic" if symbolic else "real"
    gm = make_fx(fn, decomposition_table=ember_decompositions(), tracing_mode=mode)(*args)
    return schedule_program(lower_graph(gm, options=LoweringOptions(loops=True))).kernels


def test_ops_table_covers_the_protocol() -> None:
    assert set(OP_FORMATS) | set(OP_FUNCTIONS) | set(UNSUPPORTED_OPS) == set(OP_NAMES)
    assert not set(OP_FORMATS) & set(OP_FUNCTIONS)
    assert not (set(OP_FORMATS) | set(OP_FUNCTIONS)) & set(UNSUPPORTED_OPS)


def test_unknown_op_is_named_with_its_kernel() -> None:
    with pytest.raises(CppRenderError, match=r"op 'no_such_op'.*kernel 'k7'.*member 'buf3'"):
        render_op("no_such_op", ["t0"], "k7", "buf3")


def _special_kernel(name: str, op: str, nargs: int = 1) -> FusedKernel:
    i0 = index_var("i", 0)
    args = tuple(Load(f"x{k}", i0, torch.float32) for k in range(nargs))
    layout = Layout.contiguous(torch.device("cpu"), torch.float32, (sympy.Integer(8),))
    member = KernelMember("buf0", layout, POINTWISE, Op(op, args, torch.float32), i0, stored=True)
    inputs = tuple(f"x{k}" for k in range(nargs))
    return FusedKernel(name, (sympy.Integer(8),), (), (member,), inputs, ("buf0",))


def test_special_functions_are_emitted_only_where_called() -> None:
    """A unit carries the special functions its kernels call, each after the tables and
    functions it needs (K0 needs I0; Y0 needs J0), and nothing for kernels without."""
    plain = render_kernels(kernels_of(lambda x: x.exp() + 1, torch.randn(4))).source
    assert "special_" not in plain and "namespace sf" not in plain
    unit = render_kernels(
        [
            _special_kernel("k0", "special_modified_bessel_k0"),
            _special_kernel("k1", "special_bessel_y0"),
        ]
    ).source
    for needed in ("I0_SMALL", "K0_LARGE", "Y0_SMALL_P", "J0_PHASE_Q"):
        assert f"constexpr double {needed}[]" in unit
    order = [
        unit.index(f"inline T {f}(")
        for f in ("special_i0", "k0_small", "special_modified_bessel_k0")
    ]
    assert order == sorted(order)
    assert unit.index("inline T special_bessel_j0(") < unit.index("inline T special_bessel_y0(")
    assert "I1_SMALL" not in unit and "special_zeta" not in unit
    assert "ember::special_modified_bessel_k0(t0)" in unit
    two = render_kernels([_special_kernel("k2", "igammac", 2)]).source
    assert "ember::special_igammac(t0, t1)" in two and "inline double igamma_series(" in two


def test_special_tables_hold_the_published_coefficients() -> None:
    """Spot checks of the tables against values derived independently: Cephes' I0 series
    on [0, 8] sums to exp(-x) I0(x) (1 at x = 0 with t = -2), and the zeta table holds
    (2k)!/B_2k."""
    from ember.ir import special_tables as tables

    b0, b1, b2 = tables.I0_SMALL[0], 0.0, 0.0
    for c in tables.I0_SMALL[1:]:
        b2, b1 = b1, b0
        b0 = -2.0 * b1 - b2 + c
    assert abs(0.5 * (b0 - b2) - 1.0) < 1e-15
    bernoulli = [1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730]
    for k, b in enumerate(bernoulli, start=1):
        assert tables.ZETA_EULER_MACLAURIN[k - 1] == pytest.approx(math.factorial(2 * k) / b)


def _softmax(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1) * w


GOLDEN_CASES: dict[str, Callable[[], list[FusedKernel]]] = {
    "pointwise": lambda: kernels_of(
        lambda x, y: (x * y).sigmoid(), torch.randn(8, 512), torch.randn(512)
    ),
    "softmax": lambda: kernels_of(_softmax, torch.randn(32, 100), torch.randn(100)),
    "column_sum": lambda: kernels_of(lambda x: x.sum(0), torch.randn(100, 64)),
    "transpose": lambda: kernels_of(lambda x: x.t().contiguous() * 2, torch.randn(64, 96)),
    "masked_cat": lambda: kernels_of(
        lambda x, y: torch.cat([x, y], 1), torch.randn(4, 3), torch.randn(4, 5)
    ),
    "embedding": lambda: kernels_of(
        lambda i, w: F.embedding(i, w), torch.tensor([1, 3]), torch.randn(10, 4)
    ),
    "index_put": lambda: kernels_of(
        lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True),
        torch.randn(5, 4),
        torch.tensor([0, 2, 0]),
        torch.randn(3, 4),
    ),
    "cumsum_rows": lambda: kernels_of(lambda x: x.cumsum(1), torch.randn(64, 4096)),
    "cummax_columns": lambda: kernels_of(lambda x: torch.cummax(x, 0), torch.randn(100, 64)),
    "welford_bf16": lambda: kernels_of(
        lambda x: torch.var_mean(x.float(), -1)[0].to(torch.bfloat16), torch.randn(4, 8).bfloat16()
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_source(name: str) -> None:
    text = "\n".join(render_kernel(k)[0] for k in GOLDEN_CASES[name]())
    path = GOLDEN / f"{name}.cpp"
    if os.environ.get("EMBER_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"generated source of {name} changed (EMBER_UPDATE_GOLDEN=1)"


def test_one_unit_with_prelude_and_metadata() -> None:
    kernels = kernels_of(
        lambda x, y: (x.softmax(-1) + y, x.sum(0)), torch.randn(4, 8), torch.randn(8), symbolic=True
    )
    unit = render_kernels(kernels)
    assert unit.source.startswith(PRELUDE)
    assert [info.name for info in unit.kernels] == [k.name for k in kernels]
    for kernel, info in zip(kernels, unit.kernels, strict=True):
        buffers = [a for a in info.arguments if a.kind == "buffer"]
        sizes = [a for a in info.arguments if a.kind == "size"]
        assert tuple(a.name for a in buffers) == kernel.buffer_arguments()
        assert tuple(a.name for a in sizes) == tuple(s.name for s in kernel.size_arguments())
        assert sizes and all(a.ctype == "int64_t" for a in sizes)
        for a in buffers:
            assert a.dtype == torch.float32
            assert a.writes == (a.name in kernel.outputs)
            assert a.ctype == ("float* __restrict__" if a.writes else "const float* __restrict__")
        params = ", ".join(
            f"float* __restrict__ out_{a.name}"
            if a.writes
            else f"const float* __restrict__ in_{a.name}"
            for a in buffers
        )
        params += "".join(f", int64_t {a.name}" for a in sizes)
        assert f'extern "C" void {kernel.name}({params})' in unit.source
    assert "#include <omp.h>" in unit.source and "#include <vector>" not in unit.source


def test_duplicate_kernel_names_are_refused() -> None:
    (kernel,) = kernels_of(lambda x: x + 1, torch.randn(4))
    with pytest.raises(ValueError, match="unique"):
        render_kernels([kernel, kernel])


def test_index_printer() -> None:
    i0, i1, r0 = index_var("i", 0), index_var("i", 1), index_var("r", 0)
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    ind = indirect_var(0)
    assert print_index(8 * i0 + r0) == "8*i0 + r0"
    assert print_index(i0 * s0 - s0) == "i0*s0 - s0"
    assert print_index(5 * i0 + i1 - 3) == "5*i0 + i1 - 3"
    assert print_index(FloorDiv(i0, 12)) == "(i0 / 12)"
    assert print_index(ModularIndexing(i0, 3, 4)) == "((i0 / 3) % 4)"
    assert print_index(4 * ind + i1, {ind: "t5"}) == "i1 + 4*t5"
    assert print_index(FloorDiv(ind, 3), {ind: "t5"}) == "ember::floordiv_i(t5, 3)"
    assert print_index(sympy.Integer(2**40)) == "1099511627776LL"
    assert print_index(s0**2) == "s0*s0"


def test_index_printer_parenthesises_a_power_it_divides_by() -> None:
    # `(s**3)//(s**2)` was printed `s*s*s / s*s` (= s**3): a loop ran s**2 times too far
    # and a dynamic-shape kernel wrote far outside its buffer (heap corruption).
    i0 = index_var("i", 0)
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    assert print_index(FloorDiv(s0**3, s0**2)) == "((s0*s0*s0) / (s0*s0))"
    assert print_index(ModularIndexing(i0, s0**2, s0)) == "((i0 / (s0*s0)) % s0)"
    assert print_index(sympy.Mod(i0, s0**2)) == "(i0 % (s0*s0))"
    assert print_index(3 * i0 * s0**2) == "3*i0*s0*s0"
    for s in (1, 2, 5):
        value = eval(
            print_index(FloorDiv(i0 + s0**3, s0**2)).replace("/", "//"), {"i0": 7, "s0": s}
        )
        assert value == (7 + s**3) // s**2


class _Int(int):
    """A size value in the evaluation of printed C++: integer arithmetic stays
    integral, and a `/` between integers (C++'s truncating division) is an error."""

    def _wrap(self, result: Any) -> Any:
        return _Int(result) if isinstance(result, int) and result is not NotImplemented else result

    def __add__(self, other: Any) -> Any:
        return self._wrap(int.__add__(self, other))

    def __radd__(self, other: Any) -> Any:
        return self._wrap(int.__radd__(self, other))

    def __sub__(self, other: Any) -> Any:
        return self._wrap(int.__sub__(self, other))

    def __rsub__(self, other: Any) -> Any:
        return self._wrap(int.__rsub__(self, other))

    def __mul__(self, other: Any) -> Any:
        return self._wrap(int.__mul__(self, other))

    def __rmul__(self, other: Any) -> Any:
        return self._wrap(int.__rmul__(self, other))

    def __truediv__(self, other: Any) -> Any:
        raise AssertionError(f"integer division {self} / {other} in a float expression")

    def __rtruediv__(self, other: Any) -> Any:
        raise AssertionError(f"integer division {other} / {self} in a float expression")


def test_index_printer_divides_float_size_expressions_as_doubles() -> None:
    """Batch norm's unbiased-variance correction `n / (n - 1)` and its backward's
    `1 / n` with a symbolic `n` (torch's IntTrueDiv and FloatTrueDiv): no printer
    case existed, so a dynamic-batch training graph failed to render. Each division
    must divide doubles, as Python does, never C++'s truncating integer division."""
    from torch.utils._sympy.functions import FloatTrueDiv, IntTrueDiv, ToFloat

    s0, s1 = (sympy.Symbol(n, integer=True, positive=True) for n in ("s0", "s1"))
    n = IntTrueDiv(8 * s0 * (s1 - 2) ** 2, 8)

    def expected(b: int, h: int) -> list[float]:
        count = 8 * b * (h - 2) ** 2 / 8
        return [count / (count - 1.0), 1.0 / count, b * 0.5, b / (h + 1), count - 1.0]

    exprs = [FloatTrueDiv(n, n - 1.0), FloatTrueDiv(sympy.Float(1.0), n), ToFloat(s0) * 0.5]
    exprs += [IntTrueDiv(s0, s1 + 1), n - 1.0]
    texts = [print_index(e) for e in exprs]
    assert texts[1] == "(1.0 / (static_cast<double>(8*s0*((s1 - 2))*((s1 - 2))) / 8.0))"
    for b, h in ((4, 10), (3, 5), (7, 3)):
        values = {"s0": _Int(b), "s1": _Int(h), "__builtins__": {}}
        got = [
            eval(t.replace("static_cast<double>", "float"), {"float": float}, values) for t in texts
        ]
        assert got == expected(b, h)  # exactly: the same double operations
        assert all(isinstance(v, float) for v in got)
