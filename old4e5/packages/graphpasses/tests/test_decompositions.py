"""The decomposition table and the list of ops that remain after it."""

from __future__ import annotations

import torch
from graphpasses_helpers import MLP, SmallCNN, TransformerBlock, aot_capture, export_aten

from ember.graphpasses import EMBER_ADDITIONS, REMAINING_OPS, default_pipeline, ember_decompositions
from ember.graphpasses.graph_checks import is_aten_level_target
from ember.graphpasses.remaining_ops import CORE_REMAINING, OTHER_REMAINING, PATTERN_RESULTS

aten = torch.ops.aten


def _existing(name: str) -> bool:
    namespace, op, overload = name.split(".")
    packet = getattr(getattr(torch.ops, namespace), op, None)
    return packet is not None and overload in packet.overloads()


def test_remaining_core_ops_match_the_table() -> None:
    """If this fails, update remaining_ops.CORE_REMAINING (and tell the IR layer)."""
    table = ember_decompositions()
    computed = set()
    # Every registered aten op, not just those `torch.ops.aten` has loaded so far (it
    # loads lazily, so iterating it depends on what earlier tests touched).
    packets = {
        n.split("::")[1].split(".")[0]
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith("aten::")
    }
    for name in sorted(packets):
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if torch.Tag.core in op.tags and op not in table:
                computed.add(str(op))
    listed = {name for name in CORE_REMAINING if _existing(name)}
    assert sorted(computed - listed) == [], "core ops left whole but not listed"
    assert sorted(listed - computed) == [], "listed ops the table now decomposes"


def test_lists_are_sorted_and_disjoint_where_it_matters() -> None:
    assert list(CORE_REMAINING) == sorted(CORE_REMAINING)
    assert not set(OTHER_REMAINING) & set(CORE_REMAINING)
    assert all(_existing(name) for name in (*OTHER_REMAINING, *PATTERN_RESULTS))


def test_ember_additions_are_decomposed() -> None:
    table = ember_decompositions()
    for packet in EMBER_ADDITIONS:
        assert packet.default in table, packet
    assert aten._native_batch_norm_legit_functional.default in table
    assert aten.addmm.default not in table  # an extern on purpose


def test_fresh_copy_each_call() -> None:
    first = ember_decompositions()
    first.clear()
    assert ember_decompositions()


def _ops(gm: torch.fx.GraphModule) -> set[str]:
    return {
        str(n.target)
        for n in gm.graph.nodes
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
    }


def test_model_graphs_only_use_remaining_ops() -> None:
    """Every op in the end-to-end models' graphs, after the default pipeline, is listed."""
    seen: set[str] = set()
    models = [
        (MLP(), torch.randn(4, 16)),
        (SmallCNN(), torch.randn(2, 3, 16, 16)),
        (TransformerBlock(), torch.randn(2, 6, 32)),
    ]
    for model, x in models:
        for train in (False, True):
            captured = aot_capture(model.train(train), x, train=train)
            for kind in captured.graphs:
                gm, _ = default_pipeline().run(captured.graph(kind))
                assert all(
                    is_aten_level_target(n.target)
                    for n in gm.graph.nodes
                    if n.op == "call_function"
                )
                seen |= _ops(gm)
        seen |= _ops(export_aten(model.eval(), x).graph_module)
    assert sorted(seen - REMAINING_OPS) == []
    assert "aten._native_batch_norm_legit_functional.default" not in seen
    assert "aten.native_layer_norm.default" not in seen
