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
Inputs whose layout is symbolic (dynamic shapes) take their storage offset, and any
size or stride that is a symbol of its own, as size arguments read off the tensor at
every call; their other strides are expressions of sizes (`(s1, 1)` for a contiguous
`[s0, s1]`), which Dynamo guards for the forward graph but nothing guards for a
backward: a saved `x[:, -k:]` traced as a view (strides `(s27, 1)`) and materialised
by the forward in a fresh buffer (`(k, 1)`) was read with the view's strides.
`guard_symbolic_layouts` checks those inputs at each call, evaluating their layouts
with the call's size symbols through Python functions generated once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx

from ember.graphpasses.effects import written_args
from ember.ir import InputBuffer, Program, SizeInput, conforms, laid_out
from ember.runtime.pyexpr import pyexpr, symbol_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InputLayout:
    """Where input `index` must have `stride` and `offset` (its storage offset)."""

    index: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    written: bool  # the graph writes to this input


@dataclass(frozen=True)
class InputRecord:
    """One graph input as a compiled artifact describes it (its manifest): what it
    is, the layout the kernels assume (Python expressions over the size symbols'
    wrapper names; plain integers where static) and the size symbols the call reads
    off it (`binds`: name, `size`/`stride`/`storage_offset`/`value`, dimension)."""

    index: int
    kind: str  # "tensor", "size" (an int size argument) or "other"
    dtype: str = ""
    device: str = ""
    size: tuple[str, ...] = ()
    stride: tuple[str, ...] = ()
    offset: str = "0"
    written: bool = False  # the graph writes to this input
    binds: tuple[tuple[str, str, int | None], ...] = ()

    @property
    def static(self) -> bool:
        return all(_is_int(e) for e in (*self.size, *self.stride, self.offset))

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index, "kind": self.kind, "dtype": self.dtype, "device": self.device,
            "size": list(self.size), "stride": list(self.stride), "offset": self.offset,
            "written": self.written, "binds": [list(b) for b in self.binds],
        }  # fmt: skip

    @staticmethod
    def from_json(data: dict[str, Any]) -> InputRecord:
        return InputRecord(
            index=int(data["index"]),
            kind=str(data["kind"]),
            dtype=str(data["dtype"]),
            device=str(data["device"]),
            size=tuple(str(e) for e in data["size"]),
            stride=tuple(str(e) for e in data["stride"]),
            offset=str(data["offset"]),
            written=bool(data["written"]),
            binds=tuple(
                (str(n), str(m), None if d is None else int(d)) for n, m, d in data["binds"]
            ),
        )


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def input_records(program: Program, gm: torch.fx.GraphModule) -> list[InputRecord]:
    """The records of every input of `program`, lowered from `gm` (one program input
    per placeholder)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    written = {arg for node in gm.graph.nodes for arg in written_args(node)}
    records = []
    for index, (entry, node) in enumerate(zip(program.inputs, placeholders, strict=True)):
        if isinstance(entry, InputBuffer):
            layout = entry.layout
            records.append(
                InputRecord(
                    index,
                    "tensor",
                    str(layout.dtype).removeprefix("torch."),
                    str(layout.device),
                    tuple(pyexpr(e) for e in layout.size),
                    tuple(pyexpr(e) for e in layout.stride),
                    pyexpr(layout.offset),
                    node in written,
                    tuple((symbol_name(s), m, d) for s, m, d in layout.runtime_symbols()),
                )
            )
        elif isinstance(entry, SizeInput) and isinstance(entry.expr, sympy.Symbol):
            binds = ((symbol_name(entry.expr), "value", None),)
            records.append(InputRecord(index, "size", binds=binds))
        else:
            records.append(InputRecord(index, "other"))
    return records


def static_layouts(records: Sequence[InputRecord]) -> list[InputLayout]:
    """The assumed layout of every tensor input whose layout is static
    (`Layout.is_static`): exactly the inputs whose offset the kernels bake."""
    return [
        InputLayout(
            r.index,
            tuple(int(v) for v in r.size),
            tuple(int(v) for v in r.stride),
            int(r.offset),
            r.written,
        )
        for r in records
        if r.kind == "tensor" and r.static
    ]


def symbol_binder(records: Sequence[InputRecord]) -> Callable[[list[Any]], dict[str, int]]:
    """A function from a call's inputs to the values of the size symbols (by wrapper
    name), each read off the first input that carries it."""
    reads: list[tuple[str, int, str, int | None]] = []
    seen: set[str] = set()
    for record in records:
        for name, method, dim in record.binds:
            if name not in seen:
                seen.add(name)
                reads.append((name, record.index, method, dim))

    def bind(args: list[Any]) -> dict[str, int]:
        values = {}
        for name, index, method, dim in reads:
            arg = args[index]
            if method == "value":
                values[name] = int(arg)
            else:
                read = getattr(arg, method)
                values[name] = int(read() if dim is None else read(dim))
        return values

    return bind


def guard_layouts(
    call: Callable[[list[Any]], Any],
    layouts: Sequence[InputLayout],
    graph: str,
    static_inputs: Sequence[int] = (),
) -> Callable[[list[Any]], Any]:
    """`call`, taking any input that does not conform to its layout in `layouts` as
    a copy that does (and copying written ones back).

    Inputs in `static_inputs` (parameters and buffers, which keep their storage from
    call to call) are checked once: while none has moved to other memory since
    every one of them last conformed (one C call compares all their addresses), their
    checks are skipped. A model's parameters are most of its inputs, and checking
    each at every call cost more than a small model's kernels."""
    checks = [layout for layout in layouts if 0 not in layout.size]  # empty: read nowhere
    if not checks:
        return call
    static = set(static_inputs)
    fixed = [layout for layout in checks if layout.index in static]
    varying = [layout for layout in checks if layout.index not in static]
    fixed_indices = [layout.index for layout in fixed]
    verified: list[int | None] = []  # the fixed inputs' addresses when they last conformed

    def guarded(args: list[Any]) -> Any:
        moved: list[tuple[torch.Tensor, torch.Tensor]] = []
        todo, before = varying, None
        if fixed and not (verified and pointers_equal(args, verified, fixed_indices)):
            todo, before = checks, [args[i] for i in fixed_indices]
            verified.clear()
        for layout in todo:
            offset = layout.offset
            _conform(
                args,
                layout.index,
                layout.size,
                layout.stride,
                offset,
                offset,
                layout.written,
                moved,
                graph,
            )
        if before is not None and all(
            args[i] is x and isinstance(x, torch.Tensor)
            for i, x in zip(fixed_indices, before, strict=True)
        ):  # every fixed input conformed as it came: checked until one moves
            checked = set(fixed_indices)
            verified.extend(args[i].data_ptr() if i in checked else None for i in range(len(args)))
        return _call_writing_back(call, args, moved)

    return guarded


