"""Layout: where a tensor's elements live (device, dtype, sizes, strides, offset).

It also holds Ember's one layout contract, which every part of the stack that meets a
real tensor uses (the runtime's input guard, the check of extern results, the reference
interpreter): kernels index buffers from their storage's start, so a layout's storage
offset is part of every index. An offset is only ever baked into kernels as a constant
where the runtime checks it at each call (`Layout.is_static` inputs, extern results);
an input whose layout is symbolic gets its offset as a size symbol read off the tensor
at each call (`runtime_offset`), because Dynamo guards sizes and strides but not
storage offsets. `conforms` is the one test of "this tensor has that layout" and
`laid_out` the one way to make a tensor that has it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import sympy
import torch

from ember.ir.symbolic import as_expr


@dataclass(frozen=True)
class Layout:
    """Device, dtype, sizes, strides and storage offset of a tensor.

    Sizes, strides and offset are sympy expressions: Integers when static, expressions
    over size symbols when the graph is dynamic.
    """

    device: torch.device
    dtype: torch.dtype
    size: tuple[sympy.Expr, ...]
    stride: tuple[sympy.Expr, ...]
    offset: sympy.Expr = sympy.Integer(0)  # noqa: RUF009 - sympy numbers are immutable

    @staticmethod
    def of(tensor: torch.Tensor) -> Layout:
        """The layout of a real or fake tensor, symbolic sizes included."""
        return Layout(
            device=tensor.device,
            dtype=tensor.dtype,
            size=tuple(as_expr(s) for s in tensor.shape),
            stride=tuple(as_expr(s) for s in tensor.stride()),
            offset=as_expr(tensor.storage_offset()),
        )

    @staticmethod
    def contiguous(
        device: torch.device, dtype: torch.dtype, size: tuple[sympy.Expr, ...]
    ) -> Layout:
        """A dense row-major layout (what computed buffers use)."""
        return Layout(device, dtype, size, contiguous_strides(size))

    def storage_extent(self) -> sympy.Expr:
        """One past the largest storage offset the layout addresses (0 when empty)."""
        extent = self.offset + 1
        for size, stride in zip(self.size, self.stride, strict=True):
            extent = extent + (size - 1) * stride
        if any(s == 0 for s in self.size):
            return sympy.Integer(0)
        return sympy.expand(extent)

    @property
    def is_static(self) -> bool:
        """Whether sizes, strides and offset are all integers (no size symbols)."""
        return all(isinstance(e, sympy.Integer) for e in (*self.size, *self.stride, self.offset))

    def runtime_offset(self, name: str) -> Layout:
        """This layout of the input `name`, with a storage offset read off the tensor at
        each call (the symbol `offset_symbol(name)`) unless the layout is static (and
        so checked at each call). Even an offset the graph already has as a size
        symbol is read off the tensor: Dynamo may pass that symbol's value as a graph
        input too, and the kernels must index where the tensor really starts."""
        if self.is_static:
            return self
        return replace(self, offset=offset_symbol(name))

    def runtime_symbols(self) -> Iterator[tuple[sympy.Symbol, str, int | None]]:
        """`(symbol, method, dim)` for each size symbol that stands alone as one of the
        layout's sizes, strides or offset: the runtime binds it from a tensor of this
        layout with `tensor.size(dim)`, `tensor.stride(dim)` or `tensor.storage_offset()`
        (`dim` None). The interpreter and the generated wrapper both bind through it."""
        for method, exprs in (("size", self.size), ("stride", self.stride)):
            for dim, expr in enumerate(exprs):
                if isinstance(expr, sympy.Symbol):
                    yield expr, method, dim
        if isinstance(self.offset, sympy.Symbol):
            yield self.offset, "storage_offset", None

    @property
    def ndim(self) -> int:
        return len(self.size)

    @property
    def free_symbols(self) -> frozenset[sympy.Symbol]:
        symbols: set[sympy.Symbol] = set()
        for e in (*self.size, *self.stride, self.offset):
            symbols |= e.free_symbols
        return frozenset(symbols)

    def numel(self) -> sympy.Expr:
        return sympy.Mul(*self.size) if self.size else sympy.Integer(1)

    def __str__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        size = ", ".join(str(s) for s in self.size)
        stride = ", ".join(str(s) for s in self.stride)
        offset = f", offset={self.offset}" if self.offset != 0 else ""
        return f"{dtype}[{size}] stride=({stride}){offset} {self.device}"


def contiguous_strides(size: tuple[sympy.Expr, ...]) -> tuple[sympy.Expr, ...]:
    strides: list[sympy.Expr] = []
    running: sympy.Expr = sympy.Integer(1)
    for s in reversed(size):
        strides.append(running)
        running = running * s
    return tuple(reversed(strides))


def offset_symbol(name: str) -> sympy.Symbol:
    """The size symbol of input `name`'s storage offset (see `Layout.runtime_offset`)."""
    return sympy.Symbol(f"offset_{name}", integer=True, nonnegative=True)


def conforms(tensor: torch.Tensor, size: Sequence[int], stride: Sequence[int], offset: int) -> bool:
    """Whether kernels that index `tensor`'s storage with `stride` from `offset` read
    its elements. The stride of a dimension of size 1 is never used, so it is not
    compared; an empty tensor is read nowhere, so it always conforms."""
    if 0 in size:
        return True
    if tensor.storage_offset() != offset or tensor.dim() != len(size):
        return False
    actual = tensor.stride()
    if actual == tuple(stride):
        return True
    return all(a == s for a, s, n in zip(actual, stride, size, strict=True) if n > 1)


def laid_out(
    tensor: torch.Tensor, size: Sequence[int], stride: Sequence[int], offset: int
) -> torch.Tensor:
    """A copy of `tensor` with `stride` at storage offset `offset`, in a fresh storage
    just large enough. Where `stride` broadcasts a dimension (stride 0), one slice is
    stored for all: a tensor expected with that layout was traced as an expand, equal
    along that dimension, so its first slice is kept."""
    size, stride = tuple(size), tuple(stride)
    if tuple(tensor.shape) != size:
        raise RuntimeError(
            f"ember: a tensor of sizes {tuple(tensor.shape)} cannot take the layout "
            f"{size} stride {stride}; this is a bug in ember's guards, please report it"
        )
    extent = 1 + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    kept = tuple(1 if s == 0 else n for n, s in zip(size, stride, strict=True))
    with torch.no_grad():
        storage = torch.empty(offset + extent, dtype=tensor.dtype, device=tensor.device)
        source = tensor[tuple(slice(0, n) for n in kept)]
        storage.as_strided(kept, stride, offset).copy_(source)
    return storage.as_strided(size, stride, offset)
