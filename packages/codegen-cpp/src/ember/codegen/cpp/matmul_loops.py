"""Matmul kernels: a float32 matrix product with its epilogue, block by block.

A kernel with `matmul` set (ember.scheduler.epilogue) computes its first member, the
product of A (M x K) and B (K x N), possibly batched, and then its pointwise members
over the product's points. Rendered here as one OpenMP loop over blocks of the output
(`ember::GemmBlocks`: along N first, one block per thread): each thread computes its
block's product into its scratch (`ember::gemm_block`, a BLAS sgemm where the runtime
gave one: ember.codegen.cpp.gemm_prelude), then runs the epilogue members over the
block, reading the product from the scratch while it is in cache, and stores what
the kernel stores (the product too, where something outside the kernel reads it).

Operands are addressed by the affine coefficients of their loads' indices in M (or N),
K and the batch, printed as C++ expressions, so symbolic sizes and strides work; the
prelude checks at run time whether they make BLAS matrices. Only float32 operands are
multiplied (the CPU choices ask the scheduler for no others); anything else is a
`CppRenderError`.
"""

from __future__ import annotations

import sympy
import torch

from ember.codegen.cpp.emitter import Emitter
from ember.codegen.cpp.loops import hoist_checks, store, store_member
from ember.ir.symbolic import index_var
from ember.scheduler import POINTWISE, REDUCTION, matmul_operands, matmul_roles
from ember.scheduler.indexing import affine_coefficient

SCRATCH = "scratch"


def emit_matmul(e: Emitter) -> None:
    kernel = e.ctx.kernel
    product = kernel.members[0]
    if product.kind != REDUCTION or product.reduction != "sum":
        raise e.ctx.error("a matmul kernel's first member is not a sum")
    roles = matmul_roles(product.body, len(kernel.ranges))
    operands = matmul_operands(product.body)
    if roles is None or operands is None:
        raise e.ctx.error("the product's operands and roles cannot be read")
    a, b = operands
    if a.dtype != torch.float32 or b.dtype != torch.float32:
        raise e.ctx.error(f"matmul operands of dtype {a.dtype} (float32 only)")
    for member in kernel.members[1:]:
        if member.kind != POINTWISE or member.over_reduction:
            raise e.ctx.error(f"epilogue member {member.name} is not pointwise over the product")
    variables = [index_var("i", d) for d in range(len(kernel.ranges))]
    ranges = dict(zip(variables, kernel.ranges, strict=True))
    k_var = roles.k
    batch = roles.batch
    c = e.ctx.index

    def coefficient(index: sympy.Expr, var: sympy.Symbol) -> str:
        found = affine_coefficient(index, var)
        if found is None:
            raise e.ctx.error(f"operand index {index} is not affine in {var}")
        return c(found)

    e.line(f"const int64_t M = {c(ranges[roles.m])}, N = {c(ranges[roles.n])};")
    e.line(f"const int64_t K = {c(kernel.reduction_ranges[0])};")
    e.line(f"const int64_t batch = {c(ranges[batch]) if batch is not None else '1'};")
    e.line("const ember::GemmBlocks blocks(batch, M, N, K, omp_get_max_threads());")
    e.line("#pragma omp parallel for schedule(static) if(blocks.parallel)")
    with e.block("for (int64_t block = 0; block < blocks.count; ++block)"):
        e.line("const int64_t per_matrix = blocks.mcount * blocks.ncount;")
        b_name = str(batch) if batch is not None else "b0"
        e.line(f"const int64_t {b_name} = block / per_matrix;")
        e.line("const int64_t mi = block % per_matrix / blocks.ncount;")
        e.line("const int64_t ni = block % blocks.ncount;")
        e.line("const int64_t m0 = mi * blocks.mb, m1 = std::min(M, m0 + blocks.mb);")
        e.line("const int64_t n0 = ni * blocks.nb, n1 = std::min(N, n0 + blocks.nb);")
        e.line("const int64_t bn = n1 - n0;")
        e.line(f"float* {SCRATCH} = ember::gemm_scratch(blocks.mb * blocks.nb);")
        m0, n0 = sympy.Symbol("m0", integer=True), sympy.Symbol("n0", integer=True)
        a_start = a.index.subs({roles.m: m0, k_var: 0})
        b_start = b.index.subs({roles.n: n0, k_var: 0})
        a_pointer = e.pointer(a.buffer, torch.float32)
        b_pointer = e.pointer(b.buffer, torch.float32)
        e.line(
            f"ember::gemm_block(m1 - m0, bn, K, {a_pointer} + ({c(a_start)}), "
            f"{coefficient(a.index, roles.m)}, {coefficient(a.index, k_var)}, "
            f"{b_pointer} + ({c(b_start)}), {coefficient(b.index, k_var)}, "
            f"{coefficient(b.index, roles.n)}, {SCRATCH});"
        )
        m_name, n_name = str(roles.m), str(roles.n)
        with e.block(f"for (int64_t {m_name} = m0; {m_name} < m1; ++{m_name})"):
            e.line(f"const float* row = {SCRATCH} + ({m_name} - m0) * bn;")
            hoist_checks(e, n_name)
            with e.simd_loop(f"for (int64_t {n_name} = n0; {n_name} < n1; ++{n_name})", roles.n):
                _epilogue(e, n_name)


def _epilogue(e: Emitter, n_name: str) -> None:
    kernel = e.ctx.kernel
    product = kernel.members[0]
    e.ctx.local_values[product.name] = (f"row[{n_name} - n0]",)
    if product.stored:
        e.ctx.member = product.name
        store(e, product, f"row[{n_name} - n0]", product.index)
    for member in kernel.members[1:]:
        if member.stored:
            e.ctx.member = member.name
            store_member(e, member)
    e.ctx.member = None
