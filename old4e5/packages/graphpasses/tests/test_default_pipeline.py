"""The default pipeline on the end-to-end models, as the runtime runs it."""

from __future__ import annotations

import pytest
import torch
from graphpasses_helpers import MLP, SmallCNN, TransformerBlock, aot_capture, count

from ember.graphpasses import default_pipeline
from ember.graphpasses.effects import is_random

aten = torch.ops.aten

MODELS = {
    "mlp": (MLP, (4, 16)),
    "cnn": (SmallCNN, (2, 3, 16, 16)),
    "transformer": (TransformerBlock, (2, 6, 32)),
}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("train", [False, True])
def test_values_mutations_and_random_ops_survive(name: str, train: bool) -> None:
    factory, shape = MODELS[name]
    captured = aot_capture(factory().train(train), torch.randn(shape), train=train)
    for kind in captured.graphs:
        gm = captured.graph(kind)
        copies = count(gm, aten.copy_.default)
        random_ops = [str(n.target) for n in gm.graph.nodes if is_random(n)]
        manager = default_pipeline()
        manager.sample_inputs = captured.inputs[kind]  # checking mode: values compared
        manager.check = True
        gm, _report = manager.run(gm)
        assert count(gm, aten.copy_.default) == copies  # e.g. batch norm running stats
        assert [str(n.target) for n in gm.graph.nodes if is_random(n)] == random_ops
        assert all("val" in n.meta for n in gm.graph.nodes if n.op not in ("output",))


def test_transformer_inference_uses_sdpa() -> None:
    captured = aot_capture(TransformerBlock().eval(), torch.randn(2, 6, 32))
    gm, report = default_pipeline().run(captured.graph("inference"))
    assert report.stats("pattern_rewrite")["attention_div_mask"] == 1
    assert count(gm, aten.scaled_dot_product_attention.default) == 1


def test_dynamic_shapes_pipeline() -> None:
    captured = aot_capture(TransformerBlock().eval(), torch.randn(2, 6, 32), dynamic=True)
    gm = captured.graph("inference")
    manager = default_pipeline()
    manager.sample_inputs, manager.check = captured.inputs["inference"], True
    gm, _report = manager.run(gm)
    assert count(gm, aten.scaled_dot_product_attention.default) == 1


def test_pipeline_without_patterns() -> None:
    captured = aot_capture(TransformerBlock().eval(), torch.randn(2, 6, 32))
    gm, report = default_pipeline(patterns=False).run(captured.graph("inference"))
    assert "pattern_rewrite" not in [r.name for r in report.records]
    assert count(gm, aten.scaled_dot_product_attention.default) == 0
