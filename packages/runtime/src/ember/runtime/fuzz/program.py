"""Random programs for the differential fuzzer: what they are and how they print.

A `Program` is straight-line Python over torch: inputs with symbolic shapes (dimension
names like `d0`, or `1` for a broadcast dimension), then steps, each one assignment
`vN = <expression over earlier values>`, then a tuple of outputs. Programs are plain
data (frozen dataclasses) so the shrinker can edit them, and they print as source, so
a failing one becomes a standalone script. Sizes live beside the shapes (`sizes`, and
`dynamic_sizes` for a second run that changes every dimension longer than one), so the
same program runs at several sizes under `torch.compile(dynamic=True)`.

The float64 reference run prints the same program with every floating dtype replaced by
float64 (`render(program, float64=True)`).

Programs never write their inputs, so every run passes the same input tensors as they
are: an input may be a view at a storage offset, or overlap an earlier input's storage
(`Input.offset`, `Input.shares`), which is how the fuzzer reaches the runtime's layout
rules. An index input (`Input.index_of`) holds indices into a dimension, negative
ones too for the ops that wrap them (`Input.wraps`: advanced indexing, index_put),
and may hold one out of range (`Input.bad_index`): eager raises, and so must ember.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")


@dataclass(frozen=True)
class Input:
    """A program input: name, shape as dimension keys, dtype name, and where it lies."""

    name: str
    shape: tuple[str, ...]
    dtype: str
    offset: int = 0  # the storage offset of the view the program is given
    shares: str | None = None  # an earlier input whose storage this view overlaps
    index_of: str | None = None  # an index input into a dimension of this key (size n)
    wraps: bool = False  # its values span [-n, n) (ops that wrap negatives), else [0, n)
    bad_index: str | None = None  # an expression of n put in its first element (eager raises)


@dataclass(frozen=True)
class Step:
    """One assignment: `out = template.format(*args)`; args name earlier values."""

    out: str
    template: str
    args: tuple[str, ...]

    def expression(self) -> str:
        return self.template.format(*self.args)


@dataclass(frozen=True)
class Program:
    """A straight-line torch program plus the sizes to run it at."""

    inputs: tuple[Input, ...]
    steps: tuple[Step, ...]
    outputs: tuple[str, ...]
    sizes: tuple[tuple[str, int], ...]  # base dimension -> size
    dynamic_sizes: tuple[tuple[str, int], ...] = ()  # second run's sizes (dynamic programs)
    seed: int = 0

    @property
    def dynamic(self) -> bool:
        return bool(self.dynamic_sizes)

    def with_steps(self, steps: tuple[Step, ...], outputs: tuple[str, ...]) -> Program:
        return replace(self, steps=steps, outputs=outputs)

    def live(self) -> Program:
        """Drop steps and inputs no output depends on."""
        needed = set(self.outputs)
        kept: list[Step] = []
        for step in reversed(self.steps):
            if step.out in needed:
                kept.append(step)
                needed |= set(step.args)
        inputs = tuple(i for i in self.inputs if i.name in needed)
        return replace(self, steps=tuple(reversed(kept)), inputs=inputs)


def least_precise_float(program: Program, name: str) -> str | None:
    """The least precise floating dtype value `name` is computed through (its inputs'
    dtypes and the targets of its casts): a float32 sum cast to float64 is only as
    exact as float32, and is judged at float32's tolerance."""
    producers = {step.out: step for step in program.steps}
    dtypes = {i.name: i.dtype for i in program.inputs}
    found: set[str] = set()
    pending, seen = [name], set()
    while pending:
        value = pending.pop()
        if value in seen:
            continue
        seen.add(value)
        if value in dtypes:
            found.add(dtypes[value])
        elif value in producers:
            found.update(_DTYPE_IN_TEMPLATE.findall(producers[value].template))
            pending.extend(producers[value].args)
    floats = [d for d in _PRECISION if d in found]
    return floats[0] if floats else None


_PRECISION = ("bfloat16", "float16", "float32", "float64")  # least precise first


def dim_size(key: str, sizes: dict[str, int]) -> int:
    """Size of a dimension key: '1', a base name, or an expression over base names."""
    return int(eval(key, {"__builtins__": {}}, dict(sizes)))


def input_sizes(inp: Input, sizes: dict[str, int]) -> list[int]:
    return [dim_size(k, sizes) for k in inp.shape]


_DTYPE_IN_TEMPLATE = re.compile(r"torch\.(float32|bfloat16|float16|float64)\b")


def render_function(program: Program, *, float64: bool = False, name: str = "program") -> str:
    """The program as a Python function `name(*inputs)` returning a tuple."""
    params = ", ".join(i.name for i in program.inputs)
    lines = [f"def {name}({params}):"]
    for step in program.steps:
        expr = step.expression()
        if float64:
            expr = _DTYPE_IN_TEMPLATE.sub("torch.float64", expr)
        lines.append(f"    {step.out} = {expr}")
    outs = ", ".join(program.outputs)
    lines.append(f"    return ({outs}{',' if len(program.outputs) == 1 else ''})")
    return "\n".join(lines) + "\n"


