"""Reduction kernels: persistent (the row in registers) and looped (a loop per stage).

A persistent kernel evaluates every member once, in order, over the [XBLOCK, RBLOCK]
block that holds whole rows: softmax reads its input once. A looped kernel splits the
members into stages, a new stage starting where a member reads a reduction of the
current one (softmax: max | sum | divide), and runs one loop over the row per stage,
accumulating per lane in [XBLOCK, RBLOCK] registers and combining across lanes after
the loop. Members that only use outer values (`over_reduction=False`) run last.

Online softmax: where a stage's max M is followed by a stage holding only the sum of
exp(x - M) over the same x, both run in one loop, keeping per lane the running max and
the sum rescaled by exp(old max - new max) whenever the max grows; the lanes merge the
same way after the loop. A looped softmax then reads its row twice instead of three
times, a log_softmax's statistics once instead of twice.

Reductions: sum, prod, max/min (NaN propagates, as torch.amax), argmax/argmin (first
index of the extreme; NaN is the extreme), any/all, and welford (mean and M2; in a
persistent kernel as two exact passes over the registers, in a looped one with
Welford's update per lane and Chan's merge across lanes).
"""

from __future__ import annotations

import torch

from ember.codegen.triton.body import BodyRenderer, Scope, Value, round_low_precision
from ember.codegen.triton.plan import LOOPED, KernelPlan
from ember.codegen.triton.printer import UnsupportedKernelError, float_literal, register_type
from ember.codegen.triton.skeleton import define_variables
from ember.ir.expr import Load, Node, Op, walk
from ember.ir.loops import reduction_dtype
from ember.scheduler import FusedKernel, KernelMember

_XR = frozenset({"x", "r"})
_X = frozenset({"x"})


def identity(kind: str, dtype: torch.dtype) -> str:
    """The neutral element of `kind` over `dtype` (what masked lanes contribute); the
    scan kinds (ember.ir.loops.SCAN_KINDS) too."""
    if kind == "logsumexp":
        return float_literal(float("-inf"))
    if kind in ("sum", "welford", "any"):
        return "0"
    if kind in ("prod", "all"):
        return "1"
    largest = kind in ("min", "argmin")
    if dtype.is_floating_point:
        return float_literal(float("inf") if largest else float("-inf"))
    if dtype == torch.bool:
        return "1" if largest else "0"
    info = torch.iinfo(dtype)
    return str(info.max if largest else info.min)


def stages(kernel: FusedKernel) -> tuple[list[list[KernelMember]], list[KernelMember]]:
    """(loop stages, members evaluated after the loops) of a looped kernel."""
    result: list[list[KernelMember]] = []
    current: list[KernelMember] = []
    reduced: set[str] = set()
    tail: list[KernelMember] = []
    for m in kernel.members:
        if not m.over_reduction and m.kind != "reduction":
            tail.append(m)
            continue
        reads = {n.buffer for n in walk(m.body) if isinstance(n, Load)}
        if reads & reduced:
            result.append(current)
            current, reduced = [], set()
        current.append(m)
        if m.kind == "reduction":
            reduced.add(m.name)
    if current:
        result.append(current)
    return result, tail


def online_pairs(
    loops: list[list[KernelMember]],
) -> tuple[list[list[KernelMember]], dict[str, KernelMember]]:
    """Merge each stage holding only `sum(exp(x - M))` into the stage before it, when that
    stage computes M = max(x) over the same `x` (a float): the stages, and for each such
    max the name of the sum that now runs online with it."""
    merged: list[list[KernelMember]] = []
    partner: dict[str, KernelMember] = {}
    for stage in loops:
        previous = merged[-1] if merged else []
        if len(stage) == 1 and (maximum := _online_max(stage[0], previous)) is not None:
            previous.append(stage[0])
            partner[maximum.name] = stage[0]
            continue
        merged.append(list(stage))
    return merged, partner


