"""CPU matmuls as oneDNN linears, with the bias and an activation in the output pass.

ATen runs `addmm` and `mm` on the CPU with MKL's sgemm, and adds nothing in its output
pass: a following activation is a second pass over the output. oneDNN's linear
(`torch.ops.mkldnn._linear_pointwise`, the op TorchInductor's CPU backend also calls)
adds the bias and applies an activation ("post-op") while it writes the output. On the
2-core AMD Zen 5 development VM it was also 1.1-2.1x faster than MKL for the float32
shapes of the demo's MLP and transformer block (benchmarks/cpu_gemm.py, results in
benchmarks/results/cpu-threads-2core-*), and slower for small ones: so the pass asks a
`prefer` function before rewriting a matmul (the runtime gives a fixed rule by shape,
operand layout and CPU family, ember.runtime.cpu_gemm, so that the same graph gets the
same choices on the same kind of machine whatever its load).

A candidate is `addmm(bias, x, w)` (`beta` = `alpha` = 1, `bias` of size N) or
`mm(x, w)` on float32 CPU tensors with static 2-D sizes. It becomes
`_linear_pointwise(x, w^T, bias, "none", [], "")`: oneDNN takes the weight as N x K,
so `permute(W, [1, 0])` is passed as `W` and any other `w` as a permuted view (oneDNN
reads strided operands; nothing is copied). Where the matmul's only reader is an
activation (possibly through one view: a 3-D linear's matmul output is viewed back to
3-D before its GELU), the activation becomes the post-op, if `prefer` agrees for that
case too: SiLU (`x * sigmoid(x)` as AOTAutograd decomposes it: "swish"), ReLU, GELU
(erf or tanh), tanh and sigmoid. In training graphs the forward keeps the matmul's
output for the backward, so it has other readers and only the bias goes in.

Values: oneDNN accumulates in float32 like MKL, in another order, and its post-ops
are float32 approximations; the tests compare with eager under ember's accuracy rule
(the post-ops measured at most a third of the float32 tolerance). A residual add is
not fused: the binary form of the op has no fake (meta) kernel in torch, so graphs
holding it could not be traced; the add stays a pointwise node for ember's kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx

from ember.graphpasses.fake import copy_debug_meta, fake_mode_of, infer_value
from ember.graphpasses.graph_edit import tensor_value
from ember.graphpasses.passes import (
    PRESERVES_NO_MUTATION,
    PRESERVES_RANDOMNESS,
    GraphPass,
    PassResult,
    named_pass,
)

aten = torch.ops.aten
PASS = "cpu_linear"


@dataclass(frozen=True)
class LinearCase:
    """One matmul as the measuring side sees it: sizes, the operands' strides (the
    input M x K, the weight as oneDNN takes it, N x K), whether a bias is added, and
    the post-op ("none", "swish", "relu", "gelu", "gelu_tanh", "tanh", "sigmoid")."""

    m: int
    k: int
    n: int
    input_strides: tuple[int, int]
    weight_strides: tuple[int, int]
    bias: bool
    post_op: str = "none"


Prefer = Callable[[LinearCase], bool]


def linear_op() -> torch._ops.OpOverload | None:
    """oneDNN's linear, where this torch has it and oneDNN is on; else None."""
    available = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]  # torch stub
    if not (available and torch.backends.mkldnn.enabled):
        return None
    try:
        op: torch._ops.OpOverload = torch.ops.mkldnn._linear_pointwise.default
    except (AttributeError, RuntimeError):
        return None
    return op


def cpu_linear(prefer: Prefer) -> GraphPass:
    """The pass; `prefer(case)` says whether oneDNN should run `case`."""

    @named_pass(PASS, (PRESERVES_NO_MUTATION, PRESERVES_RANDOMNESS))
    def run(gm: torch.fx.GraphModule) -> PassResult:
        op = linear_op()
        mode = fake_mode_of(gm)
        if op is None or mode is None:
            return PassResult(gm, False, {"linears": 0, "post_ops": 0})
        linears = post_ops = 0
        for node in list(gm.graph.nodes):
            fused = _rewrite(gm.graph, node, op, mode, prefer)
            if fused is not None:
                linears += 1
                post_ops += fused
        if linears:  # what the rewrites left unread goes in dead code elimination
            gm.graph.lint()
            gm.recompile()
        return PassResult(gm, linears > 0, {"linears": linears, "post_ops": post_ops})

    return run


def _static_2d(value: torch.Tensor | None) -> bool:
    return (
        value is not None
        and value.dim() == 2
        and value.device.type == "cpu"
        and value.dtype == torch.float32
        and all(isinstance(s, int) for s in (*value.shape, *value.stride()))
    )


