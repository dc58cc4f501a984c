"""The OpenMP schedule of reduction kernels (the prelude's `EMBER_REDUCTION_SCHEDULE`):
rendered into the loop over outer points, static by default, and any schedule gives
the same bits, since each outer point is reduced by one thread in a fixed order
whichever thread that is (benchmarks/cpu_threads.py times them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from cpp_harness import run_compiled, trace

from ember.codegen.cpp import CPP_CHOICES, PRELUDE, CppSource, render_kernels
from ember.runtime.cpp_kernels import CppKernel, compile_cpp_source

SCHEDULES = ("static", "dynamic", "dynamic,3", "guided")

CASES: dict[str, tuple[Callable[..., Any], tuple[int, ...]]] = {
    "rows": (lambda x: x.sum(-1), (4099, 17)),
    "softmax": (lambda x: x.softmax(-1), (301, 257)),
    "columns": (lambda x: x.sum(0), (257, 3001)),
}


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _runner(
    fn: Callable[..., Any], x: torch.Tensor, cache: Path
) -> tuple[str, Callable[[str], torch.Tensor]]:
    """The rendered source, and a function building it under a schedule and running it."""
    case = trace("schedule", fn, (x,), choices=CPP_CHOICES)
    source = render_kernels(case.kernels)

    def run(name: str) -> torch.Tensor:
        text = f"#define EMBER_REDUCTION_SCHEDULE {name}\n" + source.source
        unit = compile_cpp_source(CppSource(text, source.kernels), cache_dir=cache)
        compiled = {info.name: CppKernel(unit, info) for info in source.kernels}
        (output,) = run_compiled(case, compiled, (x,))
        result: torch.Tensor = output
        return result

    return source.source, run


def test_prelude_defaults_to_static() -> None:
    assert "#ifndef EMBER_REDUCTION_SCHEDULE\n#define EMBER_REDUCTION_SCHEDULE static\n" in PRELUDE


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_schedule_gives_the_same_bits(case: str, tmp_path: Path, two_threads: None) -> None:
    fn, shape = CASES[case]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    source, run = _runner(fn, x, tmp_path)
    assert "parallel for" in source and "schedule(EMBER_REDUCTION_SCHEDULE)" in source, source
    want = fn(x)
    first = run(SCHEDULES[0])
    torch.testing.assert_close(first, want, rtol=1e-5, atol=1e-5)
    for name in SCHEDULES[1:]:
        got = run(name)
        assert torch.equal(got, first), (name, (got - first).abs().max())


def test_an_unknown_schedule_is_a_compile_error(tmp_path: Path) -> None:
    """The macro reaches the pragma: a bad schedule name fails the build, so the
    benchmark cannot time a default schedule under another schedule's name."""
    fn, shape = CASES["rows"]
    _, run = _runner(fn, torch.randn(shape), tmp_path)
    with pytest.raises(Exception, match="schedule"):
        run("no_such_schedule")
