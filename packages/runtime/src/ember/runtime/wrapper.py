"""Generate the Python wrapper module that runs a Schedule.

The wrapper is plain Python source, written to a file so tracebacks point at real
lines. Its `call(args)` takes the inputs as a list (AOTAutograd's boxed convention),
clears the list so the wrapper owns the inputs, binds the size symbols from the
inputs, runs each step, and drops every value right after its last use as the memory
plan says.

The module is self-contained: operators are named by their path
(`torch.ops.aten.add.Tensor`), devices by their text, and what has no source form
is bound by name when the module is loaded (ember.runtime.artifact): the kernels'
launchers, built from the artifact's binaries, and the graph's constant tensors,
kept in its weights file. Any other object the graph holds (an opaque script
object, say) is `live`: it exists only in the compiling process, and an artifact
holding one cannot be saved.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from ember.ir import BufferRef, ExternKernel, InputBuffer, Layout, SizeInput
from ember.runtime.hugepages import HUGE_MIN
from ember.runtime.pyexpr import pyexpr, symbol_name
from ember.scheduler import (
    Allocation,
    ExternCall,
    FusedKernel,
    KernelStep,
    Schedule,
    SelectOutput,
)


@dataclass
class WrapperSource:
    """The wrapper's source text and what its globals are bound to at load: the
    kernels (by name), the constants and the live objects."""

    source: str
    kernels: tuple[str, ...] = ()
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    live: dict[str, Any] = field(default_factory=dict)


class _Writer:
    def __init__(self) -> None:
        self.live: dict[str, Any] = {}
        self.header: dict[str, str] = {}  # module-level name -> its definition
        self._ids: dict[int, str] = {}

    def inject(self, prefix: str, obj: Any) -> str:
        """A name for an object with no source form, bound at load in this process."""
        key = id(obj)
        if key not in self._ids:
            name = f"{prefix}{len(self.live)}"
            self._ids[key] = name
            self.live[name] = obj
        return self._ids[key]

    def define(self, name: str, definition: str) -> str:
        """A module-level `name = definition` in the header (once per name)."""
        if self.header.setdefault(name, definition) != definition:
            raise ValueError(f"wrapper name {name!r} defined twice: {definition}")
        return name

    def op(self, op: Any) -> str:
        if not isinstance(op, torch._ops.OpOverload):
            return self.inject("op", op)  # a higher-order operator: no path to name it by
        packet = op.overloadpacket.__name__
        raw = f"{op.namespace}_{packet}_{op._overloadname}"
        name = "".join(c if c.isalnum() else "_" for c in raw)
        path = f"torch.ops.{op.namespace}.{packet}.{op._overloadname}"
        if getattr(getattr(getattr(torch.ops, op.namespace), packet), op._overloadname) is not op:
            return self.inject("op", op)  # not reachable by its path (a private copy)
        return self.define(name, path)

    def arg(self, value: Any) -> str:
        if isinstance(value, BufferRef):
            return value.name
        if isinstance(value, sympy.Basic):
            return pyexpr(value)
        if value is None or isinstance(value, (bool, int, str)):
            return repr(value)
        if isinstance(value, float):
            return repr(value) if math.isfinite(value) else f"float('{value}')"
        if isinstance(value, (tuple, list)):
            inner = ", ".join(self.arg(v) for v in value)
            return f"[{inner}]"
        if isinstance(value, dict):
            inner = ", ".join(f"{k!r}: {self.arg(v)}" for k, v in value.items())
            return "{" + inner + "}"
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
            return str(value)
        if isinstance(value, torch.device):  # one module global per device, not one per call
            name = "device_" + "".join(c if c.isalnum() else "_" for c in str(value))
            return self.define(name, f"torch.device({str(value)!r})")
        return self.inject("obj", value)


def generate_wrapper(
    schedule: Schedule,
    launchers: Mapping[str, Callable[..., None]] | None = None,
    timer: Any = None,
) -> WrapperSource:
    """The wrapper module's source for `schedule`.

    `launchers` maps each fused kernel's name to its compiled launcher, called with
    the kernel's buffer arguments then its size arguments (FusedKernel's contract).
    `timer` (ember.runtime.profiling.StepTimer, EMBER_PROFILE) is called around the
    whole call and around each step that runs device code.
    """
    program = schedule.program
    w = _Writer()
    constants: dict[str, torch.Tensor] = {}
    for const in program.constants:
        if isinstance(const.value, torch.Tensor):
            constants[const.name] = const.value
        else:
            w.live[const.name] = const.value
    for kernel in schedule.kernels:
        if launchers is None or kernel.name not in launchers:
            raise KeyError(f"no compiled launcher for fused kernel {kernel.name!r}")
    body: list[str] = []
    names = [node.name for node in program.inputs]
    if names:
        body.append(f"{', '.join(names)}{',' if len(names) == 1 else ''} = args")
    body.append("args.clear()")
    clock = w.inject("timer", timer) if timer is not None else None
    if clock is not None:
        body.append(f"{clock}.call_begin()")
    bound: set[sympy.Symbol] = set()
    body += _bind_symbols(schedule, bound)
    if schedule.memory.frees_at_entry:
        body.append(f"del {', '.join(schedule.memory.frees_at_entry)}")
    if program.rng_seed is not None:
        body.append(_seed_line(w, schedule))
    for index, (step, frees) in enumerate(
        zip(schedule.steps, schedule.memory.frees_after, strict=True)
    ):
        body += [_allocation_line(w, a) for a in schedule.memory.allocations[index]]
        timed = clock is not None and step.launches_kernel
        if timed:
            body.append(f"{clock}.begin({index})")
        if isinstance(step, KernelStep):
            body += _kernel_lines(w, step.kernel)
        elif isinstance(step, ExternCall):
            body.append(_extern_line(w, step.node) + _from(step.origins))
            node = step.node
            if isinstance(node.symbol, sympy.Symbol):
                bound.add(node.symbol)
            if not node.multi and not node.is_view and not node.writes_arguments:
                what = str(node.op)
                body += _layout_check(w, step.node.name, step.node.outputs[0], bound, what)
        elif isinstance(step, SelectOutput):
            body.append(f"{step.node.name} = {step.node.source}[{step.node.index}]")
            what = f"output {step.node.index} of {step.node.source}"
            body += _layout_check(w, step.node.name, step.node.layout, bound, what)
        if timed:
            body.append(f"{clock}.end({index})")
        if frees:
            body.append(f"del {', '.join(frees)}")
    outputs = [w.arg(o) for o in program.outputs]
    if clock is not None:
        body.append(f"{clock}.call_end()")
    body.append(f"return ({', '.join(outputs)}{',' if len(outputs) == 1 else ''})")

    at_load = [*(k.name for k in schedule.kernels), *constants, *w.live]
    header = [
        f"# Wrapper generated by ember for graph {program.name!r}.",
        f"# {schedule.kernel_count} kernel launches, {len(schedule.steps)} steps.",
        "import torch",
        *(["import ember.runtime.hugepages"] if "advise_huge_pages" in w.header else []),
        "from ember.ir import ensure_layout",
        "",
        *(f"{name} = {definition}" for name, definition in sorted(w.header.items())),
        "",
        "# bound at load: kernels, constants and live objects",
        *(f"{name} = None" for name in at_load),
        "",
        "",
        "def call(args):",
    ]
    source = "\n".join(header + ["    " + line for line in body]) + "\n"
    kernels = tuple(k.name for k in schedule.kernels)
    return WrapperSource(source, kernels, constants, dict(w.live))


def _bind_symbols(schedule: Schedule, bound: set[sympy.Symbol]) -> list[str]:
    """Lines binding each size symbol once, from the first input that carries it (the
    symbols are added to `bound`): a size input's value, or an input tensor's size,
    stride or storage offset (`Layout.runtime_symbols`)."""
    lines: list[str] = []
    for node in schedule.program.inputs:
        if isinstance(node, SizeInput) and isinstance(node.expr, sympy.Symbol):
            if node.expr not in bound:
                bound.add(node.expr)
                lines.append(f"{symbol_name(node.expr)} = {node.name}")
        elif isinstance(node, InputBuffer):
            lines += _bind_from(node.name, node.layout, bound)
    return lines


def _bind_from(
    name: str, layout: Layout, bound: set[sympy.Symbol], *, sizes_only: bool = False
) -> list[str]:
    """Lines binding each not yet `bound` symbol of `layout` from the tensor `name`
    (the symbols are added to `bound`); with `sizes_only`, from its sizes alone."""
    lines = []
    for symbol, method, dim in layout.runtime_symbols():
        if symbol not in bound and (method == "size" or not sizes_only):
            bound.add(symbol)
            read = f"{method}()" if dim is None else f"{method}({dim})"
            lines.append(f"{symbol_name(symbol)} = {name}.{read}")
    return lines


def _allocation_line(w: _Writer, allocation: Allocation) -> str:
    if allocation.reuse is not None:
        how = "written in place" if allocation.inplace else "reused"
        return f"{allocation.name} = {allocation.reuse}  # storage {how}"
    layout = allocation.layout
    size = w.arg(tuple(layout.size))
    stride = w.arg(tuple(layout.stride))
    empty = (
        f"torch.empty_strided({size}, {stride}, "
        f"dtype={w.arg(layout.dtype)}, device={w.arg(layout.device)})"
    )
    if _may_be_huge(layout):
        advise = w.define("advise_huge_pages", "ember.runtime.hugepages.advise_huge_pages")
        return f"{allocation.name} = {advise}({empty})"
    return f"{allocation.name} = {empty}"


def _may_be_huge(layout: Layout) -> bool:
    """Whether a CPU buffer of `layout` can reach HUGE_MIN bytes (symbolic sizes can:
    the check is then made at each call)."""
    if layout.device.type != "cpu":
        return False
    extent = sympy.expand(sympy.sympify(layout.storage_extent()))
    if not extent.is_number:
        return True
    return int(extent) * layout.dtype.itemsize >= HUGE_MIN


def _kernel_lines(w: _Writer, kernel: FusedKernel) -> list[str]:
    lines = [f"{m.name} = {m.mutates}" for m in kernel.members if m.mutates is not None]
    args = [*kernel.buffer_arguments(), *(pyexpr(s) for s in kernel.size_arguments())]
    lines.append(f"{kernel.name}({', '.join(args)}){_from(kernel.origins)}")
    return lines


def _from(origins: tuple[str, ...]) -> str:
    """A line's provenance comment: the FX nodes it computes."""
    return f"  # from {', '.join(origins)}" if origins else ""


