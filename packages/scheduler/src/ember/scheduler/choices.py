"""Device-specific scheduling choices, behind one small interface.

The scheduler is device-neutral; how much to fuse and how to run a reduction depend on
the device. Each codegen provides a `DeviceChoices` (the defaults here suit both
today); the runtime passes the right one to `schedule_program`.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy


@dataclass(frozen=True)
class DeviceChoices:
    """Knobs the scheduler consults.

    `max_members`: most IR nodes in one kernel (compile time and register pressure).
    `max_inline_ops`: a pointwise member is inlined into other members of its kernel
    (recomputed) only when its body has at most this many ops, and only while inlining
    adds at most this many ops to the reader; heavier producers stay in their own
    kernel rather than being computed again at every stage of a long chain.
    `horizontal`: fuse siblings that share inputs but not data.
    `split_reduction_above`: a reduction over more elements than this, with few outer
    points, is worth splitting into two kernels (a hint the codegen may act on).
    """

    max_members: int = 48
    max_inline_ops: int = 24
    horizontal: bool = True
    split_reduction_above: int = 1 << 16

    def reduction_hint(self, outer: sympy.Expr, inner: sympy.Expr) -> str:
        """'inner' (one row per program/thread), or 'split' for huge rows with few of them."""
        if (
            inner.is_number
            and outer.is_number
            and int(inner) > self.split_reduction_above
            and int(outer) < 64
        ):
            return "split"
        return "inner"


DEFAULT_CHOICES = DeviceChoices()
