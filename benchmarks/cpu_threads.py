"""Reduction kernels on the CPU at 1, 2, 4, 8 and 16 threads under each OpenMP
schedule of their loop over outer points: the measurement behind the choice by thread
count that the prelude makes (`ember::reduction_schedule`: `static` on one thread,
`guided` on more) and behind the `EMBER_REDUCTION_SCHEDULE` setting.

    uv run python benchmarks/cpu_threads.py [--threads 1,2,4,8,16] [--rounds 5]
        [--calls 10] [--scale 1.0] [--only softmax,sum_cols] [--schedules ...]

Each case is traced, lowered and scheduled as the runtime does and its kernels are
built once, as ember builds them (`schedule(runtime)`); the schedules are then set on
the loaded library between rounds (`CompiledUnit.set_reduction_schedule`: "auto" is
the choice by thread count, the others fix one), as the setting does, with no
rebuild. One more build fixes `static` at compile time (`#define
EMBER_REDUCTION_SCHEDULE static` in front, the code before the run-time choice): the
column "built static" prices the run-time dispatch itself. For each thread count
(`torch.set_num_threads`, which the kernels follow), the schedules are timed in
interleaved rounds (auto, static, ..., auto, static, ...): each round is the median of
`--calls` calls with preallocated outputs, and each schedule keeps its fastest round,
so that a burst of load on a shared machine costs one round rather than one schedule.
Thread counts above the machine's CPU count are skipped unless named with `--threads`.

It prints a markdown table: ms per schedule, auto's choice, auto against static and
against the fastest schedule of the row (1.00: auto was the fastest; 1.10: 10%
slower). On a 16-core machine it runs in about a minute; `--only` and `--threads`
shorten it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sympy
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.codegen.cpp import CPP_CHOICES, CppSource, render_kernels
from ember.graphpasses import ember_decompositions
from ember.ir import LoweringOptions, evaluate, lower_graph
from ember.runtime.cpp_kernels import CompiledUnit, CppKernel, compile_cpp_source
from ember.scheduler import FusedKernel, schedule_program

AUTO = "auto"
BUILT_STATIC = "built static"
SCHEDULES = (AUTO, "static", "dynamic,16", "guided", BUILT_STATIC)
THREADS = (1, 2, 4, 8, 16)


def cases(scale: float) -> dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]]:
    """Reductions over rows (long, short, a count no thread count divides), over
    columns, and the fused row kernels of softmax, layer norm and variance."""
    rows = max(1, int(4096 * scale))
    x = torch.randn(rows, 2048)
    w, b = torch.randn(2048), torch.randn(2048)
    return {
        "sum_rows": (lambda x: x.sum(-1), (x,)),
        "sum_short_rows": (lambda x: x.sum(-1), (torch.randn(max(1, int(65536 * scale)), 128),)),
        "var_rows": (lambda x: x.var(-1), (x,)),
        "softmax": (lambda x: x.softmax(-1), (x,)),
        "softmax_1000x3000": (lambda x: x.softmax(-1), (torch.randn(1000, 3000),)),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (2048,), w, b), (x, w, b)),
        "sum_cols": (lambda x: x.sum(0), (x,)),
    }


Runner = Callable[[], None]


def _runner(unit: CompiledUnit, kernels: list[FusedKernel], env: dict[str, Any]) -> Runner:
    compiled = {info.name: CppKernel(unit, info) for info in unit.source.kernels}
    calls = [(compiled[k.name], [env[n] for n in k.buffer_arguments()]) for k in kernels]

    def run() -> None:
        for kernel, tensors in calls:
            kernel(*tensors)

    return run


def build(
    fn: Callable[..., Any], args: tuple[torch.Tensor, ...], schedules: list[str], cache: Path
) -> tuple[CompiledUnit, dict[str, Runner]]:
    """The library as ember builds it, and one runner per schedule: run-time ones set
    the schedule on that library first; "built static" runs its own build."""
    gm = make_fx(fn, decomposition_table=ember_decompositions())(*args)
    program = lower_graph(gm, options=LoweringOptions(loops=True))
    schedule = schedule_program(program, CPP_CHOICES)
    program = schedule.program
    env: dict[str, Any] = {n.name: a for n, a in zip(program.inputs, args, strict=True)}
    for kernel in schedule.kernels:
        for member in kernel.members:
            if member.stored and member.mutates is None:
                size = [int(evaluate(sympy.sympify(s), {})) for s in member.layout.size]
                stride = [int(evaluate(sympy.sympify(s), {})) for s in member.layout.stride]
                env[member.name] = torch.empty_strided(size, stride, dtype=member.layout.dtype)
    source = render_kernels(schedule.kernels)
    if "schedule(EMBER_REDUCTION_SCHEDULE)" not in source.source:
        raise SystemExit(
            f"no reduction loop with a schedule in {[k.name for k in schedule.kernels]}"
        )
    unit = compile_cpp_source(source, cache_dir=cache)
    shared = _runner(unit, schedule.kernels, env)
    runners: dict[str, Runner] = {}
    for name in schedules:
        if name == BUILT_STATIC:
            text = "#define EMBER_REDUCTION_SCHEDULE static\n" + source.source
            built = compile_cpp_source(CppSource(text, source.kernels), cache_dir=cache)
            runners[name] = _runner(built, schedule.kernels, env)
            continue

        def run(name: str = name) -> None:
            unit.set_reduction_schedule(name)
            shared()

        runners[name] = run
    return unit, runners


def round_ms(run: Runner, calls: int) -> float:
    run()  # sets the schedule (run-time ones) outside the timed calls
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", default="", help="comma-separated (default 1,2,4,8,16)")
    parser.add_argument(
        "--schedules",
        default=";".join(SCHEDULES),
        help="';'-separated: auto, built static, or EMBER_REDUCTION_SCHEDULE values",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10, help="calls per round (median)")
    parser.add_argument("--scale", type=float, default=1.0, help="rows of the 4096-row cases")
    parser.add_argument("--only", default="", help="comma-separated case names")
    options = parser.parse_args()
    cpus = os.cpu_count() or 1
    if options.threads:
        counts = [int(t) for t in options.threads.split(",")]
    else:
        counts = [t for t in THREADS if t <= cpus]
    schedules = [s.strip() for s in options.schedules.split(";") if s.strip()]
    if AUTO not in schedules:
        schedules.insert(0, AUTO)
    if "static" not in schedules:
        schedules.insert(1, "static")
    only = {n for n in options.only.split(",") if n}
    revision = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"torch {torch.__version__}, {cpus} CPUs, commit {revision or '?'}, load {load}")
    print(
        f"threads {counts}; fastest of {options.rounds} interleaved rounds, each the median "
        f"of {options.calls} calls; ms\n"
    )
    print(
        "| case | threads | auto's choice | "
        + " | ".join(f"{s} ms" for s in schedules)
        + " | auto / static | auto / fastest | fastest |"
    )
    print("|---|---:|---|" + "---:|" * len(schedules) + "---:|---:|---|")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ember-threads-") as cache:
        for name, (fn, args) in cases(options.scale).items():
            if only and name not in only:
                continue
            unit, runners = build(fn, args, schedules, Path(cache))
            for threads in counts:
                torch.set_num_threads(threads)
                unit.set_reduction_schedule(AUTO)
                choice = unit.reduction_schedule(threads)
                for run in runners.values():
                    run()  # warm: pages, threads, caches
                best = dict.fromkeys(schedules, float("inf"))
                for _ in range(options.rounds):
                    for schedule, run in runners.items():
                        best[schedule] = min(best[schedule], round_ms(run, options.calls))
                fastest = min(best, key=lambda s: best[s])
                cells = " | ".join(f"{best[s]:.3f}" for s in schedules)
                print(
                    f"| {name} | {threads} | {choice} | {cells} | "
                    f"{best[AUTO] / best['static']:.2f} | {best[AUTO] / best[fastest]:.2f} | "
                    f"{fastest} |",
                    flush=True,
                )
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"\n{time.perf_counter() - start:.0f} s, load {load}")


if __name__ == "__main__":
    main()