def build_function(program: Program, *, float64: bool = False) -> Callable[..., Any]:
    """Execute the rendered source and return the function object."""
    namespace: dict[str, Any] = {"torch": torch}
    exec(render_function(program, float64=float64), namespace)
    function: Callable[..., Any] = namespace["program"]
    return function


def render_inputs(program: Program, sizes: dict[str, int], *, seed_expr: str = "seed") -> str:
    """Source that builds the inputs with a seeded generator (for reproducers)."""
    lines = [f"gen = torch.Generator().manual_seed({seed_expr})"]
    for inp in program.inputs:
        shape = input_sizes(inp, sizes)
        if inp.index_of is not None:
            n = dim_size(inp.index_of, sizes)
            bad, wraps = inp.bad_index, inp.wraps
            lines.append(f"{inp.name} = make_index({shape}, {n}, gen, {bad!r}, wraps={wraps})")
        else:
            lines.append(f"{inp.name} = make_input({shape}, torch.{inp.dtype}, gen)")
    placements = _placements(program)
    if any(p != (0, None) for p in placements):
        names = ", ".join(i.name for i in program.inputs)
        lines.append(f"{names}, = place_views([{names}], {placements!r}, DEVICE)")
    return "\n".join(lines) + "\n"


def make_input(shape: list[int], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random values for one input: normal floats, small integers, random booleans."""
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    return torch.randint(-5, 6, shape, generator=gen, dtype=dtype)


def make_index(
    shape: list[int], n: int, gen: torch.Generator, bad: str | None = None, *, wraps: bool = False
) -> torch.Tensor:
    """int64 indices into a dimension of size `n` (negative ones too, if `wraps`);
    with `bad`, the first element is that expression of n (out of range)."""
    index = torch.randint(-n if wraps else 0, n, shape, generator=gen, dtype=torch.int64)
    if bad is not None and index.numel():
        index.view(-1)[0] = int(eval(bad, {"__builtins__": {}}, {"n": n}))
    return index


def place_views(
    tensors: list[torch.Tensor],
    placements: list[tuple[int, int | None]],
    device: str | torch.device = "cpu",
) -> list[torch.Tensor]:
    """Each tensor as a contiguous view at storage offset `placements[i][0]`, in a
    storage of its own or, where `placements[i][1]` names an earlier tensor's position,
    in that tensor's storage (the views overlap: the later one's values win where they
    do). Elements no view covers hold NaN (or a large integer), so a read of the wrong
    place shows. Every tensor comes back on `device` (a copy to another device would
    start at offset 0 again)."""
    groups: dict[int, list[int]] = {}
    for i, (offset, shares) in enumerate(placements):
        if offset or shares is not None:
            groups.setdefault(i if shares is None else shares, []).append(i)
    placed = [t.to(device) for t in tensors]
    for root, members in groups.items():
        members = sorted({root, *members})
        length = max(placements[i][0] + tensors[i].numel() for i in members) + 3
        dtype = tensors[root].dtype
        fill = float("nan") if dtype.is_floating_point else (True if dtype == torch.bool else 99991)
        storage = torch.full((length,), fill, dtype=dtype, device=device)
        for i in members:
            t = tensors[i]
            view = storage.as_strided(t.shape, t.contiguous().stride(), placements[i][0])
            view.copy_(t)
            placed[i] = view
    return placed


def _placements(program: Program) -> list[tuple[int, int | None]]:
    """(offset, position of the shared input or None) per input; a shared input that
    shrinking removed leaves a view of the input's own storage."""
    positions = {inp.name: k for k, inp in enumerate(program.inputs)}
    return [
        (inp.offset, positions.get(inp.shares) if inp.shares is not None else None)
        for inp in program.inputs
    ]


def make_inputs(
    program: Program,
    sizes: dict[str, int],
    seed: int,
    *,
    float64: bool = False,
    device: str | torch.device = "cpu",
) -> list[torch.Tensor]:
    """The program's inputs on `device`, values from a generator seeded with `seed`."""
    gen = torch.Generator().manual_seed(seed)
    tensors = []
    for i in program.inputs:
        shape = input_sizes(i, sizes)
        if i.index_of is not None:
            n = dim_size(i.index_of, sizes)
            tensors.append(make_index(shape, n, gen, i.bad_index, wraps=i.wraps))
        else:
            tensors.append(make_input(shape, getattr(torch, i.dtype), gen))
    tensors = place_views(tensors, _placements(program), device)
    if float64:
        tensors = [t.double() if t.is_floating_point() else t for t in tensors]
    return tensors
