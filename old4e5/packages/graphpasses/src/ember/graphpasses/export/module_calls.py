"""Module-call signatures from export tracepoints, and the tracepoints' removal.

`torch.export(..., preserve_module_call_signature=("sub",))` wraps each named
submodule so that its inputs and outputs pass through a
`higher_order._export_tracepoint(*values, kind=..., path=...)` node. Their positions
say which graph values a submodule call consumed and produced, which is what lets an
exported program be unflattened (or a submodule swapped) later. This pass records,
per module path, the values entering and leaving the call, then erases the
tracepoints, pointing each `getitem` user at the value the tracepoint passed through.

A submodule reachable under two names (`self.b = self.a`) is wrapped once per name,
so every call passes through one tracepoint per name; the node's `nn_module_stack`
tells which name the call used, and only that name records the call. A module called
more than once appears in `nn_module_stack` as `name@1`, `name@2`, ...; those calls
are recorded under the same suffixed path.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from ember.graphpasses.errors import GraphPassError

PASS_NAME = "module_call_signatures"


@dataclass(frozen=True)
class Constant:
    """A non-tensor value passed into or out of a module call."""

    value: Any


@dataclass
class ModuleCallRecord:
    """The values one module call consumed and produced: node names or constants."""

    path: str
    inputs: list[str | Constant] = field(default_factory=list)
    outputs: list[str | Constant] = field(default_factory=list)


@dataclass
class ModuleCallSignatures:
    """What the pass found: records by (suffixed) path, and the names it rewired."""

    calls: dict[str, ModuleCallRecord] = field(default_factory=dict)
    renamed: dict[str, str] = field(default_factory=dict)  # erased getitem -> value


def _is_tracepoint(node: torch.fx.Node) -> bool:
    hop = getattr(torch.ops.higher_order, "_export_tracepoint", None)
    return node.op == "call_function" and hop is not None and node.target is hop


def _caller(node: torch.fx.Node) -> tuple[str, str]:
    """(name the call used, its `@n` suffix or "") from the node's module stack."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        raise GraphPassError(PASS_NAME, "tracepoint has no nn_module_stack metadata", node)
    key = next(reversed(stack))
    fqn = stack[key][0]
    suffix = key.split("@")[-1] if "@" in key else ""
    return fqn, suffix


def _describe(value: Any) -> str | Constant:
    return value.name if isinstance(value, torch.fx.Node) else Constant(value)


def _erase_tracepoint(node: torch.fx.Node, found: ModuleCallSignatures) -> None:
    for user in list(node.users):
        index = user.args[1] if user.target is operator.getitem else None
        if not isinstance(index, int):
            raise GraphPassError(
                PASS_NAME, f"tracepoint used by {user.name} other than through getitem", node
            )
        replacement = node.args[index]
        if isinstance(replacement, torch.fx.Node):
            user.replace_all_uses_with(replacement)
            found.renamed[user.name] = replacement.name
        elif user.users:
            raise GraphPassError(PASS_NAME, "a constant passed through is still used", user)
        user.graph.erase_node(user)
    node.graph.erase_node(node)


def collect_module_call_signatures(gm: torch.fx.GraphModule) -> ModuleCallSignatures:
    """Record module calls from the tracepoints in `gm` (and its submodules), erase them."""
    found = ModuleCallSignatures()
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        tracepoints = [n for n in module.graph.nodes if _is_tracepoint(n)]
        # In order: a tracepoint's arguments may come from an earlier one, which is
        # already gone by then, so records name the real values.
        for node in tracepoints:
            path = str(node.kwargs["path"])
            kind = node.kwargs["kind"]
            fqn, suffix = _caller(node)
            if fqn == path:
                key = f"{path}@{suffix}" if suffix else path
                record = found.calls.setdefault(key, ModuleCallRecord(key))
                values = [_describe(a) for a in node.args]
                if kind == "module_call_inputs":
                    record.inputs = values
                elif kind == "module_call_outputs":
                    record.outputs = values
                else:
                    raise GraphPassError(PASS_NAME, f"unknown tracepoint kind {kind!r}", node)
            _erase_tracepoint(node, found)
        if tracepoints:
            module.recompile()
    return found
