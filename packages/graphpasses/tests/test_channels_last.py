"""channels_last_convolutions: convolution graphs run channels-last, with the same
values and the output strides they promise; training forwards (which return their
saved activations) are left alone.

The pass acts on CUDA graphs by default; here it is pointed at the CPU so that the
rewritten graphs can be run and compared with the originals.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.utils._pytree as pytree
from graphpasses_helpers import aot_capture, count  # type: ignore[import-not-found]  # tests/ on sys.path
from torch import nn

from ember.graphpasses import channels_last_convolutions

aten = torch.ops.aten
ON_CPU = channels_last_convolutions(devices=("cpu",))


class Block(nn.Module):
    """conv-bn-relu twice with a residual, then pooling and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + y)
        return self.head(y.mean((2, 3)))


def _run(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    out = gm(*[x.clone() for x in inputs])
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _channels_last_convolutions(gm: torch.fx.GraphModule) -> int:
    return sum(
        node.args[0].meta["val"].is_contiguous(memory_format=torch.channels_last)
        for node in gm.graph.nodes
        if node.target is aten.convolution.default
    )


def test_inference_graph_runs_channels_last_with_the_same_results() -> None:
    model = Block().eval()
    captured = aot_capture(model, torch.randn(2, 3, 12, 12))
    gm = captured.graph("inference")
    before = _run(gm, captured.inputs["inference"])
    assert _channels_last_convolutions(gm) == 0
    result = ON_CPU(gm)
    # one conversion, at the first convolution; the second receives channels-last
    assert result.changed and result.stats == {"converted": 1}
    assert _channels_last_convolutions(gm) == 2
    assert count(gm, aten.clone.default) == 1
    after = _run(gm, captured.inputs["inference"])
    for a, b in zip(after, before, strict=True):
        assert a.stride() == b.stride()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_four_dimensional_output_is_copied_back_to_its_promised_strides() -> None:
    conv = nn.Sequential(nn.Conv2d(4, 8, 3), nn.ReLU()).eval()
    captured = aot_capture(conv, torch.randn(2, 4, 9, 9))
    gm = captured.graph("inference")
    before = _run(gm, captured.inputs["inference"])
    assert ON_CPU(gm).changed
    after = _run(gm, captured.inputs["inference"])
    assert after[0].is_contiguous() and before[0].is_contiguous()
    torch.testing.assert_close(after[0], before[0], rtol=1e-4, atol=1e-5)


def test_training_forward_with_saved_activations_is_left_alone() -> None:
    captured = aot_capture(Block(), torch.randn(2, 3, 12, 12), train=True)
    gm = captured.graph("forward")
    code = gm.code
    result = ON_CPU(gm)
    assert not result.changed and gm.code == code
    assert _channels_last_convolutions(gm) == 0
    # the fake values are the originals again: the lowering reads their strides
    for node in gm.graph.nodes:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and value.dim() == 4:
            assert value.is_contiguous(), node.name


def test_cuda_graphs_only_by_default() -> None:
    captured = aot_capture(Block().eval(), torch.randn(2, 3, 12, 12))
    gm = captured.graph("inference")
    assert not channels_last_convolutions()(gm).changed


def test_training_joint_graph_runs_channels_last_with_eager_gradients() -> None:
    """On the joint graph, before the split: the forward's convolutions and their
    backward read channels-last inputs, the saved activations cross channels-last,
    and the loss, the input's gradient and every parameter's gradient equal eager's,
    with the parameters' strides (the weight gradients are copied back).

    The parameters' gradients are compared with eager run channels-last: the graphs
    run as ATen calls here, and batch norm's backward stays one op
    (`native_batch_norm_backward`), whose channels-last CPU kernel rounds its
    per-channel sums differently from the contiguous one (against float64, the
    gradient of conv2's bias, 0 but for rounding, is off by 3e-5 in both the compiled
    graph and eager channels-last, by 2e-6 in eager contiguous)."""
    import copy

    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._functorch.partitioners import default_partition

    from ember.graphpasses import channels_last_training, ember_decompositions

    seen: dict[str, Any] = {}

    def partition(joint: torch.fx.GraphModule, inputs: Any, **kwargs: Any) -> Any:
        seen["result"] = channels_last_training(devices=("cpu",))(joint)
        return default_partition(joint, inputs, **kwargs)

    def compiler(kind: str) -> Any:
        def compile_graph(gm: torch.fx.GraphModule, example: Any) -> Any:
            seen[kind] = gm
            return make_boxed_func(gm.forward)

        return compile_graph

    backend = aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        partition_fn=partition,
        decompositions=ember_decompositions(),
    )
    model, x = Block(), torch.randn(4, 3, 32, 32, requires_grad=True)
    reference, x_ref = copy.deepcopy(model), x.detach().clone().requires_grad_()
    reference(x_ref).square().sum().backward()
    nhwc = copy.deepcopy(model).to(memory_format=torch.channels_last)
    nhwc(x.detach().contiguous(memory_format=torch.channels_last)).square().sum().backward()
    torch._dynamo.reset()
    torch.compile(model, backend=backend, fullgraph=True)(x).square().sum().backward()
    assert seen["result"].changed
    assert _channels_last_convolutions(seen["forward"]) == 2
    grads = [
        n for n in seen["backward"].graph.nodes if n.target is aten.convolution_backward.default
    ]
    assert len(grads) == 2
    assert all(
        g.args[1].meta["val"].is_contiguous(memory_format=torch.channels_last) for g in grads
    )
    assert x.grad is not None and x_ref.grad is not None
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-5)
    for (name, p), q, r in zip(
        model.named_parameters(), reference.parameters(), nhwc.parameters(), strict=True
    ):
        assert p.grad is not None and q.grad is not None and r.grad is not None, name
        assert p.grad.stride() == q.grad.stride(), name
        torch.testing.assert_close(p.grad, r.grad.contiguous(), rtol=1e-4, atol=1e-5, msg=name)