def pointers_equal(args: list[Any], pointers: list[int | None], indices: list[int]) -> bool:
    """Whether each `args[i]` for `i` in `indices` is a tensor whose data pointer is
    `pointers[i]`: one C call where torch has it (its CUDA graph trees use it)."""
    if not indices:
        return True
    check = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
    if check is not None:
        return bool(check(args, pointers, indices))
    return all(
        isinstance(args[i], torch.Tensor) and args[i].data_ptr() == pointers[i] for i in indices
    )


def guard_symbolic_layouts(
    call: Callable[[list[Any]], Any], records: Sequence[InputRecord], graph: str
) -> Callable[[list[Any]], Any]:
    """`call`, taking any input with a symbolic layout that does not conform to it
    (evaluated with the call's size symbols) as a copy that does, and copying written
    ones back."""
    names = sorted({name for r in records for name, _, _ in r.binds})
    checks = [
        (r.index, r.written, _evaluator(r, names))
        for r in records
        if r.kind == "tensor" and not r.static
    ]
    if not checks:
        return call
    bind = symbol_binder(records)

    def guarded(args: list[Any]) -> Any:
        values = bind(args)
        moved: list[tuple[torch.Tensor, torch.Tensor]] = []
        for index, written, evaluate in checks:
            size, stride, offset = evaluate(**values)
            # the offset of such an input is its own (`Layout.runtime_offset`), read
            # again from the copy by the wrapper: the copy starts at 0
            _conform(args, index, size, stride, offset, 0, written, moved, graph)
        return _call_writing_back(call, args, moved)

    return guarded


def _conform(
    args: list[Any],
    index: int,
    size: Sequence[int],
    stride: Sequence[int],
    offset: int,
    copy_offset: int,
    written: bool,
    moved: list[tuple[torch.Tensor, torch.Tensor]],
    graph: str,
) -> None:
    """Replace `args[index]` by a copy with the layout where it does not conform to it
    (a copy at `copy_offset`), noting a written input in `moved` to be copied back.
    A non-tensor (an effect token's place, which the wrapper ignores) is left alone."""
    x = args[index]
    if not isinstance(x, torch.Tensor) or conforms(x, size, stride, offset):
        return
    log.debug(
        "%s: input %d has strides %s at offset %d, compiled for %s at %d: copied",
        graph,
        index,
        x.stride(),
        x.storage_offset(),
        tuple(stride),
        offset,
    )
    copy = laid_out(x, size, stride, copy_offset)
    if written:
        moved.append((x, copy))
    args[index] = copy


def _call_writing_back(
    call: Callable[[list[Any]], Any],
    args: list[Any],
    moved: list[tuple[torch.Tensor, torch.Tensor]],
) -> Any:
    """`call(args)`, then each written input's copy back into the input itself."""
    result = call(args)
    if moved:
        with torch.no_grad():
            for original, copy in moved:
                original.copy_(copy)
    return result


def _evaluator(record: InputRecord, names: Sequence[str]) -> Callable[..., tuple[Any, Any, Any]]:
    """A Python function of the size symbols `names` (wrapper names) that returns the
    input's sizes, strides and offset: generated once, since evaluating expressions
    per call would cost more than the kernels it guards. The expressions are ember's
    own (`pyexpr`), kept in the artifact's manifest."""
    size, stride = (
        "(" + "".join(f"{e}, " for e in exprs) + ")" for exprs in (record.size, record.stride)
    )
    parameters = ", ".join([*names, "**_"])
    function: Callable[..., tuple[Any, Any, Any]] = eval(
        f"lambda {parameters}: ({size}, {stride}, {record.offset})"
    )
    return function
