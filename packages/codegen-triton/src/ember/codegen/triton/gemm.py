"""The matmul template: a tiled matrix product whose pointwise consumers run on its
output tile before it is stored (a matmul kernel, ember.scheduler.kernel).

Each program computes one [YBLOCK, XBLOCK] tile of C = A @ B (y: M, x: N; with a
batch dimension, one tile of one batch entry): it walks K in steps of RBLOCK, loads an
[YBLOCK, RBLOCK] block of A and an [RBLOCK, XBLOCK] block of B through their strides
(any strides: a Linear's transposed weight is read in place), and accumulates `tl.dot`
products in float32. The loop is the shape Triton software-pipelines (`num_stages`
blocks in flight): pointers advanced by a constant step, and no mask on its loads
where every config's RBLOCK divides K. Rows of A and columns of B are not masked
either: a tile that overhangs M or N reads wrapped rows (`% ynumel`, real ones, as
Triton's matmul tutorial does) whose results the stores' masks drop. float32 operands multiply
exactly (`input_precision="ieee"`) unless the kernel allows TF32 (torch's
`allow_tf32`). Tiles are visited in groups of GROUP_M rows, so that programs
running together share blocks of B in L2.

The accumulator, rounded once to the product's dtype, is the value the kernel's other
members read (`BodyRenderer.local`): their bodies (bias, activation, residual, scale,
cast) are rendered by the ordinary body renderer over the tile's `y`/`x` (and batch
`b`) axes and stored through their own indices; the product itself is stored only
where something outside the kernel reads it.
"""

from __future__ import annotations

import sympy
import torch

from ember.codegen.triton.body import BodyRenderer, Scope, Value, pointer_name, round_low_precision
from ember.codegen.triton.plan import Axis, KernelPlan, LaunchConfig, _index_type
from ember.codegen.triton.printer import LOW_PRECISION, UnsupportedKernelError, coefficient
from ember.ir.symbolic import index_var, size_hint
from ember.scheduler import (
    POINTWISE,
    REDUCTION,
    FusedKernel,
    MatmulRoles,
    matmul_operands,
    matmul_roles,
)

GEMM = "gemm"
# Rows of tiles visited together (grouped ordering for L2 reuse of B's blocks).
GROUP_M = 8
# (YBLOCK, XBLOCK, RBLOCK, warps, stages) to try, by operand size in bytes and by
# whether the product has few tiles: the first is the guess. Two-byte operands follow
# the tile shapes Triton's matmul tutorial and Inductor list for Hopper: 128x128 and
# 128x256 tiles with K blocks of 64 and two warp groups (8 warps), 3-4 pipeline stages
# (at most 144 KiB of shared memory; a config a smaller GPU cannot hold fails to
# load and tuning skips it). A product with few 128x128 tiles (`FEW_TILES`: under
# one wave of an H100's 132 SMs) tries smaller tiles first, so more SMs take part.
_MENU: dict[tuple[int, bool], tuple[tuple[int, int, int, int, int], ...]] = {
    (2, False): (
        (128, 128, 64, 8, 4),
        (128, 256, 64, 8, 3),
        (128, 128, 64, 4, 3),
        (64, 128, 64, 4, 4),
        (128, 64, 64, 4, 4),
    ),
    (2, True): (
        (64, 128, 64, 4, 4),
        (128, 64, 64, 4, 4),
        (64, 64, 64, 4, 4),
        (64, 32, 64, 4, 4),
        (128, 128, 64, 8, 3),
    ),
    (4, False): (
        (128, 128, 32, 8, 3),
        (128, 64, 32, 4, 4),
        (64, 128, 32, 4, 4),
        (64, 64, 32, 4, 4),
    ),
    (4, True): (
        (64, 128, 32, 4, 4),
        (128, 64, 32, 4, 4),
        (64, 64, 32, 4, 4),
        (64, 32, 32, 4, 4),
    ),
}
# Fewer 128x128 output tiles than this (over the batch too) counts as a small grid.
FEW_TILES = 128


def gemm_roles(kernel: FusedKernel) -> MatmulRoles:
    """The roles of a matmul kernel's variables; an error where it is not one this
    template renders."""
    product = kernel.members[0] if kernel.members else None
    if (
        product is None
        or product.kind != REDUCTION
        or product.reduction != "sum"
        or len(kernel.reduction_ranges) != 1
    ):
        raise UnsupportedKernelError(f"kernel {kernel.name}: not a matrix product")
    roles = matmul_roles(product.body, len(kernel.ranges))
    if roles is None:
        raise UnsupportedKernelError(f"kernel {kernel.name}: the product's roles are unclear")
    for m in kernel.members[1:]:
        if m.kind != POINTWISE or m.over_reduction:
            raise UnsupportedKernelError(
                f"kernel {kernel.name}: {m.kind} member {m.name} in a matmul epilogue"
            )
    return roles


