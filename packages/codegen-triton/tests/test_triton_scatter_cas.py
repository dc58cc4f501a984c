"""Scatters that combine in a compare-and-swap loop (products; maxima and minima of
floats; everything on 8- and 16-bit elements), run in Triton's interpreter, every
config on the menu, against eager on the CPU.

The interpreter runs a kernel's programs one after another and a block's swaps lane
by lane, so a lane whose swap finds a value another lane wrote (to its element, or to
the other half of its 32-bit word) must retry as on a GPU, and a lost update shows.
The order in which duplicates combine is not the index order there either, so the
cases are built where eager's result does not depend on it: products of powers of
two (exact in any order), one repeated value per element (the same roundings in any
order), maxima and minima. The interpreter converts float32 to bfloat16 by cutting
bits off (a GPU rounds to nearest even), so bfloat16 products are checked with exact
values only; float16 and float32 check the rounding at every step.

As in test_triton_split, the kernels run in a subprocess (`TRITON_INTERPRET=1` must
be set before Triton is imported), which prints one JSON record per case.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from triton_cases import interpret, report, run_schedule

from ember.codegen.triton import render_kernel
from ember.codegen.triton.plan import config_menu, plan_kernel
from ember.graphpasses import ember_decompositions
from ember.ir import LoweringOptions, Program, lower_graph
from ember.scheduler import Schedule, schedule_program

Case = tuple[Callable[..., Any], Callable[[torch.Generator], list[torch.Tensor]]]


def _powers_of_two(g: torch.Generator, n: int) -> torch.Tensor:
    """n values among +-1/2, +-1, +-2, +-4: their products are exact in any order."""
    magnitude = torch.tensor([0.5, 1.0, 2.0, 4.0])[torch.randint(0, 4, (n,), generator=g)]
    return torch.where(torch.rand(n, generator=g) < 0.3, -magnitude, magnitude)


def _nans(g: torch.Generator, x: torch.Tensor, share: float) -> torch.Tensor:
    """x with about `share` of its values NaN, half of those with the sign bit set."""
    picked = torch.rand(x.shape, generator=g)
    x = torch.where(picked < share / 2, torch.full_like(x, math.nan), x)
    return torch.where((picked >= share / 2) & (picked < share), -torch.full_like(x, math.nan), x)


def _products(dtype: torch.dtype) -> Case:
    def args(g: torch.Generator) -> list[torch.Tensor]:
        x = torch.tensor([1.5, 0.75, 3.0, 1.25])[torch.randint(0, 4, (10, 3), generator=g)]
        x = x * _powers_of_two(g, 30).view(10, 3)
        index = torch.randint(0, 10, (40, 3), generator=g)
        source = _powers_of_two(g, 120).view(40, 3)
        return [x.to(dtype), index, source.to(dtype), torch.randint(0, 10, (40,), generator=g)]

    def fn(x: Any, index: Any, source: Any, rows: Any) -> Any:
        return (
            x.scatter_reduce(0, index, source, "prod"),
            x.scatter_reduce(0, index, source, "prod", include_self=False),
            x.index_reduce(0, rows, source, "prod", include_self=False),
        )

    return fn, args


def _repeated_products(dtype: torch.dtype) -> Case:
    """Each element receives one value several times: ((s * a) * a) * a rounds the same
    in any order, so every step's rounding shows (index_reduce: eager's CPU kernel
    rounds each step, as its CUDA kernels do; its scatter_reduce rounds once)."""

    def args(g: torch.Generator) -> list[torch.Tensor]:
        x = 1 + torch.rand(16, generator=g)
        rows = torch.randint(0, 16, (64,), generator=g)
        per_row = 1 + torch.rand(16, generator=g) * 0.4
        return [x.to(dtype), rows, per_row[rows].to(dtype)]

    def fn(x: Any, rows: Any, source: Any) -> Any:
        return x.index_reduce(0, rows, source, "prod"), x.index_reduce(0, rows, -source, "prod")

    return fn, args


def _extrema(dtype: torch.dtype) -> Case:
    """amax and amin with duplicate indices and NaNs of both signs among the targets
    and the values: eager's NaN wins wherever one takes part."""

    def args(g: torch.Generator) -> list[torch.Tensor]:
        x = _nans(g, torch.randn(12, 4, generator=g), 0.15)
        index = torch.randint(0, 12, (30, 4), generator=g)
        source = _nans(g, torch.randn(30, 4, generator=g), 0.15)
        return [x.to(dtype), index, source.to(dtype), torch.randint(0, 12, (30,), generator=g)]

    def fn(x: Any, index: Any, source: Any, rows: Any) -> Any:
        out = []
        for mode in ("amax", "amin"):
            out.append(x.scatter_reduce(0, index, source, mode))
            out.append(x.scatter_reduce(0, index, source, mode, include_self=False))
            out.append(x.index_reduce(0, rows, source, mode, include_self=False))
        return tuple(out)

    return fn, args


def _neighbours(dtype: torch.dtype) -> Case:
    """Every element written once, by a lane of the same block as the lanes writing
    the other elements of its 32-bit word: a swap that dropped a neighbour's update,
    or that did not retry after one, leaves an element as it was."""

    def args(g: torch.Generator) -> list[torch.Tensor]:
        x = torch.randint(1, 4, (64,), generator=g).to(dtype)
        order = torch.randperm(64, generator=g)
        return [x, order, x[order] + 1]  # larger than the target, and not 1

    def fn(x: Any, order: Any, source: Any) -> Any:
        return (
            x.scatter_reduce(0, order, source, "amax"),
            x.scatter_reduce(0, order, source, "prod"),
        )

    return fn, args


