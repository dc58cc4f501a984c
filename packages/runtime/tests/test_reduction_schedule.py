"""The OpenMP schedule of reduction kernels: `schedule(runtime)` loops whose schedule
the library sets per loop from its thread count (the prelude's `ReductionSchedule`:
static on one thread, guided on more), the `EMBER_REDUCTION_SCHEDULE` setting
that fixes one with no rebuild, the macro that fixes one at build time, and the
property that makes all of it safe: every schedule and every choice gives the same
bits, since each outer point is reduced by one thread in a fixed order whichever
thread that is (benchmarks/cpu_threads.py times them)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from cpp_harness import Case, run_compiled, trace

from ember.codegen.cpp import CPP_CHOICES, PRELUDE, CppSource, render_kernels
from ember.runtime.config import EmberConfig, EmberConfigError, config
from ember.runtime.cpp_kernels import CompiledUnit, CppKernel, compile_cpp_source
from ember.runtime.threads import parse_reduction_schedule, schedule_code

RUN_TIME = ("auto", "static", "dynamic", "dynamic,3", "guided", "guided,7")
THREADS = (1, 2, 8)  # 8: oversubscribed here
# the choice by thread count: static on one thread, guided on more
AUTO = {1: "static", 2: "guided", 4: "guided", 8: "guided", 16: "guided"}

# row counts no thread count divides, rows short and long, a fused row kernel, columns
CASES: dict[str, tuple[Callable[..., Any], tuple[int, ...]]] = {
    "sum": (lambda x: x.sum(-1), (4099, 17)),
    "mean": (lambda x: x.mean(-1), (1031, 301)),
    "var": (lambda x: x.var(-1), (1031, 301)),
    "softmax": (lambda x: x.softmax(-1), (301, 257)),
    "columns": (lambda x: x.sum(0), (257, 3001)),
}


@pytest.fixture
def threads() -> Iterator[Callable[[int], None]]:
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def compiled(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[CompiledUnit, dict[str, Case], dict[str, CppKernel]]:
    """Every case's kernels in one library, built once as ember builds them."""
    cases = {}
    for name, (fn, shape) in CASES.items():
        x = torch.randn(shape, generator=torch.Generator().manual_seed(3))
        cases[name] = trace(f"sched_{name}", fn, (x,), choices=CPP_CHOICES)
    source = render_kernels([k for case in cases.values() for k in case.kernels])
    assert source.source.count("schedule(EMBER_REDUCTION_SCHEDULE)") >= len(CASES), source.source
    assert "const ember::ReductionSchedule ember_schedule;" in source.source
    unit = compile_cpp_source(source, cache_dir=tmp_path_factory.mktemp("schedules"))
    kernels = {info.name: CppKernel(unit, info) for info in source.kernels}
    return unit, cases, kernels


def test_prelude_makes_the_loops_read_the_run_time_schedule() -> None:
    assert "#ifndef EMBER_REDUCTION_SCHEDULE\n#define EMBER_REDUCTION_SCHEDULE runtime\n" in PRELUDE


def test_the_choice_by_thread_count(compiled: Any) -> None:
    unit: CompiledUnit = compiled[0]
    unit.set_reduction_schedule("auto")
    assert {t: unit.reduction_schedule(t) for t in AUTO} == AUTO


def test_a_fixed_schedule_holds_at_every_thread_count(compiled: Any) -> None:
    unit: CompiledUnit = compiled[0]
    try:
        for setting in ("static", "guided", "dynamic,3", " Dynamic , 64 "):
            unit.set_reduction_schedule(setting)
            want = parse_reduction_schedule(setting)
            assert [unit.reduction_schedule(t) for t in (1, 4, 16)] == [want] * 3
    finally:
        unit.set_reduction_schedule("auto")
    assert unit.reduction_schedule(16) == "guided"


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_schedule_and_thread_count_gives_the_same_bits(
    case: str, compiled: Any, threads: Callable[[int], None]
) -> None:
    unit, cases, kernels = compiled
    traced = cases[case]
    (x,) = traced.args
    results = {}
    try:
        for count in THREADS:
            threads(count)
            for setting in RUN_TIME:
                unit.set_reduction_schedule(setting)
                (results[count, setting],) = run_compiled(traced, kernels, (x,))
    finally:
        unit.set_reduction_schedule("auto")
    first = results[1, "auto"]
    torch.testing.assert_close(first, traced.fn(x), rtol=1e-5, atol=1e-5)
    # these shapes have more outer points than threads: no reduction is split over
    # threads, so the thread count cannot change the bits either
    for key, got in results.items():
        assert torch.equal(got, first), (key, (got - first).abs().max())


