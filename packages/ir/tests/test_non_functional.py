"""Graphs that are not functionalized: ATen ops writing their arguments in place
(`addmm_`, `renorm_`, `out=` variants, `_foreach_*_`) after lazy values read the
buffer they write. Each graph is traced with make_fx alone (no functionalization),
lowered with loops, run through the interpreter, and compared with eager: outputs and
the inputs the graph writes. What ember cannot lower correctly it refuses, naming
the node."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.ir import LoweringError, LoweringOptions, lower_graph, run_program, verify


def _compare_with_eager(fn: Callable[..., Any], *args: torch.Tensor) -> None:
    gm = make_fx(fn)(*[a.clone() for a in args])
    program = lower_graph(gm, options=LoweringOptions(loops=True))
    verify(program)
    inputs = [a.clone() for a in args]
    actual = run_program(program, inputs)
    eager_inputs = [a.clone() for a in args]
    expected = fn(*eager_inputs)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    assert len(actual) == len(expected)
    for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
        torch.testing.assert_close(a, e, msg=f"output {index}")
    for index, (a, e) in enumerate(zip(inputs, eager_inputs, strict=True)):
        torch.testing.assert_close(a, e, msg=f"input {index} (written in place)")


def _args() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x, a, b = (torch.randn(*size, generator=g) for size in ((4, 6), (4, 3), (3, 6)))
    return x, a, b


def out_keyword(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> Any:
    y = x + 1  # pending: reads x before mm writes it through `out=`
    torch.mm(a, b, out=x)
    return y * 2, x


def out_into_a_view(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> Any:
    y = x + 1
    torch.mm(a, b[:, :3], out=x[:, :3])
    return y * 2, x


def inplace_on_a_slice(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> Any:
    y = x + 1
    x[:, :3].addmm_(a, b[:, :3])
    return y * 2, x


def inplace_on_a_transpose(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> Any:
    y = x * 3
    x.t().renorm_(2, 0, 0.5)
    return y - 1, x


def inplace_on_rows_then_the_slice_is_read(
    x: torch.Tensor, a: torch.Tensor, b: torch.Tensor
) -> Any:
    w = x[:, :3]
    y = x[:, 3:] + 1
    w.addmm_(a, b[:, :3])
    return w * 2, y, x


def a_list_written_in_place(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> Any:
    y = x + a.sum()
    torch._foreach_add_([x, a], 1.0)
    return y * 2, x, a


def a_pending_reduction_then_a_write_through_a_view(
    x: torch.Tensor, a: torch.Tensor, b: torch.Tensor
) -> Any:
    s = x.sum(0)
    m = x.amax(1)
    x[1:].renorm_(2, 0, 0.5)
    return s * 2, m + 1, x


def views_taken_before_the_write_see_it(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> Any:
    part, whole = x[:, :3], x.view(24)
    y = x + 1  # a computed value: keeps the data from before the write
    x.addmm_(a, b)
    return part * 2, whole + 1, y


def out_values_read_after_the_sort(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> Any:
    y = x + 1
    values, indices = torch.empty_like(x), torch.empty(x.shape, dtype=torch.long)
    torch.sort(x, 1, out=(values, indices))
    x.copy_(values)
    return y * 2, x, indices


CASES = [
    out_keyword,
    out_into_a_view,
    inplace_on_a_slice,
    inplace_on_a_transpose,
    inplace_on_rows_then_the_slice_is_read,
    a_list_written_in_place,
    a_pending_reduction_then_a_write_through_a_view,
    views_taken_before_the_write_see_it,
    out_values_read_after_the_sort,
]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_an_extern_writing_in_place_after_lazy_reads_matches_eager(
    fn: Callable[..., Any],
) -> None:
    _compare_with_eager(fn, *_args())


def test_the_graphs_are_not_functionalized() -> None:
    """The cases really hold ops writing their arguments (make_fx keeps them)."""
    for fn in CASES:
        gm = make_fx(fn)(*_args())
        written = [
            n
            for n in gm.graph.nodes
            if isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
        ]
        assert written, fn.__name__


def test_a_written_view_of_a_computed_value_is_refused_naming_the_node() -> None:
    """`z[:, :3].addmm_` writes into z, a value ember has not stored: passing a copy
    would lose the write, so lowering refuses and names the op and the view."""

    def f(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        z = x * 2
        z[:, :3].addmm_(a, b[:, :3])
        return z

    gm = make_fx(f)(*_args())
    with pytest.raises(LoweringError, match=r"'addmm_'.*writes 'slice_1'.*functionalize"):
        lower_graph(gm, options=LoweringOptions(loops=True))


@pytest.mark.xfail(
    reason="ember's own in-place writes (x.add_) still store the views of x taken "
    "before them as copies: a view read after the write keeps the old data",
    strict=True,
)
def test_a_view_taken_before_an_own_inplace_write_sees_it() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        part = x[:, :3]
        x.add_(1)
        return part * 2

    _compare_with_eager(f, _args()[0])
