"""The decomposition table ember lowers from.

AOTAutograd and `torch.export(...).run_decompositions` apply this table while tracing,
so the graphs that reach the IR contain only the ops left over. It is torch's core ATen
decomposition set, minus the ops ember prefers to see whole (listed in
`KEEP_WHOLE` with the reason), plus ember's own additions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._decomp import core_aten_decompositions

aten = torch.ops.aten

# Ops torch would decompose that ember keeps as one op, and why.
KEEP_WHOLE: dict[torch._ops.OpOverloadPacket, str] = {
    aten._scaled_dot_product_flash_attention_for_cpu: (
        "attention stays one fused ATen kernel; and torch's decomposition of this op gave "
        "wrong gradients (max abs error 0.025) on a 2-layer GPT-2 under torch 2.15"
    ),
}


def ember_decompositions() -> dict[torch._ops.OperatorBase, Callable[..., Any]]:
    """Return a fresh copy of the table (callers may add to it)."""
    table: dict[torch._ops.OperatorBase, Callable[..., Any]] = dict(core_aten_decompositions())
    for op in list(table):
        packet = getattr(op, "overloadpacket", None)
        if packet is not None and packet in KEEP_WHOLE:
            del table[op]
    return table
