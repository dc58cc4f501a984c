"""Errors of the IR layer. Each names the ATen op and the FX node it came from."""

from __future__ import annotations


class LoweringError(RuntimeError):
    """An FX node could not be lowered into the IR."""

    def __init__(self, node_name: str, target: str, message: str) -> None:
        super().__init__(f"cannot lower node {node_name!r} ({target}): {message}")
        self.node_name = node_name
        self.target = target


class VerificationError(RuntimeError):
    """The IR program breaks an invariant (a dangling reference, a bad dtype...)."""


class NotLowerable(Exception):
    """Raised by a lowering that does not handle this node's arguments (a complex
    dtype, a data-dependent shape...): the node becomes an extern instead."""


class IndexOutOfBounds(RuntimeError, IndexError):
    """A data-dependent index (embedding, gather, index, scatter, ...) lies outside
    its dimension, found while running a program (the reference interpreter, or a
    generated kernel through the runtime). Eager raises IndexError for some of these
    ops and RuntimeError for others; this is both, so code written against either
    catches it."""

    def __init__(self, message: str, *, index: int | None = None, size: int | None = None):
        super().__init__(message)
        self.index = index
        self.size = size


def index_error_message(what: str, dim: int, index: int | None, size: int | None) -> str:
    """The message of an out-of-bounds index into dimension `dim` of `what` (a
    `CheckIndex.describe()`), worded as eager's so that searches for it find it."""
    if index is None or size is None:
        return f"ember: an index is out of bounds for dimension {dim} in {what}"
    return f"ember: index {index} is out of bounds for dimension {dim} with size {size} in {what}"
