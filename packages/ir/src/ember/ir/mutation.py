"""Mutation during lowering: in-place writes into buffers.

AOTAutograd ends a graph that mutates an input with `copy_(input, new_value)`;
decompositions and non-functional graphs also contain in-place ops (`add_`, `zero_`,
`squeeze_`) and writes into views (`y[:, 1:3].mul_(2)`). Each write becomes a
`ComputedBuffer` whose `mutates` names the buffer it overwrites: a `Pointwise` over
the whole buffer, or a `Scatter` at a view's index. Later readers read the new
version's name (GraphLowering.current); lazy values still pending that read the old
version are stored first, because eager computed them before the write.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any
from typing import cast as type_cast

import torch
import torch.fx

from ember.ir.errors import LoweringError, NotLowerable
from ember.ir.expr import Load
from ember.ir.layout import Layout
from ember.ir.loops import Pointwise, Scatter
from ember.ir.nodes import BufferRef, returns_view
from ember.ir.symbolic import loop_vars
from ember.ir.tensor import LazyTensor, broadcast_loader, cast

if TYPE_CHECKING:
    from ember.ir.lowering import GraphLowering, LoweringFn


def snapshot_readers(lowering: GraphLowering, buffer: str, *, keep_aliases: bool = False) -> None:
    """Store every pending lazy value that reads `buffer` before it is overwritten:
    those values were computed before the mutation in program order.

    `keep_aliases`: the write comes from an ATen op writing its argument in place (a
    graph that is not functionalized), where a view of `buffer` taken before the
    write is an alias that later reads see the new data through: such views (view
    ops reading `buffer` directly) stay lazy instead of becoming a copy of the old
    data."""
    for node, item in _pending(lowering):
        if buffer in item.buffers():
            if keep_aliases and aliased_buffer(node, item) == buffer:
                continue
            layout = Layout.contiguous(item.device, item.dtype, item.size)
            item.realized = lowering.store(Pointwise(item.size, item.body()), layout)
            item.borrowed = False


class _Pending:
    """The lazy values of a lowering still pending (not stored, or only borrowing a
    buffer), kept up to date from one call to the next: the environment only grows,
    one entry per FX node, and a value once stored stays stored. Walking the whole
    environment at every write was quadratic: resnet50's training graph, 159 running
    statistics writes over ~4000 nodes, spent 0.19 s in it."""

    def __init__(self) -> None:
        self.seen = 0  # environment entries looked at so far
        self.items: list[tuple[torch.fx.Node, LazyTensor]] = []  # with the node computing it


def _pending(lowering: GraphLowering) -> list[tuple[torch.fx.Node, LazyTensor]]:
    state: _Pending = lowering.__dict__.setdefault("_pending_values", _Pending())
    env = lowering.env
    for fx_node, value in itertools.islice(env.items(), state.seen, None):
        if fx_node.users:
            for item in value if isinstance(value, tuple) else (value,):
                if isinstance(item, LazyTensor):
                    state.items.append((fx_node, item))
    state.seen = len(env)
    state.items = [(n, i) for n, i in state.items if i.realized is None or i.borrowed]
    return list(state.items)


def aliased_buffer(node: torch.fx.Node, value: LazyTensor) -> str | None:
    """The buffer that `value`, computed by FX `node`, aliases: `node` is a view op
    (view, slice, transpose, ...) and `value` reads a stored buffer directly, element
    for element through an index (no mask, no indirection). None otherwise (a
    computed value, or a view of one: it holds no storage of its own to alias)."""
    op = node.target
    if not isinstance(op, torch._ops.OpOverload) or not returns_view(op):
        return None
    body = value.body()
    if not isinstance(body, Load) or body.mask is not None or body.indirect:
        return None
    return body.buffer


def mutate(lowering: GraphLowering, target: Any, value: LazyTensor) -> Any:
    """Write `value` (broadcast and cast) into the buffer behind the FX argument
    `target`, in place: AOTAutograd's copy_ epilogues and in-place ops."""
    ref = lowering.env[target] if isinstance(target, torch.fx.Node) else target
    if isinstance(ref, LazyTensor):
        if is_view(target):  # an alias: writing it writes what it aliases
            whole = lowering.whole_buffer(ref)
            if whole is None:
                return write_through_view(lowering, target, value)
            ref = BufferRef(whole)
        elif ref.realized is None or ref.borrowed:
            # a fresh value (clone, repeat...): it needs storage of its own
            layout = Layout.contiguous(ref.device, ref.dtype, ref.size)
            ref.realized, ref.borrowed = (
                lowering.store(Pointwise(ref.size, ref.body()), layout),
                False,
            )
            ref = ref.realized
        else:
            ref = ref.realized
    if not isinstance(ref, BufferRef):
        raise LoweringError(
            getattr(lowering.current_node, "name", "?"),
            "in-place write",
            "the destination is a view or an unstored intermediate; functionalize the "
            "graph first (AOTAutograd and torch.export do)",
        )
    ref = lowering.current(ref)
    layout = lowering.layouts[ref.name]
    load = broadcast_loader(value, layout.size)
    body = cast(load(loop_vars(layout.ndim)), layout.dtype)
    return lowering.store(Pointwise(layout.size, body), layout, mutates=ref.name)


