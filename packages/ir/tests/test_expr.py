"""The body DAG: hash-consing, rewriting, printing, and the ops protocol."""

from __future__ import annotations

import pickle

import sympy
import torch

from ember.ir import OP_NAMES, Const, IndexExpr, Load, Op, Where, format_body, loads
from ember.ir.evaluate import TORCH_OPS
from ember.ir.expr import replace_index
from ember.ir.symbolic import index_var

f32 = torch.float32
i0, i1 = index_var("i", 0), index_var("i", 1)


def test_nodes_are_hash_consed() -> None:
    a = Op("add", (Load("x", 4 * i0 + i1, f32), Const(1.0, f32)), f32)
    b = Op("add", (Load("x", 4 * i0 + i1, f32), Const(1.0, f32)), f32)
    assert a is b and hash(a) == hash(b)
    assert Const(0.0, f32) is not Const(-0.0, f32)
    assert Const(1, torch.int64) is not Const(1.0, torch.float64)
    assert pickle.loads(pickle.dumps(a)) is a


def test_fingerprint_is_structural() -> None:
    a = Op("exp", (Load("x", i0, f32),), f32)
    assert a.fingerprint() == Op("exp", (Load("x", i0, f32),), f32).fingerprint()
    assert a.fingerprint() != Op("exp", (Load("y", i0, f32),), f32).fingerprint()


def test_replace_index_rewrites_every_load_and_keeps_sharing() -> None:
    x = Load("x", i0, f32)
    body = Where(Op("gt", (x, Const(0.0, f32)), torch.bool), x, Op("neg", (x,), f32))
    moved = replace_index(body, {i0: i0 + 1})
    assert [ld.index for ld in loads(moved)] == [i0 + 1]
    assert "load x[i0 + 1]" in format_body(moved)


def test_printer_numbers_shared_nodes_once() -> None:
    x = Load(
        "x", 2 * i0, f32, mask=Op("lt", (IndexExpr(i0), IndexExpr(sympy.Integer(3))), torch.bool)
    )
    text = format_body(Op("mul", (x, x), f32))
    assert text.count("load x") == 1
    assert "if %2 else 0" in text and "mul(%3, %3)" in text


def test_interpreter_implements_the_whole_ops_protocol() -> None:
    assert set(TORCH_OPS) == set(OP_NAMES)


def test_symbolic_sizes_lose_exact_divisions_and_redundant_max() -> None:
    # ShapeEnv gave `s**3 // s**2` for a view's -1 and `Max(1, (s + 1)//2)` for the
    # strides of a strided slice: the IR neither matched them with `s` nor printed Max.
    from torch.utils._sympy.functions import FloorDiv, Max

    from ember.ir.symbolic import _exact_divisions

    s = sympy.Symbol("s0", integer=True, positive=True)
    assert _exact_divisions(FloorDiv(s**3, s**2)) == s
    assert _exact_divisions(3 * FloorDiv(s**2 + s, s)) == 3 * s + 3
    assert _exact_divisions(FloorDiv(s, 2)) == FloorDiv(s, 2)  # not exact: kept
    assert _exact_divisions(Max(1, FloorDiv(s + 1, 2))) == FloorDiv(s + 1, 2)
    kept = _exact_divisions(Max(1, s - 1))  # s - 1 may be 0: kept, as sympy's Max
    assert kept == sympy.Max(1, s - 1) and isinstance(kept, sympy.Max)


def test_a_float_size_expression_is_held_as_a_float64() -> None:
    """`x * (n / (n - 1))` with `n` a symbolic size (batch norm's unbiased variance):
    its IndexExpr held an int64 (the default), so the factor was truncated to 1."""
    from ir_helpers import check, computed
    from torch.utils._sympy.functions import FloatTrueDiv, IntTrueDiv, ToFloat

    from ember.ir import float_valued, size_value, walk
    from ember.ir.loops import loop_bodies

    s0 = sympy.Symbol("s0", integer=True, positive=True)
    assert not float_valued(s0 * 3 + 1) and size_value(s0 * 3 + 1).dtype == torch.int64
    for expr in (IntTrueDiv(s0, s0 - 1), FloatTrueDiv(ToFloat(s0), 2.0), s0 * 0.5):
        assert float_valued(expr) and size_value(expr).dtype == torch.float64

    def fn(x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        return x * (n / (n - 1))

    program = check(fn, torch.randn(5, 3), mode="symbolic")  # against eager, too
    held = [
        node
        for buffer in computed(program)
        for body in loop_bodies(buffer.loop)
        for node in walk(body)
        if isinstance(node, IndexExpr) and float_valued(node.expr)
    ]
    assert held and all(node.dtype == torch.float64 for node in held)
