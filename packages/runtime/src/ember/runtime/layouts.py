"""The input layouts a compiled graph assumes, checked at every call.

Ember's kernels index each input tensor from its storage's start (ember.ir.layout's
contract). Where an input's layout is static, its strides and storage offset are
baked into the kernels' index expressions. Dynamo guards an input's sizes and strides
but not its storage offset, and AOTAutograd hands the backward graph whatever the
forward returned: `base[1]` then `base[2]` (same sizes, offsets 8 and 16), or a saved
`x[1]` that the forward materialised in a fresh buffer while the backward was traced
with the view's offset, were read at the wrong place. So a call first checks each
static input with `ember.ir.conforms` (27-44 us for 200 inputs on a 2-core CPU
machine, with its load) and passes a mismatched input as a copy laid out the assumed
way (`ember.ir.laid_out`); an input the graph writes to is copied back afterwards.
Inputs whose layout is symbolic (dynamic shapes) are not checked here: their sizes,
strides and storage offset are size arguments read off the tensor at every call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from ember.graphpasses.effects import written_args
from ember.ir import InputBuffer, Program, conforms, laid_out

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InputLayout:
    """Where input `index` must have `stride` and `offset` (its storage offset)."""

    index: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    written: bool  # the graph writes to this input


def static_layouts(program: Program, gm: torch.fx.GraphModule) -> list[InputLayout]:
    """The assumed layout of every tensor input of `program` (lowered from `gm`) whose
    layout is static (`Layout.is_static`): exactly the inputs whose offset the
    kernels bake."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    written = {arg for node in gm.graph.nodes for arg in written_args(node)}
    layouts = []
    for index, (entry, node) in enumerate(zip(program.inputs, placeholders, strict=True)):
        if isinstance(entry, InputBuffer) and entry.layout.is_static:
            layout = entry.layout
            layouts.append(
                InputLayout(
                    index,
                    tuple(int(v) for v in layout.size),
                    tuple(int(v) for v in layout.stride),
                    int(layout.offset),
                    node in written,
                )
            )
    return layouts


def guard_layouts(
    call: Callable[[list[Any]], Any], layouts: Sequence[InputLayout], graph: str
) -> Callable[[list[Any]], Any]:
    """`call`, taking any input that does not conform to its layout in `layouts` as
    a copy that does (and copying written ones back)."""
    checks = [layout for layout in layouts if 0 not in layout.size]  # empty: read nowhere
    if not checks:
        return call

    def guarded(args: list[Any]) -> Any:
        moved: list[tuple[torch.Tensor, torch.Tensor]] = []
        for layout in checks:
            index, size, stride, offset = layout.index, layout.size, layout.stride, layout.offset
            x = args[index]
            if not isinstance(x, torch.Tensor) or conforms(x, size, stride, offset):
                continue  # (not a tensor: an effect token's place, which the wrapper ignores)
            copy = laid_out(x, size, stride, offset)
            log.debug(
                "%s: input %d has strides %s at offset %d, compiled for %s at %d: copied",
                graph,
                index,
                x.stride(),
                x.storage_offset(),
                stride,
                offset,
            )
            if layout.written:
                moved.append((x, copy))
            args[index] = copy
        if not moved:
            return call(args)
        result = call(args)
        with torch.no_grad():
            for original, copy in moved:
                original.copy_(copy)
        return result

    return guarded
