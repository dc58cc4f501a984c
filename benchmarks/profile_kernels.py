"""Which GPU kernels a compiled step spends its time in, for ember beside Inductor
and eager: the profile behind a speed miss in the benchmark table.

    python benchmarks/profile_kernels.py --models transformer_block --mode train [--top 12]

Each backend compiles the model (bf16 on CUDA), runs a few warm-up steps, then
profiles five steps with torch.profiler and prints its CUDA kernels grouped by name:
total microseconds per step, launches per step, and the share of the step. Ember's
kernel names say what they fuse (k3_red_var_mean_add...), so a slow one points at
its schedule. Matmul/attention kernels are the libraries' own names.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import ember.runtime  # noqa: F401  (registers the backend)
from ember.runtime.bench.measure import prepare, step_fn

STEPS = 5


def kernel_times(backend: str, name: str, mode: str) -> tuple[float, dict[str, list[float]]]:
    torch._dynamo.reset()
    model, inputs = prepare(name, torch.device("cuda"), torch.bfloat16)
    compiled = model if backend == "eager" else torch.compile(model, backend=backend)
    step = step_fn(compiled, inputs, mode)  # type: ignore[arg-type]
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = by_name[event.name]
            entry[0] += event.device_time / STEPS  # microseconds
            entry[1] += 1 / STEPS
    total = sum(v[0] for v in by_name.values())
    return total, dict(by_name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="transformer_block")
    parser.add_argument("--mode", default="train")
    parser.add_argument("--backends", default="eager,inductor,ember")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    for name in args.models.split(","):
        for backend in args.backends.split(","):
            total, kernels = kernel_times(backend, name, args.mode)
            count = sum(v[1] for v in kernels.values())
            print(f"\n{name} {args.mode} {backend}: {total:.0f} us of kernels per step, "
                  f"{count:.0f} launches")  # fmt: skip
            ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])[: args.top]
            for kernel, (us, launches) in ranked:
                share = 100 * us / total if total else 0.0
                print(f"  {us:9.1f} us {launches:5.1f}x {share:5.1f}%  {kernel[:90]}")


if __name__ == "__main__":
    main()
