"""Shared helpers: real fused kernels from small PyTorch functions; running a traced
function's schedule with the rendered kernels (in Triton's interpreter, where the
caller set `TRITON_INTERPRET=1` before importing Triton); and running a test file's
cases in such interpreter subprocesses (`interpret`, and `report` for the file's
`__main__`)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.graphpasses import ember_decompositions
from ember.ir import BufferRef, LoweringOptions, Program, lower_graph
from ember.ir.interpreter import call_extern
from ember.scheduler import (
    ExternCall,
    FusedKernel,
    KernelStep,
    Schedule,
    SelectOutput,
    schedule_program,
)


def fused_kernels(fn: Callable[..., Any], *args: Any, dynamic: bool = False) -> list[FusedKernel]:
    """The scheduler's kernels for `fn` traced on `args`."""
    mode = "symbolic" if dynamic else "real"
    gm = make_fx(fn, decomposition_table=ember_decompositions(), tracing_mode=mode)(*args)
    program = lower_graph(gm, options=LoweringOptions(loops=True))
    return schedule_program(program).kernels


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(shape).to(dtype)


def load_function(source: str, function: str, directory: Path) -> Any:
    """The function `function` of the module `source`, imported from a file of its own
    (Triton's jit reads real source files)."""
    path = directory / f"{function}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(function, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, function)


def run_schedule(
    program: Program,
    schedule: Schedule,
    args: list[torch.Tensor],
    config: int = 0,
    *,
    edit: Callable[[str], str] | None = None,
) -> list[Any]:
    """Execute the schedule with every kernel launched with its `config`-th candidate
    (or its last one, when it has fewer); `edit`, where given, rewrites each kernel's
    source before it is loaded."""
    from ember.codegen.triton import render_kernel
    from ember.codegen.triton.plan import config_menu, plan_kernel

    env: dict[str, Any] = {n.name: a for n, a in zip(program.inputs, args, strict=True)}
    directory = Path(tempfile.mkdtemp())
    for step in schedule.steps:
        if isinstance(step, ExternCall):
            env[step.node.name] = call_extern(step.node, env, {})
        elif isinstance(step, SelectOutput):
            env[step.node.name] = env[step.node.source][step.node.index]
        elif isinstance(step, KernelStep):
            kernel = step.kernel
            for m in kernel.members:
                if m.mutates is not None:
                    env[m.name] = env[m.mutates]
                elif m.stored:
                    size = [int(s) for s in m.layout.size]
                    env[m.name] = torch.full(size, 7, dtype=m.layout.dtype)
            rendered = render_kernel(kernel)
            menu = config_menu(kernel, plan_kernel(kernel))
            launch = menu[min(config, len(menu) - 1)]
            source = rendered.source if edit is None else edit(rendered.source)
            jit = load_function(source, rendered.function_name, directory)
            grid = rendered.launch_grid(launch, {})
            jit[grid](
                *[env[b] for b in rendered.buffer_arguments],
                **dict(launch.blocks),
                num_warps=launch.num_warps,
                num_stages=launch.num_stages,
            )
    return [env[o.name] if isinstance(o, BufferRef) else o for o in program.outputs]


def interpret(test_file: str, names: list[str], processes: int = 1) -> dict[str, dict[str, Any]]:
    """Run `python test_file NAME...` under `TRITON_INTERPRET=1` (which must be set
    before Triton is imported, and must not leak into other tests), the names shared
    among `processes` at once; the JSON record each prints per case, by case."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    running = [
        subprocess.Popen(
            [sys.executable, test_file, *names[k::processes]],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(processes)
    ]
    results: dict[str, dict[str, Any]] = {}
    errors = []
    for process in running:
        stdout, stderr = process.communicate(timeout=600)
        errors.append(stderr[-4000:])
        for line in stdout.splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                results[record["case"]] = record
    if not results:
        pytest.fail("the interpreter runs produced nothing:\n" + "\n".join(errors))
    return results


def report(run_case: Callable[[str], dict[str, Any]], names: list[str]) -> None:
    """A test file's `__main__` under `interpret`: one JSON record per case, a failure
    (with its traceback) as a record too."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    for name in names:
        try:
            record = run_case(name)
        except Exception as exc:
            record = {"case": name, "ok": False, "error": f"{exc!r}\n{traceback.format_exc()}"}
        print(json.dumps(record), flush=True)
