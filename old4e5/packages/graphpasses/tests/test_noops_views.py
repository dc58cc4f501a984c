"""No-op removal and view normalisation."""

from __future__ import annotations

import torch
import torch.fx
from graphpasses_helpers import aot_capture, count
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from ember.graphpasses import (
    PassManager,
    compose_permutes,
    normalise_views,
    remove_noops,
)

aten = torch.ops.aten


def run(gm: torch.fx.GraphModule, inputs: list[object] | None, *passes: object) -> dict[str, int]:
    gm, report = PassManager(list(passes), sample_inputs=inputs, check=True).run(gm)  # type: ignore[arg-type]
    return {k: v for r in report.records for k, v in r.stats.items() if v}


class Noops(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.view(x.shape).expand(x.shape)[:, :] * 1 + 0
        y = y.to(torch.float32).clone().permute(0, 1) / 1 - 0
        return y.relu()


def test_noops_removed_in_aot_graph() -> None:
    captured = aot_capture(Noops(), torch.randn(3, 4))
    gm = captured.graph("inference")
    stats = run(gm, captured.inputs["inference"], remove_noops)
    assert stats["removed"] >= 6
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert ops == [aten.relu.default]


def test_noops_that_change_dtype_or_shape_stay() -> None:
    def f(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        a = i * 1.0  # int -> float: a real conversion
        b = x.to(torch.float16).float()  # rounding
        c = x.view(2, 6) + 0  # a real view
        d = x[:, 1:]  # a real slice
        return a.sum() + b.sum() + c.sum() + d.sum()

    captured = aot_capture(f, torch.randn(3, 4), torch.arange(4))
    gm = captured.graph("inference")
    before = [n.target for n in gm.graph.nodes]
    run(gm, captured.inputs["inference"], remove_noops)
    after = [n.target for n in gm.graph.nodes]
    assert aten.view.default in after
    assert aten.slice.Tensor in after
    assert len(after) >= len(before) - 1  # at most the `+ 0`


def test_clone_of_mutated_value_stays() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        x.add_(1)
        return y * x

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4))
    run(gm, None, remove_noops)
    assert count(gm, aten.clone.default) == 1


def test_no_output_aliasing_change() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.clone(), x.view(x.shape)  # a fresh tensor and a view of the input

    captured = aot_capture(f, torch.randn(4))
    gm = captured.graph("inference")
    stats = run(gm, captured.inputs["inference"], remove_noops)
    assert stats == {}


def test_unsafe_view_and_view_chains_normalised() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a @ b).reshape(-1).view(2, -1)

    gm = make_fx(f, tracing_mode="fake")(torch.randn(2, 3, 4), torch.randn(4, 5))
    assert count(gm, aten._unsafe_view.default) >= 1
    stats = run(gm, None, normalise_views)
    assert count(gm, aten._unsafe_view.default) == 0
    assert stats["view_chain"] >= 1
    views = [n for n in gm.graph.nodes if n.target is aten.view.default]
    assert all(v.args[0].target is not aten.view.default for v in views)


def reshape_graph(permuted: bool) -> tuple[torch.fx.GraphModule, torch.Tensor]:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    source = graph.call_function(aten.permute.default, (x, [1, 0])) if permuted else x
    graph.output(graph.call_function(aten.reshape.default, (source, [12])))
    gm = torch.fx.GraphModule({}, graph)
    example = torch.randn(3, 4)
    FakeTensorProp(gm).propagate(example)
    return gm, example


def test_reshape_becomes_view_only_when_contiguous() -> None:
    gm, example = reshape_graph(permuted=False)
    run(gm, [example], normalise_views)
    assert count(gm, aten.view.default) == 1

    gm, example = reshape_graph(permuted=True)
    run(gm, [example], normalise_views)
    assert count(gm, aten.reshape.default) == 1  # a copy: must not become a view


def test_permute_chains_composed_or_removed() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        round_trip = x.transpose(0, 1).transpose(0, 1) * 2
        rotated = x.transpose(0, 1).transpose(1, 2) * 3
        return round_trip, rotated

    captured = aot_capture(f, torch.randn(2, 3, 4))
    gm = captured.graph("inference")
    stats = run(gm, captured.inputs["inference"], compose_permutes)
    assert stats["composed"] == 2
    (permute,) = [n for n in gm.graph.nodes if n.target is aten.permute.default]
    assert permute.args[1] == [1, 2, 0]
    assert permute.meta["val"].shape == (3, 4, 2)