def _integers(dtype: torch.dtype) -> Case:
    """Sums, products and extrema of narrow integers, with duplicates (wrapping as
    eager's do)."""

    def args(g: torch.Generator) -> list[torch.Tensor]:
        x = torch.randint(-100, 100, (9,), generator=g)
        index = torch.randint(0, 9, (40,), generator=g)
        source = torch.randint(-100, 100, (40,), generator=g)
        if not dtype.is_signed:
            x, source = x.abs(), source.abs()
        return [x.to(dtype), index, source.to(dtype)]

    def fn(x: Any, index: Any, source: Any) -> Any:
        return (
            x.index_put((index,), source, accumulate=True),
            x.scatter_reduce(0, index, source, "prod"),
            x.scatter_reduce(0, index, source, "amax", include_self=False),
            x.scatter_reduce(0, index, source, "amin"),
        )

    return fn, args


_FLOATS = {"float32": torch.float32, "float64": torch.float64}
_HALVES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
CASES: dict[str, Case] = {
    **{f"products_{n}": _products(d) for n, d in {**_FLOATS, **_HALVES}.items()},
    "repeated_products_float16": _repeated_products(torch.float16),
    "repeated_products_float32": _repeated_products(torch.float32),
    **{f"extrema_{n}": _extrema(d) for n, d in {**_FLOATS, **_HALVES}.items()},
    **{f"neighbours_{n}": _neighbours(d) for n, d in {**_HALVES, "int8": torch.int8}.items()},
    "integers_int16": _integers(torch.int16),
    "integers_int8": _integers(torch.int8),
    "integers_uint8": _integers(torch.uint8),
}


def _schedule(name: str) -> tuple[Program, Schedule, list[torch.Tensor]]:
    fn, make = CASES[name]
    args = make(torch.Generator().manual_seed(0))
    gm = make_fx(fn, decomposition_table=ember_decompositions())(*args)
    program = lower_graph(gm, options=LoweringOptions(loops=True))
    assert not program.fallback_ops, program.fallback_ops
    return program, schedule_program(program), args


def _differs(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    """Where `actual` is not eager's `expected` exactly (NaN where eager has NaN)."""
    same = (actual == expected) | (actual.isnan() & expected.isnan())
    if actual.dtype != expected.dtype or bool(same.all()):
        return None if actual.dtype == expected.dtype else f"dtype {actual.dtype}"
    at = (~same).nonzero().flatten()[:4].tolist()
    ours, eager = actual.flatten()[at].tolist(), expected.flatten()[at].tolist()
    return f"{int((~same).sum())} differ, e.g. ours {ours} eager {eager}"


_SWAP_CALL = re.compile(
    r"ember_scatter_cas\((\w+), (.+), (\S+), xmask, '(max|min)', tl\.int(?:32|64)\)"
)


def _triton_atomics(source: str) -> str:
    """The source with its swap loops replaced by Triton's float atomic max and min
    (what the scatter rendered before): to show the NaN those lose."""
    return _SWAP_CALL.sub(r"tl.atomic_\4(\1 + (\2), \3, xmask)", source)


def run_case(name: str) -> dict[str, Any]:
    fn, _ = CASES[name]
    program, schedule, args = _schedule(name)
    combining = [k for k in schedule.kernels if any(m.scatter_reduce for m in k.members)]
    scatters = [render_kernel(k).source for k in combining]
    uses_swap = bool(scatters) and all("ember_scatter_cas" in s for s in scatters)
    expected = fn(*[a.clone() for a in args])
    configs = max(len(config_menu(k, plan_kernel(k))) for k in schedule.kernels)
    errors = []
    for config in range(configs):
        actual = run_schedule(program, schedule, [a.clone() for a in args], config)
        for k, (a, e) in enumerate(zip(actual, expected, strict=True)):
            differs = _differs(a, e)
            if differs:
                errors.append(f"config {config}, output {k}: {differs}")
    record: dict[str, Any] = {"case": name, "ok": not errors, "error": "\n".join(errors[:6])}
    record["uses_swap"] = uses_swap
    if name == "extrema_float32":
        atomic = run_schedule(program, schedule, [a.clone() for a in args], edit=_triton_atomics)
        record["atomics_match"] = all(
            _differs(a, e) is None for a, e in zip(atomic, expected, strict=True)
        )
    return record


@pytest.fixture(scope="module")
def interpreted() -> dict[str, dict[str, Any]]:
    return interpret(__file__, list(CASES), processes=2)


@pytest.mark.parametrize("case", list(CASES))
def test_swap_scatter_matches_eager_in_the_interpreter(
    case: str, interpreted: dict[str, dict[str, Any]]
) -> None:
    record = interpreted.get(case)
    assert record is not None, f"case {case} did not report"
    assert record["ok"], record.get("error")
    assert record["uses_swap"], "a scatter kernel of the case does not use the swap loop"


def test_triton_float_atomics_lose_the_nan_eager_keeps(
    interpreted: dict[str, dict[str, Any]],
) -> None:
    """Why float maxima and minima take the swap loop: the same kernels with Triton's
    atomic max and min (which compare the bits as integers) miss eager's NaN: a NaN
    without its sign bit loses every minimum there, one with it every maximum."""
    record = interpreted["extrema_float32"]
    assert record["ok"], record.get("error")
    assert record["atomics_match"] is False


if __name__ == "__main__":
    report(run_case, sys.argv[1:])