def write_through_view(lowering: GraphLowering, target: torch.fx.Node, value: LazyTensor) -> Any:
    """Write into a view (a slice of a buffer, say): a Scatter into the base at
    the view's own index. The chain of view nodes is lowered again over the
    stored base, before the write (for the index) and after it (so that later
    readers of the views read the new version)."""
    chain: list[torch.fx.Node] = []
    node: Any = target
    while (
        isinstance(node, torch.fx.Node)
        and isinstance(node.target, torch._ops.OpOverload)
        and is_view(node)
        and node.target in _lowerings()
    ):
        chain.append(node)
        node = node.args[0]
    base = lowering.env.get(node) if isinstance(node, torch.fx.Node) else None
    if not chain or base is None or isinstance(base, tuple):
        raise LoweringError(
            getattr(lowering.current_node, "name", "?"),
            "in-place write",
            "the destination is a view ember cannot trace back to a buffer; "
            "functionalize the graph first (AOTAutograd and torch.export do)",
        )
    if isinstance(base, LazyTensor) and (base.realized is None or base.borrowed):
        layout = Layout.contiguous(base.device, base.dtype, base.size)
        base.realized, base.borrowed = (
            lowering.store(Pointwise(base.size, base.body()), layout),
            False,
        )
    base_ref = lowering.current(base.realized if isinstance(base, LazyTensor) else base)  # type: ignore[arg-type]  # realized above
    for view_node in reversed(chain):
        lowering.env[view_node] = _lowerings()[view_node.target](lowering, view_node)  # type: ignore[index]  # an overload
    view = lowering.env[target]
    body = view.body() if isinstance(view, LazyTensor) else None
    if (
        not isinstance(body, Load)
        or body.mask is not None
        or body.indirect
        or body.buffer != base_ref.name
    ):
        raise LoweringError(
            getattr(lowering.current_node, "name", "?"),
            "in-place write",
            "the destination view does not read its base directly",
        )
    layout = lowering.layouts[base_ref.name]
    update = cast(broadcast_loader(value, view.size)(loop_vars(view.ndim)), layout.dtype)
    lowering.store(Scatter(view.size, body.index, (), update, None), layout, mutates=base_ref.name)
    for view_node in reversed(chain):
        lowering.env[view_node] = _lowerings()[view_node.target](lowering, view_node)  # type: ignore[index]  # an overload
    return lowering.env[target]


def inplace_lowering(op: torch._ops.OpOverload) -> LoweringFn | None:
    """`x.op_(...)` as the lowering of `op` followed by a write into x."""
    name = op._schema.name.split("::")[-1]
    args = op._schema.arguments
    if not name.endswith("_") or not args or args[0].alias_info is None:
        return None
    if not args[0].alias_info.is_write:
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    functional = getattr(packet, op._overloadname, None) if packet is not None else None
    if not isinstance(functional, torch._ops.OpOverload) or functional not in _lowerings():
        return None
    fn = _lowerings()[functional]
    target = functional

    def lower_inplace(lowering_: GraphLowering, node: torch.fx.Node) -> Any:
        as_functional = type_cast(torch.fx.Node, _Retargeted(node, target))
        result = fn(lowering_, as_functional)
        returns = target._schema.returns
        if returns and returns[0].alias_info is not None:
            # an in-place view op (squeeze_, t_...) changes the metadata of its
            # argument, not the data: later readers of the argument see the view
            lowering_.env[node.args[0]] = result  # type: ignore[index]  # an FX node
            return result
        if not isinstance(result, LazyTensor):
            raise NotLowerable("in-place variant of a multi-output op")
        return lowering_.mutate(node.args[0], result)

    return lower_inplace


class _Retargeted:
    """An FX node seen as a call of another overload (same args, meta and users)."""

    def __init__(self, node: torch.fx.Node, target: Any) -> None:
        self._node = node
        self.target = target

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)


def is_view(node: Any) -> bool:
    """The FX node's value aliases another tensor (writing it must write that one)."""
    if not isinstance(node, torch.fx.Node) or not isinstance(node.target, torch._ops.OpOverload):
        return not (isinstance(node, torch.fx.Node) and node.op == "placeholder")
    returns = node.target._schema.returns
    return bool(returns) and returns[0].alias_info is not None


def _lowerings() -> dict[torch._ops.OpOverload, LoweringFn]:
    from ember.ir.lowering import LOWERINGS  # the table imports this module

    return LOWERINGS
