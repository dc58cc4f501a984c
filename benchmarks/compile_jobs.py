"""How many Triton compiles a suite model's cold start needs, and what compiling them
in threads or processes buys, without a GPU.

    uv run python benchmarks/compile_jobs.py --models gpt2,resnet50 [--compile 20] [--workers 2]

Traces each model at its GPU benchmark size in bfloat16 on the CPU (fake tensors, as
benchmarks/traffic_report.py does), schedules and renders every graph for Triton, and
counts the distinct kernel sources and the (source, config) compile jobs: with every
config on the menu (`config_menu`, what was compiled before) and with the configs
ember now times (`candidate_configs`). With `--compile N` it compiles N of the jobs
for an H100 (sm_90: Triton's CUDA backend compiles to cubin on the CPU) one after
another, in `--workers` threads and in `--workers` processes (started and importing
Triton before the clock starts, as ember's workers start while Dynamo traces), each
with Triton's cache bypassed (TRITON_ALWAYS_COMPILE), and prints the wall times.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import torch
from traffic_report import capture_graphs

import ember.runtime  # noqa: F401
from ember.codegen.triton import TRITON_CHOICES, UNSUPPORTED, plan_kernel, render_kernel
from ember.codegen.triton.plan import SMALL_TRAFFIC, config_menu, traffic_bytes
from ember.graphpasses import default_pipeline
from ember.ir import LoweringOptions, lower_graph
from ember.scheduler import schedule_program

os.environ["TRITON_ALWAYS_COMPILE"] = "1"  # time compiles, never cache hits

_POINTER = {
    torch.float32: "*fp32",
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.int64: "*i64",
    torch.int32: "*i32",
    torch.bool: "*i1",
    torch.uint8: "*u8",
}

# (path, function, signature, constexprs, options): one compile, in plain values
Job = tuple[str, str, dict[str, str], dict[str, int], dict[str, int]]


def graphs(name: str, mode: str) -> list[torch.fx.GraphModule]:
    """The model's graphs as its backend would see them (before ember's pipeline)."""
    return [gm for _, gm in capture_graphs(name, mode)]


def jobs_of(name: str, mode: str, directory: Path) -> tuple[list[Job], list[Job], list[int]]:
    """(jobs with every menu config, jobs with the timed configs, traffic per source)."""
    menu_jobs: list[Job] = []
    timed_jobs: list[Job] = []
    traffic: list[int] = []
    seen: set[str] = set()
    options = LoweringOptions(loops=True, unsupported_ops=frozenset(UNSUPPORTED))
    for i, gm in enumerate(graphs(name, mode)):
        gm, _ = default_pipeline().run(gm)
        program = lower_graph(gm, name=f"{name}{i}", options=options)
        for kernel in schedule_program(program, TRITON_CHOICES).kernels:
            rendered = render_kernel(kernel)
            if rendered.source in seen:
                continue
            seen.add(rendered.source)
            traffic.append(traffic_bytes(kernel))
            path = directory / f"k{len(seen)}_{rendered.function_name}.py"
            path.write_text(rendered.source)
            types = [_POINTER[d] for d in rendered.buffer_dtypes]
            types += ["i32"] * (len(rendered.size_arguments) + len(rendered.bounds_arguments))
            for configs, out in (
                (config_menu(kernel, plan_kernel(kernel)), menu_jobs),
                (rendered.configs, timed_jobs),
            ):
                for c in configs:
                    out.append(
                        (
                            str(path),
                            rendered.function_name,
                            {"types": ",".join(types)},  # names filled in by the compiler
                            dict(c.blocks),
                            {"num_warps": c.num_warps, "num_stages": c.num_stages},
                        )
                    )
    return menu_jobs, timed_jobs, traffic


def compile_one(job: Job) -> float:
    """Compile one job for sm_90; its seconds."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    path, function, signature, constexprs, options = job
    start = time.perf_counter()
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    jit = getattr(module, function)
    types = signature["types"].split(",")
    names = jit.arg_names
    full = dict(zip(names, types + ["constexpr"] * (len(names) - len(types)), strict=True))
    source = ASTSource(jit, full, constexprs=constexprs)
    triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    return time.perf_counter() - start


def _ready(job: Job) -> int:
    """A worker's first compile (its one-time costs), then a pause so that every
    worker gets one of these."""
    compile_one(job)
    time.sleep(1.0)
    return os.getpid()


