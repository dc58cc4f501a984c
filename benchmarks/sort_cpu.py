"""sort and topk on the CPU: ember against eager, median of many calls.

    PYTHONPATH=$(printf '%s:' $PWD/packages/*/src) python benchmarks/sort_cpu.py \
        [--runs 50] [--budget 20] [--cases 1d,rows,columns,topk] [--threads N]

Cases: `1d` is a stable sort of 1M float32 elements, `rows` a stable sort along the
last dim of a (64, 4096) float32 tensor, `columns` along the first dim of a (4096, 64)
one, `topk` the 16 largest of each row of a (256, 4096) one. Each backend is called
once to compile and warm up, then timed call by call (wall clock) until `--runs`
calls or `--budget` seconds. Prints the median and fastest call per case and
backend, in ms, and whether ember's values and indices equal eager's bit for bit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import torch

import ember.runtime  # noqa: F401  (registers the backend)
from ember.runtime import config

CASES: dict[str, tuple[Callable[[torch.Tensor], Any], tuple[int, ...]]] = {
    "1d": (lambda x: torch.sort(x, dim=0, stable=True), (1 << 20,)),
    "rows": (lambda x: torch.sort(x, dim=1, stable=True), (64, 4096)),
    "columns": (lambda x: torch.sort(x, dim=0, stable=True), (4096, 64)),
    "topk": (lambda x: torch.topk(x, 16, 1), (256, 4096)),
}


def _time(fn: Callable[[], Any], runs: int, budget: float) -> list[float]:
    times: list[float] = []
    deadline = time.perf_counter() + budget
    while len(times) < runs and (not times or time.perf_counter() < deadline):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--budget", type=float, default=20.0, help="seconds per measurement")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: keep)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)  # ember's kernels follow torch's setting
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, tree {commit}")
    print(f"# load average before: {os.getloadavg()}")
    print("| case | backend | calls | median ms | fastest ms | equal to eager |")
    print("|---|---|---:|---:|---:|---|")
    for name in args.cases.split(","):
        fn, shape = CASES[name]
        x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        expected = fn(x)
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="ember")
        with config.scope(strict=True, fallback=False, compile_cache=False):
            start = time.perf_counter()
            got = compiled(x)  # compile, then one call
            first = (time.perf_counter() - start) * 1e3
            same = all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))
            calls = {"eager": lambda f=fn, a=x: f(a), "ember": lambda f=compiled, a=x: f(a)}
            for backend, call in calls.items():
                times = _time(call, args.runs, args.budget)
                print(
                    f"| {name} {list(shape)} | {backend} | {len(times)} | "
                    f"{statistics.median(times):.3f} | {min(times):.3f} | "
                    f"{same if backend == 'ember' else ''} |",
                    flush=True,
                )
        print(f"# {name}: compile + first call {first:.0f} ms")
    print(f"# load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
