"""The decomposition table and the list of ops that remain after it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from graphpasses_helpers import MLP, SmallCNN, TransformerBlock, aot_capture, export_aten
from torch._functorch.aot_autograd import aot_function

from ember.graphpasses import (
    EMBER_ADDITIONS,
    KEEP_WHOLE,
    REMAINING_OPS,
    aot_decompositions,
    default_pipeline,
    ember_decompositions,
)
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
    assert aten.native_batch_norm_backward.default not in table  # lowered whole


MAX_POOLS = (
    aten.max_pool2d_with_indices,
    aten.max_pool3d_with_indices,
    aten.adaptive_max_pool2d,
    aten.adaptive_max_pool3d,
    aten.max_pool2d_with_indices_backward,
    aten.max_pool3d_with_indices_backward,
    aten.adaptive_max_pool2d_backward,
    aten.adaptive_max_pool3d_backward,
)


def test_max_pools_reach_the_ir_whole_on_any_torch() -> None:
    """The IR lowers max pooling and its backward, so neither table decomposes them,
    whichever torch decompositions exist (torch 2.15 has some, 2.11 none)."""
    tables = (ember_decompositions(), aot_decompositions())
    for packet in MAX_POOLS:
        assert packet in KEEP_WHOLE and packet not in EMBER_ADDITIONS
        for table in tables:
            assert not [op for op in table if getattr(op, "overloadpacket", None) is packet]

    def pools(x: torch.Tensor) -> Any:
        a = F.max_pool3d(x, 2, 1, 1)
        b = F.adaptive_max_pool3d(x, (2, 3, 2))
        c = F.max_pool2d(x.flatten(1, 2), 3, 2, 1)
        return a.sum() + b.sum() + c.sum()

    x = torch.randn(2, 3, 4, 6, 5)
    ops = {op for code in _traced(pools, [x], aot_decompositions(), True) for op in MAX_POOLS
           if f"aten.{op.__name__}.default" in code}  # fmt: skip
    assert ops == set(MAX_POOLS) - {aten.adaptive_max_pool2d, aten.adaptive_max_pool2d_backward}


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
    # the training backward's batch norm and max pool reach the IR whole (KEEP_WHOLE)
    assert "aten.native_batch_norm_backward.default" in seen
    assert "aten.max_pool2d_with_indices_backward.default" in seen
    assert "aten.native_layer_norm.default" not in seen


def _traced(fn: Any, args: list[torch.Tensor], table: Any, grad: bool | None) -> list[str]:
    """The code of every graph AOTAutograd hands its compilers for `fn(*args)`, with
    gradients (True), without (False), or under inference mode (None: autograd off,
    so composite ops reach the tracer whole)."""
    codes: list[str] = []

    def record(gm: torch.fx.GraphModule, _: Any) -> torch.fx.GraphModule:
        codes.append(gm.code)
        return gm

    inputs = [a.detach().requires_grad_(bool(grad) and a.is_floating_point()) for a in args]
    mode = torch.inference_mode() if grad is None else torch.set_grad_enabled(grad)
    with mode:
        out = aot_function(fn, fw_compiler=record, bw_compiler=record, decompositions=table)(
            *inputs
        )
        if grad:
            out.float().sum().backward()
    return codes


def test_aot_table_traces_as_the_full_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table without the composite ops that cannot reach a tracer whole traces the
    same forward and backward graphs (linear, matmul, norms, softmax, conv + batch
    norm, SDPA, cross-entropy, embedding, interpolation, channel shuffle, ...), with
    and without gradients and under inference mode, and is built without torch
    walking every registered operator."""
    full = ember_decompositions()
    import torch._export.utils as export_utils

    def walked() -> None:
        raise AssertionError("aot_decompositions() walked every composite op")

    monkeypatch.setattr(export_utils, "_materialize_cpp_cia_ops", walked)
    lean = aot_decompositions()
    assert set(lean) < set(full)
    assert aten.native_layer_norm.default in lean and aten.linear.default not in lean
    assert aten.upsample_nearest2d.default in lean  # has CPU and CUDA kernels

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 8, 16, generator=g), torch.randn(16, 16, generator=g)
    img, kernel = torch.randn(2, 4, 8, 8, generator=g), torch.randn(6, 4, 3, 3, generator=g)
    scale, labels = torch.randn(4, generator=g), torch.randint(0, 16, (32,), generator=g)
    cases: list[tuple[Any, list[torch.Tensor]]] = [
        (lambda x, w: F.gelu(F.layer_norm(F.linear(x, w), (16,))) @ w, [x, w]),
        (lambda x: F.softmax(x, -1) + F.log_softmax(x, 1) + F.silu(x) * F.hardswish(x), [x]),
        (
            lambda i, k, s: F.batch_norm(F.conv2d(i, k)[:, :4], None, None, s, training=True),
            [img, kernel, scale],
        ),
        (lambda i: F.group_norm(i, 2) + F.interpolate(F.avg_pool2d(i, 2), scale_factor=2), [img]),
        (lambda i: F.interpolate(i, scale_factor=2, mode="nearest-exact") * 2, [img]),
        (lambda i: F.channel_shuffle(i, 2) * 2, [img]),
        (lambda x: F.scaled_dot_product_attention(x, x, x, is_causal=True), [x]),
        (lambda x, t: F.cross_entropy(x.reshape(32, 16), t), [x, labels]),
        (lambda w, t: F.embedding(t, w) + torch.einsum("ij,jk->ik", w, w)[t], [w, labels]),
        (lambda x: x.std(-1).sum() + F.normalize(x, dim=-1).sum() + x.norm(), [x]),
    ]
    for fn, args in cases:
        for grad in (False, True, None):
            assert _traced(fn, args, lean, grad) == _traced(fn, args, full, grad)


def test_aot_table_leaves_out_only_ops_no_tracer_sees_whole() -> None:
    """Every entry of the full table missing from the AOT table is a composite op
    without a CPU or CUDA kernel: autograd or the tracer decomposes it by itself."""
    lean = aot_decompositions()
    for op in ember_decompositions():
        if op in lean:
            continue
        assert torch._C._dispatch_has_kernel_for_dispatch_key(
            op.name(), "CompositeImplicitAutograd"
        ) or (torch._C.DispatchKey.CompositeImplicitAutograd in op.py_kernels), op
        for key in ("CPU", "CUDA"):
            assert not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key), (op, key)


def test_composites_with_kernels_are_those_the_dispatcher_names_one_by_one() -> None:
    """The registrations read as lists find exactly the ops that asking the dispatcher
    op by op finds."""
    from ember.graphpasses.decompositions import _composites_with_kernels

    found = set(_composites_with_kernels())
    composite = torch._C.DispatchKey.CompositeImplicitAutograd
    expected = set()
    for op in ember_decompositions():
        if not isinstance(op, torch._ops.OpOverload):
            continue
        is_composite = torch._C._dispatch_has_kernel_for_dispatch_key(
            op.name(), "CompositeImplicitAutograd"
        ) or (composite in op.py_kernels)
        has_kernel = any(
            torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)
            for key in ("CPU", "CUDA")
        )
        if is_composite and has_kernel:
            expected.add(op)
    assert expected and expected <= found
    for op in found:
        assert any(
            torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)
            for key in ("CPU", "CUDA")
        ), op