def test_training_joint_graph_is_left_alone_when_copies_would_cost_too_much() -> None:
    """A fraction of 0 allows no copy back: the weight gradients would need one. A
    block whose 4-D output is as large as its activations is left alone by default."""
    from ember.graphpasses import channels_last_training

    captured: dict[str, torch.fx.GraphModule] = {}

    def partition(joint: torch.fx.GraphModule, inputs: Any, **kwargs: Any) -> Any:
        from torch._functorch.partitioners import default_partition

        captured["joint"] = joint
        code = joint.code
        assert not channels_last_training(("cpu",), max_copy_fraction=0.0)(joint).changed
        assert joint.code == code
        return default_partition(joint, inputs, **kwargs)

    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    backend = aot_autograd(
        fw_compiler=lambda gm, ex: make_boxed_func(gm.forward),
        bw_compiler=lambda gm, ex: make_boxed_func(gm.forward),
        partition_fn=partition,
    )
    torch._dynamo.reset()
    torch.compile(Block(), backend=backend, fullgraph=True)(
        torch.randn(2, 3, 12, 12)
    ).sum().backward()
    assert "joint" in captured


class Narrowing(nn.Module):
    """A wide early convolution (small weight, large input), then a deep late one
    (large weight, small input): by convolution, only the first runs channels-last
    and the second gets NCHW back."""

    def __init__(self) -> None:
        super().__init__()
        self.early = nn.Conv2d(8, 8, 3, padding=1)  # weight 576 < input 2*8*16*16
        self.late = nn.Conv2d(8, 64, 3, stride=4)  # weight 4608 > input 2*8*16*16 = 4096

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.late(torch.relu(self.early(x))).mean((2, 3))


