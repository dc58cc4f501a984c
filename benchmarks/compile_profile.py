"""Where a cold compile's time goes, per model: the Dynamo + AOTAutograd floor
(`aot_eager`), Inductor, and ember split into its stages and Triton's lazy compile.

    python benchmarks/compile_profile.py --device cuda --models gpt2,bert [--mode inference]

Every backend runs in this one process against fresh cache directories (made before
torch is imported), after `torch._dynamo.reset()`; the first call (compile + one run,
synchronised) is timed. Ember's stages come from its compile records; "first launches"
is the time its launchers spent choosing configs and waiting for Triton to compile
(Triton compiles a kernel when it is first launched). A profile, not the benchmark:
`ember bench` measures each backend in a fresh process.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time

_ROOT = tempfile.mkdtemp(prefix="ember-compile-profile-")
for _var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "EMBER_CACHE_DIR"):
    os.environ[_var] = os.path.join(_ROOT, _var.lower())

import torch  # noqa: E402

import ember.runtime  # noqa: E402,F401  (registers the backend)
from ember.runtime import compile_pool, compiler, triton_kernels  # noqa: E402
from ember.runtime.bench.measure import prepare, step_fn  # noqa: E402


def first_call_seconds(
    model: torch.nn.Module, inputs: list[object], mode: str, backend: str, stats: str = ""
) -> float:
    """Seconds of the first call; with `stats`, a cProfile of it is written there."""
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    step = step_fn(compiled, inputs, mode)  # type: ignore[arg-type]
    profiler = cProfile.Profile() if stats else None
    start = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if profiler is not None:
        profiler.disable()
        with open(stats, "w") as out:
            pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(60)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", default="gpt2")
    parser.add_argument("--mode", default="inference")
    parser.add_argument("--skip-others", action="store_true", help="ember only (for A/B runs)")
    parser.add_argument("--cprofile", default="", help="write a cProfile of ember's first calls")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    for name in args.models.split(","):
        model, inputs = prepare(name, device, dtype)
        floor = inductor = float("nan")
        if not args.skip_others:
            floor = first_call_seconds(model, inputs, args.mode, "aot_eager")
            inductor = first_call_seconds(model, inputs, args.mode, "inductor")
        compiler.compile_records.clear()
        triton_kernels.first_launch_seconds[0] = 0.0
        for key in triton_kernels.precompile_stats:
            triton_kernels.precompile_stats[key] = 0.0
        for key in compile_pool.busy_seconds:
            compile_pool.busy_seconds[key] = 0.0
        stats = f"{args.cprofile}-{name}.txt" if args.cprofile else ""
        ember = first_call_seconds(model, inputs, args.mode, "ember", stats)
        stages: dict[str, float] = {}
        for record in compiler.compile_records:
            for stage, seconds in record.stage_seconds.items():
                stages[stage] = stages.get(stage, 0.0) + seconds
        kernels = sum(r.fused_kernels for r in compiler.compile_records)
        launch = triton_kernels.first_launch_seconds[0]
        for key, value in triton_kernels.precompile_stats.items():
            stages[f"[{key}]"] = value
        for key, value in compile_pool.busy_seconds.items():
            stages[f"[{key} s]"] = value
        rows.append((name, floor, inductor, ember, stages, launch, kernels))
        print(f"{name}: done", file=sys.stderr, flush=True)
    print(
        f"cold compile profile ({args.device}, {args.mode}, {dtype}); seconds to the first result"
    )
    head = ("model", "aot_eager", "inductor", "ember", "kernels", "first launches")
    print("{:<18} {:>9} {:>9} {:>7} {:>7} {:>14}  ember stages".format(*head))
    for name, floor, inductor, ember, stages, launch, kernels in rows:
        text = ", ".join(f"{k} {v:.2f}" for k, v in stages.items())
        times = f"{floor:9.2f} {inductor:9.2f} {ember:7.2f} {kernels:7d} {launch:14.2f}"
        print(f"{name:<18} {times}  {text}")


if __name__ == "__main__":
    main()
