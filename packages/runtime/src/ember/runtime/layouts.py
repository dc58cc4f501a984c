"""The input layouts a compiled graph assumes, checked at every call.

Ember's kernels read each input tensor through its whole storage, with the strides and
storage offset of the graph's example input baked into their index expressions. Dynamo
guards an input's sizes and strides but not its storage offset, and AOTAutograd hands
the backward graph whatever the forward returned: `base[1]` then `base[2]` (same sizes,
offsets 8 and 16), or a saved `x[1]` that the forward materialised in a fresh buffer
while the backward was traced with the view's offset, were read at the wrong place.
So a call first compares each input's strides and storage offset with the assumed
ones (27-44 us for 200 inputs on a 2-core CPU machine, with its load) and passes a
mismatched input as a copy laid out the assumed way; an input the graph writes to is
copied back afterwards. Inputs whose layout is symbolic (dynamic shapes) are indexed
through size arguments and are not checked here (`base[i]` at any row gives the right
values there too).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from ember.graphpasses.effects import written_args

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InputLayout:
    """Where input `index` must have `stride` and `offset` (its storage offset)."""

    index: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    written: bool  # the graph writes to this input


def static_layouts(gm: torch.fx.GraphModule) -> list[InputLayout]:
    """The assumed layout of every tensor input whose sizes, strides and storage offset
    are plain integers in its example value (`meta['val']`)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    written = {arg for node in gm.graph.nodes for arg in written_args(node)}
    layouts = []
    for index, node in enumerate(placeholders):
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.layout is not torch.strided:
            continue
        size, stride, offset = tuple(value.shape), value.stride(), value.storage_offset()
        if all(type(v) is int for v in (*size, *stride, offset)):
            layouts.append(
                InputLayout(
                    index,
                    tuple(int(v) for v in size),
                    tuple(int(v) for v in stride),
                    int(offset),
                    node in written,
                )
            )
    return layouts


def guard_layouts(
    call: Callable[[list[Any]], Any], layouts: Sequence[InputLayout], graph: str
) -> Callable[[list[Any]], Any]:
    """`call`, taking any input whose strides or storage offset differ from `layouts`
    as a copy with the assumed layout (and copying written ones back). The stride of a
    dimension of size 1 is never read, so it is not compared; empty inputs are not
    checked."""
    # per checked input, its layout and the dimensions whose strides are compared
    # (None: all of them, compared as one tuple)
    checks: list[tuple[InputLayout, tuple[int, ...] | None]] = []
    for layout in layouts:
        if 0 not in layout.size:
            dims = tuple(d for d, n in enumerate(layout.size) if n > 1)
            checks.append((layout, None if len(dims) == len(layout.size) else dims))
    if not checks:
        return call

    def guarded(args: list[Any]) -> Any:
        moved: list[tuple[torch.Tensor, torch.Tensor]] = []
        for layout, dims in checks:
            index, stride, offset = layout.index, layout.stride, layout.offset
            x = args[index]
            if not isinstance(x, torch.Tensor):
                continue  # an effect token's place, say, which the wrapper ignores
            if x.storage_offset() == offset:
                if dims is None:
                    if x.stride() == stride:
                        continue
                else:
                    actual = x.stride()
                    if all(actual[d] == stride[d] for d in dims):
                        continue
            copy = _laid_out(x, layout)
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


def _laid_out(x: torch.Tensor, layout: InputLayout) -> torch.Tensor:
    """A copy of `x` with `layout`'s strides at its storage offset (in a storage just
    large enough). Where `layout` broadcasts a dimension (stride 0), the compiled code
    reads one slice for all: such an input was traced as an expand, equal along that
    dimension, so the first slice is kept."""
    if x.shape != layout.size:
        raise RuntimeError(
            f"ember: input {layout.index} has sizes {tuple(x.shape)} where the compiled "
            f"graph expects {layout.size}; this is a bug in the guards, please report it"
        )
    extent = 1 + sum((n - 1) * s for n, s in zip(layout.size, layout.stride, strict=True))
    with torch.no_grad():
        storage = torch.empty(layout.offset + extent, dtype=x.dtype, device=x.device)
        kept = tuple(1 if s == 0 else n for n, s in zip(layout.size, layout.stride, strict=True))
        source = x[tuple(slice(0, n) for n in kept)]
        storage.as_strided(kept, layout.stride, layout.offset).copy_(source)
    return storage.as_strided(layout.size, layout.stride, layout.offset)