PROBE = r"""
// The schedule a reduction loop runs under, seen from inside: the run-sched-var that
// ReductionSchedule set (kind, chunk), which thread ran each iteration, and the
// caller's schedule after the loop.
extern "C" void probe(int threads, int caller_kind, int caller_chunk, int n, int* owner,
                      int* seen) {
  omp_sched_t saved_kind;
  int saved_chunk;
  omp_get_schedule(&saved_kind, &saved_chunk);
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(threads);
  omp_set_schedule(static_cast<omp_sched_t>(caller_kind), caller_chunk);
  {
    const ember::ReductionSchedule ember_schedule;
    omp_sched_t kind;
    omp_get_schedule(&kind, &seen[1]);
    seen[0] = static_cast<int>(kind);
    #pragma omp parallel for schedule(EMBER_REDUCTION_SCHEDULE)
    for (int i = 0; i < n; ++i) owner[i] = omp_get_thread_num();
  }
  omp_sched_t kind;
  omp_get_schedule(&kind, &seen[3]);
  seen[2] = static_cast<int>(kind);
  omp_set_schedule(saved_kind, saved_chunk);
  omp_set_num_threads(saved_threads);
}
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], tuple[list[int], ...]]:
    unit = compile_cpp_source(
        CppSource(PRELUDE + PROBE, ()), cache_dir=tmp_path_factory.mktemp("probe")
    )
    function = unit.library.probe
    function.restype = None
    caller = schedule_code("dynamic,5")  # the caller's own, to be put back

    def run(threads: int) -> tuple[list[int], ...]:
        n = 64
        owner, seen = (ctypes.c_int * n)(), (ctypes.c_int * 4)()
        function(threads, *caller, n, owner, seen)
        return list(owner), list(seen[:2]), list(seen[2:])

    return run


# not 2: guided's first chunk is then static's first share, and its later chunks can
# all fall to the other thread, as static would give them
@pytest.mark.parametrize("count", [1, 4, 8, 16])
def test_the_loop_runs_under_the_choice_and_the_caller_keeps_its_own(
    count: int, probe: Callable[[int], tuple[list[int], ...]]
) -> None:
    owner, inside, after = probe(count)
    assert after == list(schedule_code("dynamic,5"))
    if count == 1:
        assert inside == [schedule_code("static")[0], 0]
        # equal contiguous shares, in thread order
        assert owner == [i * count // 64 for i in range(64)]
    else:
        assert inside == [schedule_code("guided")[0], 1]  # guided's least chunk: 1
        # guided's chunks shrink (64 / count first, then less): one of them spans the
        # boundary of two of static's equal shares, which static gives to two threads
        assert owner != [i * count // 64 for i in range(64)], owner


def test_the_setting_is_read_as_a_library_loads(tmp_path: Path) -> None:
    fn, shape = CASES["sum"]
    case = trace("sched_setting", fn, (torch.randn(shape),), choices=CPP_CHOICES)
    source = render_kernels(case.kernels)
    with config.scope(reduction_schedule="guided,5"):
        fixed = compile_cpp_source(source, cache_dir=tmp_path)
        assert [fixed.reduction_schedule(t) for t in (1, 16)] == ["guided,5"] * 2
    # a second load of the same library (a cache hit, nothing rebuilt) under the default
    again = compile_cpp_source(source, cache_dir=tmp_path)
    assert again.compile_seconds == 0.0 and again.path == fixed.path
    assert [again.reduction_schedule(t) for t in (1, 16)] == ["static", "guided"]


def test_the_setting_parses_and_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBER_REDUCTION_SCHEDULE", raising=False)
    assert EmberConfig().reduction_schedule == "auto"
    for text, want in [("STATIC", "static"), ("dynamic, 8", "dynamic,8"), ("", "auto")]:
        monkeypatch.setenv("EMBER_REDUCTION_SCHEDULE", text)
        assert EmberConfig().reduction_schedule == want
    for bad in ("runtime", "dynamic,0", "static,x", "guided,", "auto,4"):
        monkeypatch.setenv("EMBER_REDUCTION_SCHEDULE", bad)
        with pytest.raises(EmberConfigError, match=r"EMBER_REDUCTION_SCHEDULE.*'dynamic'"):
            _ = EmberConfig().reduction_schedule


def test_a_library_without_the_choice_loads_and_says_so(tmp_path: Path) -> None:
    """Libraries built before the choice existed (ahead-of-time packages) have no
    setter: loading them under a fixed schedule neither fails nor pretends."""
    old = 'extern "C" void ember_set_num_threads(int) {}\n'
    with config.scope(reduction_schedule="dynamic"):
        unit = compile_cpp_source(CppSource(old, ()), cache_dir=tmp_path)
    assert unit.reduction_schedule(8) is None


def test_end_to_end_results_do_not_depend_on_the_thread_count(
    threads: Callable[[int], None],
) -> None:
    """Through the backend: one compiled graph called at 1 thread (static) and at 8
    (guided) gives the same bits."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.sum(-1), x.mean(-1), x.var(-1), x.softmax(-1)

    x = torch.randn(1031, 301)
    compiled_fn = torch.compile(fn, backend="ember")
    threads(1)
    one = compiled_fn(x)
    threads(8)
    eight = compiled_fn(x)
    for a, b, want in zip(one, eight, fn(x), strict=True):
        torch.testing.assert_close(a, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(a, b), (a - b).abs().max()


def test_the_build_time_macro_fixes_the_schedule(tmp_path: Path) -> None:
    """The macro reaches the pragma: a bad schedule name fails the build, so the
    benchmark's built-in schedule cannot be another under its name."""
    fn, shape = CASES["sum"]
    case = trace("sched_macro", fn, (torch.randn(shape),), choices=CPP_CHOICES)
    source = render_kernels(case.kernels)
    text = "#define EMBER_REDUCTION_SCHEDULE static\n" + source.source
    built = compile_cpp_source(CppSource(text, source.kernels), cache_dir=tmp_path)
    x = torch.randn(shape)
    (got,) = run_compiled(case, {i.name: CppKernel(built, i) for i in source.kernels}, (x,))
    torch.testing.assert_close(got, fn(x), rtol=1e-5, atol=1e-5)
    bad = "#define EMBER_REDUCTION_SCHEDULE no_such_schedule\n" + source.source
    with pytest.raises(Exception, match="schedule"):
        compile_cpp_source(CppSource(bad, source.kernels), cache_dir=tmp_path)
