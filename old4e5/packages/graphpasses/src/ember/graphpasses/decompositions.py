"""The decomposition table ember lowers from.

AOTAutograd and `torch.export(...).run_decompositions` apply this table while tracing,
so the graphs that reach the IR contain only the ops left over: the list in
`ember.graphpasses.remaining_ops`, which a test recomputes from this table. The table is
torch's core ATen decomposition set, minus the ops ember prefers to see whole
(`KEEP_WHOLE`, with the reason), plus ember's own additions (`EMBER_ADDITIONS`, with the
reason), all taken from torch's registered decompositions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

aten = torch.ops.aten

# Ops torch would decompose that ember keeps as one op, and why. The core set already
# keeps what ember calls as ATen externs on purpose (mm, addmm, bmm, convolution), and
# most of what it decomposes is cheaper for ember as pointwise and reduction ops the
# scheduler can fuse; attention is the exception.
KEEP_WHOLE: dict[torch._ops.OpOverloadPacket, str] = {
    aten._scaled_dot_product_flash_attention_for_cpu: (
        "attention stays one fused ATen kernel; and torch 2.15's decomposition of this op "
        "gave wrong gradients on CPU (off by ~40x on plain SDPA; tests/stack/"
        "test_attention_gradients.py)"
    ),
}

# Ops the core set leaves whole that ember decomposes, and why. Not the other batch
# norm spellings (`native_batch_norm`, `_native_batch_norm_legit[_no_training]`): their
# decompositions go through the in-place `_native_batch_norm_legit`, which AOTAutograd
# rejects in its functional graphs; the IR lowers inference batch norm directly.
EMBER_ADDITIONS: dict[torch._ops.OpOverloadPacket, str] = {
    aten._native_batch_norm_legit_functional: (
        "training batch norm after functionalisation is not a core op and the core set "
        "has no decomposition for it; as mean/var/pointwise it fuses with the activation"
    ),
    aten.native_layer_norm: "layer norm as reductions + pointwise fuses with residual adds",
    aten.native_group_norm: "group norm as reductions + pointwise, same reason",
    # Found by the OpInfo sweep without fallbacks: ops that reached the IR whole and
    # whose torch decompositions are ops it lowers (they fuse instead of an ATen call).
    aten.dist: "the norm of a difference: a reduction over a pointwise body",
    aten.grid_sampler_2d: "bilinear/nearest sampling as indirect loads and pointwise math",
    aten.max_pool3d_with_indices: "windowed max and argmax, as the 2d pooling",
    aten.adaptive_max_pool3d: "windowed max and argmax, as the 2d pooling",
}


def ember_decompositions() -> dict[torch._ops.OperatorBase, Callable[..., Any]]:
    """Return a fresh copy of the table (callers may add to it)."""
    table: dict[torch._ops.OperatorBase, Callable[..., Any]] = dict(core_aten_decompositions())
    for op in list(table):
        packet = getattr(op, "overloadpacket", None)
        if packet is not None and packet in KEEP_WHOLE:
            del table[op]
    for op, fn in get_decompositions(list(EMBER_ADDITIONS)).items():
        if isinstance(op, torch._ops.OpOverload) and op._schema.is_mutable:
            continue  # out= variants: AOTAutograd graphs never contain them
        table[op] = fn
    return table
