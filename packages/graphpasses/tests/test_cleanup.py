"""DCE, CSE and constant folding on graphs from AOTAutograd and make_fx."""

from __future__ import annotations

import torch
import torch.fx
from graphpasses_helpers import aot_capture, count
from torch.fx.experimental.proxy_tensor import make_fx

from ember.graphpasses import (
    PassManager,
    eliminate_common_subexpressions,
    eliminate_dead_code,
    fold_constants,
)

aten = torch.ops.aten


def fake_trace(f: object, *inputs: torch.Tensor) -> torch.fx.GraphModule:
    """make_fx without functionalisation: in-place ops stay in the graph."""
    return make_fx(f, tracing_mode="fake")(*inputs)  # type: ignore[arg-type]


# -- dead code elimination ----------------------------------------------------------


class Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        unused = x.cos()  # noqa: F841  # dead on purpose
        return x.sin()


def test_dce_keeps_mutation_epilogue_and_removes_dead_code() -> None:
    captured = aot_capture(Counter(), torch.randn(4))
    gm = captured.graph("inference")
    assert count(gm, aten.copy_.default) == 1
    manager = PassManager([eliminate_dead_code], sample_inputs=captured.inputs["inference"])
    gm, _ = manager.run(gm)
    assert count(gm, aten.copy_.default) == 1  # the buffer update stays
    assert count(gm, aten.sin.default) == 1


def test_dce_removes_unused_ops_but_keeps_random_and_in_place() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        x.cos()  # dead
        torch.rand(3)  # dead, but a draw: later random numbers depend on it
        y = x.clone()
        y.add_(1)  # mutates a value nobody reads: still an effect in this graph
        return x * torch.rand(3)

    gm = fake_trace(f, torch.randn(3))
    gm, report = PassManager([eliminate_dead_code], check=True).run(gm)
    assert count(gm, aten.cos.default) == 0
    assert count(gm, aten.rand.default) == 2
    assert count(gm, aten.add_.Tensor) == 1
    assert report.records[0].stats == {"removed": 1}


# -- common subexpression elimination -----------------------------------------------


def test_cse_merges_repeated_pure_ops() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin() * 2 + x.sin() * 2

    captured = aot_capture(f, torch.randn(8))
    gm = captured.graph("inference")
    gm, _report = PassManager(
        [eliminate_common_subexpressions, eliminate_dead_code],
        sample_inputs=captured.inputs["inference"],
    ).run(gm)
    assert count(gm, aten.sin.default) == 1
    assert count(gm, aten.mul.Tensor) == 1


def test_cse_never_merges_random_ops() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand_like(x) - torch.rand_like(x)

    captured = aot_capture(f, torch.randn(8))
    gm = captured.graph("inference")
    random_before = sum(1 for n in gm.graph.nodes if "rand" in str(n.target))
    gm, report = PassManager([eliminate_common_subexpressions], check=True).run(gm)
    assert not report.records[0].changed
    assert sum(1 for n in gm.graph.nodes if "rand" in str(n.target)) == random_before == 2


def test_cse_respects_mutation_between_reads() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        before = x.sum()
        x.add_(1)
        after = x.sum()
        return before + after

    gm = fake_trace(f, torch.randn(4))
    gm, _report = PassManager([eliminate_common_subexpressions], check=True).run(gm)
    assert count(gm, aten.sum.default) == 2


def test_cse_merges_reads_when_no_mutation_in_between() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        a = x.sum()
        b = x.sum()
        x.add_(1)
        return a + b + x.sum()

    gm = fake_trace(f, torch.randn(4))
    gm, _ = PassManager([eliminate_common_subexpressions], check=True).run(gm)
    assert count(gm, aten.sum.default) == 2


def test_cse_keeps_distinct_outputs_distinct() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.sin(), x.sin()  # the caller may mutate one of them

    captured = aot_capture(f, torch.randn(4))
    gm = captured.graph("inference")
    gm, _ = PassManager([eliminate_common_subexpressions], check=True).run(gm)
    assert count(gm, aten.sin.default) == 2


def test_cse_keeps_buffers_that_are_written() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        a = torch.zeros(4)
        b = torch.zeros(4)
        a.add_(x)
        return a + b

    gm = fake_trace(f, torch.randn(4))
    gm, _ = PassManager([eliminate_common_subexpressions], check=True).run(gm)
    assert count(gm, aten.zeros.default) == 2


def test_cse_keeps_the_bases_of_distinct_outputs_distinct() -> None:
    """Two equal products returned as views (two parameters' gradients in a backward
    graph): merged, both outputs would be views of one tensor, and accumulating
    gradients into them would add twice (found in review)."""

    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (x * y).view(2, 2), (x * y).view(2, 2)

    gm = fake_trace(f, torch.randn(4), torch.randn(4))
    gm, _ = PassManager([eliminate_common_subexpressions], check=True).run(gm)
    assert count(gm, aten.mul.Tensor) == 2
    first, second = gm(torch.randn(4), torch.randn(4))
    assert first.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()


def test_cse_keeps_each_data_dependent_size_symbol() -> None:
    """Two `.item()` calls on the same value bind two size symbols; later fake values
    are written in terms of them, so neither binding node is merged away."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.full((2,), x.sum().item()) + torch.full((2,), x.sum().item())

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(4))  # type: ignore[arg-type]
    gm, _ = PassManager([eliminate_common_subexpressions], check=True).run(gm)
    assert count(gm, aten._local_scalar_dense.default) == 2
    assert count(gm, aten.sum.default) == 1


# -- constant folding ----------------------------------------------------------------


class WithConstants(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        small = torch.tensor([1.0, 2.0, 3.0, 4.0])
        big = torch.linspace(0, 1, 4096)
        return x * (small * 2 + 1) + (big * 3).sum() + torch.rand(4) * 0


def test_constant_folding_folds_small_keeps_big_and_random() -> None:
    captured = aot_capture(WithConstants(), torch.randn(4))
    gm = captured.graph("inference")
    gm, report = PassManager(
        [fold_constants(max_elements=1024), eliminate_dead_code],
        sample_inputs=captured.inputs["inference"],
    ).run(gm)
    assert report.stats("constant_folding")["folded"] >= 1
    folded = [n for n in gm.graph.nodes if n.op == "get_attr" and "ember_constant" in str(n.target)]
    assert folded
    for node in folded:
        value = getattr(gm, str(node.target))
        assert value.numel() <= 1024
        assert "val" in node.meta
    assert count(gm, aten.rand.default) == 1


def test_constant_folding_limit_zero_folds_nothing() -> None:
    captured = aot_capture(WithConstants(), torch.randn(4))
    gm = captured.graph("inference")
    gm, report = PassManager([fold_constants(max_elements=0)], check=True).run(gm)
    assert not report.records[0].changed


def test_constant_folding_leaves_recipes_from_literals() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x + torch.arange(4.0) * 2

    captured = aot_capture(f, torch.randn(4))
    gm = captured.graph("inference")
    gm, report = PassManager([fold_constants()], check=True).run(gm)
    assert not report.records[0].changed
    assert count(gm, aten.arange.start_step) + count(gm, aten.arange.default) == 1
