"""Index checks and integer division by zero in compiled C++ kernels: an index outside
its dimension and an integer division by zero raise as eager does (after the kernel,
from its error record), never reading garbage or taking the process down; good
indices, negative ones where eager wraps them, and INT64_MIN // -1 give eager's values.
EMBER_INDEX_CHECKS=0 leaves the index checks out."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from ember.ir import IndexOutOfBounds
from ember.runtime import compile_records, config

W = torch.arange(40.0).view(10, 4)
X = torch.arange(10.0)
M = torch.randn(6, 2000)  # rows long enough for the blocked and transposed loops


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, backend="ember", dynamic=False)


def _run(fn: Callable[..., Any], *args: Any) -> Any:
    """Compile in strict mode (a compile failure must not hide behind eager) and check
    the graph ran through generated kernels."""
    with config.scope(strict=True):
        before = len(compile_records)
        result = compiled(fn)(*args)
        assert any(r.fused_kernels for r in compile_records[before:])
        return result


T = torch.tensor
Case = tuple[str, Callable[..., Any], tuple[Any, ...], tuple[Any, ...], type[Exception]]
# name, fn, good args, bad args, eager's exception type
CASES: list[Case] = [
    ("embedding", lambda i, w: F.embedding(i, w) * 2, (T([1, 9]), W), (T([1, 10]), W), IndexError),
    ("embedding_negative", lambda i, w: F.embedding(i, w), (T([0]), W), (T([-1]), W), IndexError),
    (
        "gather_last_dim",
        lambda x, i: torch.gather(x, 1, i) + 1,
        (M, torch.randint(0, 2000, (6, 2000))),
        (M, torch.full((6, 2000), 2000)),
        RuntimeError,
    ),
    ("gather", lambda x, i: torch.gather(x, 0, i) + 1, (X, T([9])), (X, T([-1])), RuntimeError),
    ("index_select", lambda m, i: m.index_select(0, i) + 1, (M, T([5])), (M, T([6])), IndexError),
    ("index", lambda x, i: x[i] + 1, (X, T([0, -10])), (X, T([0, -11])), IndexError),
    (
        "index_2d",
        lambda m, i, j: m[i, j] * 3,
        (M, T([5, -6]), T([1999, -2000])),
        (M, T([5, 1]), T([2000, 0])),
        IndexError,
    ),
    (
        "index_put",
        lambda x, i: x.index_put((i,), T([7.0])) + 1,
        (X, T([-1])),
        (X, T([10])),
        IndexError,
    ),
    (
        "index_put_accumulate",
        lambda x, i: x.index_put((i,), T([7.0, 1.0]), accumulate=True),
        (X, T([-1, 9])),
        (X, T([3, 2**40])),
        IndexError,
    ),
    (
        "embedding_bag",
        lambda i, o, w: F.embedding_bag(i, w, o, mode="max") * 2,
        (T([1, 9, 0]), T([0, 2]), W),
        (T([1, 10, 0]), T([0, 2]), W),
        RuntimeError,
    ),
    (
        "embedding_bag_offsets",
        lambda i, o, w: F.embedding_bag(i, w, o, mode="sum") * 2,
        (T([1, 9, 0]), T([0, 3]), W),
        (T([1, 9, 0]), T([1, 3]), W),
        RuntimeError,
    ),
    (
        "scatter",
        lambda x, i: x.scatter(0, i, T([5.0])) + 1,
        (X, T([9])),
        (X, T([-1])),
        RuntimeError,
    ),
    (
        "scatter_add",
        lambda x, i: x.scatter_add(0, i, torch.ones(2)) + 1,
        (X, T([2, 2])),
        (X, T([2, 10])),
        RuntimeError,
    ),
    (
        "scatter_reduce",
        lambda x, i: x.scatter_reduce(0, i, torch.ones(2), "amax") + 1,
        (X, T([0, 9])),
        (X, T([0, 12])),
        RuntimeError,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_index_checks_match_eager(case: Any) -> None:
    _name, fn, good, bad, eager_error = case
    torch.testing.assert_close(_run(fn, *good), fn(*good))
    with pytest.raises(eager_error):
        fn(*bad)
    torch._dynamo.reset()
    with pytest.raises(IndexOutOfBounds, match="is out of bounds for dimension") as info:
        _run(fn, *bad)
    assert isinstance(info.value, eager_error)
    assert "graph node" in str(info.value) and "aten." in str(info.value)


def test_error_names_the_index_size_and_op() -> None:
    fn = lambda i, w: F.embedding(i, w) * 2  # noqa: E731
    with pytest.raises(IndexOutOfBounds) as info:
        _run(fn, torch.tensor([3, 2**40, 1]), W)
    assert (info.value.index, info.value.size) == (2**40, 10)
    assert f"index {2**40} is out of bounds for dimension 0 with size 10" in str(info.value)
    assert "aten.embedding" in str(info.value)
    # the record was reset: the same compiled graph runs good indices afterwards
    torch.testing.assert_close(compiled(fn)(torch.tensor([3, 1]), W), fn(torch.tensor([3, 1]), W))


def test_dynamic_sizes_and_an_empty_dimension() -> None:
    fn = torch.compile(lambda i, w: F.embedding(i, w) + 1, backend="ember", dynamic=True)
    with config.scope(strict=True):
        for rows in (10, 7):
            w = torch.randn(rows, 3)
            torch.testing.assert_close(fn(torch.tensor([rows - 1, 0]), w), w[[rows - 1, 0]] + 1)
            with pytest.raises(IndexOutOfBounds, match=f"with size {rows}"):
                fn(torch.tensor([rows]), w)
        with pytest.raises(IndexOutOfBounds, match="with size 0"):
            fn(torch.tensor([0]), torch.randn(0, 3))


def test_checks_can_be_turned_off(tmp_path: Any) -> None:
    fn = lambda i, w: F.embedding(i, w) * 2  # noqa: E731
    for checks in (True, False):
        torch._dynamo.reset()
        with config.scope(index_checks=checks, debug_dir=tmp_path / str(checks)):
            torch.testing.assert_close(_run(fn, T([1, 9]), W), fn(T([1, 9]), W))
        (source,) = (tmp_path / str(checks)).glob("run-*/*/kernels.cpp")
        assert ("ember::checked_index(" in source.read_text()) == checks


INT_DIVISIONS = [
    ("floor", lambda a, b: torch.div(a, b, rounding_mode="floor") + 1),
    ("trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc") + 1),
    ("floordiv", lambda a, b: a // b + 1),
    ("remainder", lambda a, b: torch.remainder(a, b) + 1),
    ("fmod", lambda a, b: torch.fmod(a, b) + 1),
]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8])
@pytest.mark.parametrize("case", INT_DIVISIONS, ids=[c[0] for c in INT_DIVISIONS])
def test_integer_division_by_zero_raises_like_eager(case: Any, dtype: torch.dtype) -> None:
    _name, fn = case
    a = torch.tensor([7, -7, 5, 3], dtype=dtype)
    good, bad = torch.tensor([2, 2, -3, 1], dtype=dtype), torch.tensor([2, 0, 1, 1], dtype=dtype)
    torch.testing.assert_close(_run(fn, a, good), fn(a, good))
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a, bad)
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        _run(fn, a, bad)


@pytest.mark.parametrize("case", INT_DIVISIONS, ids=[c[0] for c in INT_DIVISIONS])
def test_a_zero_divisor_raises_where_its_quotient_is_not_read(case: Any) -> None:
    """Eager divides every element: a zero divisor in a column the program then drops
    still raises (found by fuzzing: a lazy quotient was computed only where read)."""
    _name, fn = case
    a = torch.tensor([[7, -7], [5, 3]])
    b = torch.tensor([[2, 0], [3, 0]])  # zeros only in column 1

    def first_column(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return fn(x, y).select(1, 0) * 2

    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        first_column(a, b)
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        _run(first_column, a, b)
    good = b + (b == 0)
    torch._dynamo.reset()
    torch.testing.assert_close(_run(first_column, a, good), first_column(a, good))


@pytest.mark.parametrize("case", INT_DIVISIONS, ids=[c[0] for c in INT_DIVISIONS])
def test_most_negative_divided_by_minus_one(case: Any) -> None:
    """Eager's floor division, remainder and fmod give INT64_MIN, 0 and 0; its trunc
    division traps (SIGFPE) on the CPU: ember gives the floor division's value."""
    name, fn = case
    a = torch.tensor([-(2**63), -(2**31), 9])
    b = torch.tensor([-1, -1, -1])
    expected = torch.div(a, b, rounding_mode="floor") + 1 if name == "trunc" else fn(a, b)
    torch.testing.assert_close(_run(fn, a, b), expected)
    a32, b32 = a[1:].to(torch.int32), b[1:].to(torch.int32)
    expected32 = torch.div(a32, b32, rounding_mode="floor") + 1 if name == "trunc" else fn(a32, b32)
    torch.testing.assert_close(_run(fn, a32, b32), expected32)


