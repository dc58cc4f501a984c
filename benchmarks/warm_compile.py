"""Cold and warm compile times: ember with an empty cache, ember again in a fresh
process sharing that cache (the persistent compile cache: no lowering, no kernel
compiles), and `aot_eager` (AOTAutograd tracing alone, no compiler behind it), side by
side, each model in fresh processes.

Compile time is the wall time of the first call (inference under no_grad, or one
training step's forward and backward) minus the wall time of a steady call, as
measured in the same process. Every ember process runs with EMBER_STRICT=1 and
reports its graphs' cache hits, so a warm number is a real hit, not a silent eager
run. A training step of a block without weights differentiates with respect to its
inputs (as `ember bench` does).

Torch's `aot_eager` imports parts of Inductor at its first compile (its AOTAutograd
helper imports `torch._inductor.debug`; the min-cut partitioner's CSE imports
Inductor's pattern matcher), about 0.4 s and 1 s of a first call on the 2-core CPU,
none of which is tracing. By default every process imports those modules before
its timed call, so that the `aot_eager` column is the tracing floor (ember's own
imports stay inside its timed call). `--as-shipped` leaves them in.

    python3 benchmarks/warm_compile.py --device cuda --models mlp gpt2 --modes inference
    python3 benchmarks/warm_compile.py --repeat 3 --markdown table.md   # the CPU set

Each process runs torch with one thread by default (`--threads`, as `ember bench` on
the CPU: a core taken by another process stalls every parallel region of a
two-thread one). Beside wall times the table gives the main thread's CPU time of
the same first-call-minus-steady-call difference (`time.thread_time`), which other
processes on the machine disturb less; it leaves out subprocesses (the C++
compiler, so it is not given for cold compiles).

`--repeat N` runs each process N times (each cold run with a fresh cache, each warm
run after its own cold one) and reports the fastest of the N: on a machine shared
with other work, the run least disturbed; `--median` reports their median instead
(what a run typically costs, disturbances included). The table's caption line gives
the machine's load average before and after the runs. Runs with PYTHONPATH over
packages/*/src or without it (it adds them itself).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
import json, sys, time, torch
backend, name, device, mode, preimport, threads = sys.argv[1:7]
if int(threads) > 0:
    torch.set_num_threads(int(threads))
import ember.runtime
if preimport == "1":
    import torch._inductor.debug, torch._inductor.pattern_matcher
from ember.runtime import compile_cache
from ember.runtime.bench.registry import MODELS, loss_input
from ember.runtime.compiler import compile_records
torch.manual_seed(0)
model, inputs = MODELS[name].build("gpu" if device == "cuda" else "cpu")
dtype = torch.bfloat16 if device == "cuda" else torch.float32
model = model.to(device)
if device == "cuda":
    model = model.to(dtype)
inputs = [x.to(device, dtype) if x.is_floating_point() else x.to(device) for x in inputs]
if mode == "train" and not any(p.requires_grad for p in model.parameters()):
    inputs = [x.requires_grad_(True) if x.is_floating_point() else x for x in inputs]
compiled = torch.compile(model, backend=backend)
def step():
    if mode == "inference":
        model.eval()
        with torch.no_grad():
            compiled(*inputs)
    else:
        model.train()
        loss_input(compiled(*inputs)).float().square().mean().backward()
    if device == "cuda":
        torch.cuda.synchronize()
def timed():
    wall, cpu = time.perf_counter(), time.thread_time()
    step()
    return time.perf_counter() - wall, time.thread_time() - cpu
first, first_cpu = timed()
times = sorted(timed() for _ in range(5))
steady, steady_cpu = times[2]
print(json.dumps({"first": first, "steady": steady, "compile": first - steady,
                  "compile_cpu": first_cpu - steady_cpu,
                  "cache": dict(compile_cache.stats) if backend == "ember" else None,
                  "eager_graphs": sum(1 for r in compile_records if r.ran_eagerly)}))
"""


def child(
    backend: str,
    name: str,
    device: str,
    mode: str,
    cache: str,
    preimport: bool = True,
    threads: int = 1,
) -> dict[str, object]:
    env = {**os.environ, "EMBER_CACHE_DIR": cache, "EMBER_STRICT": "1"}
    paths = [str(p) for p in sorted((_ROOT / "packages").glob("*/src"))]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    flag = "1" if preimport else "0"
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, backend, name, device, mode, flag, str(threads)],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{backend} {name} {mode} failed:\n{done.stderr[-3000:]}")
    result: dict[str, object] = json.loads(lines[-1])
    return result