def _cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (ptxas runs as one)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def gil_free_share(jobs: list[Job]) -> float:
    """The share of the GIL a spinning Python thread gets while this thread compiles
    `jobs`, relative to spinning alone: near 1, compiles leave the interpreter free
    (threads scale); near 0.5, they run Python code and alternate with it; lower,
    they hold the lock in long calls."""
    import threading

    def spin(seconds: float | None, stop: threading.Event) -> int:
        count, end = 0, time.perf_counter() + (seconds or 1e9)
        while not stop.is_set() and time.perf_counter() < end:
            count += 1
        return count

    never = threading.Event()
    alone = spin(1.0, never)
    counts: list[int] = []
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: counts.append(spin(None, stop)))
    start = time.perf_counter()
    spinner.start()
    for job in jobs:
        compile_one(job)
    stop.set()
    spinner.join()
    return counts[0] / (alone * (time.perf_counter() - start))


_stage_seconds: Counter[str] = Counter()


def time_stages() -> None:
    """Time each stage of Triton's CUDA compile (ttir, ttgir, llir, ptx, cubin) into
    `_stage_seconds`, by wrapping the stage functions the backend registers."""
    from triton.backends.nvidia.compiler import CUDABackend

    original = CUDABackend.add_stages

    def add_stages(self: object, stages: dict[str, object], *args: object) -> None:
        original(self, stages, *args)  # type: ignore[arg-type]
        for name, fn in list(stages.items()):

            def timed(*a: object, _fn: object = fn, _name: str = name) -> object:
                start = time.perf_counter()
                try:
                    return _fn(*a)  # type: ignore[operator]
                finally:
                    _stage_seconds[_name] += time.perf_counter() - start

            stages[name] = timed

    CUDABackend.add_stages = add_stages  # type: ignore[method-assign]


def time_compiles(jobs: list[Job], workers: int) -> None:
    compile_one(jobs[0])  # first-use costs (imports, backend setup) out of the timings
    time_stages()
    start, cpu = time.perf_counter(), _cpu_seconds()
    serial = [compile_one(j) for j in jobs]
    serial_s, serial_cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    stages = ", ".join(f"{k} {v:.2f}" for k, v in _stage_seconds.items())
    print(f"serial compile stages (s): {stages}", flush=True)
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(compile_one, jobs))
    threads_s = time.perf_counter() - start
    context = multiprocessing.get_context("spawn")  # as ember's workers: fresh interpreters
    start = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        pids = set(pool.map(_ready, [jobs[0]] * workers))
        started_s = time.perf_counter() - start
        start = time.perf_counter()
        list(pool.map(compile_one, jobs))
        processes_s = time.perf_counter() - start
    median = sorted(serial)[len(serial) // 2]
    share = gil_free_share(jobs)
    print(
        f"{len(jobs)} compiles for sm_90: serial {serial_s:.2f} s "
        f"(median {median * 1e3:.0f} ms each, {serial_cpu:.2f} s CPU), "
        f"{workers} threads {threads_s:.2f} s, "
        f"{workers} processes {processes_s:.2f} s "
        f"(+{started_s:.2f} s to start {len(pids)} of them: imports, a first compile, 1 s pause); "
        f"a Python thread spinning beside serial compiles ran at {share:.0%} of its speed alone"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="gpt2")
    parser.add_argument("--mode", default="inference")
    parser.add_argument("--compile", type=int, default=0, help="compile this many jobs")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="ember-compile-jobs-"))
    sample: list[Job] = []
    for name in args.models.split(","):
        menu, timed, traffic = jobs_of(name, args.mode, directory)
        per_source = Counter(len([j for j in timed if j[0] == p]) for p in {j[0] for j in timed})
        small = sum(b < SMALL_TRAFFIC for b in traffic)
        print(
            f"{name} {args.mode}: {len(traffic)} distinct sources ({small} under "
            f"{SMALL_TRAFFIC >> 20} MiB), compile jobs {len(menu)} with every menu config, "
            f"{len(timed)} now; sources by config count {dict(sorted(per_source.items()))}"
        )
        sample += timed
    if args.compile:
        step = max(1, len(sample) // args.compile)
        time_compiles(sample[::step][: args.compile], args.workers)


if __name__ == "__main__":
    main()
