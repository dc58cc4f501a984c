"""A graph with an op eager has no kernel for at its dtypes raises eager's error
compiled too (ember.runtime.dtype_gaps), and graphs eager runs are not refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import ember.runtime  # noqa: F401  # registers backend="ember"
from ember.runtime import dtype_gaps
from ember.runtime.aot import PackageError, compile_and_package
from ember.runtime.compiler import compile_records
from ember.runtime.config import config


def _eager_error(fn: Callable[..., Any], *args: Any) -> str:
    with pytest.raises(NotImplementedError) as caught:
        fn(*args)
    return str(caught.value)


@pytest.mark.parametrize(
    ("fn", "args"),
    [
        (F.silu, (torch.arange(6),)),  # "silu_cpu" not implemented for 'Long'
        (lambda x: torch.argmax(x & x), (torch.tensor([True, False]),)),
        (torch.special.zeta, (torch.ones(3, dtype=torch.bfloat16),) * 2),
        (lambda x: x - x, (torch.tensor([True]),)),  # bool subtraction
        (lambda x: torch.arange(x.shape[0], dtype=torch.bool), (torch.ones(3),)),  # a factory
    ],
    ids=["silu_int64", "argmax_bool", "zeta_bfloat16", "sub_bool", "arange_bool"],
)
def test_a_graph_eager_refuses_raises_eagers_error(fn: Callable[..., Any], args: Any) -> None:
    message = _eager_error(fn, *args)
    torch._dynamo.reset()
    with pytest.raises(NotImplementedError) as caught:
        torch.compile(fn, backend="ember")(*args)
    assert str(caught.value) == message


def test_a_refused_graph_is_on_record_as_run_eagerly() -> None:
    """Reports count the graphs that ran eagerly from the compile records: a graph
    refused for its dtypes is one of them, as a graph that failed to lower is."""
    torch._dynamo.reset()
    first = len(compile_records)
    with pytest.raises(NotImplementedError):
        torch.compile(F.silu, backend="ember")(torch.arange(6))
    (record,) = compile_records[first:]
    assert record.ran_eagerly is not None and "silu on int64" in record.ran_eagerly


def test_strict_mode_names_the_node_at_compile_time() -> None:
    torch._dynamo.reset()
    with config.scope(strict=True), pytest.raises(Exception, match="silu on int64"):
        torch.compile(F.silu, backend="ember")(torch.arange(6))


def test_graphs_eager_runs_compile() -> None:
    """Integer indices into a float table, a bf16 softmax and a cast of integers are
    run by eager, so the graphs compile (no ATen graph ran eagerly)."""

    def fn(table: torch.Tensor, ids: torch.Tensor, scores: torch.Tensor) -> Any:
        looked_up = F.embedding(ids, table).sum(-1)
        return looked_up + ids.float(), torch.softmax(scores, -1), F.silu(ids.float())

    args = (torch.randn(10, 4), torch.tensor([[1, 2], [3, 9]]), torch.randn(2, 5).bfloat16())
    torch._dynamo.reset()
    first = len(compile_records)
    with config.scope(strict=True):
        got = torch.compile(fn, backend="ember")(*args)
    for g, want in zip(got, fn(*args), strict=True):
        torch.testing.assert_close(g, want)
    records = compile_records[first:]
    assert records and not any(r.ran_eagerly for r in records)


def test_the_probe_leaves_the_random_generator_as_it_was() -> None:
    """A small factory call is asked as it is, and `rand` draws numbers: the generator
    is put back."""
    graph = torch.fx.Graph()
    drawn = graph.call_function(torch.rand, (3,), {"dtype": torch.bfloat16})
    graph.output(drawn)
    drawn.meta["example_value"] = torch.ones(3, dtype=torch.bfloat16)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    torch.manual_seed(3)
    before = torch.get_rng_state()
    dtype_gaps._ANSWERS.clear()  # asked now, whatever an earlier test asked
    assert dtype_gaps.first_gap(gm) is None
    assert torch.equal(torch.get_rng_state(), before)


def _refuses_dtypes(x: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError(f"not implemented for {x.dtype}")


def _needs_a_long_row(x: torch.Tensor) -> torch.Tensor:
    raise RuntimeError(f"needs more than {x.shape[-1]} elements")


def _checks_for_integers(x: torch.Tensor) -> torch.Tensor:
    if not x.is_floating_point():
        raise RuntimeError("Integer inputs are not supported")
    return x


def _int_only_check_that_float_fails_too(x: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("Integer rows must be longer")


def _graph_calling(target: Callable[..., Any], fake: torch.Tensor) -> torch.fx.GraphModule:
    """x -> target(x), with `fake` as both nodes' example value (as Dynamo records)."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(target, (x,))
    graph.output(y)
    for node in (x, y):
        node.meta["example_value"] = fake
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@pytest.mark.parametrize(
    ("target", "found"),
    [
        (_refuses_dtypes, True),
        (_needs_a_long_row, False),
        (_checks_for_integers, True),
        (_int_only_check_that_float_fails_too, False),
    ],
    ids=["not_implemented", "shape", "dtype_check", "dtype_words_float_fails_too"],
)
def test_what_counts_as_a_refusal(target: Callable[..., Any], found: bool) -> None:
    """A NotImplementedError from the stand-ins is eager's refusal, and so is a
    RuntimeError naming a dtype that float32 stand-ins do not raise; an error of any
    other kind (a shape the stand-ins do not satisfy) proves nothing."""

    gm = _graph_calling(target, torch.ones(60, dtype=torch.int32))
    (call,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    error = dtype_gaps._ask(call)  # asked directly: first_gap runs torch's code only
    assert (error is not None) == found, error
    if error is not None:
        assert error.startswith(("NotImplementedError", "RuntimeError")), error


def test_integer_division_by_the_stand_ins_zeros_is_no_refusal() -> None:
    """The stand-ins' zeros divide by zero in integers (a RuntimeError on the CPU):
    a value, not a dtype, so the graph compiles."""

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x // y + torch.remainder(x, y)

    args = (torch.tensor([7, 9, -4]), torch.tensor([2, 4, 3]))
    torch._dynamo.reset()
    first = len(compile_records)
    with config.scope(strict=True):
        got = torch.compile(fn, backend="ember")(*args)
    assert torch.equal(got, fn(*args))
    assert len(compile_records) > first


def test_a_program_eager_refuses_gets_no_package(tmp_path: Path) -> None:
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.silu(x) + 1

    ep = torch.export.export(Model(), (torch.arange(4),))
    with pytest.raises(PackageError, match="silu on int64"):
        compile_and_package(ep, tmp_path / "model.ember")
    assert not (tmp_path / "model.ember").exists()


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("fn", "dtype"),
    [
        (torch.igamma, torch.bfloat16),
        (F.silu, torch.int64),
        (torch.special.zeta, torch.float16),
        (torch.dot, torch.int64),  # the CPU takes it; asked on the GPU (no indices)
    ],
    ids=["igamma_bfloat16", "silu_int64", "zeta_float16", "dot_int64"],
)
def test_a_graph_eager_refuses_on_cuda_raises_eagers_error(
    fn: Callable[..., Any], dtype: torch.dtype
) -> None:
    """CUDA's kernels refuse other dtypes than the CPU's (igamma takes bfloat16 on the
    CPU, not on CUDA): the probe asks the device the graph runs on."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    args = [
        torch.arange(1, 5, device="cuda").to(dtype) for _ in range(2 if fn is not F.silu else 1)
    ]
    message = _eager_error(fn, *args)
    torch._dynamo.reset()
    with pytest.raises(NotImplementedError) as caught:
        torch.compile(fn, backend="ember")(*args)
    assert str(caught.value) == message


@pytest.mark.cuda
def test_the_cpu_speaks_for_a_cuda_nodes_integers_only() -> None:
    """multi_margin_loss's target is integers, so on CUDA it is asked on the CPU, which
    refuses bfloat16 where CUDA takes it: that refusal is not believed, and the graph
    compiles and matches eager."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = torch.randn(4, 5, device="cuda", dtype=torch.bfloat16)
    target = torch.tensor([0, 3, 4, 1], device="cuda")
    torch._dynamo.reset()
    first = len(compile_records)
    with config.scope(strict=True):
        got = torch.compile(F.multi_margin_loss, backend="ember")(x, target)
    torch.testing.assert_close(got, F.multi_margin_loss(x, target))
    assert len(compile_records) > first