def measure(
    name: str,
    device: str,
    mode: str,
    repeat: int,
    preimport: bool,
    threads: int,
    pick: Callable[[list[float]], float] = min,
) -> dict[str, object]:
    """The fastest (or, with `pick`, the median) of `repeat` runs each: cold, warm and
    aot_eager compile seconds (wall and the main thread's CPU time), and the warm
    runs' cache hits."""
    runs: dict[str, list[dict[str, object]]] = {"cold": [], "warm": [], "aot": []}
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="ember-warm-") as cache:
            runs["cold"].append(child("ember", name, device, mode, cache, preimport, threads))
            runs["warm"].append(child("ember", name, device, mode, cache, preimport, threads))
        with tempfile.TemporaryDirectory(prefix="ember-warm-") as cache:
            runs["aot"].append(child("aot_eager", name, device, mode, cache, preimport, threads))
    best: dict[str, object] = {}
    for kind, results in runs.items():
        best[kind] = pick([float(r["compile"]) for r in results])  # type: ignore[arg-type]
        best[f"{kind}_cpu"] = pick([float(r["compile_cpu"]) for r in results])  # type: ignore[arg-type]
    best["hits"] = [(r["cache"] or {}).get("hits") for r in runs["warm"]]  # type: ignore[union-attr]
    return best


def _ensure_bytecode() -> None:
    """Write the bytecode of ember's own modules where Python would have written it.

    Torch's modules come with theirs (compiled at install); ember's, imported from the
    workspace, get theirs at the first import, unless PYTHONDONTWRITEBYTECODE is set
    (as on the 2-core development VM). Then every process compiled the modules ember
    imports at its first compile from source again: about 40 ms of cnn_block's warm
    training compile of 0.37 s (cProfile, `source_to_code`), a cost aot_eager's column
    never paid and no installed copy pays. Python reads bytecode that exists whether
    or not the variable is set."""
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        import compileall

        for src in sorted((_ROOT / "packages").glob("*/src")):
            compileall.compile_dir(str(src), quiet=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--modes", nargs="+", default=["inference", "train"], choices=["inference", "train"]
    )
    parser.add_argument("--models", nargs="+", default=None, help="default: the device's set")
    parser.add_argument("--repeat", type=int, default=1, help="processes per number (the fastest)")
    parser.add_argument("--median", action="store_true", help="the median of --repeat runs")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: its default)")
    parser.add_argument("--as-shipped", action="store_true", help="no imports before timing")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    args = parser.parse_args()
    _ensure_bytecode()
    if args.models is None:
        sys.path[:0] = [str(p) for p in sorted((_ROOT / "packages").glob("*/src"))]
        from ember.runtime.bench.registry import models_for

        args.models = [spec.name for spec in models_for(args.device)]
    header = (
        "| model | mode | cold s | warm s | aot_eager s | warm/aot_eager "
        "| warm CPU s | aot_eager CPU s | CPU ratio | warm hits |"
    )
    rows = [header, "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    print(header, flush=True)
    pick: Callable[[list[float]], float] = statistics.median if args.median else min
    load_before = os.getloadavg()
    for mode in args.modes:
        for name in args.models:
            r = measure(
                name, args.device, mode, args.repeat, not args.as_shipped, args.threads, pick
            )
            c, w, a = (float(r[k]) for k in ("cold", "warm", "aot"))  # type: ignore[arg-type]
            wc, ac = float(r["warm_cpu"]), float(r["aot_cpu"])  # type: ignore[arg-type]
            row = (
                f"| {name} | {mode} | {c:.2f} | {w:.2f} | {a:.2f} | {w / a:.2f} "
                f"| {wc:.2f} | {ac:.2f} | {wc / ac:.2f} | {r['hits']} |"
            )
            rows.append(row)
            print(row, flush=True)
    load = " ".join(f"{v:.2f}" for v in load_before), " ".join(f"{v:.2f}" for v in os.getloadavg())
    caption = (
        f"{'median' if args.median else 'fastest'} of {args.repeat} processes; "
        f"load average (1, 5, 15 min) {load[0]} before, {load[1]} after"
    )
    print(caption, flush=True)
    if args.markdown is not None:
        args.markdown.write_text("\n".join([caption, "", *rows]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
