"""Pointwise kernels (1-D and 2-D tiles) and scatter kernels.

A pointwise kernel evaluates each stored member at every point of its block and
stores it; the members share rendered nodes (one load of each input). A scatter
kernel computes its member's value and its data-dependent index (`ind0..` are the
values of the member's `indirect` nodes) and writes into the storage of the buffer it
mutates: a plain store, or, when combining, an atomic update (duplicate indices then
all count, as with `index_put_(accumulate=True)`).

Sums of 16- to 64-bit floats and sums, maxima and minima of 32- and 64-bit integers
are Triton's atomics (`tl.atomic_add`, `_max`, `_min`). The rest combine in a
compare-and-swap loop (helpers `ember_scatter_cas` and, for 8- and 16-bit elements,
`ember_scatter_cas_narrow`, which swaps the 32-bit word holding the element, so that
a neighbour in the same word changed by another lane is kept): products, which have
no atomic; maxima and minima of floats, whose Triton atomics work on the bits as
integers and so lose NaN (a NaN without its sign bit loses every minimum there, one
with it every maximum, where eager's NaN wins), and of 16-bit floats, which
Triton has no atomic for; and anything on 8- and 16-bit integers (no Triton atomic).
The combination follows eager's step (`ember_scatter_combine`): a NaN wins a maximum
or minimum, a tie keeps the value already there, and a product is rounded to the
element's dtype at every step, as eager's CUDA kernels round it.

What is not deterministic, on a GPU as in eager's CUDA kernels, is the order in which
the values scattered to one element combine: the lanes' swaps go through in whatever
order the hardware serializes them. Maxima and minima do not depend on it, but for
the sign of a zero (a tie between -0.0 and 0.0 keeps whichever came first) and which
NaN's bits remain. Products do, by their rounding: k values multiplied in another
order differ by at most about k roundings (relative (1 + u)^k - 1, u = 2^-8 for
bfloat16, 2^-11 for float16, 2^-24 for float32), which is how far eager's own GPU
result is from a product taken in index order, and the accuracy rule's tolerance (or
its float64 reference) holds that for the few duplicates of an index that usual
inputs have. An order can also decide whether an intermediate product overflows (a
huge value times a huge one, then a tiny one), as in eager. Bool targets with a
combination are refused.
"""

from __future__ import annotations

import torch

from ember.codegen.triton.body import BodyRenderer, Scope, pointer_name
from ember.codegen.triton.printer import (
    IndexPrinter,
    UnsupportedKernelError,
    register_type,
    storage_type,
)
from ember.ir.symbolic import indirect_var
from ember.scheduler import FusedKernel

_ATOMICS = {None: None, "sum": "atomic_add", "max": "atomic_max", "min": "atomic_min"}
_COMBINED = frozenset({"sum", "prod", "max", "min"})
# elements combined in the 32-bit word holding them: dtype -> the unsigned integer type
# of their width
_NARROW: dict[torch.dtype, str] = {
    torch.float16: "tl.uint16",
    torch.bfloat16: "tl.uint16",
    torch.int16: "tl.uint16",
    torch.int8: "tl.uint8",
    torch.uint8: "tl.uint8",
}
# elements combined by themselves: dtype -> the signed integer type of their width
_WIDE: dict[torch.dtype, str] = {
    torch.float32: "tl.int32",
    torch.float64: "tl.int64",
    torch.int32: "tl.int32",
    torch.int64: "tl.int64",
}


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
        reduce = m.scatter_reduce
        if reduce is not None and reduce not in _COMBINED:
            raise UnsupportedKernelError(
                f"kernel {kernel.name}: scatter with reduce={reduce!r} (supported: None, "
                "'sum', 'prod', 'max', 'min')"
            )
        if m.mutates is None:
            raise UnsupportedKernelError(f"kernel {kernel.name}: scatter {m.name} has no target")
        by_swap = reduce is not None and _by_swap(reduce, m.dtype)
        if by_swap and m.dtype not in _NARROW and m.dtype not in _WIDE:
            raise UnsupportedKernelError(
                f"kernel {kernel.name}: scatter {m.name} takes the {reduce} of {m.dtype} "
                "values, which neither Triton's atomics nor a compare-and-swap here combine"
            )
        value = body.render(m.body, scope)
        printer = IndexPrinter(body.printer.names)
        for k, node in enumerate(m.indirect):
            printer.names[indirect_var(k)] = f"{body.render(node, scope).name}.to(tl.int64)"
        index = body.broadcast(printer(m.index), body.expr_axes(m.index), axes)
        if body.debug:
            body.check_bounds(m.mutates, index, "xmask", scope)
        if not by_swap:
            atomic = _ATOMICS[reduce]
            body.store(
                m.mutates, m.index, value, m.dtype, axes, scope, atomic=atomic, printer=printer
            )
            continue
        converted = f"{value.name}.to({register_type(m.dtype)})"
        arguments = f"{pointer_name(m.mutates)}, {index}, {converted}, xmask, {reduce!r}"
        if m.dtype in _NARROW:
            body.helpers.add("ember_scatter_cas_narrow")
            types = f"{storage_type(m.dtype)}, {_NARROW[m.dtype]}"
            scope.emit(f"ember_scatter_cas_narrow({arguments}, {types})")
        else:
            body.helpers.add("ember_scatter_cas")
            scope.emit(f"ember_scatter_cas({arguments}, {_WIDE[m.dtype]})")


def _by_swap(reduce: str, dtype: torch.dtype) -> bool:
    """Whether a scatter combining `reduce` into `dtype` elements takes the
    compare-and-swap loop (the module's docstring says why) instead of an atomic."""
    if reduce == "prod":
        return True
    if dtype.is_floating_point:
        return reduce != "sum" or dtype.itemsize < 2
    return dtype.itemsize < 4  # bools too, which neither takes