def _online_max(total: KernelMember, stage: list[KernelMember]) -> KernelMember | None:
    """The max reduction of `stage` that `total` sums exp(x - max) of, if any."""
    if total.kind != "reduction" or total.reduction != "sum":
        return None
    body: Node = total.body
    if not (isinstance(body, Op) and body.name == "exp" and len(body.args) == 1):
        return None
    inner = body.args[0]
    if not (isinstance(inner, Op) and inner.name == "sub" and len(inner.args) == 2):
        return None
    x, subtracted = inner.args
    if not isinstance(subtracted, Load) or subtracted.mask is not None or subtracted.indirect:
        return None
    for m in stage:
        if (
            m.kind == "reduction"
            and m.reduction == "max"
            and m.name == subtracted.buffer
            and m.body == x
            and m.body.dtype.is_floating_point
            and m.name not in {n.buffer for n in walk(x) if isinstance(n, Load)}
        ):
            return m
    return None


class ReductionRenderer:
    def __init__(self, kernel: FusedKernel, plan: KernelPlan, body: BodyRenderer) -> None:
        self.kernel, self.plan, self.body = kernel, plan, body
        self.online: dict[str, KernelMember] = {}  # looped max -> the sum run with it
        self.sentinel = "2147483647" if plan.index_type == "tl.int32" else str(2**62)

    def render(self, scope: Scope) -> None:
        row = self.plan.axis("r")
        assert row is not None
        if self.plan.kind == LOOPED:
            loops, tail = stages(self.kernel)
            loops, self.online = online_pairs(loops)
            for number, stage in enumerate(loops):
                self._loop(number, stage, scope)
            for m in tail:
                self._pointwise(m, scope)
            return
        scope.emit("rindex = rbase")
        scope.emit("rmask = rindex < rnumel")
        define_variables(row, self.body.printer, scope)
        for m in self.kernel.members:
            if m.kind == "reduction":
                self._persistent(m, scope)
            else:
                self._pointwise(m, scope)

    # -- shared --------------------------------------------------------------------

    def _pointwise(self, m: KernelMember, scope: Scope) -> None:
        if m.kind != "pointwise":
            raise UnsupportedKernelError(f"kernel {self.kernel.name}: {m.kind} member {m.name}")
        value = self.body.render(m.body, scope)
        axes = _XR if m.over_reduction else _X
        self.body.store(m.mutates or m.name, m.index, value, m.dtype, axes, scope)

    def _finish(self, m: KernelMember, results: list[str], scope: Scope) -> None:
        """Record (and store) the reduced values `results` ([XBLOCK, 1] names)."""
        dtype = reduction_dtype(m.reduction or "", m.body.dtype)
        for which, text in enumerate(results):
            name = f"{_var(m.name)}_{which}" if len(results) > 1 else _var(m.name)
            scope.emit(f"{name} = {round_low_precision(text, dtype)}")
            value = Value(name, dtype)
            self.body.local[(m.name, which)] = value
            if m.stored:
                index = m.index + (m.layout.stride[-1] if which == 1 else 0)
                self.body.store(m.mutates or m.name, index, value, dtype, _X, scope)

    # -- persistent ------------------------------------------------------------------

    def _persistent(self, m: KernelMember, scope: Scope) -> None:
        kind = m.reduction or ""
        value = self.body.render(m.body, scope).name
        dtype = m.body.dtype
        ident = identity(kind, dtype)
        masked = f"tl.where(xmask & rmask, {value}, {ident})"
        name = _var(m.name)
        if kind == "sum":
            results = [f"tl.sum({masked}, 1)[:, None]"]
        elif kind in ("max", "min", "prod"):
            helper = f"ember_{kind}_combine"
            self.body.helpers.add(helper)
            results = [f"tl.reduce({masked}, 1, {helper})[:, None]"]
        elif kind in ("any", "all"):
            results = [
                _any_all(kind, f"tl.where(xmask & rmask, ({value} != 0).to(tl.int32), {ident})")
            ]
        elif kind in ("argmax", "argmin"):
            helper = f"ember_{kind}_combine"
            self.body.helpers.add(helper)
            scope.emit(f"{name}_v = {masked}")
            index = f"rindex.to({self.plan.index_type})"  # one type for the pair's reduce
            scope.emit(f"{name}_i = tl.where(xmask & rmask, {index}, {self.sentinel})")
            scope.emit(f"{name}_v, {name}_i = tl.reduce(({name}_v, {name}_i), 1, {helper})")
            results = [f"{name}_i[:, None].to(tl.int64)"]
        elif kind == "welford":
            scope.emit(f"{name}_mean = tl.sum({masked}, 1)[:, None] / rnumel")
            scope.emit(f"{name}_d = tl.where(xmask & rmask, {value} - {name}_mean, 0)")
            results = [f"{name}_mean", f"tl.sum({name}_d * {name}_d, 1)[:, None]"]
        else:
            raise UnsupportedKernelError(f"kernel {self.kernel.name}: reduction {kind!r}")
        self._finish(m, results, scope)

    # -- looped --------------------------------------------------------------------

    def _loop(self, number: int, stage: list[KernelMember], scope: Scope) -> None:
        row = self.plan.axis("r")
        assert row is not None
        inner = Scope(parent=scope, indent=scope.indent + "    ")
        inner.emit("rindex = roffset + rbase")
        inner.emit("rmask = rindex < rnumel")
        define_variables(row, self.body.printer, inner)
        after = Scope(indent=scope.indent)
        finish: list[tuple[KernelMember, list[str]]] = []
        paired = {p.name for p in self.online.values()}
        for m in stage:
            if m.name in self.online:
                total = self.online[m.name]
                results = self._online(m, scope, inner, after)
                finish += [(m, results[:1]), (total, results[1:])]
            elif m.name in paired:
                continue  # accumulated with its max
            elif m.kind == "reduction":
                finish.append((m, self._accumulate(m, scope, inner, after)))
            else:
                self._pointwise(m, inner)
        scope.emit(f"for roffset in range(0, rnumel, RBLOCK):  # stage {number}")
        scope.lines.extend(inner.lines)
        scope.lines.extend(after.lines)
        for m, results in finish:
            self._finish(m, results, scope)

    def _accumulate(self, m: KernelMember, outer: Scope, inner: Scope, after: Scope) -> list[str]:
        """Set up accumulators in `outer`, update them in `inner`, combine the lanes in
        `after` (after the loop); return the expressions of the results."""
        kind = m.reduction or ""
        dtype = m.body.dtype
        value = self.body.render(m.body, inner).name
        acc = f"{_var(m.name)}_acc"
        reg = register_type(dtype)
        shape = "[XBLOCK, RBLOCK]"
        ident = identity(kind, dtype)
        masked = f"tl.where(xmask & rmask, {value}, {ident})"
        if kind == "sum":
            outer.emit(f"{acc} = tl.full({shape}, 0, {reg})")
            inner.emit(f"{acc} = {acc} + {masked}")
            return [f"tl.sum({acc}, 1)[:, None]"]
        if kind in ("max", "min", "prod"):
            helper = f"ember_{kind}_combine"
            self.body.helpers.add(helper)
            outer.emit(f"{acc} = tl.full({shape}, {ident}, {reg})")
            inner.emit(f"{acc} = {helper}({acc}, {masked})")
            return [f"tl.reduce({acc}, 1, {helper})[:, None]"]
        if kind in ("any", "all"):
            pick = "tl.maximum" if kind == "any" else "tl.minimum"
            outer.emit(f"{acc} = tl.full({shape}, {ident}, tl.int32)")
            flag = f"tl.where(xmask & rmask, ({value} != 0).to(tl.int32), {ident})"
            inner.emit(f"{acc} = {pick}({acc}, {flag})")
            return [_any_all(kind, acc)]
        if kind in ("argmax", "argmin"):
            helper = f"ember_{kind}_combine"
            self.body.helpers.add(helper)
            outer.emit(f"{acc}_v = tl.full({shape}, {ident}, {reg})")
            outer.emit(f"{acc}_i = tl.full({shape}, {self.sentinel}, {self.plan.index_type})")
            # rindex is int32 wherever the loop bound is a runtime int32; the carried
            # index must keep one type across iterations (Triton refuses the loop else)
            index = f"tl.where(xmask & rmask, rindex.to({self.plan.index_type}), {self.sentinel})"
            inner.emit(f"{acc}_v, {acc}_i = {helper}({acc}_v, {acc}_i, {masked}, {index})")
            after.emit(f"{acc}_v, {acc}_i = tl.reduce(({acc}_v, {acc}_i), 1, {helper})")
            return [f"{acc}_i[:, None].to(tl.int64)"]
        if kind == "welford":
            return self._welford(acc, value, reg, outer, inner, after)
        raise UnsupportedKernelError(f"kernel {self.kernel.name}: reduction {kind!r}")

    def _welford(
        self, acc: str, value: str, reg: str, outer: Scope, inner: Scope, after: Scope
    ) -> list[str]:
        """Welford's update per lane, then Chan's merge across lanes.

        Only the last iteration masks lanes (`rindex < rnumel` fails only at the
        row's end), so every lane updated in iteration k has seen exactly k + 1
        elements: the update multiplies by one reciprocal per iteration instead of
        dividing each element by a count of its own, and each lane's count is found
        after the loop from its position. A per-element division and a count select
        were most of the update's instructions: the H100 ran batch-norm statistics
        of channels-last activations at about 1.2 TB/s, bound by that arithmetic."""
        self.body.helpers.add("ember_welford_combine")
        shape = "[XBLOCK, RBLOCK]"
        for part in ("mean", "m2"):
            outer.emit(f"{acc}_{part} = tl.full({shape}, 0, {reg})")
        outer.emit(f"{acc}_k = tl.zeros([1, 1], {reg})")  # iterations so far
        inner.emit(f"{acc}_k = {acc}_k + 1")
        inner.emit(f"{acc}_w = 1.0 / {acc}_k")
        inner.emit(f"{acc}_d = {value} - {acc}_mean")
        inner.emit(f"{acc}_mean1 = {acc}_mean + {acc}_d * {acc}_w")
        inner.emit(f"{acc}_m21 = {acc}_m2 + {acc}_d * ({value} - {acc}_mean1)")
        for part, new in (("mean", "mean1"), ("m2", "m21")):
            inner.emit(f"{acc}_{part} = tl.where(xmask & rmask, {acc}_{new}, {acc}_{part})")
        # lane j took part in the iterations with roffset + j < rnumel
        after.emit(
            f"{acc}_n = tl.where(rbase < rnumel, (rnumel - rbase + RBLOCK - 1) // RBLOCK, 0)"
            f".to({reg}) + tl.zeros({shape}, {reg})"
        )
        parts = f"{acc}_mean, {acc}_m2, {acc}_n"
        after.emit(f"{parts} = tl.reduce(({parts}), 1, ember_welford_combine)")
        return [f"{acc}_mean[:, None]", f"{acc}_m2[:, None]"]

    def _online(self, m: KernelMember, outer: Scope, inner: Scope, after: Scope) -> list[str]:
        """max(x) and sum(exp(x - max(x))) in one pass: per lane the running max `m` and
        the sum `s` of exp(x - m), rescaled when m grows. Where old and new max are
        equal (both -inf before any element) the scale is 1, and a -inf element adds 0,
        so no exp(-inf - -inf) = NaN enters; a NaN element makes the max NaN and the sum
        NaN, as the two-pass form would."""
        self.body.helpers.add("ember_max_combine")
        value = self.body.render(m.body, inner).name
        reg = register_type(m.body.dtype)
        acc = f"{_var(m.name)}_acc"
        shape = "[XBLOCK, RBLOCK]"
        minus_inf = float_literal(float("-inf"))
        outer.emit(f"{acc} = tl.full({shape}, {minus_inf}, {reg})")
        outer.emit(f"{acc}_sum = tl.full({shape}, 0, {reg})")  # float64 rows sum in float64
        inner.emit(f"{acc}_x = tl.where(xmask & rmask, {value}, {minus_inf})")
        inner.emit(f"{acc}_new = ember_max_combine({acc}, {acc}_x)")
        inner.emit(
            f"{acc}_sum = tl.where({acc} == {acc}_new, {acc}_sum, "
            f"{acc}_sum * tl.exp({acc} - {acc}_new)) + "
            f"tl.where({acc}_x == {minus_inf}, 0.0, tl.exp({acc}_x - {acc}_new))"
        )
        inner.emit(f"{acc} = {acc}_new")
        after.emit(f"{acc}_row = tl.reduce({acc}, 1, ember_max_combine)[:, None]")
        after.emit(
            f"{acc}_sum = tl.where({acc} == {acc}_row, {acc}_sum, "
            f"{acc}_sum * tl.exp({acc} - {acc}_row))"
        )
        return [f"{acc}_row", f"tl.sum({acc}_sum, 1)[:, None]"]


def _any_all(kind: str, flags: str) -> str:
    fn = "tl.max" if kind == "any" else "tl.min"
    return f"({fn}({flags}, 1) != 0)[:, None]"


def _var(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)
