"""Pointwise kernels (1-D and 2-D tiles) and scatter kernels.

A pointwise kernel evaluates each stored member at every point of its block and
stores it; the members share rendered nodes (one load of each input). A scatter
kernel computes its member's value and its data-dependent index (`ind0..` are the
values of the member's `indirect` nodes) and writes into the storage of the buffer it
mutates: a plain store, or an atomic add/max/min when combining (duplicate indices
then all count, as with `index_put_(accumulate=True)`). Products have no Triton
atomic and are refused.
"""

from __future__ import annotations

import torch

from ember.codegen.triton.body import BodyRenderer, Scope
from ember.codegen.triton.printer import IndexPrinter, UnsupportedKernelError
from ember.ir.symbolic import indirect_var
from ember.scheduler import FusedKernel

_ATOMICS = {None: None, "sum": "atomic_add", "max": "atomic_max", "min": "atomic_min"}


def render_pointwise(kernel: FusedKernel, body: BodyRenderer, scope: Scope) -> None:
    axes = frozenset(a.name for a in body.plan.axes)
    for m in kernel.members:
        if m.kind != "pointwise":
            raise UnsupportedKernelError(f"kernel {kernel.name}: {m.kind} member {m.name}")
        value = body.render(m.body, scope)
        body.store(m.mutates or m.name, m.index, value, m.dtype, axes, scope)


def render_scatter(kernel: FusedKernel, body: BodyRenderer, scope: Scope) -> None:
    axes = frozenset({"x"})
    for m in kernel.members:
        if m.kind != "scatter":
            value = body.render(m.body, scope)
            body.store(m.mutates or m.name, m.index, value, m.dtype, axes, scope)
            continue
        if m.scatter_reduce not in _ATOMICS:
            raise UnsupportedKernelError(
                f"kernel {kernel.name}: scatter with reduce={m.scatter_reduce!r} has no "
                "Triton atomic (supported: None, 'sum', 'max', 'min')"
            )
        if m.mutates is None:
            raise UnsupportedKernelError(f"kernel {kernel.name}: scatter {m.name} has no target")
        if m.scatter_reduce in ("max", "min") and m.dtype in (torch.float16, torch.bfloat16):
            raise UnsupportedKernelError(  # Triton has no 16-bit float atomic max/min
                f"kernel {kernel.name}: scatter {m.name} takes the {m.scatter_reduce} of "
                f"{m.dtype} values, which Triton's atomics do not support"
            )
        value = body.render(m.body, scope)
        printer = IndexPrinter(body.printer.names)
        for k, node in enumerate(m.indirect):
            printer.names[indirect_var(k)] = f"{body.render(node, scope).name}.to(tl.int64)"
        if body.debug:
            index = body.broadcast(printer(m.index), body.expr_axes(m.index), axes)
            body.check_bounds(m.mutates, index, "xmask", scope)
        atomic = _ATOMICS[m.scatter_reduce]
        body.store(m.mutates, m.index, value, m.dtype, axes, scope, atomic=atomic, printer=printer)
