"""FusedKernel: the contract between the scheduler and the codegens.

A fused kernel runs one loop nest over `ranges` (the outer, parallel dimensions,
variables `i0, i1, ...`) and, when it reduces, `reduction_ranges` (the inner
dimensions, variables `r0, r1, ...`). Its `members` are IR computed buffers, in
evaluation order, each rewritten into the kernel's variables:

- a `pointwise` member computes `body` at every outer point (`over_reduction=False`)
  or at every outer x inner point (`over_reduction=True`, e.g. softmax's division);
- a `reduction` member combines `body` over the inner dimensions into one value per
  outer point (`welford` yields two: mean and M2, stored at `index` and at
  `index + layout.stride[-1]`);
- a `scan` member computes, at every outer x inner point, the running combination
  (`scan`: 'sum', 'prod', 'logsumexp', 'max', 'min', 'argmax', 'argmin'; the rules
  of ember.ir.loops.SCAN_KINDS) of `body` along the kernel's one inner dimension `r0`
  (the scanned one) up to and including that point, carried in `body.dtype`, and
  stores it at `index` as `layout.dtype`. A scan kernel holds scan members only
  (siblings over the same space, such as cummax's values and indices), each stored;
  codegens run `r0` in order, carrying the running values from one point to the next;
- a `sort` member orders, at every outer point, the values of `body` along the
  kernel's one inner dimension `r0` (`r0 = 0 .. length - 1`, the kernel's
  `reduction_ranges`) by the rule of `sort` (a `SortSpec`: ascending or descending,
  the order of ember.ir.loops.Sort: NaN largest, ties in input order) and stores the
  first `sort.count` of that order at `index`, in which `r0` is then the position in
  the order (`r0 < sort.count` only): the values as `layout.dtype`, or with
  `sort.indices` the `r0` each value came from (int64). A sort kernel holds sort
  members only, siblings over the same space and body (sort's values and indices),
  which codegens may sort once;
- a `scatter` member (always alone in its kernel) stores `body` at the data-dependent
  `index` (which may use `ind0, ind1, ...`, the values of `indirect`) into the
  storage of the buffer it mutates, combining with `scatter_reduce` when set.

Bodies read memory through `Load`s, with two kernel-local exceptions the codegen must
honour: loads of a *pointwise* member of the same kernel never appear (the scheduler
inlined that member's body), and a load of a *reduction* member of the same kernel
(`kernel.local_reductions`) means the value that member computed for the current
outer point (`local_value` tells which one, for welford). A member with
`stored=False` is not written to memory at all: only other members use it.
Loads may carry masks and indirect indices (see ember.ir.expr.Load).

A kernel with `matmul` set is a matrix product with an epilogue (ember.scheduler.
epilogue): its first member is a `sum` reduction over the one inner dimension `r0`
(the K of the product) whose body is the product of two plain loads, A and B
(`matmul_operands`), each converted to float32; the products are accumulated in
float32 and the member's value (rounded to its dtype) is what the other members, all
pointwise over the outer dimensions, read. The outer variables each operand's index
uses say their roles (`matmul_roles`): only A's is M, only B's is N, both is a batch.
Codegens that render such kernels say so (`DeviceChoices.matmul_templates`); the
scheduler's interpreter runs them as the reduction they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import sympy
import torch

from ember.ir import Layout, Load, Node, Rand, walk
from ember.ir.expr import map_dag

POINTWISE = "pointwise"
REDUCTION = "reduction"
SCATTER = "scatter"
SCAN = "scan"
SORT = "sort"


@dataclass(frozen=True)
class SortSpec:
    """What a sort member keeps of its ordered row (see the module docstring)."""

    descending: bool
    count: sympy.Expr  # the first `count` of the order are stored
    indices: bool  # stores positions along the row, not values


@dataclass(frozen=True)
class MatmulSpec:
    """How a matmul kernel's product is computed (see the module docstring).

    `tf32`: float32 operands may be rounded to TF32 inside the product (torch's
    `torch.backends.cuda.matmul.allow_tf32` when the graph was compiled); False keeps
    the product exact in float32, as eager's default."""

    tf32: bool = False


@dataclass(frozen=True)
class KernelMember:
    """One IR computed buffer inside a fused kernel, in the kernel's variables."""

    name: str
    layout: Layout
    kind: str
    body: Node
    index: sympy.Expr  # where this member's value for the current point lives
    stored: bool  # written to memory (False: only other members use it)
    over_reduction: bool = False
    reduction: str | None = None  # the reduction kind ('sum', 'welford', ...)
    scan: str | None = None  # the scan kind ('sum', 'argmax', ...)
    sort: SortSpec | None = None  # sort members only
    indirect: tuple[Node, ...] = ()  # scatter only
    scatter_reduce: str | None = None  # scatter only
    mutates: str | None = None  # the buffer whose storage this member writes
    origin: str = ""

    @property
    def dtype(self) -> torch.dtype:
        return self.layout.dtype


