"""Running a schedule's fused kernels through the compiled C++ (test helper).

The lead's wrapper does this for real; here a small driver walks the schedule's kernel
steps, allocates each stored buffer as the layout says (storage offset included),
and calls the compiled kernels, so results can be compared with the IR interpreter
(`ember.ir.run_program`) and with eager.

Table-driven test modules (a `CASES` table of functions and inputs) take their module
fixtures from `case_fixtures` (the IR patch, the traced cases, one compiled unit) and
compare each case with `check_case` (compiled against the interpreter and eager,
output by output), so that each module keeps only its cases and tolerances.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.graphpasses import ember_decompositions
from ember.ir import (
    BufferRef,
    Layout,
    LoweringOptions,
    Program,
    bind_symbols,
    call_extern,
    evaluate,
    lower_graph,
    run_program,
)
from ember.scheduler import (
    DEFAULT_CHOICES,
    DeviceChoices,
    ExternCall,
    FusedKernel,
    KernelStep,
    Schedule,
    schedule_program,
)


@dataclasses.dataclass
class Case:
    """A traced function, its IR program, schedule and kernels renamed `<case>_<kernel>`."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    program: Program
    schedule: Schedule
    kernels: list[FusedKernel]


def trace(
    name: str,
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    symbolic: bool = False,
    choices: DeviceChoices = DEFAULT_CHOICES,
) -> Case:
    mode = "symbolic" if symbolic else "real"
    gm = make_fx(fn, decomposition_table=ember_decompositions(), tracing_mode=mode)(*args)
    program = lower_graph(gm, options=LoweringOptions(loops=True))
    schedule = schedule_program(program, choices)
    renamed = [dataclasses.replace(k, name=f"{name}_{k.name}") for k in schedule.kernels]
    return Case(name, fn, tuple(args), program, schedule, renamed)


def exact_evaluate(expr: Any, bindings: Any) -> int | float | bool:
    """ember.ir.symbolic.evaluate with sympy Integer bindings: the IR's version fails
    on a bare symbol bound to a Python int (`xreplace` returns the int), which every
    symbolic program hits in `run_program`; tests patch this in until the IR fixes it."""
    exact = {k: sympy.Integer(v) for k, v in bindings.items()}
    return evaluate(sympy.sympify(expr), exact)


def _allocate(layout: Layout, bindings: dict[sympy.Symbol, int]) -> torch.Tensor:
    def value(expr: Any) -> int:
        return int(exact_evaluate(expr, bindings))

    size = [value(s) for s in layout.size]
    stride = [value(s) for s in layout.stride]
    offset = value(layout.offset)
    extent = value(layout.storage_extent())
    storage = torch.full((max(extent, 1),), 7, dtype=layout.dtype)  # garbage, never read
    return storage.as_strided(size, stride, offset)


def run_compiled(
    case: Case, compiled: dict[str, Callable[..., None]], args: Sequence[Any], seed: int = 0
) -> list[Any]:
    """Execute the case's schedule with compiled kernels (no extern calls expected)."""
    program = case.schedule.program  # with the partial buffers of split reductions
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    env: dict[str, Any] = {n.name: a for n, a in zip(program.inputs, args, strict=True)}
    env.update({c.name: c.value for c in program.constants})
    bindings = bind_symbols(program, args)
    if program.rng_seed is not None:
        env[program.rng_seed] = torch.tensor(seed, dtype=torch.int64)
    for step, kernel in zip(
        [s for s in case.schedule.steps if isinstance(s, KernelStep)], case.kernels, strict=True
    ):
        assert step.kernel.name == kernel.name.removeprefix(case.name + "_")
        for member in kernel.members:
            if member.mutates is not None:
                env[member.name] = env[member.mutates]
            elif member.stored:
                env[member.name] = _allocate(member.layout, bindings)
        tensors = [env[name] for name in kernel.buffer_arguments()]
        sizes = [bindings[s] for s in kernel.size_arguments()]
        compiled[kernel.name](*tensors, *sizes)
    for step in case.schedule.steps:
        if isinstance(step, ExternCall):
            # Only views may appear (outputs that reshape a kernel's result): no kernel
            # reads them, so they can run after the kernels.
            assert step.node.is_view, f"extern {step.node.op} in a test case"
            env[step.node.name] = call_extern(step.node, env, dict(bindings))

    def value(tree: Any) -> Any:
        if isinstance(tree, BufferRef):
            return env[tree.name]
        if isinstance(tree, sympy.Basic):
            return exact_evaluate(tree, bindings)
        if isinstance(tree, (tuple, list)):
            return [value(t) for t in tree]
        return tree

    return [value(out) for out in program.outputs]


