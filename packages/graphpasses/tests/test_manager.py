"""The pass manager: reports, dumps, checking mode, and clear errors for bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx
from graphpasses_helpers import MLP, aot_capture, count
from torch.fx.experimental.proxy_tensor import make_fx

from ember.graphpasses import (
    PRESERVES_NO_MUTATION,
    PRESERVES_RANDOMNESS,
    PRESERVES_VALUES,
    GraphPassError,
    PassManager,
    PassResult,
    default_pipeline,
    eliminate_dead_code,
    named_pass,
)

aten = torch.ops.aten


def mlp_graph() -> tuple[torch.fx.GraphModule, list[object]]:
    captured = aot_capture(MLP().eval(), torch.randn(4, 16))
    return captured.graph("inference"), captured.inputs["inference"]


@named_pass("relu_to_sigmoid", (PRESERVES_VALUES,))
def wrong_values(gm: torch.fx.GraphModule) -> PassResult:
    """A buggy pass: claims to keep values, changes them."""
    for node in gm.graph.nodes:
        if node.target is aten.add.Tensor:
            node.args = (node.args[0], node.args[0])
            gm.recompile()
            return PassResult(gm, True)
    return PassResult(gm, False)


def test_report_records_time_counts_and_stats() -> None:
    gm, _ = mlp_graph()
    before = len(gm.graph.nodes)
    gm, report = default_pipeline().run(gm)
    assert next(r.name for r in report.records) == "view_normalisation"
    assert report.records[0].nodes_before == before
    assert report.records[-1].nodes_after == len(gm.graph.nodes)
    assert all(r.seconds >= 0 for r in report.records)
    assert "dead_code_elimination" in report.format()


def test_dump_dir_gets_input_changed_graphs_and_report(tmp_path: Path) -> None:
    gm, _ = mlp_graph()
    default_pipeline(dump_dir=tmp_path).run(gm)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0] == "00_input.txt"
    assert "report.txt" in names
    assert "aten.addmm" in (tmp_path / "00_input.txt").read_text()


def test_checking_mode_names_the_pass_that_changed_values() -> None:
    gm, inputs = mlp_graph()
    manager = PassManager([eliminate_dead_code, wrong_values], sample_inputs=inputs)
    with pytest.raises(GraphPassError, match=r"'relu_to_sigmoid'.*changed the graph's values"):
        manager.run(gm)


def test_checking_mode_verifies_declared_promises() -> None:
    @named_pass("adds_mutation", (PRESERVES_NO_MUTATION,))
    def adds_mutation(gm: torch.fx.GraphModule) -> PassResult:
        x = next(n for n in gm.graph.nodes if n.op == "placeholder")
        with gm.graph.inserting_after(x):
            node = gm.graph.call_function(aten.add_.Tensor, (x, 0))
        node.meta["val"] = x.meta["val"]
        gm.recompile()
        return PassResult(gm, True)

    gm, _ = mlp_graph()
    with pytest.raises(GraphPassError, match=r"'adds_mutation' at node 'add__tensor'.*mutating"):
        PassManager([adds_mutation], check=True).run(gm)


def test_checking_mode_catches_dropped_random_op() -> None:
    @named_pass("erase_rand", (PRESERVES_RANDOMNESS,))
    def erase_rand(gm: torch.fx.GraphModule) -> PassResult:
        x = next(n for n in gm.graph.nodes if n.op == "placeholder")
        for node in list(gm.graph.nodes):
            if node.target is aten.rand.default:
                node.replace_all_uses_with(x)
                gm.graph.erase_node(node)
        gm.recompile()
        return PassResult(gm, True)

    def f(x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand(3)

    gm = make_fx(f)(torch.randn(3))
    assert count(gm, aten.rand.default) == 1
    with pytest.raises(GraphPassError, match=r"'erase_rand'.*random ops changed"):
        PassManager([erase_rand], check=True).run(gm)


def test_pass_that_breaks_the_graph_is_named() -> None:
    @named_pass("breaks_order")
    def breaks_order(gm: torch.fx.GraphModule) -> PassResult:
        output = next(n for n in gm.graph.nodes if n.op == "output")
        first = next(n for n in gm.graph.nodes if n.op == "call_function")
        output.append(first)  # now used before it is defined
        return PassResult(gm, True)

    gm, _ = mlp_graph()
    with pytest.raises(GraphPassError, match=r"'breaks_order'.*malformed"):
        PassManager([breaks_order]).run(gm)


def test_pass_that_creates_node_without_value_is_named() -> None:
    @named_pass("forgets_meta")
    def forgets_meta(gm: torch.fx.GraphModule) -> PassResult:
        x = next(n for n in gm.graph.nodes if n.op == "placeholder")
        with gm.graph.inserting_after(x):
            gm.graph.call_function(aten.neg.default, (x,))
        return PassResult(gm, True)

    gm, _ = mlp_graph()
    with pytest.raises(
        GraphPassError, match=r"'forgets_meta' at node 'neg_default'.*meta\['val'\]"
    ):
        PassManager([forgets_meta]).run(gm)


def test_exception_inside_a_pass_is_wrapped_with_its_name() -> None:
    @named_pass("crashes")
    def crashes(gm: torch.fx.GraphModule) -> PassResult:
        raise KeyError("boom")

    gm, _ = mlp_graph()
    with pytest.raises(GraphPassError, match=r"'crashes'.*KeyError"):
        PassManager([crashes]).run(gm)


def test_torch_level_graph_is_rejected_with_node_name() -> None:
    gm = torch.fx.symbolic_trace(MLP())
    with pytest.raises(GraphPassError, match=r"at node 'fc1'.*call_module.*ATen"):
        default_pipeline().run(gm)


def test_unknown_target_is_rejected_with_node_name() -> None:
    def helper(x: torch.Tensor) -> torch.Tensor:
        return x

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(helper, (x,))
    graph.output(y)
    gm = torch.fx.GraphModule({}, graph)
    with pytest.raises(GraphPassError, match=r"at node 'helper'.*unknown target"):
        default_pipeline().run(gm)


def test_overload_packet_target_is_rejected() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(aten.relu, (x,)))
    gm = torch.fx.GraphModule({}, graph)
    with pytest.raises(GraphPassError, match=r"overload packet.*aten.relu.default"):
        default_pipeline().run(gm)


def test_named_pass_rejects_unknown_promise() -> None:
    with pytest.raises(ValueError, match=r"unknown preserves"):
        named_pass("x", ("fast",))


def test_default_pipeline_returns_pass_manager_and_keeps_graph_runnable() -> None:
    gm, inputs = mlp_graph()
    manager = default_pipeline()
    assert isinstance(manager, PassManager)
    manager.sample_inputs, manager.check = inputs, True
    gm, _ = manager.run(gm)
    assert count(gm, aten.addmm.default) == 2


def test_the_python_code_is_regenerated_once_per_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Passes recompile after each change; without a value checker nothing runs the
    module in between, so the pipeline regenerates its code once, at the end, and the
    result runs the rewritten graph."""
    gm, inputs = mlp_graph()
    expected = gm(*inputs)

    @named_pass("double_then_halve", (PRESERVES_VALUES,))
    def double_then_halve(gm: torch.fx.GraphModule) -> PassResult:
        output = next(n for n in gm.graph.nodes if n.op == "output")
        (result,) = output.args[0]
        with gm.graph.inserting_before(output):
            doubled = gm.graph.call_function(aten.mul.Tensor, (result, 2.0))
            halved = gm.graph.call_function(aten.mul.Tensor, (doubled, 0.5))
        doubled.meta["val"] = halved.meta["val"] = result.meta["val"]
        output.args = ((halved,),)
        gm.recompile()
        return PassResult(gm, True)

    regenerated: list[int] = []
    real = torch.fx.GraphModule.recompile

    def counting(self: torch.fx.GraphModule) -> Any:
        regenerated.append(1)
        return real(self)

    monkeypatch.setattr(torch.fx.GraphModule, "recompile", counting)
    gm, report = PassManager([double_then_halve, double_then_halve]).run(gm)
    assert len(regenerated) == 1 and all(r.changed for r in report.records)
    assert "recompile" not in vars(gm)  # the stand-in is gone
    assert count(gm, aten.mul.Tensor) >= 4
    torch.testing.assert_close(gm(*inputs), expected)