@dataclass(frozen=True)
class FusedKernel:
    """One generated kernel: a loop nest and the members it computes."""

    name: str
    ranges: tuple[sympy.Expr, ...]
    reduction_ranges: tuple[sympy.Expr, ...]
    members: tuple[KernelMember, ...]
    inputs: tuple[str, ...]  # buffers read from memory, sorted
    outputs: tuple[str, ...]  # buffers written to memory, in member order
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    # Provenance: the FX nodes whose computation the kernel holds, in graph order, and
    # every IR buffer it computes, the ones inlined into their readers included.
    origins: tuple[str, ...] = ()
    computes: tuple[str, ...] = ()
    matmul: MatmulSpec | None = None  # a matrix product with an epilogue

    @property
    def local_reductions(self) -> frozenset[str]:
        return frozenset(m.name for m in self.members if m.kind == REDUCTION)

    @property
    def is_reduction(self) -> bool:
        return bool(self.reduction_ranges)

    @property
    def is_scan(self) -> bool:
        """A scan kernel: its inner dimension is scanned in order, not reduced."""
        return any(m.kind == SCAN for m in self.members)

    @property
    def is_sort(self) -> bool:
        """A sort kernel: each outer point orders its row along the inner dimension."""
        return any(m.kind == SORT for m in self.members)

    @property
    def is_scatter(self) -> bool:
        return any(m.kind == SCATTER for m in self.members)

    def buffer_arguments(self) -> tuple[str, ...]:
        """The kernel's buffer parameters in order: inputs, outputs, then mutated
        targets not already listed."""
        names = [*self.inputs, *self.outputs]
        for m in self.members:
            if m.mutates is not None and m.mutates not in names:
                names.append(m.mutates)
        return tuple(names)

    def buffer_dtypes(self) -> tuple[torch.dtype, ...]:
        """The element type of each of `buffer_arguments()`: a member's own dtype for
        what it writes, the loads' dtype for what is read, int64 for a random seed."""
        dtypes: dict[str, torch.dtype] = {}
        for m in self.members:
            dtypes.setdefault(m.name, m.dtype)
            if m.mutates is not None:
                dtypes[m.mutates] = m.dtype
        for m in self.members:
            for root in (m.body, *m.indirect):
                for node in walk(root):
                    if isinstance(node, Load):
                        dtypes.setdefault(node.buffer, node.dtype)
                    elif isinstance(node, Rand):
                        dtypes.setdefault(node.seed, torch.int64)
        missing = [name for name in self.buffer_arguments() if name not in dtypes]
        if missing:
            raise ValueError(f"kernel {self.name}: no member reads or writes buffer {missing[0]!r}")
        return tuple(dtypes[name] for name in self.buffer_arguments())

    def size_arguments(self) -> tuple[sympy.Symbol, ...]:
        """The size symbols the kernel's ranges and index expressions use, by name."""
        from ember.scheduler.indexing import body_exprs

        exprs = [*self.ranges, *self.reduction_ranges]
        for m in self.members:
            exprs += [m.index, *body_exprs([m.body, *m.indirect])]
        symbols = {
            s for e in exprs for s in sympy.sympify(e).free_symbols if not _is_kernel_variable(s)
        }
        return tuple(sorted(symbols, key=lambda s: s.name))

    def renamed(self, names: Mapping[str, str]) -> FusedKernel:
        """This kernel with buffers and members renamed by `names` (others unchanged),
        in every load, seed, member and argument list. The same layer repeated twelve
        times yields kernels that differ only in buffer names; renamed to names by
        position they become identical, so a codegen can compile one of them."""

        def rename(node: Node) -> Node:
            if isinstance(node, Load) and node.buffer in names:
                return replace(node, buffer=names[node.buffer])
            if isinstance(node, Rand) and node.seed in names:
                return replace(node, seed=names[node.seed])
            return node

        def new(name: str | None) -> str | None:
            return None if name is None else names.get(name, name)

        members = tuple(
            replace(
                m,
                name=names.get(m.name, m.name),
                body=map_dag(m.body, rename),
                indirect=tuple(map_dag(i, rename) for i in m.indirect),
                mutates=new(m.mutates),
                origin="",
            )
            for m in self.members
        )
        return replace(
            self,
            members=members,
            inputs=tuple(names.get(b, b) for b in self.inputs),
            outputs=tuple(names.get(b, b) for b in self.outputs),
            origins=(),
            computes=(),
        )

    def member(self, name: str) -> KernelMember:
        for m in self.members:
            if m.name == name:
                return m
        raise KeyError(f"{name!r} is not a member of kernel {self.name!r}")

    def local_value(self, load: Load) -> tuple[KernelMember, int]:
        """For a load of a local reduction: the member and which of its results
        (0; for welford 0 = mean, 1 = M2)."""
        member = self.member(load.buffer)
        if member.reduction != "welford":
            return member, 0
        delta = sympy.expand(load.index - member.index)
        if delta == 0:
            return member, 0
        if delta == member.layout.stride[-1]:
            return member, 1
        raise ValueError(f"load {load.index} of welford {member.name} reads neither mean nor M2")

    def __str__(self) -> str:
        from ember.scheduler.printing import format_kernel

        return format_kernel(self)


def _is_kernel_variable(symbol: sympy.Symbol) -> bool:
    from ember.ir.symbolic import is_indirect_var, is_loop_var

    return bool(is_loop_var(symbol) or is_indirect_var(symbol))