def exact_ir_evaluation() -> Iterator[None]:
    """While it runs (a module fixture's body), `run_program` evaluates size
    expressions with `exact_evaluate`: it fails on symbolic programs otherwise."""
    modules = [sys.modules["ember.ir.evaluate"], sys.modules["ember.ir.interpreter"]]
    saved = [m.evaluate for m in modules]  # type: ignore[attr-defined]
    for m in modules:
        m.evaluate = exact_evaluate  # type: ignore[attr-defined]
    yield
    for m, original in zip(modules, saved, strict=True):
        m.evaluate = original  # type: ignore[attr-defined]


CaseTable = Mapping[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...], bool]]


def trace_cases(cases: CaseTable) -> dict[str, Case]:
    """Every case of a table of (function, arguments, symbolic) traced."""
    return {name: trace(name, fn, args, symbolic=sym) for name, (fn, args, sym) in cases.items()}


def compile_cases(traced: Mapping[str, Case], cache_dir: Path) -> dict[str, Any]:
    """The C++ launchers of every traced case's kernels, compiled together."""
    from ember.runtime.cpp_kernels import compile_cpp_kernels

    kernels = [k for case in traced.values() for k in case.kernels]
    return compile_cpp_kernels(kernels, cache_dir=cache_dir)


def leaves(tree: Any) -> list[Any]:
    """The tensors of nested lists and tuples, in order."""
    if isinstance(tree, (list, tuple)):
        return [leaf for item in tree for leaf in leaves(item)]
    return [tree]


def case_fixtures(cases: CaseTable, cache: str) -> tuple[Any, Any, Any]:
    """The module fixtures of a table-driven C++ test module, to be bound as

        _exact_ir_evaluation, traced, compiled = case_fixtures(CASES, "cpp-x-cache")

    `_exact_ir_evaluation` (autouse) keeps `exact_ir_evaluation` in force for the whole
    module; `traced`, every case traced (`trace_cases`); `compiled`, their kernels in
    one unit built into a fresh directory named after `cache` (`compile_cases`)."""

    @pytest.fixture(scope="module", autouse=True, name="_exact_ir_evaluation")
    def patched() -> Iterator[None]:
        yield from exact_ir_evaluation()

    @pytest.fixture(scope="module", name="traced")
    def traced(_exact_ir_evaluation: None) -> dict[str, Case]:
        return trace_cases(cases)

    @pytest.fixture(scope="module", name="compiled")
    def compiled(
        traced: dict[str, Case], tmp_path_factory: pytest.TempPathFactory
    ) -> dict[str, Any]:
        return compile_cases(traced, tmp_path_factory.mktemp(cache))

    return patched, traced, compiled


Tolerance = Callable[[torch.Tensor], tuple[float, float]]  # an output's (rtol, atol)


def exact(_: torch.Tensor) -> tuple[float, float]:
    """The tolerance of outputs that must equal bit for bit (NaN equal to NaN)."""
    return 0.0, 0.0


def check_case(
    case: Case,
    compiled: Mapping[str, Callable[..., None]],
    inputs: Sequence[Sequence[Any]] = (),
    *,
    tolerance: Tolerance = exact,
    eager_tolerance: Tolerance | None = None,
    eager: bool | Callable[[torch.Tensor], bool] = True,
    seed: int | None = None,
) -> None:
    """Run `case` compiled on its traced arguments and on each of `inputs`, and
    require each output to have eager's dtype and shape and to be close to the IR
    interpreter's (`tolerance`) and to eager's (`eager_tolerance`, by default the
    same). `eager`: False to leave eager out (random numbers), or which outputs to
    compare with eager's values (their dtype and shape are checked all the same).
    `seed`: of random ops, in both runs (None: 0 compiled, the interpreter's own)."""
    for args in [case.args, *inputs]:
        got = leaves(run_compiled(case, compiled, args, seed=0 if seed is None else seed))
        oracle = leaves(run_program(case.program, [_clone(a) for a in args], seed=seed))
        want = leaves(case.fn(*[_clone(a) for a in args])) if eager is not False else oracle
        for g, o, e in zip(got, oracle, want, strict=True):
            assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, e.dtype, g.shape, e.shape)
            rtol, atol = tolerance(g)
            torch.testing.assert_close(g, o, rtol=rtol, atol=atol, equal_nan=True)
            if eager is False or (callable(eager) and not eager(g)):
                continue
            rtol, atol = (eager_tolerance or tolerance)(g)
            torch.testing.assert_close(g, e, rtol=rtol, atol=atol, equal_nan=True)


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value