def test_by_convolution_each_takes_the_layout_its_shapes_favour() -> None:
    captured = aot_capture(Narrowing().eval(), torch.randn(2, 8, 16, 16))
    gm = captured.graph("inference")
    before = _run(gm, captured.inputs["inference"])
    convs = [n for n in gm.graph.nodes if n.target is aten.convolution.default]
    from ember.graphpasses import favours_channels_last

    assert [favours_channels_last(c) for c in convs] == [True, False]
    result = channels_last_convolutions(devices=(), by_convolution=("cpu",))(gm)
    assert result.changed and result.stats == {"converted": 2}  # there and back
    layouts = [
        n.args[0].meta["val"].is_contiguous(memory_format=torch.channels_last)
        for n in gm.graph.nodes
        if n.target is aten.convolution.default
    ]
    assert layouts == [True, False]
    after = _run(gm, captured.inputs["inference"])
    for a, b in zip(after, before, strict=True):
        assert a.stride() == b.stride()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_by_convolution_leaves_a_graph_alone_where_no_convolution_favours_it() -> None:
    model = nn.Sequential(nn.Conv2d(8, 64, 3, stride=4), nn.ReLU()).eval()
    captured = aot_capture(model, torch.randn(2, 8, 16, 16))
    gm = captured.graph("inference")
    code = gm.code
    assert not channels_last_convolutions(devices=(), by_convolution=("cpu",))(gm).changed
    assert gm.code == code and count(gm, aten.clone.default) == 0


