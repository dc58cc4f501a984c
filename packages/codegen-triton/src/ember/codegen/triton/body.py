"""Rendering body DAGs (ember.ir.expr) into lines of Triton, one node per line.

Nodes are hash-consed, so a node shared by several members of a kernel (the load of
`x` that softmax's max, sum and division all use) is rendered once per scope and
reused. A `Scope` is where lines go: the kernel body, or the inside of a reduction
loop; a loop scope has the enclosing scope as parent, and nodes that do not depend on
the reduction variables are rendered into the parent (hoisted out of the loop).

Values of float16/bfloat16 nodes live in float32 registers: loads convert up, every
op and cast that produces such a node rounds to its dtype (so results match eager's
per-op rounding), and stores convert back.

Masks: a load is masked by the masks of the block axes its value depends on (ragged
edges) and-ed with its own IR mask (padding, cat); masked lanes read `other`. Lanes
outside the kernel's range compute garbage that is never stored or reduced.

Index checks (`CheckIndex`) become `tl.device_assert`s, as eager's CUDA indexing
kernels assert: on a GPU a failed one stops the kernel before it reads or writes
outside the buffer and surfaces as CUDA's "device-side assert triggered". Triton
compiles asserts only with its `debug` option, so a kernel with checks asks for it
(`TritonKernel.launch_options`). The message names the op and the dimension, not the
graph node: twelve identical layers keep one source and one compile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy
import torch

from ember.codegen.triton.optable import bits_type, op_template
from ember.codegen.triton.plan import KernelPlan
from ember.codegen.triton.printer import (
    LOW_PRECISION,
    IndexPrinter,
    UnsupportedKernelError,
    constant,
    literal,
    register_type,
    sanitize,
    storage_type,
)
from ember.ir.expr import Cast, CheckIndex, Const, IndexExpr, Load, Node, Op, Rand, Where
from ember.ir.symbolic import indirect_var
from ember.scheduler import FusedKernel


@dataclass(frozen=True)
class Value:
    """A rendered node: the Triton name (or scalar expression) and its IR dtype."""

    name: str
    dtype: torch.dtype


@dataclass
class Scope:
    lines: list[str] = field(default_factory=list)
    memo: dict[int, Value] = field(default_factory=dict)
    parent: Scope | None = None
    indent: str = "    "

    def emit(self, line: str) -> None:
        self.lines.append(self.indent + line)


def pointer_name(buffer: str) -> str:
    return f"{sanitize(buffer)}_ptr"


def numel_name(buffer: str) -> str:
    return f"{sanitize(buffer)}_numel"


def round_low_precision(text: str, dtype: torch.dtype) -> str:
    if dtype in LOW_PRECISION:
        return f"({text}).to({storage_type(dtype)}).to(tl.float32)"
    return text


class BodyRenderer:
    """Renders the bodies of one kernel. `local` maps (member, result) of the
    kernel's reductions to their values once computed."""

    def __init__(self, kernel: FusedKernel, plan: KernelPlan, *, debug: bool = False) -> None:
        self.kernel = kernel
        self.plan = plan
        self.debug = debug
        names: dict[sympy.Symbol, str] = {}
        for axis in plan.axes:
            for var in axis.variables:
                names[var] = var.name
        self.printer = IndexPrinter(names)
        self.local: dict[tuple[str, int], Value] = {}
        self.helpers: set[str] = set()
        self.bounds_checked: list[str] = []  # buffers whose storage size is an argument
        self.index_checks: list[CheckIndex] = []  # in the order of their asserts
        self._count = 0
        self._axis_of = {v: a.name for a in plan.axes for v in a.variables}
        self._axes_memo: dict[int, frozenset[str]] = {}

    # -- analysis ----------------------------------------------------------------------

    def axes(self, node: Node) -> frozenset[str]:
        """The block axes a node's value varies along."""
        key = id(node)
        if key in self._axes_memo:
            return self._axes_memo[key]
        found: set[str] = set()
        if isinstance(node, Load) and node.buffer in self.kernel.local_reductions:
            found.add("x")
        else:
            if isinstance(node, (Load, IndexExpr, Rand)):
                expr = node.expr if isinstance(node, IndexExpr) else node.index
                found |= self.expr_axes(expr)
            for child in node.children():
                found |= self.axes(child)
        result = frozenset(found)
        self._axes_memo[key] = result
        return result

    def expr_axes(self, expr: sympy.Expr) -> frozenset[str]:
        symbols = sympy.sympify(expr).free_symbols
        return frozenset(self._axis_of[s] for s in symbols if s in self._axis_of)

    def mask(self, axes: frozenset[str]) -> str | None:
        ordered = [a.name for a in self.plan.axes if a.name in axes]
        return " & ".join(f"{a}mask" for a in ordered) or None

    def broadcast(self, index: str, have: frozenset[str], need: frozenset[str]) -> str:
        """`index` widened to the block shape of the axes in `need`."""
        for a in self.plan.axes:
            if a.name in need and a.name not in have:
                index = f"{index} + 0 * {a.name}index"
        return index

    # -- rendering -----------------------------------------------------------------

    def _fresh(self) -> str:
        name = f"t{self._count}"
        self._count += 1
        return name

    def _assign(self, scope: Scope, text: str, dtype: torch.dtype) -> Value:
        name = self._fresh()
        scope.emit(f"{name} = {text}")
        return Value(name, dtype)

    def render(self, node: Node, scope: Scope) -> Value:
        target = scope
        while target.parent is not None and "r" not in self.axes(node):
            target = target.parent
        look: Scope | None = scope
        while look is not None:
            if id(node) in look.memo:
                return look.memo[id(node)]
            look = look.parent
        value = self._render(node, target)
        target.memo[id(node)] = value
        return value

    def _render(self, node: Node, scope: Scope) -> Value:
        if isinstance(node, Const):
            return Value(constant(node.value, node.dtype), node.dtype)
        if isinstance(node, IndexExpr):
            return self._index_value(node, scope)
        if isinstance(node, Load):
            return self._load(node, scope)
        if isinstance(node, Op):
            return self._op(node, scope)
        if isinstance(node, Cast):
            return self._cast(self.render(node.x, scope), node.to, scope)
        if isinstance(node, Where):
            cond, a, b = (self.render(n, scope) for n in (node.cond, node.a, node.b))
            return self._assign(scope, f"tl.where({cond.name}, {a.name}, {b.name})", node.dtype)
        if isinstance(node, Rand):
            return self._rand(node, scope)
        if isinstance(node, CheckIndex):
            return self._check_index(node, scope)
        raise UnsupportedKernelError(
            f"kernel {self.kernel.name}: no Triton rendering for {type(node).__name__}"
        )

    def _index_value(self, node: IndexExpr, scope: Scope) -> Value:
        expr = sympy.sympify(node.expr)
        if expr.is_Integer:
            return Value(constant(int(expr), node.dtype), node.dtype)
        text = self.printer(expr)
        return self._assign(scope, f"({text}).to({register_type(node.dtype)})", node.dtype)

    def _op(self, node: Op, scope: Scope) -> Value:
        args = [self.render(a, scope) for a in node.args]
        arg_dtype = args[-1].dtype if args else node.dtype
        try:
            template = op_template(node.name, arg_dtype)
        except (KeyError, ValueError) as exc:
            raise UnsupportedKernelError(
                f"kernel {self.kernel.name}: op {node.name!r} is not supported by the "
                f"Triton codegen ({exc})"
            ) from None
        if "libdevice." in template:
            self.helpers.add("libdevice")
        for word in template.replace("(", " ").split():
            if word.startswith("ember_"):
                self.helpers.add(word)
        extra: dict[str, str] = {"T": register_type(node.dtype)}
        if "{I}" in template:
            extra["I"] = bits_type(register_type(arg_dtype))
        text = template.format(*(a.name for a in args), **extra)
        return self._assign(scope, round_low_precision(text, node.dtype), node.dtype)

    def _cast(self, value: Value, to: torch.dtype, scope: Scope) -> Value:
        source = value.dtype
        if source == to:
            return value
        if to == torch.bool:
            return self._assign(scope, f"{value.name} != 0", to)
        if to in LOW_PRECISION:
            return self._assign(scope, round_low_precision(value.name, to), to)
        if register_type(source) == register_type(to):
            return Value(value.name, to)  # float16/bfloat16 -> float32: already float32
        return self._assign(scope, f"{value.name}.to({register_type(to)})", to)

    def _load(self, node: Load, scope: Scope) -> Value:
        if node.buffer in self.kernel.local_reductions:
            member, which = self.kernel.local_value(node)
            try:
                return self.local[(member.name, which)]
            except KeyError:
                raise UnsupportedKernelError(
                    f"kernel {self.kernel.name}: {member.name} is read before it is reduced"
                ) from None
        printer = self.printer
        if node.indirect:
            printer = IndexPrinter(printer.names)
            for k, child in enumerate(node.indirect):
                value = self.render(child, scope)
                printer.names[indirect_var(k)] = f"{value.name}.to(tl.int64)"
        index = printer(node.index)
        axes = self.axes(node)
        index = self.broadcast(index, self.expr_axes(node.index), axes)
        conditions = [m for m in (self.mask(axes),) if m]
        if node.mask is not None:
            conditions.append(self.render(node.mask, scope).name)
        mask = " & ".join(f"({c})" if " " in c else c for c in conditions)
        pointer = pointer_name(node.buffer)
        if node.indirect and self.debug:
            self.check_bounds(node.buffer, index, mask, scope)
        if mask:
            other = literal(node.other, node.dtype)
            text = f"tl.load({pointer} + ({index}), {mask}, other={other})"
        else:
            text = f"tl.load({pointer} + ({index}))"
        if node.dtype in LOW_PRECISION:
            text += ".to(tl.float32)"
        return self._assign(scope, text, node.dtype)

    def check_bounds(self, buffer: str, index: str, mask: str, scope: Scope) -> None:
        if buffer not in self.bounds_checked:
            self.bounds_checked.append(buffer)
        inside = f"(({index}) >= 0) & (({index}) < {numel_name(buffer)})"
        if mask:
            inside = f"({inside}) | ~({mask})"
        message = f"kernel {self.kernel.name}: index out of bounds of {buffer}"
        scope.emit(f'tl.device_assert({inside}, "{message}")')

    def _check_index(self, node: CheckIndex, scope: Scope) -> Value:
        """The index, after asserting it lies in its dimension wherever the block's
        axes (and the check's own mask) hold."""
        index = self.render(node.index, scope)
        size = self.render(node.size, scope)
        low = self.render(node.low, scope)
        inside = f"(({index.name} >= {low.name}) & ({index.name} < {size.name}))"
        conditions = [m for m in (self.mask(self.axes(node)),) if m]
        if node.mask is not None:
            conditions.append(self.render(node.mask, scope).name)
        if conditions:
            inside = f"{inside} | ~({' & '.join(conditions)})"
        number = len(self.index_checks)
        self.index_checks.append(node)
        message = (
            f"ember index check {number}: index out of bounds for dimension {node.dim} of {node.op}"
        )
        scope.emit(f'tl.device_assert({inside}, "{message}")')
        return index

    def _rand(self, node: Rand, scope: Scope) -> Value:
        helper = {"uniform": "ember_rand_uniform", "normal": "ember_rand_normal"}.get(
            node.distribution
        )
        if helper is None:
            raise UnsupportedKernelError(
                f"kernel {self.kernel.name}: random distribution {node.distribution!r}"
            )
        self.helpers.add(helper)
        if helper == "ember_rand_normal":
            self.helpers.add("libdevice")
        index = self.printer(node.index)
        counter = f"({index}).to(tl.int64) + {self.printer(node.offset)}"
        if not self.expr_axes(node.index):
            counter = f"tl.full([], {index}, tl.int64) + {self.printer(node.offset)}"
        # The seed is a one-element int64 tensor drawn on the device each call: loading it
        # here (instead of passing an int) spares the wrapper a device-to-host sync.
        seed = f"tl.load({pointer_name(node.seed)})"
        text = f"{helper}({seed}, {counter})"
        return self._assign(scope, round_low_precision(text, node.dtype), node.dtype)

    # -- stores ------------------------------------------------------------------------

    def store(
        self,
        buffer: str,
        index: sympy.Expr,
        value: Value,
        dtype: torch.dtype,
        axes: frozenset[str],
        scope: Scope,
        *,
        atomic: str | None = None,
        printer: IndexPrinter | None = None,
    ) -> None:
        """Store `value` (converted to `dtype`) at `index` over the block `axes`."""
        text = (printer or self.printer)(index)
        text = self.broadcast(text, self.expr_axes(index), axes)
        pointer = f"{pointer_name(buffer)} + ({text})"
        converted = f"{value.name}.to({storage_type(dtype)})"
        mask = self.mask(axes)
        mask_arg = f", {mask}" if mask else ""
        if atomic is None:
            scope.emit(f"tl.store({pointer}, {converted}{mask_arg})")
        else:
            scope.emit(f"tl.{atomic}({pointer}, {converted}{mask_arg})")
