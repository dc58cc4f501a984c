"""The entry point: a graph's fused kernels rendered into one C++17 translation unit.

`render_kernels(kernels)` returns the source (the prelude, the special functions the
kernels call, then one `extern "C"` function per kernel) and, per kernel, the argument
list the runtime passes: one pointer per buffer of `kernel.buffer_arguments()` (the
start of the buffer's storage; index expressions are storage offsets), then one
`int64_t` per size symbol of `kernel.size_arguments()`, then, for a kernel with
`checks`, its error record: an `int64_t[3]` the runtime zeroes, which the kernel sets
to (check number + 1, bad value, size) when it finds an error (see
ember.codegen.cpp.emitter). Rendering is pure text: nothing is compiled here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from ember.codegen.cpp.dtypes import storage_type
from ember.codegen.cpp.emitter import ERROR_RECORD, Emitter, KernelContext
from ember.codegen.cpp.errors import CppRenderError
from ember.codegen.cpp.gemm_prelude import GEMM_PRELUDE
from ember.codegen.cpp.info import CppSource, KernelArgument, KernelInfo
from ember.codegen.cpp.loops import emit_pointwise, emit_scatter
from ember.codegen.cpp.matmul_loops import emit_matmul
from ember.codegen.cpp.prelude import PRELUDE
from ember.codegen.cpp.reduction_loops import ReductionEmitter
from ember.codegen.cpp.scan_loops import emit_scan
from ember.codegen.cpp.sort_loops import emit_sort
from ember.codegen.cpp.special import special_source
from ember.codegen.cpp.transpose_loops import emit_transposed, transposed_dim
from ember.scheduler import FusedKernel, KernelMember

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def render_kernels(kernels: Sequence[FusedKernel]) -> CppSource:
    """Render the kernels of one graph into one translation unit."""
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        raise ValueError(f"kernel names must be unique in one translation unit: {names}")
    parts = []
    infos = []
    for kernel in kernels:
        text, info = render_kernel(kernel)
        parts.append(text)
        infos.append(info)
    body = "\n".join(parts)
    gemm = GEMM_PRELUDE if any(k.matmul is not None for k in kernels) else ""
    return CppSource("\n".join([PRELUDE, gemm, special_source(body), body]), tuple(infos))


def render_kernel(kernel: FusedKernel) -> tuple[str, KernelInfo]:
    """One kernel's `extern "C"` function (without the prelude) and its metadata."""
    if not _IDENTIFIER.match(kernel.name):
        raise CppRenderError(f"kernel name {kernel.name!r} (not a C identifier)", kernel.name)
    arguments = kernel_arguments(kernel)
    pointers = {
        a.name: f"{'out' if a.writes else 'in'}_{_c_name(a.name)}"
        for a in arguments
        if a.kind == "buffer"
    }
    ctx = KernelContext(
        kernel,
        pointers=pointers,
        pointer_dtypes={a.name: a.dtype for a in arguments if a.kind == "buffer"},
    )
    e = Emitter(ctx)
    if kernel.matmul is not None:
        emit_matmul(e)
    elif kernel.is_scatter:
        emit_scatter(e)
    elif kernel.is_scan:
        emit_scan(e)
    elif kernel.is_sort:
        emit_sort(e)
    elif kernel.is_reduction:
        ReductionEmitter(e).emit()
    elif (d := transposed_dim(kernel)) is not None:
        emit_transposed(e, d)
    else:
        emit_pointwise(e)
    params = [
        f"{a.ctype} {pointers[a.name]}" if a.kind == "buffer" else f"int64_t {a.name}"
        for a in arguments
    ]
    if ctx.checks:
        params.append(f"int64_t* __restrict__ {ERROR_RECORD}")
    header = f"// {kernel.name}: {_summary(kernel)}\n"
    if kernel.origins:  # provenance: the FX nodes this kernel computes
        header += f"// from FX nodes: {', '.join(kernel.origins)}\n"
    signature = f'extern "C" void {kernel.name}({", ".join(params)}) {{\n'
    text = header + signature + "\n".join(e.lines) + "\n}\n"
    return text, KernelInfo(kernel.name, arguments, tuple(ctx.checks))


def kernel_arguments(kernel: FusedKernel) -> tuple[KernelArgument, ...]:
    """The parameters of `kernel`: its buffers, then its size symbols."""
    written = set(kernel.outputs) | {m.mutates for m in kernel.members if m.mutates is not None}
    try:
        dtypes = kernel.buffer_dtypes()
    except ValueError as exc:
        raise CppRenderError(str(exc), kernel.name) from None
    arguments = []
    for name, dtype in zip(kernel.buffer_arguments(), dtypes, strict=True):
        element = storage_type(dtype, kernel.name)
        writes = name in written
        ctype = f"{'' if writes else 'const '}{element}* __restrict__"
        arguments.append(KernelArgument(name, "buffer", dtype, ctype, writes))
    for symbol in kernel.size_arguments():
        if not _IDENTIFIER.match(symbol.name):
            raise CppRenderError(f"size symbol {symbol.name!r} (not a C identifier)", kernel.name)
        arguments.append(KernelArgument(symbol.name, "size", torch.int64, "int64_t"))
    return tuple(arguments)


def _c_name(name: str) -> str:
    return re.sub(r"\W", "_", name)


def _summary(kernel: FusedKernel) -> str:
    ranges = ", ".join(str(r) for r in kernel.ranges)
    text = f"[{ranges}]"
    if kernel.reduction_ranges:
        text += " over [" + ", ".join(str(r) for r in kernel.reduction_ranges) + "]"
    members = ", ".join(
        f"{m.name} {m.reduction or m.scan or _sort(m) or m.kind}{'' if m.stored else ' (local)'}"
        for m in kernel.members
    )
    return f"{text}: {members}"


def _sort(member: KernelMember) -> str | None:
    if member.sort is None:
        return None
    what = "argsort" if member.sort.indices else "sort"
    return f"{what}{' descending' if member.sort.descending else ''} first {member.sort.count}"