def test_pivots_are_never_asked() -> None:
    """LAPACK's pivots count from 1 and go unchecked: a graph solving with them is not
    asked (zeros as pivots corrupted the heap) and compiles as before."""
    a = torch.randn(4, 4)
    a = a @ a.T + 4 * torch.eye(4)
    ld, pivots = torch.linalg.ldl_factor(a)
    b = torch.randn(4, 2)
    graph = torch.fx.Graph()
    nodes = [graph.placeholder(n) for n in ("ld", "pivots", "b")]
    solved = graph.call_function(torch.linalg.ldl_solve, tuple(nodes))
    graph.output(solved)
    for node, value in zip((*nodes, solved), (ld, pivots, b, b), strict=True):
        node.meta["example_value"] = value
    asked = len(dtype_gaps._ANSWERS)
    assert dtype_gaps.first_gap(torch.fx.GraphModule(torch.nn.Module(), graph)) is None
    assert len(dtype_gaps._ANSWERS) == asked  # not asked at all


def test_collectives_are_never_asked() -> None:
    """An all-reduce of bfloat16 run by one process on stand-ins would wait for the
    other ranks: collectives are not asked, whatever their dtypes."""
    import torch.distributed._functional_collectives as collectives

    grads = torch.ones(4, dtype=torch.bfloat16)
    for target, args in (
        (torch.ops._c10d_functional.all_reduce.default, ("sum", "0")),
        (torch.ops._c10d_functional.all_reduce, ("sum", "0")),  # a packet, as users call it
        (collectives.all_reduce, ("sum", [0, 1])),
    ):
        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        reduced = graph.call_function(target, (x, *args))
        graph.output(reduced)
        for node in (x, reduced):
            node.meta["example_value"] = grads
        asked = len(dtype_gaps._ANSWERS)
        assert dtype_gaps.first_gap(torch.fx.GraphModule(torch.nn.Module(), graph)) is None
        assert len(dtype_gaps._ANSWERS) == asked  # not asked


