"""Seconds ember's own CPU-side compile stages take per suite model, without a GPU.

    uv run python benchmarks/stage_times.py --models bert,resnet50 [--modes inference,train]
        [--dump DIR] [--profile STAGE] [--repeat N]

Traces each model at its GPU benchmark size in bfloat16 on fake tensors (as
benchmarks/traffic_report.py does; tracing is not timed), then runs and times, graph
by graph, what the runtime runs before Triton: the default pass pipeline, lowering,
scheduling with the Triton codegen's choices, and rendering every kernel's Triton
source. Prints one row per model and mode (train = forward + backward graphs) with the
seconds of each stage, the best of `--repeat` runs on fresh copies of the graphs.

`--dump DIR` writes every rendered source (DIR/<model>-<mode>/<graph>-<kernel>.py) and
each graph's schedule (<graph>-schedule.txt), so that two versions of ember can be
compared byte for byte (`diff -r`). `--profile STAGE` runs cProfile over that stage
('passes', 'lowering', 'scheduling', 'rendering') and prints the top functions by
cumulative and by own time.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import pstats
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from traffic_report import capture_graphs

import ember.runtime  # noqa: F401
from ember.codegen.triton import TRITON_CHOICES, UNSUPPORTED, render_kernel
from ember.graphpasses import default_pipeline
from ember.ir import LoweringOptions, lower_graph
from ember.scheduler import schedule_program

STAGES = ("passes", "lowering", "scheduling", "rendering")


def run_stages(
    graphs: list[torch.fx.GraphModule],
    label: str,
    profile: str | None,
    profiler: cProfile.Profile,
    dump: Path | None,
) -> dict[str, float]:
    """Seconds per stage over the graphs (each run on a deep copy: passes rewrite it)."""
    seconds = dict.fromkeys(STAGES, 0.0)
    # as the runtime lowers CUDA graphs (EMBER_RECOMPUTE's default, `cuda`)
    options = LoweringOptions(
        loops=True, unsupported_ops=frozenset(UNSUPPORTED), recompute_shared=True
    )

    def timed(stage: str, work: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if stage == profile:
            profiler.enable()
        start = time.perf_counter()
        result = work(*args, **kwargs)
        seconds[stage] += time.perf_counter() - start
        if stage == profile:
            profiler.disable()
        return result

    for i, original in enumerate(graphs):
        gm = copy.deepcopy(original)
        gm, _ = timed("passes", lambda module: default_pipeline().run(module), gm)
        program = timed("lowering", lower_graph, gm, name=f"{label}{i}", options=options)
        schedule = timed("scheduling", schedule_program, program, TRITON_CHOICES)
        rendered = timed(
            "rendering", lambda kernels: [render_kernel(k) for k in kernels], schedule.kernels
        )
        if dump is not None:
            dump.mkdir(parents=True, exist_ok=True)
            (dump / f"{i}-schedule.txt").write_text(schedule.format())
            for kernel, source in zip(schedule.kernels, rendered, strict=True):
                (dump / f"{i}-{kernel.name}.py").write_text(source.source)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="gpt2,bert,resnet50")
    parser.add_argument("--modes", default="inference,train")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--dump", type=Path, default=None)
    parser.add_argument("--profile", choices=STAGES, default=None)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    profiler = cProfile.Profile()
    rows = []
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            graphs = [gm for _, gm in capture_graphs(name, mode)]
            best = dict.fromkeys(STAGES, float("inf"))
            for attempt in range(args.repeat):
                dump = args.dump / f"{name}-{mode}" if args.dump and attempt == 0 else None
                got = run_stages(graphs, name, args.profile, profiler, dump)
                best = {s: min(best[s], got[s]) for s in STAGES}
            rows.append((name, mode, best))
    print(f"{'model':<18}{'mode':<10}" + "".join(f"{s:>11}" for s in STAGES) + f"{'total':>9}")
    for name, mode, best in rows:
        cells = "".join(f"{best[s]:11.3f}" for s in STAGES)
        print(f"{name:<18}{mode:<10}{cells}{sum(best.values()):9.3f}")
    if args.profile:
        stats = pstats.Stats(profiler)
        stats.sort_stats("cumulative").print_stats(args.top)
        stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
