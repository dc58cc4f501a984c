"""The parts every kernel shares: its signature and the setup of its block axes.

Arguments, in order: one per buffer of `FusedKernel.buffer_arguments()` (a pointer to
the start of the buffer's storage; a random seed is a one-element int64 buffer read
in the kernel), the size symbols of `size_arguments()` (ints, never specialised, so a new
batch size does not recompile), in debug mode the storage sizes of the buffers read
or written indirectly (bounds checks), the launcher's workspace (a look-back scan's:
`TritonKernel.workspace`), then the block sizes (constexpr).

Axis setup turns the program id into block offsets, `{axis}index` vectors shaped for
the block ([XBLOCK] for 1-D; [YBLOCK, 1] / [1, XBLOCK] for 2-D tiles; [XBLOCK, 1] /
[1, RBLOCK] for reductions), `{axis}mask` for the ragged edge, and the loop variables
(`i0..`, `r0..`) by division and modulo of the flattened index.
"""

from __future__ import annotations

import sympy

from ember.codegen.triton.body import Scope, numel_name, pointer_name
from ember.codegen.triton.plan import LOOKBACK_SCAN, POINTWISE_2D, Axis, KernelPlan
from ember.codegen.triton.printer import IndexPrinter, sanitize
from ember.scheduler import FusedKernel


def parameters(kernel: FusedKernel, plan: KernelPlan, bounds: list[str]) -> list[str]:
    names = [pointer_name(b) for b in kernel.buffer_arguments()]
    names += [sanitize(s.name) for s in kernel.size_arguments()]
    names += [numel_name(b) for b in bounds]
    if plan.kind == LOOKBACK_SCAN:
        names.append("workspace_ptr")
    names += [f"{a.block}: tl.constexpr" for a in plan.axes]
    return names


def decorator(kernel: FusedKernel, bounds: list[str], debug: bool) -> str:
    dynamic = [sanitize(s.name) for s in kernel.size_arguments()]
    dynamic += [numel_name(b) for b in bounds]
    options = []
    if dynamic:
        options.append(f"do_not_specialize={dynamic!r}")
    if debug:
        options.append("debug=True")
    return f"@triton.jit({', '.join(options)})" if options else "@triton.jit"


def shape_suffix(plan: KernelPlan, axis: Axis) -> str:
    if len(plan.axes) == 1:
        return ""
    return "[:, None]" if plan.axes[0] is axis else "[None, :]"


def setup_axes(plan: KernelPlan, printer: IndexPrinter, scope: Scope) -> None:
    """Program id -> offsets, index vectors, masks and loop variables of the
    non-reduction axes; `rbase` for the reduction axis."""
    wide = plan.index_type == "tl.int64"
    pid = "tl.program_id(0).to(tl.int64)" if wide else "tl.program_id(0)"
    for axis in plan.axes:
        scope.emit(f"{axis.name}numel = {printer(axis.numel)}")
    if plan.kind == POINTWISE_2D:
        scope.emit(f"pid = {pid}")
        scope.emit("xblocks = (xnumel + XBLOCK - 1) // XBLOCK")
        scope.emit("yoffset = (pid // xblocks) * YBLOCK")
        scope.emit("xoffset = (pid % xblocks) * XBLOCK")
    else:
        scope.emit(f"xoffset = {pid} * XBLOCK")
    for axis in plan.axes:
        suffix = shape_suffix(plan, axis)
        if axis.name == "r":
            scope.emit(f"rbase = tl.arange(0, RBLOCK){suffix}")
            continue
        scope.emit(f"{axis.name}index = {axis.name}offset + tl.arange(0, {axis.block}){suffix}")
        scope.emit(f"{axis.name}mask = {axis.name}index < {axis.name}numel")
        define_variables(axis, printer, scope)


def define_variables(axis: Axis, printer: IndexPrinter, scope: Scope) -> None:
    """The loop variables of `axis` from its flattened index, row-major."""
    flat = f"{axis.name}index"
    count = len(axis.variables)
    for d, var in enumerate(axis.variables):
        inner = sympy.Mul(*axis.ranges[d + 1 :]) if d + 1 < count else sympy.Integer(1)
        text = flat if inner == 1 else f"({flat} // {printer(inner)})"
        if d > 0:
            text = f"{text} % {printer(axis.ranges[d])}"
        scope.emit(f"{var.name} = {text}")
