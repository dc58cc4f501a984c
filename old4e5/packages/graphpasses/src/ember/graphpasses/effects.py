"""What a node does besides computing its value: mutation, randomness, other effects.

Every cleanup pass asks the same questions before it removes, merges or moves a node:
does it write to memory someone else can see, does it draw from the random generator,
does it assert something at run time? One module answers them, so DCE, CSE, constant
folding and the pattern matcher agree. The answers come from the op schema (alias
annotations say which arguments an op writes), the op tags (`nondeterministic_seeded`
marks random ops) and a short list of effectful functions that have neither.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

import torch
import torch.fx

aten = torch.ops.aten

# Ops and functions whose call matters even when nobody reads the result.
_EFFECTFUL: set[object] = {
    aten._assert_async.default,
    aten._assert_async.msg,
    aten._assert_scalar.default,
    aten._assert_tensor_metadata.default,
    aten.sym_constrain_range.default,
    aten.sym_constrain_range_for_size.default,
    torch._assert,
    operator.setitem,
}

# Ops that keep the random state's position for later draws; dropping or merging one
# shifts every later random number, so they are never removed, merged or folded.
_RANDOM_TAG = torch.Tag.nondeterministic_seeded


# Tagged random because of optional dropout; with dropout_p == 0 they draw nothing.
_RANDOM_ONLY_WITH_DROPOUT: set[object] = {aten.scaled_dot_product_attention.default}


def op_schema(node: torch.fx.Node) -> torch.FunctionSchema | None:
    """The ATen schema of a call_function node, or None for Python functions."""
    target = node.target
    if node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
        return target._schema
    return None


def written_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The argument nodes this node writes to (per its schema's alias annotations)."""
    schema = op_schema(node)
    if schema is None:
        return []
    written: list[torch.fx.Node] = []
    for index, argument in enumerate(schema.arguments):
        info = argument.alias_info
        if info is None or not info.is_write:
            continue
        if argument.kwarg_only or index >= len(node.args):
            value = node.kwargs.get(argument.name)
        else:
            value = node.args[index]
        values = value if isinstance(value, list | tuple) else [value]
        written.extend(v for v in values if isinstance(v, torch.fx.Node))
    return written


def is_mutating(node: torch.fx.Node) -> bool:
    """Does the node write to one of its inputs (in-place op, out= op, copy_)?"""
    schema = op_schema(node)
    return schema is not None and schema.is_mutable


def is_random(node: torch.fx.Node) -> bool:
    """Does the node draw from a random generator?"""
    target = node.target
    if node.op != "call_function":
        return False
    if isinstance(target, torch._ops.OpOverload):
        if target in _RANDOM_ONLY_WITH_DROPOUT:
            dropout = node.args[4] if len(node.args) > 4 else node.kwargs.get("dropout_p", 0.0)
            return bool(dropout != 0.0)
        return _RANDOM_TAG in target.tags
    return False


def has_side_effects(node: torch.fx.Node) -> bool:
    """Must the node stay even if its result is unused?

    True for placeholders and the output, mutating ops, random ops, asserts and other
    effectful functions, and higher-order ops (their bodies may do any of the above).
    """
    if node.op in ("placeholder", "output"):
        return True
    if node.op != "call_function":
        return node.op == "call_module"
    target = node.target
    if target in _EFFECTFUL or is_mutating(node) or is_random(node):
        return True
    if isinstance(target, torch._ops.HigherOrderOperator):
        return True
    try:
        return bool(node.is_impure())
    except Exception:  # older torch versions raise on some targets: be conservative
        return True


def is_pure(node: torch.fx.Node) -> bool:
    """A call whose result depends only on its arguments and that has no effects."""
    return node.op == "call_function" and not has_side_effects(node)


def storage_key(value: object) -> object | None:
    """An identity for the memory a fake or real tensor lives in (None for non-tensors)."""
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return torch.multiprocessing.reductions.StorageWeakRef(value.untyped_storage())  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    except Exception:  # tensors without storage (sparse, some subclasses)
        return None


def mutated_storages(nodes: Iterable[torch.fx.Node]) -> set[object]:
    """Storages written anywhere among `nodes`, by their fake values in `meta['val']`."""
    storages: set[object] = set()
    for node in nodes:
        for arg in written_args(node):
            key = storage_key(arg.meta.get("val"))
            if key is not None:
                storages.add(key)
    return storages
