"""Bytes a kernel must move: each input read once, each stored output written once.

The floor of any implementation of the kernel on a memory-bound device, and how the
scheduler's fusion is judged (fused bytes against the unfused program's bytes).
"""

from __future__ import annotations

from ember.ir import ComputedBuffer, Layout, Program, size_hint
from ember.scheduler.kernel import FusedKernel


def buffer_layouts(program: Program) -> dict[str, Layout]:
    """Every named buffer's layout in `program`: inputs, constants, computed values and
    extern results (a multi-output extern's parts under their own names)."""
    found: dict[str, Layout] = {}
    for node in program.inputs:
        layout = getattr(node, "layout", None)
        if layout is not None:
            found[node.name] = layout
    for const in program.constants:
        found[const.name] = const.layout
    for item in program.nodes:
        layout = getattr(item, "layout", None)
        if isinstance(layout, Layout):
            found[item.name] = layout
    return found


def _size(layout: Layout) -> int:
    return size_hint(layout.numel()) * layout.dtype.itemsize


def kernel_bytes(kernel: FusedKernel, program: Program) -> int:
    """Bytes `kernel` reads and writes (size symbols counted as `ember.ir.SIZE_HINT`)."""
    layouts = buffer_layouts(program)
    read = sum(_size(layouts[name]) for name in kernel.inputs if name in layouts)
    written = sum(_size(m.layout) for m in kernel.members if m.stored)
    return read + written


def unfused_bytes(program: Program) -> int:
    """Bytes the program's loop nodes would move as one kernel each."""
    layouts = buffer_layouts(program)
    total = 0
    for node in program.nodes:
        if isinstance(node, ComputedBuffer):
            total += _size(node.layout) + sum(
                _size(layouts[n]) for n in set(node.reads()) if n in layouts
            )
    return total


def computed_bytes(kernel: FusedKernel, program: Program) -> int:
    """Bytes the buffers `kernel` computes (inlined ones included) would move as one
    kernel each: each reads its inputs once and writes itself once. Against
    `kernel_bytes`, what fusing them saved."""
    layouts = buffer_layouts(program)
    nodes = {n.name: n for n in program.nodes if isinstance(n, ComputedBuffer)}
    total = 0
    for name in kernel.computes or tuple(m.name for m in kernel.members):
        node = nodes.get(name)
        if node is not None:
            total += _size(node.layout) + sum(
                _size(layouts[n]) for n in set(node.reads()) if n in layouts
            )
    return total


def is_static(kernel: FusedKernel, program: Program) -> bool:
    """Whether every buffer `kernel` reads or writes has static sizes (otherwise its
    byte counts take each size symbol as `ember.ir.SIZE_HINT` and are not the run's)."""
    layouts = buffer_layouts(program)
    names = [*kernel.inputs, *(m.name for m in kernel.members)]
    return not any(layouts[n].numel().free_symbols for n in names if n in layouts)
