"""Cold and warm compile times: ember with an empty cache, ember again in a fresh
process sharing that cache (the persistent compile cache: no lowering, no kernel
compiles), and `aot_eager` (AOTAutograd tracing alone, no compiler behind it), side by
side, each model in fresh processes.

Compile time is the wall time of the first call (inference under no_grad, or one
training step's forward and backward) minus the wall time of a steady call, as
measured in the same process. Every ember process runs with EMBER_STRICT=1 and
reports its graphs' cache hits, so a warm number is a real hit, not a silent eager
run.

    python3 benchmarks/warm_compile.py --device cuda --models mlp gpt2 --mode inference

Runs with PYTHONPATH over packages/*/src or without it (it adds them itself).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
import json, sys, time, torch
backend, name, device, mode = sys.argv[1:5]
import ember.runtime
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
start = time.perf_counter(); step(); first = time.perf_counter() - start
times = []
for _ in range(5):
    start = time.perf_counter(); step(); times.append(time.perf_counter() - start)
steady = sorted(times)[2]
print(json.dumps({"first": first, "steady": steady, "compile": first - steady,
                  "cache": dict(compile_cache.stats) if backend == "ember" else None,
                  "eager_graphs": sum(1 for r in compile_records if r.ran_eagerly)}))
"""


def child(backend: str, name: str, device: str, mode: str, cache: str) -> dict[str, object]:
    env = {**os.environ, "EMBER_CACHE_DIR": cache, "EMBER_STRICT": "1"}
    paths = [str(p) for p in sorted((_ROOT / "packages").glob("*/src"))]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, backend, name, device, mode],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{backend} {name} failed:\n{done.stderr[-3000:]}")
    result: dict[str, object] = json.loads(lines[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", default="inference", choices=["inference", "train"])
    parser.add_argument("--models", nargs="+", default=["mlp", "transformer_block"])
    args = parser.parse_args()
    print(
        f"{'model':<18} {'ember cold s':>12} {'ember warm s':>12} {'aot_eager s':>11} "
        f"{'warm/aot_eager':>14}  cache hits"
    )
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix="ember-warm-") as cache:
            cold = child("ember", name, args.device, args.mode, cache)
            warm = child("ember", name, args.device, args.mode, cache)
        with tempfile.TemporaryDirectory(prefix="ember-warm-") as cache:
            aot = child("aot_eager", name, args.device, args.mode, cache)
        c, w, a = (float(r["compile"]) for r in (cold, warm, aot))  # type: ignore[arg-type]
        hits = (warm["cache"] or {}).get("hits")  # type: ignore[union-attr]
        print(f"{name:<18} {c:12.2f} {w:12.2f} {a:11.2f} {w / a:14.2f}  {hits}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
