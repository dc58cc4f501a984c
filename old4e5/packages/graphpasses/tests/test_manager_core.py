"""The pass manager's core contract: run, lint, time, dump, name the failing pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

from ember.graphpasses import (
    GraphPassError,
    PassManager,
    PassResult,
    default_pipeline,
    eliminate_dead_code,
    ember_decompositions,
    named_pass,
)


def traced() -> torch.fx.GraphModule:
    def f(x: torch.Tensor) -> torch.Tensor:
        unused = x.exp()  # noqa: F841  # dead code for the pass to remove
        return torch.relu(x) + 1

    return make_fx(f)(torch.randn(4))


def test_dead_code_is_removed_and_recorded(tmp_path: Path) -> None:
    gm = traced()
    before = len(gm.graph.nodes)
    gm, report = PassManager([eliminate_dead_code], dump_dir=tmp_path).run(gm)
    (record,) = report.records
    assert record.changed and record.nodes_before == before and record.nodes_after == before - 1
    assert not any(n.target == torch.ops.aten.exp.default for n in gm.graph.nodes)
    assert {"00_input.txt", "01_dead_code_elimination.txt"} <= {p.name for p in tmp_path.iterdir()}
    assert "dead_code_elimination" in report.format()


def test_mutation_survives_dead_code_elimination() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x.sum()

    gm = make_fx(f)(torch.randn(3))
    gm, _ = default_pipeline().run(gm)
    x = torch.zeros(3)
    gm(x)
    assert torch.equal(x, torch.ones(3))


def test_a_pass_that_breaks_the_graph_is_named() -> None:
    @named_pass("breaker")
    def breaker(gm: torch.fx.GraphModule) -> PassResult:
        output = next(n for n in gm.graph.nodes if n.op == "output")
        relu = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.relu.default)
        relu.args = (output,)  # a use of a node defined later: lint must reject it
        return PassResult(gm, True)

    with pytest.raises(GraphPassError, match="'breaker'"):
        PassManager([breaker]).run(traced())


def test_decomposition_table_is_core_aten_minus_kept_ops() -> None:
    table = ember_decompositions()
    aten = torch.ops.aten
    assert aten.gelu_backward.default in table or aten.gelu.default in table or len(table) > 100
    assert aten._scaled_dot_product_flash_attention_for_cpu.default not in table
