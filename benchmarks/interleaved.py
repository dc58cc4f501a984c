"""Backends compared in one process, in alternating rounds: ratios a noisy host cannot bend.

`ember bench` runs each backend in a fresh process, which isolates compiles and
memory but lets the host's speed differ between the processes it compares. On the
GPU machine a launch-bound MobileNetV3 training step is bound by the host, and the
host time of one backend moved by 1.8x from one process to the next (H100, bf16,
2026-11-25: ember 4.6 ms and Inductor reduce-overhead 6.8 ms in one pair of
processes, 6.5 and 4.6 ms in the next, at the same commit). Here every backend
compiles its own copy of the model in this process, and the timed calls alternate:
round after round, each backend in turn, so a slow spell of the host slows all of
them alike. Each backend's figure is its fastest round's median.

Two figures per backend:
- latency: one step timed with CUDA events and a synchronize after it (as `ember
  bench` times), the time a caller waits for a step;
- throughput: `--calls` steps enqueued back to back, then one synchronize, per step
  (host and GPU overlap across steps, as in a training loop that does not read the
  loss every step).

    EMBER_STRICT=1 python3 benchmarks/interleaved.py --models mobilenetv3 --mode train

`ember-aot` is ember with AOTAutograd's training runtime in place of its own
(`EMBER_AUTOGRAD=aot`, ember.runtime.lean_runtime). Training steps are `ember bench`'s
(forward, loss, backward; no optimizer). Every ember graph must have compiled (the
script fails if one ran eagerly), and each backend's first output is compared with
eager's under the bench's accuracy rule (against a float64 run of the same model).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import ember.runtime  # noqa: F401  (registers the backend)
from ember.runtime.accuracy import compare_outputs
from ember.runtime.bench.measure import _cloned, _graph_steps, prepare, step_fn
from ember.runtime.compiler import compile_records


def build(name: str, mode: str, backend: str) -> Callable[[], Any]:
    model, inputs = prepare(name, torch.device("cuda"), torch.bfloat16)
    if backend == "eager":
        return step_fn(model, inputs, mode)
    model = copy.deepcopy(model)
    if backend == "inductor-ro":
        compiled = torch.compile(model, backend="inductor", mode="reduce-overhead")
        return _graph_steps(step_fn(compiled, inputs, mode))  # type: ignore[arg-type]
    if backend.startswith("ember"):  # ember, or ember-aot: its training runtime AOTAutograd's
        autograd = "aot" if backend == "ember-aot" else "lean"
        compiled = torch.compile(model, backend="ember", options={"autograd": autograd})
        return step_fn(compiled, inputs, mode)  # type: ignore[arg-type]
    return step_fn(torch.compile(model, backend=backend), inputs, mode)  # type: ignore[arg-type]


def latency_ms(fn: Callable[[], Any], calls: int) -> float:
    times = []
    for _ in range(calls):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(statistics.median(times))


def throughput_ms(fn: Callable[[], Any], calls: int) -> float:
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - began) * 1e3 / calls


def compare(name: str, mode: str, backends: list[str], rounds: int, calls: int) -> None:
    torch.manual_seed(0)
    steps: dict[str, Callable[[], Any]] = {}
    first = len(compile_records)
    exact_model, exact_inputs = prepare(name, torch.device("cuda"), torch.float64)
    exact = _cloned(step_fn(exact_model, exact_inputs, mode)())
    del exact_model, exact_inputs
    expected = _cloned(build(name, mode, "eager")())
    for backend in backends:
        started = time.perf_counter()
        before = len(compile_records)
        fn = build(name, mode, backend)
        out = _cloned(fn())
        torch.cuda.synchronize()
        print(f"{name} {mode} {backend}: first call {time.perf_counter() - started:.1f} s",
              file=sys.stderr, flush=True)  # fmt: skip
        verdict = compare_outputs(out, expected, reference=exact)
        if verdict is not None:
            raise SystemExit(
                f"{backend} differs from eager at {verdict[1]}: {verdict[0].describe()}"
            )
        for _ in range(3):
            fn()
        steps[backend] = fn
        runtimes = {r.autograd for r in compile_records[before:] if r.autograd}
        if runtimes:
            print(f"  training runtime: {', '.join(sorted(runtimes))}", file=sys.stderr)
    eager_graphs = [r.graph for r in compile_records[first:] if r.ran_eagerly]
    if eager_graphs:
        raise SystemExit(f"ember graphs ran eagerly: {eager_graphs}")
    best = {b: [float("inf"), float("inf")] for b in backends}
    for _ in range(rounds):
        for backend, fn in steps.items():
            best[backend][0] = min(best[backend][0], latency_ms(fn, calls))
            best[backend][1] = min(best[backend][1], throughput_ms(fn, calls))
    ember = best.get("ember")
    print(f"\n{name} {mode} (bf16, {rounds} rounds of {calls} steps, fastest round)")
    print(
        "| backend | latency ms | throughput ms/step | ember vs it, latency "
        "| ember vs it, throughput |"
    )
    print("|---|---:|---:|---:|---:|")
    for backend, (lat, thr) in best.items():
        ratio = f"{lat / ember[0]:.2f}x | {thr / ember[1]:.2f}x" if ember else "- | -"
        print(f"| {backend} | {lat:.3f} | {thr:.3f} | {ratio} |")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="mobilenetv3")
    parser.add_argument("--mode", default="train", choices=["train", "inference"])
    parser.add_argument("--backends", default="eager,inductor-ro,ember")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("interleaved.py: needs a CUDA device", file=sys.stderr)
        return 2
    for name in args.models.split(","):
        torch._dynamo.reset()
        compare(name, args.mode, args.backends.split(","), args.rounds, args.calls)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
