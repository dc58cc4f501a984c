"""Layout: where a tensor's elements live (device, dtype, sizes, strides, offset)."""

from __future__ import annotations

from dataclasses import dataclass

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
