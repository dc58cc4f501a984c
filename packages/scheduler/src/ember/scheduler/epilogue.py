"""Matmul templates: matrix products that carry their pointwise consumers.

Lowering keeps `mm`, `addmm` and `bmm` ATen calls (cuBLAS beats generated loops),
so a Linear layer's bias, activation, residual add and casts each ran as a kernel of
their own after it, reading the product back from memory. Where the codegen renders
matmul templates (`DeviceChoices.matmul_templates`) and the runtime asks for them
(`matmul_epilogues`), `template_matmuls` turns such a call into a loop node the fuser
can give an epilogue:

- `mm(a, b)` and `bmm(a, b)` become a `sum` reduction over K of
  `float32(a[.., m, k]) * float32(b[.., k, n])`, stored in the call's own layout and
  dtype: the float32 accumulator rounded once;
- `addmm(bias, a, b)` (beta = alpha = 1) becomes that product kept in float32, plus a
  pointwise `bias + product` rounded once to the result's dtype, as cuBLAS adds the
  bias to its accumulator.

The fuser then treats the product as a reduction group of its own (`Fuser` with
`matmuls`): it starts a kernel, joins none, and takes only pointwise members over its
outer space that read something the kernel computes, each reading the product at
exactly the point it computes (no transposed, shifted, masked or indirect read: the
fuser's rule 3). A product that something else reads too is stored as well.

Only calls that fit the template are turned: float16, bfloat16 or float32 operands of
one dtype (of those the codegen multiplies: `DeviceChoices.matmul_dtypes`), known
layouts, no dimension of size 0 or 1 (ATen's cheap special cases), and indices from
which the roles of the loop variables can be read back (`matmul_roles`). A product
with no pointwise reader (and no bias) stays an ATen call: with nothing to fuse,
cuBLAS alone is the better kernel; so does one whose readers all refused to join it
(`schedule_program` schedules again with it kept).
Everything else stays an ATen call, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import sympy
import torch

from ember.ir import BufferRef, ComputedBuffer, ExternKernel, Layout, Load, Program
from ember.ir.expr import Cast, Node, Op
from ember.ir.loops import Pointwise, Reduction
from ember.ir.nodes import ComputeNode
from ember.ir.symbolic import index_var, is_loop_var
from ember.scheduler.choices import DeviceChoices
from ember.scheduler.indexing import affine_coefficient, store_index
from ember.scheduler.iteration import merge_loop
from ember.scheduler.traffic import buffer_layouts

aten = torch.ops.aten

# The calls a template replaces, by kind.
MATMUL_OPS: dict[torch._ops.OpOverload, str] = {
    aten.mm.default: "mm",
    aten.addmm.default: "addmm",
    aten.bmm.default: "bmm",
}
# Operand dtypes the template multiplies (accumulating in float32).
MATMUL_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})


@dataclass(frozen=True)
class MatmulRoles:
    """Which loop variable of a matmul kernel is which dimension of the product."""

    m: sympy.Symbol
    n: sympy.Symbol
    k: sympy.Symbol
    batch: sympy.Symbol | None = None


def matmul_operands(body: Node) -> tuple[Load, Load] | None:
    """(A, B) of a matmul member's body `float32(A) * float32(B)`, or None when the
    body is not such a product of two plain loads of one floating dtype."""
    if not (isinstance(body, Op) and body.name == "mul" and len(body.args) == 2):
        return None
    if body.dtype != torch.float32:
        return None
    found = [_operand(arg) for arg in body.args]
    a, b = found
    if a is None or b is None or a.dtype != b.dtype:
        return None
    return a, b


def _operand(node: Node) -> Load | None:
    if isinstance(node, Cast) and node.to == torch.float32:
        node = node.x
    if (
        isinstance(node, Load)
        and node.mask is None
        and not node.indirect
        and node.dtype in MATMUL_DTYPES
    ):
        return node
    return None


def matmul_roles(body: Node, outer: int) -> MatmulRoles | None:
    """The roles of the `outer` loop variables (i0 ..) and of r0 in a matmul body:
    M is read by A alone, N by B alone, a batch by both, K (r0) by both; each index
    affine in each. None when the body or its indices do not say (a broadcast operand
    whose batch stride is 0, a dimension merged away)."""
    operands = matmul_operands(body)
    if operands is None:
        return None
    a, b = operands
    k = index_var("r", 0)
    variables = {index_var("i", d) for d in range(outer)}
    allowed = variables | {k}
    for load in (a, b):
        loop_symbols = {s for s in load.index.free_symbols if is_loop_var(s)}
        if not loop_symbols <= allowed or k not in loop_symbols:
            return None
        if any(affine_coefficient(load.index, v) is None for v in loop_symbols):
            return None
    in_a = variables & a.index.free_symbols
    in_b = variables & b.index.free_symbols
    batch, m, n = in_a & in_b, in_a - in_b, in_b - in_a
    if len(m) != 1 or len(n) != 1 or len(batch) > 1 or (in_a | in_b) != variables:
        return None
    return MatmulRoles(m.pop(), n.pop(), k, batch.pop() if batch else None)


def template_matmuls(
    program: Program, choices: DeviceChoices, keep: frozenset[str] = frozenset()
) -> tuple[Program, dict[str, str]]:
    """`program` with the matmul calls that fit the template as loop nodes (but those
    named in `keep`), and the product nodes' names, each to the call it replaces (the
    same program and none when `choices` do not ask for templates). See the module
    docstring."""
    if not (choices.matmul_templates and choices.matmul_epilogues):
        return program, {}
    layouts = buffer_layouts(program)
    pointwise_readers: set[str] = set()
    for node in program.nodes:
        if isinstance(node, ComputedBuffer) and isinstance(node.loop, Pointwise):
            pointwise_readers.update(node.reads())
    taken = {node.name for node in program.nodes} | set(layouts)
    nodes: list[ComputeNode] = []
    products: dict[str, str] = {}
    for node in program.nodes:
        built = None
        if isinstance(node, ExternKernel) and node.op in MATMUL_OPS and node.name not in keep:
            built = _template(node, layouts, pointwise_readers, taken, choices.matmul_dtypes)
        if built is None:
            nodes.append(node)
            continue
        nodes += built
        products[built[0].name] = node.name
    if not products:
        return program, {}
    return replace(program, nodes=nodes), products


def _template(
    node: ExternKernel,
    layouts: dict[str, Layout],
    pointwise_readers: set[str],
    taken: set[str],
    dtypes: frozenset[torch.dtype] = MATMUL_DTYPES,
) -> list[ComputeNode] | None:
    """The loop nodes replacing one matmul call, or None where it stays a call
    (`dtypes`: the operand dtypes the codegen multiplies)."""
    kind = MATMUL_OPS[node.op]
    out = node.layout
    if node.multi or out is None or out.dtype not in MATMUL_DTYPES & dtypes:
        return None
    kwargs = dict(node.kwargs)
    bias: BufferRef | None = None
    if kind == "addmm":
        if len(node.args) != 3 or not all(_is_one(kwargs.pop(k, 1)) for k in ("beta", "alpha")):
            return None
        bias, a, b = node.args
        if not isinstance(bias, BufferRef):
            return None
    elif len(node.args) == 2:
        a, b = node.args
    else:
        return None
    if kwargs or not isinstance(a, BufferRef) or not isinstance(b, BufferRef):
        return None
    if kind != "addmm" and node.name not in pointwise_readers:
        return None  # nothing to fuse: cuBLAS alone
    la, lb = layouts.get(a.name), layouts.get(b.name)
    lbias = layouts.get(bias.name) if bias is not None else None
    if la is None or lb is None or (bias is not None and lbias is None):
        return None
    operand_layouts = [la, lb, *([lbias] if lbias is not None else [])]
    if any(lay.dtype != out.dtype or lay.device != out.device for lay in operand_layouts):
        return None
    rank = 3 if kind == "bmm" else 2
    if len(la.size) != rank or len(lb.size) != rank or len(out.size) != rank:
        return None
    size_m, size_k, size_n = la.size[-2], la.size[-1], lb.size[-1]
    expected = (*la.size[:-2], size_m, size_n)
    same = [sympy.expand(x - y) == 0 for x, y in zip(out.size, expected, strict=True)]
    if not all(same) or sympy.expand(lb.size[-2] - size_k) != 0:
        return None
    if rank == 3 and sympy.expand(la.size[0] - lb.size[0]) != 0:
        return None
    if any(_degenerate(s) for s in out.size) or _degenerate(size_k):
        return None
    outer = [index_var("i", d) for d in range(rank)]
    k = index_var("r", 0)
    a_vars = [*outer[:-2], outer[-2], k]
    b_vars = [*outer[:-2], k, outer[-1]]
    body = Op(
        "mul", (_f32(_load(a.name, la, a_vars)), _f32(_load(b.name, lb, b_vars))), torch.float32
    )
    ranges = tuple(out.size)
    product_layout = out if bias is None else Layout.contiguous(out.device, torch.float32, ranges)
    name = node.name if bias is None else _fresh(f"{node.name}_mm", taken)
    origins = (node.origin,) if node.origin else ()
    product = ComputedBuffer(
        name,
        product_layout,
        Reduction(ranges, (size_k,), "sum", body),
        origin=node.origin,
        origins=origins,
    )
    merged, _ = merge_loop(product, store_index(product))
    assert isinstance(merged.loop, Reduction)
    if matmul_roles(merged.loop.body, len(merged.loop.ranges)) is None:
        return None
    if bias is None or lbias is None:
        return [product]
    accumulator = Load(name, store_index(product), torch.float32)
    total: Node = Op(
        "add", (_f32(_broadcast_load(bias.name, lbias, outer)), accumulator), torch.float32
    )
    if out.dtype != torch.float32:
        total = Cast(total, out.dtype)
    result = ComputedBuffer(
        node.name, out, Pointwise(ranges, total), origin=node.origin, origins=origins
    )
    return [product, result]


def _load(name: str, layout: Layout, variables: list[sympy.Symbol]) -> Load:
    index = layout.offset + sum(
        (s * v for s, v in zip(layout.stride, variables, strict=True)), sympy.Integer(0)
    )
    return Load(name, sympy.expand(index), layout.dtype)


def _broadcast_load(name: str, layout: Layout, outer: list[sympy.Symbol]) -> Load:
    """A load of `name` broadcast to the output's dimensions (aligned on the right,
    size-1 dimensions read at 0)."""
    variables = outer[len(outer) - len(layout.size) :]
    index: sympy.Expr = layout.offset
    for size, stride, var in zip(layout.size, layout.stride, variables, strict=True):
        if size != 1:
            index = index + stride * var
    return Load(name, sympy.expand(index), layout.dtype)


def _f32(node: Node) -> Node:
    return node if node.dtype == torch.float32 else Cast(node, torch.float32)


def _is_one(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 1


def _degenerate(size: sympy.Expr) -> bool:
    """A static size of 0 or 1 (ATen's special cases: no product, or a vector one)."""
    return isinstance(size, sympy.Integer) and int(size) <= 1


def _fresh(name: str, taken: set[str]) -> str:
    candidate, count = name, 0
    while candidate in taken:
        count += 1
        candidate = f"{name}{count}"
    taken.add(candidate)
    return candidate