def _seed_line(w: _Writer, schedule: Schedule) -> str:
    """The seed of the program's random ops, drawn from torch's generator per call
    (so torch.manual_seed makes compiled runs repeatable), on the kernels' device."""
    seed = schedule.program.rng_seed
    readers = [k for k in schedule.kernels if seed in k.inputs]
    device = readers[0].device if readers else torch.device("cpu")
    return f"{seed} = torch.randint(0, 2**62, (), dtype=torch.int64, device={w.arg(device)})"


def _layout_check(
    w: _Writer, name: str, layout: Layout | None, bound: set[sympy.Symbol], what: str
) -> list[str]:
    """Make an ATen result have the strides and storage offset the IR planned for it.

    The IR reads extern results through the layout their FX metadata promised; an
    ATen kernel may pick other strides at run time (SDPA's backends differ, say), and
    reading through the wrong strides would be a silent wrong answer. A result with the
    promised layout costs a few comparisons (`ember.ir.conforms`); any other is copied
    into it.

    A data-dependent size (`nonzero`'s row count) is first bound from the result
    itself: the graph's own binding of it comes later. Where a symbol would still be
    unbound, the result is taken as it comes."""
    if layout is None:
        return []
    lines = _bind_from(name, layout, bound, sizes_only=True)
    if not layout.free_symbols <= bound:
        return lines
    size, stride = w.arg(tuple(layout.size)), w.arg(tuple(layout.stride))
    offset = w.arg(layout.offset)
    return [*lines, f"{name} = ensure_layout({name}, {size}, {stride}, {offset}, {what!r})"]


def _extern_line(w: _Writer, node: ExternKernel) -> str:
    args = [w.arg(a) for a in node.args]
    args += [f"{k}={w.arg(v)}" for k, v in node.kwargs]
    target = node.name if node.symbol is None else f"{node.name} = {symbol_name(node.symbol)}"
    if node.op is torch.ops.aten.as_strided.default and not node.kwargs:
        # The tensor method skips the operator dispatch wrapper: a third of the cost, and
        # the IR passes every strided argument of an extern through one of these.
        return f"{target} = {args[0]}.as_strided({', '.join(args[1:])})"
    return f"{target} = {w.op(node.op)}({', '.join(args)})"
