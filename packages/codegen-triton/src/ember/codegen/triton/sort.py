"""Sort kernels: sort, argsort and topk along the kernel's one inner dimension.

The whole row sits in one [XBLOCK, RBLOCK] block (RBLOCK: the static row length
padded to a power of two, at most MAX_SORT_LENGTH; lowering keeps longer rows ATen
calls). Each row is sorted once, as (value, position) pairs, by `ember_sort_rows`: a
bitonic network written for pairs, because `tl.sort` (and `tl.topk`) order one tensor
of values and cannot carry the positions an argsort or topk needs. Its comparison,
`ember_sort_before`, is torch's order (ember.ir.loops.Sort): NaN largest, -0.0 equal
to 0.0, ties by position, and the padding lanes (positions >= rnumel) after every
element whatever they hold. Positions are distinct, so the order is total and the
result is the stable sort's, bit for bit the interpreter's and the C++ kernels'.

After the sort, lane `r` of a row holds the `r`-th element of the order: members store
the values or the positions there for `r < count` (a topk keeps the first k). Values
are sorted in their register type (float32 for the half types, which is exact; bool
as int8) and converted back on the store.
"""

from __future__ import annotations

import torch

from ember.codegen.triton.body import BodyRenderer, Scope, Value
from ember.codegen.triton.plan import MAX_SORT_LENGTH, KernelPlan
from ember.codegen.triton.printer import UnsupportedKernelError, register_type
from ember.codegen.triton.skeleton import define_variables
from ember.scheduler import SORT, FusedKernel

_XR = frozenset({"x", "r"})
# integer types of each width: the sort moves values between lanes as their bits
_BITS = {1: "tl.int8", 2: "tl.int16", 4: "tl.int32", 8: "tl.int64"}


class SortRenderer:
    def __init__(self, kernel: FusedKernel, plan: KernelPlan, body: BodyRenderer) -> None:
        self.kernel, self.plan, self.body = kernel, plan, body

    def render(self, scope: Scope) -> None:
        kernel = self.kernel
        row = self.plan.axis("r")
        rblock = self.plan.rblock
        assert row is not None
        if rblock is None or rblock > MAX_SORT_LENGTH:
            raise UnsupportedKernelError(
                f"kernel {kernel.name}: sorts rows of {row.numel} elements; a Triton sort "
                f"holds a static row of at most {MAX_SORT_LENGTH} (lowering keeps longer "
                "ones ATen calls)"
            )
        first = kernel.members[0]
        spec = first.sort
        for m in kernel.members:
            if m.kind != SORT or m.sort is None or spec is None:
                raise UnsupportedKernelError(f"kernel {kernel.name}: {m.kind} member {m.name}")
            same = (m.body, m.sort.descending, m.sort.count)
            if same != (first.body, spec.descending, spec.count):
                raise UnsupportedKernelError(f"kernel {kernel.name}: sorts of different rows")
        assert spec is not None
        scope.emit("rindex = rbase")
        scope.emit("rmask = rindex < rnumel")
        define_variables(row, self.body.printer, scope)
        value = self.body.render(first.body, scope).name
        dtype = first.body.dtype
        carried = torch.int8 if dtype == torch.bool else dtype
        reg = register_type(carried)
        bits = _BITS[torch.float32.itemsize if reg == "tl.float32" else carried.itemsize]
        scope.emit(f"sort_v = tl.broadcast_to({value}.to({reg}), [XBLOCK, RBLOCK])")
        scope.emit("sort_k = tl.broadcast_to(rindex.to(tl.int32), [XBLOCK, RBLOCK])")
        log = rblock.bit_length() - 1
        scope.emit(
            f"sort_v, sort_k = ember_sort_rows(sort_v, sort_k, rnumel, {log}, "
            f"{spec.descending}, {bits})"
        )
        self.body.helpers.add("ember_sort_rows")
        scope.emit(f"rmask = rindex < {self.body.printer(spec.count)}")
        for m in kernel.members:
            assert m.sort is not None
            if not m.stored:
                continue
            result = Value("sort_k", torch.int32) if m.sort.indices else Value("sort_v", carried)
            self.body.store(m.mutates or m.name, m.index, result, m.dtype, _XR, scope)
