"""The error this layer raises when a kernel cannot be rendered as C++.

The runtime catches it and runs the graph another way (eager fallback), so the message
names the op or construct, the kernel and the member, and what would make it work.
"""

from __future__ import annotations


class CppRenderError(NotImplementedError):
    """A kernel uses something the C++ codegen cannot render (an op, a dtype, an index
    function)."""

    def __init__(self, what: str, kernel: str, member: str | None = None) -> None:
        where = f"kernel {kernel!r}" + (f", member {member!r}" if member else "")
        super().__init__(
            f"ember.codegen.cpp cannot render {what} in {where}; "
            "the runtime falls back to eager for this graph"
        )
        self.what = what
        self.kernel = kernel
        self.member = member
