"""Running Triton kernel test cases in Triton's interpreter (test helper), and running a
traced function's schedule with ember's Triton kernels (`lower_for_triton`,
`run_with_triton`), on the CPU in the interpreter or on a GPU.

`TRITON_INTERPRET=1` must be set before Triton is imported and must not leak into
the other tests of the process, so each test file that checks kernels on the CPU runs
itself as a script in subprocesses (`interpret`), where `report` runs the named cases
and prints one JSON record per case; the fixture reads the records back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.graphpasses import ember_decompositions
from ember.ir import LoweringOptions, Program, lower_graph
from ember.ir.interpreter import bind_symbols
from ember.ir.nodes import BufferRef
from ember.ir.symbolic import evaluate
from ember.scheduler import (
    DEFAULT_CHOICES,
    DeviceChoices,
    ExternCall,
    KernelStep,
    Schedule,
    SelectOutput,
    schedule_program,
)


def interpret(
    script: str, names: Sequence[str], *, workers: int = 1, timeout: float = 600
) -> dict[str, dict[str, Any]]:
    """Each case's record from running `script` with `names` in the interpreter, the
    names shared among `workers` subprocesses; a test failure where none reported."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    names = list(names)
    processes = [
        subprocess.Popen(
            [sys.executable, script, *names[k::workers]],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(workers)
    ]
    results: dict[str, dict[str, Any]] = {}
    errors = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=timeout)
        errors.append(stderr[-4000:])
        for line in stdout.splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                results[record["case"]] = record
    if not results:
        pytest.fail("the interpreter runs produced nothing:\n" + "\n".join(errors))
    return results


def report(run_case: Callable[[str, str], dict[str, Any]], names: Sequence[str]) -> None:
    """Run each named case on the CPU (in the interpreter) and print its record."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    for name in names:
        try:
            record = run_case(name, "cpu")
        except Exception as exc:
            record = {"case": name, "ok": False, "error": f"{exc!r}\n{traceback.format_exc()}"}
        print(json.dumps(record), flush=True)


def lower_for_triton(
    fn: Callable[..., Any],
    args: list[Any],
    dynamic: bool,
    choices: DeviceChoices = DEFAULT_CHOICES,
) -> tuple[Program, Schedule]:
    """`fn` traced with ember's decompositions, lowered and scheduled."""
    gm = make_fx(
        fn,
        decomposition_table=ember_decompositions(),
        tracing_mode="symbolic" if dynamic else "real",
    )(*args)
    program = lower_graph(gm, options=LoweringOptions(loops=True))
    return program, schedule_program(program, choices)


def run_with_triton(
    program: Program,
    schedule: Schedule,
    args: list[Any],
    *,
    seed: int,
    cache_dir: Path,
    reduction: str | None = None,
) -> tuple[list[Any], list[str]]:
    """Execute `schedule` with ember's Triton kernels (extern calls as ATen ops)."""
    from ember.codegen.triton import render_kernel
    from ember.runtime.triton_kernels import compile_triton_kernels

    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    env: dict[str, Any] = {n.name: a for n, a in zip(program.inputs, args, strict=True)}
    env.update({c.name: c.value for c in program.constants})
    bindings = {s: sympy.Integer(v) for s, v in bind_symbols(program, args).items()}
    if program.rng_seed is not None:
        env[program.rng_seed] = torch.tensor(seed, dtype=torch.int64, device=device)
    rendered = [
        render_kernel(k, reduction=reduction if k.is_reduction else None, debug=True)
        for k in schedule.kernels
    ]
    launchers = compile_triton_kernels(rendered, cache_dir=cache_dir)

    def value(tree: Any) -> Any:
        if isinstance(tree, BufferRef):
            return env[tree.name]
        if isinstance(tree, sympy.Basic):
            return evaluate(tree, bindings)  # type: ignore[arg-type]
        if isinstance(tree, (tuple, list)):
            return [value(t) for t in tree]
        return tree

    for step in schedule.steps:
        if isinstance(step, ExternCall):
            node = step.node
            env[node.name] = node.op(*value(node.args), **{k: value(v) for k, v in node.kwargs})
        elif isinstance(step, SelectOutput):
            env[step.node.name] = env[step.node.source][step.node.index]
        elif isinstance(step, KernelStep):
            kernel = step.kernel
            for m in kernel.members:
                if m.mutates is not None:
                    env[m.name] = env[m.mutates]
                elif m.stored:
                    layout = m.layout
                    size = [int(evaluate(s, bindings)) for s in layout.size]
                    stride = [int(evaluate(s, bindings)) for s in layout.stride]
                    extent = int(evaluate(layout.storage_extent(), bindings))
                    fill = float("nan") if layout.dtype.is_floating_point else -7
                    storage = torch.full((max(extent, 1),), fill, device=device).to(layout.dtype)
                    offset = int(evaluate(layout.offset, bindings))
                    env[m.name] = storage.as_strided(size, stride, offset)
            tensors = [env[b] for b in kernel.buffer_arguments()]
            sizes = [int(bindings[s]) for s in kernel.size_arguments()]
            launchers[kernel.name](*tensors, *sizes)
    outputs = [value(o) for o in program.outputs]
    return outputs, [r.kind for r in rendered]
