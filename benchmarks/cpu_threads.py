"""Reduction kernels on the CPU at 1, 2, 4, 8 and 16 threads, under each OpenMP
schedule of their loop over outer points: the measurement behind the prelude's
`EMBER_REDUCTION_SCHEDULE` (static unless a machine shows otherwise).

    uv run python benchmarks/cpu_threads.py [--threads 1,2,4,8,16] [--rounds 5]
        [--calls 10] [--scale 1.0] [--only softmax,sum_cols] [--schedules ...]

Each case is traced, lowered and scheduled as the runtime does, then its kernels are
built once per schedule (the same source with `#define EMBER_REDUCTION_SCHEDULE
<schedule>` in front) into a fresh cache directory. For each thread count
(`torch.set_num_threads`, which the kernels follow), the schedules are timed in
interleaved rounds (static, dynamic, ..., static, dynamic, ...): each round is the
median of `--calls` calls with preallocated outputs, and each schedule keeps its
fastest round, so that a burst of load on a shared machine costs one round rather
than one schedule. Thread counts above the machine's CPU count are skipped unless
named with `--threads`. The table gives ms per schedule and each one's time against
static's (below 1.00: faster than static). On a 16-core machine it runs in about a
minute; `--only` and `--threads` shorten it.
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
from ember.runtime.cpp_kernels import CppKernel, compile_cpp_source
from ember.scheduler import schedule_program

SCHEDULES = ("static", "dynamic", "dynamic,16", "guided")
THREADS = (1, 2, 4, 8, 16)


def cases(scale: float) -> dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]]:
    """Reductions over rows (long, short, a count no thread count divides), over
    columns, and the fused row kernels of softmax and layer norm."""
    rows = max(1, int(4096 * scale))
    x = torch.randn(rows, 2048)
    w, b = torch.randn(2048), torch.randn(2048)
    return {
        "sum_rows": (lambda x: x.sum(-1), (x,)),
        "sum_short_rows": (lambda x: x.sum(-1), (torch.randn(max(1, int(65536 * scale)), 128),)),
        "softmax": (lambda x: x.softmax(-1), (x,)),
        "softmax_1000x3000": (lambda x: x.softmax(-1), (torch.randn(1000, 3000),)),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (2048,), w, b), (x, w, b)),
        "sum_cols": (lambda x: x.sum(0), (x,)),
    }


def build(
    fn: Callable[..., Any], args: tuple[torch.Tensor, ...], schedules: list[str], cache: Path
) -> dict[str, Callable[[], None]]:
    """One runner per schedule: the case's kernels, outputs preallocated."""
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
    runners: dict[str, Callable[[], None]] = {}
    for name in schedules:
        text = f"#define EMBER_REDUCTION_SCHEDULE {name}\n" + source.source
        unit = compile_cpp_source(CppSource(text, source.kernels), cache_dir=cache)
        compiled = {info.name: CppKernel(unit, info) for info in source.kernels}
        calls = [
            (compiled[kernel.name], [env[n] for n in kernel.buffer_arguments()])
            for kernel in schedule.kernels
        ]

        def run(calls: list[tuple[CppKernel, list[Any]]] = calls) -> None:
            for kernel, tensors in calls:
                kernel(*tensors)

        runners[name] = run
    return runners


def round_ms(run: Callable[[], None], calls: int) -> float:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", default="", help="comma-separated (default 1,2,4,8,16)")
    parser.add_argument("--schedules", default=";".join(SCHEDULES), help="';'-separated")
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
    only = {n for n in options.only.split(",") if n}
    revision = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"torch {torch.__version__}, {cpus} CPUs, commit {revision or '?'}, load {load}")
    print(
        f"threads {counts}; fastest of {options.rounds} rounds, each the median of "
        f"{options.calls} calls"
    )
    header = f"{'case':<18} {'thr':>3}" + "".join(f" {s + ' ms':>14}" for s in schedules)
    header += "".join(f" {s + '/st':>14}" for s in schedules[1:]) + "  best"
    print(header)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ember-threads-") as cache:
        for name, (fn, args) in cases(options.scale).items():
            if only and name not in only:
                continue
            runners = build(fn, args, schedules, Path(cache))
            for threads in counts:
                torch.set_num_threads(threads)
                for run in runners.values():
                    run()  # warm: pages, threads, caches
                best = dict.fromkeys(schedules, float("inf"))
                for _ in range(options.rounds):
                    for schedule, run in runners.items():
                        best[schedule] = min(best[schedule], round_ms(run, options.calls))
                base = best[schedules[0]]
                row = f"{name:<18} {threads:>3}" + "".join(f" {best[s]:>14.3f}" for s in schedules)
                row += "".join(f" {best[s] / base:>14.2f}" for s in schedules[1:])
                print(row + f"  {min(best, key=lambda s: best[s])}", flush=True)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"{time.perf_counter() - start:.0f} s, load {load}")


if __name__ == "__main__":
    main()