def test_constant_divisors_need_no_check() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    from ember.codegen.cpp import render_kernel
    from ember.ir import LoweringOptions, lower_graph
    from ember.scheduler import schedule_program

    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a // 3, a // b

    gm = make_fx(fn)(torch.tensor([1]), torch.tensor([1]))
    program = lower_graph(gm, options=LoweringOptions(loops=True))
    kernels = schedule_program(program).kernels
    (info,) = [render_kernel(k)[1] for k in kernels]
    assert [c.kind for c in info.checks] == ["division"]


# inputs come in as arguments: constants would be folded by running eager at compile time
CRASHERS = {
    "embedding": ("F.embedding(a, b) * 2", "torch.tensor([1, 2, 10]), torch.randn(10, 4)"),
    "index_put": ("b.index_put((a,), b[:1]) + 1", "torch.tensor([10]), torch.randn(10)"),
    "index_put_huge": ("b.index_put((a,), b[:1]) + 1", "torch.tensor([2**40]), torch.randn(10)"),
    "floor_divide_by_zero": ("a // b + 1", "torch.tensor([5, 6]), torch.tensor([0, 1])"),
    "trunc_min_by_minus_one": (
        "torch.div(a, b, rounding_mode='trunc') + 1",
        "torch.tensor([-2**63]), torch.tensor([-1])",
    ),
}


@pytest.mark.parametrize("case", CRASHERS.values(), ids=list(CRASHERS))
def test_no_signal_in_a_fresh_process(case: tuple[str, str], tmp_path: Any) -> None:
    """These heap-corrupted (exit 134), segfaulted (139) or trapped (136) the process:
    run in a child so that a crash fails the test instead of killing pytest."""
    expression, inputs = case
    script = textwrap.dedent(
        f"""
        import torch
        import torch.nn.functional as F
        import ember.runtime
        from ember.runtime import config

        with config.scope(strict=True, cache_dir={str(tmp_path)!r}):
            fn = torch.compile(lambda a, b: {expression}, backend="ember")
            try:
                print("value", fn({inputs}))
            except RuntimeError as error:
                print("raised", type(error).__name__, error)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    if "trunc" in expression:
        assert "value tensor([-9223372036854775807])" in done.stdout, done.stdout
    else:
        assert "raised" in done.stdout, done.stdout
