"""Scan kernels: cumsum, cumprod, logcumsumexp, cummax and cummin along the kernel's one
inner dimension, with `tl.associative_scan` (or its `tl.cumsum`/`tl.cumprod` forms).

A persistent scan holds whole rows in its [XBLOCK, RBLOCK] block and scans each
member once. A looped scan walks the row in blocks of RBLOCK and carries, per row,
each member's running value ([XBLOCK, 1]) from block to block: a block's results are
the carry combined with the block's own scan, and the carry then takes in the block's
total (a `tl.reduce` with the same combine). Lanes past the row's end hold the neutral
element; they come after every real element of the row, so they change no stored
result, and the carry they reach is never used.

A look-back scan (ember.codegen.triton.lookback) scans one tile of a long row per
program and carries in the tiles before it through the launcher's workspace.

cummax/cummin scan (value, index) pairs with `ember_cummax_combine`: torch's rule (NaN
wins, ties go to the later index), written symmetrically in the indices so that
`tl.reduce`, which may combine in any order, agrees with the scan.
"""

from __future__ import annotations

import torch

from ember.codegen.triton.body import BodyRenderer, Scope, Value
from ember.codegen.triton.lookback import lookback_member
from ember.codegen.triton.plan import LOOKBACK_SCAN, LOOPED_SCAN, KernelPlan
from ember.codegen.triton.printer import UnsupportedKernelError, register_type
from ember.codegen.triton.reduction import identity
from ember.codegen.triton.skeleton import define_variables
from ember.scheduler import SCAN, FusedKernel, KernelMember

_XR = frozenset({"x", "r"})
_SHAPE = "[XBLOCK, RBLOCK]"


class ScanRenderer:
    def __init__(self, kernel: FusedKernel, plan: KernelPlan, body: BodyRenderer) -> None:
        self.kernel, self.plan, self.body = kernel, plan, body
        # (max or min, value) -> the member whose pair scan computed it: cummax's
        # values and indices come from one scan of (value, index) pairs
        self.pairs: dict[tuple[str, str], str] = {}

    def render(self, scope: Scope) -> None:
        row = self.plan.axis("r")
        assert row is not None
        for m in self.kernel.members:
            if m.kind != SCAN:
                raise UnsupportedKernelError(f"kernel {self.kernel.name}: {m.kind} member {m.name}")
        if self.plan.kind == LOOKBACK_SCAN:  # the axes' setup defined the row's variables
            for number, m in enumerate(self.kernel.members):
                self._lookback_member(m, number, scope)
            return
        if self.plan.kind != LOOPED_SCAN:
            scope.emit("rindex = rbase")
            scope.emit("rmask = rindex < rnumel")
            define_variables(row, self.body.printer, scope)
            for m in self.kernel.members:
                self._member(m, scope, None)
            return
        inner = Scope(parent=scope, indent=scope.indent + "    ")
        inner.emit("rindex = roffset + rbase")
        inner.emit("rmask = rindex < rnumel")
        define_variables(row, self.body.printer, inner)
        for m in self.kernel.members:
            self._member(m, inner, scope)
        scope.emit("for roffset in range(0, rnumel, RBLOCK):")
        scope.lines.extend(inner.lines)

    def _member(self, m: KernelMember, scope: Scope, outer: Scope | None) -> None:
        """Scan `m` over the block in `scope`; with `outer` (looped), combine with the
        carry set up there and update it."""
        kind = m.scan or ""
        dtype = m.body.dtype  # the carried type
        reg = register_type(dtype)
        ident = identity(kind, dtype)
        name = _var(m.name)
        value = self.body.render(m.body, scope).name
        x = f"{name}_x"
        if kind in ("max", "min", "argmax", "argmin"):
            first = self.pairs.get((kind.removeprefix("arg"), value))
            if first is not None:  # cummax's values and indices: one scan of the pairs
                self._store(
                    m, f"{first}_k" if kind.startswith("arg") else f"{first}_v", dtype, scope
                )
                return
            self.pairs[(kind.removeprefix("arg"), value)] = name
        scope.emit(f"{x} = tl.where(xmask & rmask, {value}, {ident}).to({reg})")
        carry = f"{name}_carry"
        if kind in ("sum", "prod", "logsumexp"):
            scan, combine = {
                "sum": (f"tl.cumsum({x}, 1)", "{a} + {b}"),
                "prod": (f"tl.cumprod({x}, 1)", "{a} * {b}"),
                "logsumexp": (
                    f"tl.associative_scan({x}, 1, ember_logaddexp_combine)",
                    "ember_logaddexp_combine({a}, {b})",
                ),
            }[kind]
            total = {
                "sum": f"tl.sum({x}, 1)[:, None]",
                "prod": f"tl.reduce({x}, 1, ember_prod_combine)[:, None]",
                "logsumexp": f"tl.reduce({x}, 1, ember_logaddexp_combine)[:, None]",
            }[kind]
            self.body.helpers |= {"ember_prod_combine"} if kind == "prod" else set()
            if kind == "logsumexp":
                self.body.helpers.add("ember_logaddexp_combine")
            result = f"{name}_scan"
            scope.emit(f"{result} = {scan}")
            if outer is not None:
                outer.emit(f"{carry} = tl.full([XBLOCK, 1], {ident}, {reg})")
                scope.emit(f"{result} = {combine.format(a=carry, b=result)}")
                scope.emit(f"{carry} = {combine.format(a=carry, b=total)}")
        elif kind in ("max", "min", "argmax", "argmin"):
            helper = f"ember_cum{kind.removeprefix('arg')}_combine"
            self.body.helpers.add(helper)
            scope.emit(f"{name}_i = tl.broadcast_to(rindex.to(tl.int64), {_SHAPE})")
            pair = f"{name}_v, {name}_k"
            scope.emit(f"{pair} = tl.associative_scan(({x}, {name}_i), 1, {helper})")
            if outer is not None:
                outer.emit(f"{carry}_v = tl.full([XBLOCK, 1], {ident}, {reg})")
                outer.emit(f"{carry}_k = tl.full([XBLOCK, 1], -1, tl.int64)")
                carried = f"{carry}_v, {carry}_k"
                scope.emit(f"{pair} = {helper}({carried}, {pair})")
                scope.emit(f"{name}_tv, {name}_tk = tl.reduce(({x}, {name}_i), 1, {helper})")
                scope.emit(
                    f"{carried} = {helper}({carried}, {name}_tv[:, None], {name}_tk[:, None])"
                )
            result = f"{name}_k" if kind.startswith("arg") else f"{name}_v"
        else:
            raise UnsupportedKernelError(f"kernel {self.kernel.name}: scan {kind!r}")
        self._store(m, result, dtype, scope)

    def _lookback_member(self, m: KernelMember, number: int, scope: Scope) -> None:
        kind, dtype = m.scan or "", m.body.dtype
        name = _var(m.name)
        value = self.body.render(m.body, scope).name
        x = f"{name}_x"
        scope.emit(f"{x} = tl.where(xmask & rmask, {value}, {identity(kind, dtype)})")
        scope.emit(f"{x} = {x}.to({register_type(dtype)})")
        result = lookback_member(kind, name, x, number, scope, self.body.helpers)
        self._store(m, result, dtype, scope)

    def _store(self, m: KernelMember, result: str, carried: torch.dtype, scope: Scope) -> None:
        if m.stored:
            value = Value(result, m.dtype if (m.scan or "").startswith("arg") else carried)
            self.body.store(m.mutates or m.name, m.index, value, m.dtype, _XR, scope)


def _var(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)