def plan_gemm(kernel: FusedKernel) -> KernelPlan:
    """The block axes of a matmul kernel: batch `b` (one entry per program), M as `y`,
    N as `x`, K as `r`."""
    roles = gemm_roles(kernel)
    extent = {roles.k: kernel.reduction_ranges[0]}
    extent.update({v: r for v, r in zip(_outer(kernel), kernel.ranges, strict=True)})
    axes = [Axis("b", (roles.batch,), (extent[roles.batch],))] if roles.batch is not None else []
    axes += [
        Axis("y", (roles.m,), (extent[roles.m],)),
        Axis("x", (roles.n,), (extent[roles.n],)),
        Axis("r", (roles.k,), (extent[roles.k],)),
    ]
    return KernelPlan(GEMM, tuple(axes), _index_type(kernel))


def _outer(kernel: FusedKernel) -> list[sympy.Symbol]:
    return [index_var("i", d) for d in range(len(kernel.ranges))]


def gemm_configs(kernel: FusedKernel, plan: KernelPlan) -> tuple[LaunchConfig, ...]:
    """The tile shapes the runtime compiles and times for this product (the first is
    the guess), each cut down to the problem's size (at least 16, `tl.dot`'s least)."""
    operands = matmul_operands(kernel.members[0].body)
    assert operands is not None
    itemsize = 4 if operands[0].dtype.itemsize == 4 else 2
    hints = {a.name: size_hint(a.numel) for a in plan.axes}
    tiles = -(-hints["y"] // 128) * -(-hints["x"] // 128) * hints.get("b", 1)
    found: list[LaunchConfig] = []
    for yb, xb, rb, warps, stages in _MENU[(itemsize, tiles < FEW_TILES)]:
        yb, xb, rb = (
            max(16, min(b, _ceil_pow2(hints[a]))) for b, a in ((yb, "y"), (xb, "x"), (rb, "r"))
        )
        if yb * xb <= 64 * 64:
            warps = min(warps, 4)
        blocks: tuple[tuple[str, int], ...] = (("YBLOCK", yb), ("XBLOCK", xb), ("RBLOCK", rb))
        if plan.axis("b") is not None:
            blocks = (("BBLOCK", 1), *blocks)  # one batch entry per program
        config = LaunchConfig(blocks, warps, stages)
        if config not in found:
            found.append(config)
    return tuple(found)


def _ceil_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def render_gemm(
    kernel: FusedKernel,
    plan: KernelPlan,
    body: BodyRenderer,
    scope: Scope,
    configs: tuple[LaunchConfig, ...],
) -> None:
    """The template's lines into `scope`: tile setup, the K loop, the epilogue."""
    roles = gemm_roles(kernel)
    product = kernel.members[0]
    operands = matmul_operands(product.body)
    assert operands is not None and kernel.matmul is not None
    a, b = operands
    printer = body.printer
    wide = plan.index_type == "tl.int64"
    for axis in plan.axes:
        scope.emit(f"{axis.name}numel = {printer(axis.numel)}")
    scope.emit("pid = tl.program_id(0).to(tl.int64)" if wide else "pid = tl.program_id(0)")
    scope.emit("ytiles = (ynumel + YBLOCK - 1) // YBLOCK")
    scope.emit("xtiles = (xnumel + XBLOCK - 1) // XBLOCK")
    if roles.batch is not None:
        scope.emit("bindex = pid // (ytiles * xtiles)")
        scope.emit("pid = pid % (ytiles * xtiles)")
        scope.emit(f"{roles.batch.name} = bindex")
    # grouped order: GROUP_M rows of tiles, column by column, share B's blocks in L2
    scope.emit(f"width = {GROUP_M} * xtiles")
    scope.emit(f"first = (pid // width) * {GROUP_M}")
    scope.emit(f"rows = tl.minimum(ytiles - first, {GROUP_M})")
    scope.emit("ytile = first + (pid % width) % rows")
    scope.emit("xtile = (pid % width) // rows")
    scope.emit("yindex = ytile * YBLOCK + tl.arange(0, YBLOCK)[:, None]")
    scope.emit("xindex = xtile * XBLOCK + tl.arange(0, XBLOCK)[None, :]")
    scope.emit("ymask = yindex < ynumel")
    scope.emit("xmask = xindex < xnumel")
    if roles.batch is not None:  # always true: a block-shaped mask for the epilogue's loads
        scope.emit("bmask = (bindex + 0 * yindex) < bnumel")
    scope.emit(f"{roles.m.name} = yindex")
    scope.emit(f"{roles.n.name} = xindex")
    # the operands' rows and columns: wrapped where a tile may overhang the edge
    scope.emit("arow = yindex" if _divides(plan, "y", configs) else "arow = yindex % ynumel")
    scope.emit("bcol = xindex" if _divides(plan, "x", configs) else "bcol = xindex % xnumel")
    scope.emit("rbase = tl.arange(0, RBLOCK)")
    a_m, a_k, a_rest = _strides(kernel, a.index, roles.m, roles.k)
    b_k, b_n, b_rest = _strides(kernel, b.index, roles.k, roles.n)
    scope.emit(
        f"a_ptrs = {pointer_name(a.buffer)} + ({printer(a_rest)}) + arow * ({printer(a_m)}) "
        f"+ rbase[None, :] * ({printer(a_k)})"
    )
    scope.emit(
        f"b_ptrs = {pointer_name(b.buffer)} + ({printer(b_rest)}) + rbase[:, None] * "
        f"({printer(b_k)}) + bcol * ({printer(b_n)})"
    )
    even = _divides(plan, "r", configs)  # K needs no mask
    precision = ""
    if a.dtype == torch.float32:
        precision = ', input_precision="tf32"' if kernel.matmul.tf32 else ', input_precision="ieee"'
    scope.emit("acc = tl.zeros([YBLOCK, XBLOCK], dtype=tl.float32)")
    scope.emit("for start in range(0, rnumel, RBLOCK):")
    inner = "    "
    if even:
        scope.emit(f"{inner}a = tl.load(a_ptrs)")
        scope.emit(f"{inner}b = tl.load(b_ptrs)")
    else:
        scope.emit(f"{inner}rmask = (start + rbase) < rnumel")
        scope.emit(f"{inner}a = tl.load(a_ptrs, mask=rmask[None, :], other=0.0)")
        scope.emit(f"{inner}b = tl.load(b_ptrs, mask=rmask[:, None], other=0.0)")
    scope.emit(f"{inner}acc = tl.dot(a, b, acc{precision})")
    scope.emit(f"{inner}a_ptrs += RBLOCK * ({printer(a_k)})")
    scope.emit(f"{inner}b_ptrs += RBLOCK * ({printer(b_k)})")
    # the epilogue: the product as its dtype rounds it, read by the other members
    value = Value("acc", torch.float32)
    if product.dtype in LOW_PRECISION:
        scope.emit(f"product = {round_low_precision('acc', product.dtype)}")
        value = Value("product", product.dtype)
    elif product.dtype != torch.float32:
        raise UnsupportedKernelError(f"kernel {kernel.name}: a {product.dtype} product")
    body.local[(product.name, 0)] = value
    axes = frozenset(a.name for a in plan.axes if a.name != "r")
    if product.stored:
        body.store(product.name, product.index, value, product.dtype, axes, scope)
    for m in kernel.members[1:]:
        result = body.render(m.body, scope)
        body.store(m.mutates or m.name, m.index, result, m.dtype, axes, scope)


def _divides(plan: KernelPlan, axis: str, configs: tuple[LaunchConfig, ...]) -> bool:
    """Whether the axis has a static size that every config's block divides (its
    tiles never overhang the edge)."""
    found = plan.axis(axis)
    assert found is not None
    numel, block = found.numel, f"{axis.upper()}BLOCK"
    return bool(numel.is_Integer) and all(int(numel) % c.block(block) == 0 for c in configs)


def _strides(
    kernel: FusedKernel, index: sympy.Expr, first: sympy.Symbol, second: sympy.Symbol
) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr]:
    """(stride along `first`, stride along `second`, the rest) of an operand's index."""
    along_first, along_second = coefficient(index, first), coefficient(index, second)
    if along_first is None or along_second is None:
        raise UnsupportedKernelError(f"kernel {kernel.name}: an operand index is not affine")
    rest = sympy.expand(index - along_first * first - along_second * second)
    return along_first, along_second, rest
