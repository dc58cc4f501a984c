"""Constant folding with a size limit.

A node is constant when it is pure and deterministic and every input is constant: a
`get_attr` tensor, or a node computed only from literals and other constants. Such
nodes are evaluated once, with real tensors, and the ones that non-constant code reads
become new `get_attr` constants. Three rules keep the graph from growing:
- results with more than `max_elements` elements are never stored (a 4-byte
  `full([4096, 4096], 0)` recipe must not turn into 64 MiB of weights);
- a constant made from literals alone (`full`, `arange`, `scalar_tensor`) stays a
  recipe: recomputing it is cheaper than storing it;
- nodes that depend on symbolic sizes, random ops and `empty*` (undefined contents)
  are never constant.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils import _pytree as pytree

from ember.graphpasses.dce import remove_dead_nodes
from ember.graphpasses.effects import is_pure
from ember.graphpasses.fake import copy_debug_meta, fake_mode_of
from ember.graphpasses.passes import (
    PRESERVES_CORE_ATEN,
    PRESERVES_NO_MUTATION,
    PRESERVES_RANDOMNESS,
    PRESERVES_VALUES,
    GraphPass,
    PassResult,
    named_pass,
)

DEFAULT_MAX_ELEMENTS = 1024
_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _fetch(gm: torch.fx.GraphModule, qualified: str) -> Any:
    owner: Any = gm
    for part in qualified.split("."):
        owner = getattr(owner, part)
    return owner


def _foldable_call(node: torch.fx.Node) -> bool:
    target = node.target
    if target is operator.getitem:
        return True
    if not is_pure(node) or not isinstance(target, torch._ops.OpOverload):
        return False
    if "empty" in target.__name__:
        return False
    literals = pytree.tree_leaves((node.args, node.kwargs))
    return not any(isinstance(v, _SYM_TYPES) for v in literals)


def _fresh_name(gm: torch.fx.GraphModule) -> str:
    index = 0
    while hasattr(gm, f"_ember_constant_{index}"):
        index += 1
    return f"_ember_constant_{index}"


def fold_constants(max_elements: int = DEFAULT_MAX_ELEMENTS) -> GraphPass:
    """A constant-folding pass that stores results of at most `max_elements` elements."""

    @named_pass(
        "constant_folding",
        (PRESERVES_NO_MUTATION, PRESERVES_CORE_ATEN, PRESERVES_VALUES, PRESERVES_RANDOMNESS),
    )
    def constant_folding(gm: torch.fx.GraphModule) -> PassResult:
        values: dict[torch.fx.Node, Any] = {}
        from_literals: set[torch.fx.Node] = set()
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                value = _fetch(gm, str(node.target))
                if isinstance(value, torch.Tensor):
                    values[node] = value
                continue
            if node.op != "call_function" or not _foldable_call(node):
                continue
            inputs = node.all_input_nodes
            if any(i not in values for i in inputs):
                continue
            args, kwargs = pytree.tree_map(
                lambda a: values[a] if isinstance(a, torch.fx.Node) else a,
                (node.args, node.kwargs),
            )
            try:
                # Real values, also when the graph is compiled under AOTAutograd's fake
                # mode: a FakeTensor stored as a constant would reach the generated code.
                with unset_fake_temporarily():
                    values[node] = node.target(*args, **kwargs)
            except Exception:  # an op that needs real device state: leave it to run time
                continue
            if not inputs or all(i in from_literals for i in inputs):
                from_literals.add(node)

        mode = fake_mode_of(gm)
        folded = 0
        for node, value in values.items():
            if node.op == "get_attr" or node in from_literals:
                continue
            if not isinstance(value, torch.Tensor) or value.numel() > max_elements:
                continue
            if all(user in values for user in node.users):
                continue  # only constants read it: fold further down instead
            name = _fresh_name(gm)
            with unset_fake_temporarily():
                gm.register_buffer(name, value.detach().clone())
            with gm.graph.inserting_before(node):
                constant = gm.graph.get_attr(name)
            copy_debug_meta(node, constant)
            if mode is not None:
                constant.meta["val"] = mode.from_tensor(value)
            node.replace_all_uses_with(constant)
            folded += 1
        if folded:
            remove_dead_nodes(gm.graph)
            gm.recompile()
        return PassResult(gm, folded > 0, {"folded": folded})

    return constant_folding
