"""Run a Schedule with plain torch ops: the oracle for fusion and for the codegens.

Each fused kernel is evaluated the way its contract (kernel.py) says a codegen must run
it: members in order over the kernel's iteration space, reductions combined over the
inner dimensions, scans carried along it, sorts ordering it, loads of kernel-local
reductions reading the value for the current outer point. Comparing `run_schedule` with the IR's
`run_program` tests the scheduler's fusion decisions without any code generator;
comparing a codegen's kernels with it tells codegen bugs from scheduling bugs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from ember.ir import Layout, argument_value, bind_symbols, call_extern, evaluate
from ember.ir.evaluate import BodyEvaluator, _reduce, scan_values, sort_values, storage_of
from ember.ir.interpreter import conform
from ember.ir.symbolic import indirect_var
from ember.scheduler.kernel import REDUCTION, SCAN, SCATTER, SORT, FusedKernel, KernelMember
from ember.scheduler.schedule import ExternCall, KernelStep, Schedule, SelectOutput


def _empty(layout: Layout, bindings: dict[sympy.Symbol, int]) -> torch.Tensor:
    size = [int(evaluate(s, bindings)) for s in layout.size]
    stride = [int(evaluate(s, bindings)) for s in layout.stride]
    return torch.empty_strided(size, stride, dtype=layout.dtype, device=layout.device)


def _store(target: torch.Tensor, index: Any, values: torch.Tensor) -> None:
    flat = storage_of(target)
    where = torch.as_tensor(index, dtype=torch.int64)
    where, values = torch.broadcast_tensors(where, values.to(flat.dtype))  # type: ignore[no-untyped-call]  # torch stub
    flat[where.reshape(-1)] = values.reshape(-1)


def run_kernel(kernel: FusedKernel, env: dict[str, Any], bindings: dict[sympy.Symbol, int]) -> None:
    """Execute one fused kernel, writing its stored members into `env`'s tensors."""
    ranges = tuple(int(evaluate(r, bindings)) for r in kernel.ranges)
    inner = tuple(int(evaluate(r, bindings)) for r in kernel.reduction_ranges)
    for member in kernel.members:
        if member.name not in env:  # a local value: scratch storage in its layout
            env[member.name] = _empty(member.layout, bindings)
        _run_member(member, env, bindings, ranges, inner)


def _run_member(
    member: KernelMember,
    env: dict[str, Any],
    bindings: dict[sympy.Symbol, int],
    ranges: tuple[int, ...],
    inner: tuple[int, ...],
) -> None:
    target = env[member.mutates] if member.mutates is not None else env[member.name]
    if member.kind == SCATTER:
        evaluator = BodyEvaluator(env, bindings, ranges)
        values = evaluator.run(member.body)
        extra = {
            indirect_var(k): evaluator.run(n).to(torch.int64) for k, n in enumerate(member.indirect)
        }
        where = torch.as_tensor(evaluator.index(member.index, extra), dtype=torch.int64)
        where, values = torch.broadcast_tensors(where, values.to(target.dtype))  # type: ignore[no-untyped-call]  # torch stub
        flat = storage_of(target)
        if member.scatter_reduce is None:
            flat.index_put_((where.reshape(-1),), values.reshape(-1))
        elif member.scatter_reduce == "sum":
            flat.index_put_((where.reshape(-1),), values.reshape(-1), accumulate=True)
        else:
            mode = {"prod": "prod", "max": "amax", "min": "amin"}[member.scatter_reduce]
            flat.scatter_reduce_(0, where.reshape(-1), values.reshape(-1), mode, include_self=True)
        env[member.name] = target
        return
    if member.kind == REDUCTION:
        evaluator = BodyEvaluator(env, bindings, ranges, inner)
        values = evaluator.run(member.body).broadcast_to((*ranges, *inner)).reshape(*ranges, -1)
        assert member.reduction is not None
        reduced = _reduce(values, member.reduction).to(member.dtype)
        index = BodyEvaluator(env, bindings, ranges).index(member.index)
        if member.reduction == "welford":
            _store(target, index, reduced[..., 0])
            _store(
                target,
                torch.as_tensor(index) + int(evaluate(member.layout.stride[-1], bindings)),
                reduced[..., 1],
            )
        else:
            _store(target, index, reduced)
        return
    if member.kind == SCAN:
        assert member.scan is not None
        evaluator = BodyEvaluator(env, bindings, ranges, inner)
        values = evaluator.run(member.body).to(member.body.dtype).broadcast_to((*ranges, *inner))
        _store(target, evaluator.index(member.index), scan_values(values, member.scan))
        return
    if member.kind == SORT:
        assert member.sort is not None
        values = BodyEvaluator(env, bindings, ranges, inner).run(member.body)
        values = values.to(member.body.dtype).broadcast_to((*ranges, *inner))
        count = int(evaluate(member.sort.count, bindings))
        found = sort_values(values, member.sort.descending, count, indices=member.sort.indices)
        index = BodyEvaluator(env, bindings, ranges, (count,)).index(member.index)
        _store(target, index, found)
        return
    space = (*ranges, *inner) if member.over_reduction else ranges
    evaluator = BodyEvaluator(env, bindings, ranges, inner if member.over_reduction else ())
    values = evaluator.run(member.body).broadcast_to(space)
    _store(target, evaluator.index(member.index), values)
    if member.mutates is not None:
        env[member.name] = target


def run_schedule(schedule: Schedule, args: Sequence[Any], *, seed: int | None = None) -> list[Any]:
    """Execute `schedule` on concrete inputs, following its steps and allocations."""
    program = schedule.program
    env: dict[str, Any] = {node.name: arg for node, arg in zip(program.inputs, args, strict=True)}
    env.update({c.name: c.value for c in program.constants})
    bindings = bind_symbols(program, args)
    if program.rng_seed is not None:
        drawn = int(torch.randint(0, 2**62, ()).item()) if seed is None else seed
        env[program.rng_seed] = torch.tensor(drawn, dtype=torch.int64)

    for index, step in enumerate(schedule.steps):
        for allocation in schedule.memory.allocations[index]:
            if allocation.reuse is not None:
                env[allocation.name] = env[allocation.reuse]
            else:
                env[allocation.name] = _empty(allocation.layout, bindings)
        if isinstance(step, KernelStep):
            run_kernel(step.kernel, env, bindings)
        elif isinstance(step, ExternCall):
            env[step.node.name] = call_extern(step.node, env, bindings)
        elif isinstance(step, SelectOutput):
            env[step.node.name] = conform(
                env[step.node.source][step.node.index], step.node.layout, bindings
            )
        for name in schedule.memory.frees_after[index]:
            env.pop(name, None)
    return [argument_value(out, env, bindings) for out in program.outputs]
