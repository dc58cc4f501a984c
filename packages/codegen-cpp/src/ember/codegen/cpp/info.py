"""What the runtime keeps of a rendered translation unit: its source and, per kernel,
the arguments it takes and the errors it can find.

Apart from the rendering modules (which need sympy, the IR and the scheduler) so
that a process loading compiled kernels (a compile-cache hit, an ahead-of-time
package) imports only this: the package's `__init__` imports the renderer when one
of its names is first used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KernelCheck:
    """One error a kernel can find, numbered by its place in `KernelInfo.checks`.

    `kind` is 'index' (an index outside dimension `dim` of `what`, the op and graph
    node) or 'division' (an integer division by zero in `what`)."""

    kind: str
    what: str
    dim: int = -1


@dataclass(frozen=True)
class KernelArgument:
    """One parameter of a rendered kernel."""

    name: str  # the buffer's or size symbol's name in the schedule
    kind: str  # 'buffer' or 'size'
    dtype: torch.dtype  # the buffer's element dtype (int64 for sizes)
    ctype: str  # the C++ parameter type
    writes: bool = False  # the kernel writes this buffer


@dataclass(frozen=True)
class KernelInfo:
    """What the runtime needs to call one rendered kernel."""

    name: str
    arguments: tuple[KernelArgument, ...]
    # errors the kernel can find, by number; when there are any, the kernel takes an
    # error record after its arguments
    checks: tuple[KernelCheck, ...] = ()


@dataclass(frozen=True)
class CppSource:
    """One translation unit and the kernels it defines, in order."""

    source: str
    kernels: tuple[KernelInfo, ...]
