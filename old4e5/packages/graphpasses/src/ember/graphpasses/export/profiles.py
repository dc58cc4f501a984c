"""Input/output metadata profiles of the custom operators a program calls.

To run a program under fake tensors (export, compile, shape propagation) every custom
op needs a fake kernel. When a user has none, the profiles collected here say what the
op was seen doing: for each call, the rank, dtype, device and layout of every tensor
argument and result. A fake kernel can be generated from them (or torch's
`torch._library.fake_profile`), and a test can assert the op was only ever called the
ways its fake kernel supports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

# Namespaces whose ops are not "custom".
BUILTIN_NAMESPACES = frozenset({"aten", "prims", "prim", "higher_order"})


@dataclass(frozen=True)
class TensorProfile:
    """What a fake kernel needs to know about one tensor."""

    rank: int
    dtype: torch.dtype
    device: torch.device
    layout: torch.layout

    @staticmethod
    def of(value: torch.Tensor) -> TensorProfile:
        return TensorProfile(value.dim(), value.dtype, value.device, value.layout)


@dataclass(frozen=True)
class CustomOpProfile:
    """One way a custom op was called: per argument a profile (None: not a tensor)."""

    args: tuple[TensorProfile | None, ...]
    outputs: tuple[TensorProfile | None, ...]


def _profile(value: Any) -> TensorProfile | None:
    return TensorProfile.of(value) if isinstance(value, torch.Tensor) else None


def collect_custom_op_profiles(gm: torch.fx.GraphModule) -> dict[str, set[CustomOpProfile]]:
    """Map each custom op's name (`ns::op.overload`) to the distinct ways it was called.

    Reads `meta['val']` of the arguments and of the call; calls whose values are
    missing are skipped (there is nothing reliable to record).
    """
    profiles: dict[str, set[CustomOpProfile]] = {}
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            target = node.target
            if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
                continue
            if target.namespace in BUILTIN_NAMESPACES or "val" not in node.meta:
                continue
            try:
                args = [
                    arg.meta["val"] if isinstance(arg, torch.fx.Node) else arg
                    for arg in pytree.tree_leaves((node.args, node.kwargs))
                ]
            except KeyError:
                continue
            profile = CustomOpProfile(
                tuple(_profile(a) for a in args),
                tuple(_profile(v) for v in pytree.tree_leaves(node.meta["val"])),
            )
            name = f"{target._schema.name}.{target._overloadname}"
            profiles.setdefault(name, set()).add(profile)
    return profiles
