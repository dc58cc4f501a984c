"""Host time of each phase of a training step (forward, loss, backward), no sync inside.

A launch-bound step is bound by the host while the GPU waits: the phase that takes the
host longest is where to look. After warm-up, 30 steps run back to back; the figures
are each phase's median host time, and the step time with one synchronize after the
30. `--profile` adds a cProfile of 20 more steps with the autograd engine kept on the
calling thread (a CUDA backward otherwise runs on the engine's own thread, which the
profiler does not see).

    python3 benchmarks/step_phases.py --model llama_small --backend ember [--profile]

The host of the GPU machine changes speed between processes (up to 1.8x, H100
2026-11-25): compare backends with `benchmarks/interleaved.py`, and read these phases
as shares within one process.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch

import ember.runtime  # noqa: F401  (registers the backend)
from ember.runtime.bench.measure import prepare
from ember.runtime.bench.registry import loss_input


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="mobilenetv3")
    parser.add_argument("--backend", default="ember", choices=["eager", "inductor-ro", "ember"])
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    model, inputs = prepare(args.model, torch.device("cuda"), torch.bfloat16)
    model.train()
    if args.backend == "inductor-ro":
        compiled = torch.compile(model, mode="reduce-overhead")
    elif args.backend == "eager":
        compiled = model
    else:
        compiled = torch.compile(model, backend="ember")
    params = [p for p in model.parameters() if p.requires_grad]
    times: list[tuple[float, float, float]] = []

    def step(record: bool) -> None:
        if args.backend == "inductor-ro":
            torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]
        t0 = time.perf_counter()
        for p in params:
            p.grad = None
        out = compiled(*inputs)
        t1 = time.perf_counter()
        loss = loss_input(out).float().square().mean()
        t2 = time.perf_counter()
        loss.backward()  # type: ignore[no-untyped-call]  # torch stub
        t3 = time.perf_counter()
        if record:
            times.append((t1 - t0, t2 - t1, t3 - t2))

    for _ in range(5):
        step(False)
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(30):
        step(True)
    torch.cuda.synchronize()
    total = (time.perf_counter() - began) / 30 * 1e3
    fwd, loss, bwd = (statistics.median(t[i] for t in times) * 1e3 for i in range(3))
    print(
        f"{args.model} {args.backend}: step {total:.3f} ms; host forward {fwd:.3f}, "
        f"loss {loss:.3f}, backward {bwd:.3f}, sum {fwd + loss + bwd:.3f} ms"
    )
    if args.profile:
        torch.autograd.set_multithreading_enabled(False)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(20):
            step(False)
        torch.cuda.synchronize()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