def _operands(
    node: torch.fx.Node,
) -> tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node | None] | None:
    """(x, w, bias) of a candidate matmul node, else None."""
    if node.op != "call_function":
        return None
    bias: object = None
    if node.target is aten.mm.default and len(node.args) == 2 and not node.kwargs:
        x, w = node.args
    elif node.target is aten.addmm.default and len(node.args) == 3:
        scales = [node.kwargs.get(k, 1) for k in ("beta", "alpha")]
        if set(node.kwargs) - {"beta", "alpha"} or any(s != 1 for s in scales):
            return None
        bias, x, w = node.args
        if not isinstance(bias, torch.fx.Node):
            return None
    else:
        return None
    if not (isinstance(x, torch.fx.Node) and isinstance(w, torch.fx.Node)):
        return None
    out, xv, wv = tensor_value(node), tensor_value(x), tensor_value(w)
    if not (_static_2d(out) and _static_2d(xv) and _static_2d(wv)):
        return None
    if bias is not None:
        assert isinstance(bias, torch.fx.Node)
        bv = tensor_value(bias)
        assert out is not None
        if not (
            bv is not None
            and bv.dtype == torch.float32
            and bv.device.type == "cpu"
            and tuple(bv.shape) == (out.shape[1],)
        ):
            return None
    return x, w, bias if isinstance(bias, torch.fx.Node) else None


# activation node -> post-op (attr, algorithm, LinearCase name)
def _unary_post_op(node: torch.fx.Node) -> tuple[str, str, str] | None:
    if node.op != "call_function":
        return None
    if node.target is aten.relu.default:
        return ("relu", "", "relu")
    if node.target is aten.tanh.default:
        return ("tanh", "", "tanh")
    if node.target is aten.sigmoid.default:
        return ("sigmoid", "", "sigmoid")
    if node.target is aten.gelu.default and len(node.args) == 1:
        approximate = node.kwargs.get("approximate", "none")
        if set(node.kwargs) <= {"approximate"} and approximate in ("none", "tanh"):
            return ("gelu", str(approximate), "gelu" if approximate == "none" else "gelu_tanh")
    return None


def _epilogue(
    out: torch.fx.Node,
) -> tuple[torch.fx.Node, torch.fx.Node | None, tuple[str, str, str]] | None:
    """(the node the post-op replaces, the view between, the post-op) where `out`'s
    only reader is an activation, directly or through one view."""
    users = list(out.users)
    view = None
    if len(users) == 1 and users[0].target in (aten.view.default, aten.reshape.default):
        view = users[0]
        users = list(view.users)
    source = view if view is not None else out
    if len(users) == 1:
        post = _unary_post_op(users[0])
        if post is not None and users[0].args[0] is source:
            return users[0], view, post
    # SiLU as AOTAutograd decomposes it: mul(y, sigmoid(y)), y read by nothing else
    if len(users) == 2:
        sigmoid = next((u for u in users if u.target is aten.sigmoid.default), None)
        mul = next((u for u in users if u.target is aten.mul.Tensor), None)
        if (
            sigmoid is not None
            and mul is not None
            and list(sigmoid.users) == [mul]
            and set(mul.args) == {source, sigmoid}
            and len(mul.args) == 2
            and not mul.kwargs
        ):
            return mul, view, ("swish", "", "swish")
    return None


def _rewrite(
    graph: torch.fx.Graph,
    node: torch.fx.Node,
    op: torch._ops.OpOverload,
    mode: torch._subclasses.fake_tensor.FakeTensorMode,
    prefer: Prefer,
) -> int | None:
    """Rewrite one matmul; None where it stays, else the number of post-ops fused."""
    operands = _operands(node)
    if operands is None:
        return None
    x, w, bias = operands
    xv, wv = tensor_value(x), tensor_value(w)
    assert xv is not None and wv is not None
    m, k = (int(s) for s in xv.shape)
    n = int(wv.shape[1])
    weight: object = None
    if w.target is aten.permute.default and w.args[1:] in (([1, 0],), ((1, 0),)):
        weight = w.args[0]  # W itself, N x K: oneDNN's layout
    case = LinearCase(
        m,
        k,
        n,
        (int(xv.stride(0)), int(xv.stride(1))),
        (int(wv.stride(1)), int(wv.stride(0))),  # w^T's
        bias is not None,
    )
    epilogue = _epilogue(node)
    post = None
    if epilogue is not None and prefer(_with_post_op(case, epilogue[2][2])):
        post = epilogue
    elif not prefer(case):
        return None
    with graph.inserting_before(node):
        if not isinstance(weight, torch.fx.Node):
            weight = graph.call_function(aten.permute.default, (w, [1, 0]))
            copy_debug_meta(node, weight)
            infer_value(weight, mode, PASS)
        attr, algorithm = (post[2][0], post[2][1]) if post is not None else ("none", "")
        linear = graph.call_function(op, (x, weight, bias, attr, [], algorithm))
    copy_debug_meta(node, linear)
    infer_value(linear, mode, PASS)
    if post is None:
        node.replace_all_uses_with(linear)
        graph.erase_node(node)
        return 0
    replaced, view, _ = post
    result = linear
    if view is not None:
        with graph.inserting_after(linear):
            target = view.target
            assert callable(target)
            result = graph.call_function(target, (linear, *view.args[1:]), dict(view.kwargs))
        copy_debug_meta(view, result)
        infer_value(result, mode, PASS)
    replaced.replace_all_uses_with(result)
    return 1


def _with_post_op(case: LinearCase, post_op: str) -> LinearCase:
    return LinearCase(
        case.m, case.k, case.n, case.input_strides, case.weight_strides, case.bias, post_op
    )


__all__ = ["LinearCase", "Prefer", "cpu_linear", "linear_op"]
