"""Fake values on nodes: find a graph's fake mode and compute `meta['val']` for new nodes.

Graphs from AOTAutograd and torch.export carry a FakeTensor (or SymInt) in
`meta['val']` of every node, possibly with symbolic sizes from the graph's ShapeEnv.
The IR lowering reads those values, so a pass that creates a node must give it one.
The reliable way is to run the op on the fake values of its arguments under the graph's
own fake mode: shapes, strides and dtypes then follow ATen's rules exactly, and symbolic
sizes stay in the same ShapeEnv.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils import _pytree as pytree

from ember.graphpasses.errors import GraphPassError


def fake_mode_of(gm: torch.fx.GraphModule) -> FakeTensorMode | None:
    """The fake mode the graph's `meta['val']` tensors belong to, if any."""
    for node in gm.graph.nodes:
        for value in pytree.tree_leaves(node.meta.get("val")):
            if isinstance(value, FakeTensor):
                return value.fake_mode
    return None


def has_fake_values(gm: torch.fx.GraphModule) -> bool:
    return fake_mode_of(gm) is not None


def node_value(arg: Any) -> Any:
    """Replace nodes in an argument structure by their `meta['val']`."""

    def value(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            if "val" not in a.meta:
                raise KeyError(a.name)
            return a.meta["val"]
        return a

    return pytree.tree_map(value, arg)


def infer_value(node: torch.fx.Node, mode: FakeTensorMode, pass_name: str) -> None:
    """Set `node.meta['val']` by running its target on its arguments' fake values."""
    try:
        args = node_value(node.args)
        kwargs = node_value(node.kwargs)
    except KeyError as missing:
        raise GraphPassError(
            pass_name, f"argument {missing} has no meta['val'] to infer from", node
        ) from None
    target = node.target
    if not callable(target):
        raise GraphPassError(pass_name, "cannot infer a value for a non-call node", node)
    try:
        with mode:
            node.meta["val"] = target(*args, **kwargs)
    except Exception as exc:
        raise GraphPassError(
            pass_name, f"running the op on fake inputs failed: {type(exc).__name__}: {exc}", node
        ) from exc


def copy_debug_meta(source: torch.fx.Node, target: torch.fx.Node) -> None:
    """Carry the user-facing provenance (stack trace, module stack) to a new node."""
    for key in ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node", "seq_nr"):
        if key in source.meta and key not in target.meta:
            target.meta[key] = source.meta[key]


def same_shape(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Statically equal sizes (symbolic sizes compare without adding guards)."""
    return a.dim() == b.dim() and all(
        _statically_equal(x, y) for x, y in zip(a.shape, b.shape, strict=True)
    )


def same_strides(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dim() == b.dim() and all(
        _statically_equal(x, y) for x, y in zip(a.stride(), b.stride(), strict=True)
    )


def _statically_equal(x: int | torch.SymInt, y: int | torch.SymInt) -> bool:
    if isinstance(x, int) and isinstance(y, int):
        return x == y
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(x == y))


def sizes_equal(a: Any, b: Any) -> bool:
    """Two size lists (ints or SymInts) are statically equal."""
    if not isinstance(a, list | tuple | torch.Size) or not isinstance(b, list | tuple | torch.Size):
        return False
    return len(a) == len(b) and all(_statically_equal(x, y) for x, y in zip(a, b, strict=True))
