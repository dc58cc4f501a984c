"""Pad large low-precision matrix products whose sizes break tensor-core alignment.

cuBLAS picks its fast bf16/fp16 kernels only when every leading dimension is a
multiple of 8 elements (16 bytes). GPT-2's vocabulary is 50257 wide, so its LM head
`x @ W.t()` writes rows of 50257 elements: on an H200 that product took 6.7 ms with a
1-aligned CUTLASS kernel, against 0.86 ms once padded (the profile of issue 8).

The rewrite: pad M, K and N of `mm`, `addmm` and `bmm` up to a multiple of 8 with
zeros (`constant_pad_nd`; zero rows and columns add nothing to a dot product), run
the product on the padded operands, and slice the result back. Slicing off padded
rows keeps the result contiguous; slicing off padded columns leaves a strided view,
which is copied into the original layout so every later node keeps the strides its
metadata promises (the IR reads through them). The pads and the copy move far fewer
bytes than the product reads and writes, so only products above `MIN_FLOPS` are
touched, only with static sizes, and only on the devices given (CUDA by default:
CPU BLAS does not care).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx

from ember.graphpasses.fake import copy_debug_meta, fake_mode_of, infer_value
from ember.graphpasses.graph_edit import tensor_value
from ember.graphpasses.passes import (
    PRESERVES_CORE_ATEN,
    PRESERVES_NO_MUTATION,
    PRESERVES_RANDOMNESS,
    GraphPass,
    PassResult,
    named_pass,
)

aten = torch.ops.aten

ALIGN = 8
MIN_FLOPS = 1 << 31  # 2 GFLOP: below this a product is too short for padding to pay
_LOW_PRECISION = (torch.bfloat16, torch.float16)
_PRODUCTS = (aten.mm.default, aten.addmm.default, aten.bmm.default)


def pad_matmul(devices: Sequence[str] = ("cuda",), min_flops: int = MIN_FLOPS) -> GraphPass:
    """The pass, padding products of at least `min_flops` on the given device types."""

    @named_pass("pad_matmul", (PRESERVES_NO_MUTATION, PRESERVES_CORE_ATEN, PRESERVES_RANDOMNESS))
    def run(gm: torch.fx.GraphModule) -> PassResult:
        mode = fake_mode_of(gm)
        padded = 0
        if mode is not None:
            for node in list(gm.graph.nodes):
                if node.op == "call_function" and node.target in _PRODUCTS:
                    padded += _pad(gm, node, mode, tuple(devices), min_flops)
        if padded:
            gm.graph.lint()
            gm.recompile()
        return PassResult(gm, padded > 0, {"padded": padded})

    return run


def _pad(
    gm: torch.fx.GraphModule,
    node: torch.fx.Node,
    mode: object,
    devices: tuple[str, ...],
    min_flops: int,
) -> int:
    out = tensor_value(node)
    addmm = node.target is aten.addmm.default
    if out is None or node.kwargs or out.device.type not in devices:
        return 0
    if out.dtype not in _LOW_PRECISION:
        return 0
    bias_node, a_node, b_node = (node.args[0], *node.args[1:3]) if addmm else (None, *node.args)
    a, b = tensor_value(a_node), tensor_value(b_node)
    bias = tensor_value(bias_node) if addmm else None
    if a is None or b is None or (addmm and bias is None):
        return 0
    sizes = (*a.shape, *b.shape, *(bias.shape if bias is not None else ()))
    if not all(isinstance(s, int) for s in sizes):
        return 0  # symbolic sizes: the alignment is not known at compile time
    m, k, n = int(a.shape[-2]), int(a.shape[-1]), int(b.shape[-1])
    batch = int(a.shape[0]) if a.dim() == 3 else 1
    if 2 * batch * m * n * k < min_flops:
        return 0
    pm, pk, pn = (-m) % ALIGN, (-k) % ALIGN, (-n) % ALIGN
    if not (pm or pk or pn):
        return 0
    graph = gm.graph
    made: list[torch.fx.Node] = []

    def call(target: object, *args: object) -> torch.fx.Node:
        new = graph.call_function(target, tuple(args))  # type: ignore[arg-type]  # OpOverloads
        copy_debug_meta(node, new)
        infer_value(new, mode, "pad_matmul")  # type: ignore[arg-type]  # a FakeTensorMode
        made.append(new)
        return new

    def padded(source: object, rows: int, cols: int) -> object:
        """`source` with `cols` zero columns (last dim) and `rows` zero rows (the one
        before) appended; `rows` must be 0 for a 1-D tensor."""
        if not (rows or cols):
            return source
        return call(aten.constant_pad_nd.default, source, [0, cols] + ([0, rows] if rows else []))

    with graph.inserting_before(node):
        args: list[object] = [padded(a_node, pm, pk), padded(b_node, pk, pn)]
        if addmm:
            assert bias is not None
            rows = pm if bias.dim() == 2 and int(bias.shape[0]) == m and m > 1 else 0
            cols = pn if bias.dim() >= 1 and int(bias.shape[-1]) == n and n > 1 else 0
            args.insert(0, padded(bias_node, rows, cols))
        result = call(node.target, *args)
        if pn:
            result = call(aten.slice.Tensor, result, -1, 0, n)
        if pm:
            result = call(aten.slice.Tensor, result, -2, 0, m)
        if pn:  # a column slice is strided: back into the product's own layout
            result = call(aten.clone.default, result)
    value = tensor_value(result)
    if value is None or value.shape != out.shape or value.stride() != out.stride():
        for new in reversed(made):
            graph.erase_node(new)
        return 0
    node.replace_all_uses_with(result)
    graph.erase_node(node)
    return 1


__all__ = ["ALIGN", "MIN_FLOPS", "pad_matmul"]