class SlicedNarrowing(Narrowing):
    """`Narrowing` with a strided slice between the two convolutions: the slice of
    converted (channels-last) data is neither channels-last nor contiguous, and the
    late convolution must still get NCHW back."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.early(x))[:, :, ::2, ::2]
        return self.late(y) * 2


def test_by_convolution_converts_a_strided_slice_of_converted_data_back() -> None:
    model = SlicedNarrowing().eval()
    model.late = nn.Conv2d(8, 64, 3, padding=1)  # weight 4608 > sliced input 2*8*8*8
    captured = aot_capture(model, torch.randn(2, 8, 16, 16))
    gm = captured.graph("inference")
    before = _run(gm, captured.inputs["inference"])
    assert channels_last_convolutions(devices=(), by_convolution=("cpu",))(gm).changed
    convs = [n for n in gm.graph.nodes if n.target is aten.convolution.default]
    assert convs[1].args[0].meta["val"].is_contiguous()
    after = _run(gm, captured.inputs["inference"])
    for node, a, b in zip(
        next(n for n in gm.graph.nodes if n.op == "output").args[0], after, before, strict=True
    ):
        assert a.stride() == b.stride() == node.meta["val"].stride()  # as inferred
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # what each convolution returns at run time is what its fake value says
    values = {}
    interpreter = torch.fx.Interpreter(gm)
    original_run_node = interpreter.run_node

    def run_node(n: torch.fx.Node) -> object:
        result = original_run_node(n)
        values[n] = result
        return result

    interpreter.run_node = run_node  # type: ignore[method-assign]
    interpreter.run(*[x.clone() for x in captured.inputs["inference"]])
    for conv in convs:
        assert values[conv].stride() == conv.meta["val"].stride(), conv.name


def test_values_the_conversion_does_not_reach_are_not_inferred_again() -> None:
    """Only the nodes a conversion reaches get new fake values: the rest keep theirs
    (the same objects), and every node's value still has the strides running the graph
    gives."""

    class TwoPaths(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x: torch.Tensor, side: torch.Tensor) -> Any:
            return self.conv(x).mean((2, 3)), (side * 2).sum(-1)

    captured = aot_capture(TwoPaths().eval(), torch.randn(2, 3, 8, 8), torch.randn(4, 5))
    gm = captured.graph("inference")
    before = {n: n.meta.get("val") for n in gm.graph.nodes}
    assert ON_CPU(gm).changed
    side = [n for n in gm.graph.nodes if n.target in (aten.mul.Tensor, aten.sum.dim_IntList)]
    assert side and all(n.meta["val"] is before[n] for n in side)
    conv = next(n for n in gm.graph.nodes if n.target is aten.convolution.default)
    assert conv.meta["val"] is not before[conv]
    assert conv.meta["val"].is_contiguous(memory_format=torch.channels_last)


def _joint_graph(model: nn.Module, *inputs: torch.Tensor) -> torch.fx.GraphModule:
    """AOTAutograd's joint forward + backward graph of one training step of `model`."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._functorch.partitioners import default_partition

    from ember.graphpasses import ember_decompositions

    captured: list[torch.fx.GraphModule] = []

    def partition(joint: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        captured.append(torch.fx.GraphModule(joint, copy.deepcopy(joint.graph)))
        return default_partition(joint, joint_inputs, **kwargs)

    backend = aot_autograd(
        fw_compiler=lambda gm, ex: make_boxed_func(gm.forward),
        bw_compiler=lambda gm, ex: make_boxed_func(gm.forward),
        partition_fn=partition,
        decompositions=ember_decompositions(),
    )
    torch._dynamo.reset()
    torch.compile(model, backend=backend, fullgraph=True)(*inputs).sum().backward()
    (joint,) = captured
    return joint


def test_training_infers_again_only_where_an_input_changes_layout(monkeypatch: Any) -> None:
    """On a joint graph converted there and back (by convolution), the values the
    conversions reach but whose inputs keep their sizes and strides (the late
    convolution behind its conversion back to NCHW, and its backward) keep their
    fake values, and every node ends with the same metadata as when every reached
    node is inferred again."""
    from ember.graphpasses import channels_last as module
    from ember.graphpasses import channels_last_training

    class NarrowingWithNorm(Narrowing):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.BatchNorm2d(8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.late(torch.relu(self.norm(self.early(x)))).mean((2, 3))

    joint = _joint_graph(NarrowingWithNorm(), torch.randn(2, 8, 16, 16))
    pruned = torch.fx.GraphModule(joint, copy.deepcopy(joint.graph))
    full = torch.fx.GraphModule(joint, copy.deepcopy(joint.graph))
    before = {n.name: n.meta.get("val") for n in joint.graph.nodes}
    inferred: list[str] = []
    real_infer = module.infer_value

    def counting(node: torch.fx.Node, mode: Any, name: str) -> None:
        inferred.append(node.name)
        real_infer(node, mode, name)

    monkeypatch.setattr(module, "infer_value", counting)
    layout = channels_last_training(devices=(), by_convolution=("cpu",))
    assert layout(pruned).changed
    pruned_count = len(inferred)

    def every_reached(gm: torch.fx.GraphModule, mode: Any, made: Any, saved: Any) -> None:
        touched = set(made)
        for node in gm.graph.nodes:
            if node.op == "call_function" and (
                node in touched or any(a in touched for a in node.all_input_nodes)
            ):
                counting(node, mode, module.PASS)
                touched.add(node)

    monkeypatch.setattr(module, "_reinfer", every_reached)
    inferred.clear()
    assert layout(full).changed
    assert pruned_count < len(inferred)
    assert pruned.code == full.code
    for a, b in zip(pruned.graph.nodes, full.graph.nodes, strict=True):
        assert a.name == b.name
        assert module._same_metadata(a.meta.get("val"), b.meta.get("val")), a.name
        leaves = pytree.tree_leaves(a.meta.get("val")), pytree.tree_leaves(b.meta.get("val"))
        for x, y in zip(*leaves, strict=True):
            if isinstance(x, torch.Tensor):
                assert x.stride() == y.stride() and x.shape == y.shape, a.name
    convs = [n for n in pruned.graph.nodes if n.target is aten.convolution.default]
    assert convs[0].args[0].meta["val"].is_contiguous(memory_format=torch.channels_last)
    late = convs[1]
    assert late.args[0].target is aten.clone.default  # the conversion back
    assert late.meta["val"] is before[late.name]  # not inferred again
    gradient = next(
        n for n in pruned.graph.nodes
        if n.target is aten.convolution_backward.default and n.args[2] is late.args[1]
    )  # fmt: skip
    assert gradient.meta["val"] is before[gradient.name]


def test_same_metadata_tells_strides_and_structure_apart() -> None:
    from ember.graphpasses.channels_last import _same_metadata

    x = torch.empty(2, 3, 4, 5)
    nhwc = x.contiguous(memory_format=torch.channels_last)
    assert _same_metadata(x, torch.empty(2, 3, 4, 5))
    assert not _same_metadata(x, nhwc)
    assert not _same_metadata(x, x[1:])
    assert not _same_metadata(x, x.double())
    assert _same_metadata((x, None, 3), (torch.empty(2, 3, 4, 5), None, 3))
    assert not _same_metadata((x, None), (x, x))
    assert not _same_metadata((x, 3), (x, 3.0))
    assert not _same_metadata([x], (x,))
