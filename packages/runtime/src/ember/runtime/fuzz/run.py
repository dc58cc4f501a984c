"""Run one fuzzer program eagerly, in float64 and through ember, and judge the result.

The program runs eagerly (the expected values), with its floating dtypes replaced by
float64 (the precise reference of the accuracy rule), and compiled. A dynamic program
is compiled once with `dynamic=True` and run at both of its size sets. Ember runs in
strict mode so a compile failure is a finding, not a silent eager fallback.

Where eager raises the error a user's bad input earns (an index out of range, an
integer division by zero: `EXPECTED_ERROR`), ember must raise one too; returning
values there is a finding ('missed-error'). Any other eager error means the generator
made an invalid program.

The compiler is a parameter (`compile_fn`) so that tests can plant a bug and check
that the fuzzer finds it and the shrinker reduces it.
"""

from __future__ import annotations

import functools
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ember.runtime.accuracy import Comparison, compare, tolerance
from ember.runtime.check import metadata_mismatch
from ember.runtime.config import config
from ember.runtime.fuzz.program import Program, build_function, least_precise_float, make_inputs
from ember.runtime.fuzz.rounded import RoundedOps

CompileFn = Callable[[Callable[..., Any], bool], Callable[..., Any]]


def compile_with_ember(fn: Callable[..., Any], dynamic: bool) -> Callable[..., Any]:
    return torch.compile(fn, backend="ember", dynamic=dynamic or None)


@dataclass(frozen=True)
class Finding:
    """What went wrong: `kind` is 'error', 'mismatch' or 'metadata'; `invalid` if eager fails."""

    kind: str
    detail: str


INVALID = "invalid"  # eager itself raised: the program is not valid (shrinker rejects it)
# What eager raises for bad input that a program may hold on purpose, and what ember's
# error must say too.
EXPECTED_ERROR = re.compile(r"out of (\w+ )?(range|bounds)|ZeroDivision|division by zero", re.I)


def run_program(
    program: Program,
    *,
    device: str = "cpu",
    compile_fn: CompileFn = compile_with_ember,
    stats: dict[str, int] | None = None,
) -> Finding | None:
    """None when ember agrees with eager at every size set (or raises where eager
    does: counted as `stats['raised']`); else the first finding."""
    size_sets = [dict(program.sizes)]
    if program.dynamic:
        size_sets.append(dict(program.dynamic_sizes))
    eager_fn = build_function(program)
    ref_fn = build_function(program, float64=True)
    runs: list[tuple[list[torch.Tensor], Any, Any]] = []
    for sizes in size_sets:
        inputs = make_inputs(program, sizes, program.seed, device=device)
        try:
            expected = eager_fn(*inputs)
        except Exception as exc:
            if not EXPECTED_ERROR.search(str(exc)):
                return Finding(INVALID, f"eager raised {type(exc).__name__}: {exc}")
            runs.append((inputs, exc, None))
            continue
        try:
            refs = make_inputs(program, sizes, program.seed, float64=True, device=device)
            runs.append((inputs, expected, ref_fn(*refs)))
        except Exception as exc:
            return Finding(INVALID, f"the float64 reference raised {type(exc).__name__}: {exc}")
    rounded = [_rounded_oracle(eager_fn, inputs) for inputs, _, _ in runs]
    torch._dynamo.reset()
    with config.scope(strict=True):
        compiled = compile_fn(_positional(eager_fn), program.dynamic)
        for index, (inputs, expected, reference) in enumerate(runs):
            where = f"run {index} (sizes {size_sets[index]})"
            try:
                actual = compiled(*inputs)  # programs never write their inputs
            except Exception as exc:
                first_line = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
                if isinstance(expected, Exception) and EXPECTED_ERROR.search(str(exc)):
                    if stats is not None:  # eager raised for the bad input, and so did ember
                        stats["raised"] = stats.get("raised", 0) + 1
                    continue
                frames = traceback.extract_tb(exc.__traceback__)
                raised_at = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
                return Finding("error", f"{where}: {first_line[:400]}{raised_at}")
            if isinstance(expected, Exception):
                return Finding("missed-error", f"{where}: eager raised {expected!s:.200}")
            finding = _judge(program, actual, expected, reference, where, rounded[index])
            if finding is not None:
                return finding
    return None


def _positional(fn: Callable[..., Any]) -> Callable[..., Any]:
    def program(*args: Any) -> Any:
        return fn(*args)

    return program


def _rounded_oracle(fn: Callable[..., Any], inputs: list[torch.Tensor]) -> Callable[[], Any]:
    """Eager's outputs with each low-precision op correctly rounded (`RoundedOps`),
    computed on first use (None where that run fails)."""

    @functools.cache
    def run() -> Any:
        try:
            with RoundedOps():  # type: ignore[no-untyped-call]  # torch stub
                return fn(*inputs)
        except Exception:
            return None

    return run


def _judge(
    program: Program,
    actual: Any,
    expected: Any,
    reference: Any,
    where: str,
    rounded: Callable[[], Any] = lambda: None,
) -> Finding | None:
    """The first finding among the outputs, or None. A float16/bfloat16 output that
    misses eager's passes if it meets the same rule against `rounded()`: eager with
    each op correctly rounded, which is what ember computes (see `rounded.py`)."""
    for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
        name = program.outputs[index]
        meta = metadata_mismatch(a, e)
        if meta is not None and meta.startswith(("dtype", "sizes")):
            return Finding("metadata", f"{where}: output {index} ({name}): {meta}")
        rtol = atol = None
        computed_in = least_precise_float(program, name)
        if a.is_floating_point() and computed_in is not None:
            low, own = tolerance(getattr(torch, computed_in)), tolerance(e.dtype)
            rtol, atol = max(low[0], own[0]), max(low[1], own[1])
        comparison = compare(a, e, reference=reference[index], rtol=rtol, atol=atol)
        if not comparison.ok and computed_in in ("float16", "bfloat16"):
            oracle = rounded()
            if (
                oracle is not None
                and compare(a, oracle[index], reference=reference[index], rtol=rtol, atol=atol).ok
            ):
                comparison = Comparison(True)
        if not comparison.ok:
            return Finding("mismatch", f"{where}: output {index} ({name}): {comparison.describe()}")
        if meta is not None:
            return Finding("metadata", f"{where}: output {index} ({name}): {meta}")
    return None