def test_the_users_own_functions_are_never_run() -> None:
    """A function of the user's in the graph (`allow_in_graph`, a custom op) is not
    run on stand-ins: it may have effects of its own."""
    calls: list[torch.dtype] = []

    def counted(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.dtype)
        raise NotImplementedError("not implemented for 'Long'")

    gm = _graph_calling(counted, torch.ones(4, dtype=torch.int64))
    assert dtype_gaps.first_gap(gm) is None
    assert calls == []


def test_higher_order_operators_are_never_run() -> None:
    """A higher-order operator (a user's Triton kernel, a print, a wrapped subgraph)
    would run with the real grid and sizes on stand-ins: never asked."""

    class NeverRun(torch._ops.HigherOrderOperator):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("not implemented for 'BFloat16'")

    hop = NeverRun("ember_test_never_run")
    hop.__module__ = "torch.ops.higher_order"  # as torch's own are
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    called = graph.call_function(hop, (x,))
    graph.output(called)
    for node in (x, called):
        node.meta["example_value"] = torch.ones(4, dtype=torch.bfloat16)
    assert not dtype_gaps._torchs_own(called)
    asked = len(dtype_gaps._ANSWERS)
    assert dtype_gaps.first_gap(torch.fx.GraphModule(torch.nn.Module(), graph)) is None
    assert len(dtype_gaps._ANSWERS) == asked


def test_the_answer_is_keyed_by_autocast() -> None:
    """Autocast changes what dtypes ops see: an answer asked outside it is not reused
    inside it."""
    gm = _graph_calling(torch.special.erfcx, torch.ones(4, dtype=torch.bfloat16))
    (call,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    outside = dtype_gaps._signature(call, "special_erfcx")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = dtype_gaps._signature(call, "special_erfcx")
    assert outside is not None and inside is not None and outside != inside


def test_a_dtype_torch_cannot_fill_is_no_answer_and_no_crash() -> None:
    gm = _graph_calling(torch.exp2, torch.empty(4, dtype=torch.bits8))
    (call,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert dtype_gaps._ask(call) is None
    assert dtype_gaps.first_gap(gm) is None
