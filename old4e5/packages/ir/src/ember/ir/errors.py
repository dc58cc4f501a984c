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
