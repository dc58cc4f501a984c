"""Long cumsums on the GPU: device time per call of eager (CUB), ember's one-pass
look-back kernel and ember's segmented scan (three kernels, ember.ir.scan), at 1M and
4M elements of float32 and bfloat16, with every result checked against eager by the
accuracy rule.

    export PYTHONPATH=$(printf '%s:' $PWD/packages/*/src)
    python3 benchmarks/scan_gpu.py [--sizes 1048576,4194304] [--rounds 5] [--calls 200]

Device time per call is what torch.profiler's CUDA activity records (kernels and any
memset or copy the call makes, summed) over `--calls` calls, divided by the calls;
the variants are profiled in alternating rounds in one process and the median round
is printed, with the fastest in brackets. Ember runs without CUDA graphs here, so
every kernel shows in the profile as a launch of its own; the look-back kernel's
workspace is kept by its launcher and costs no call anything (zeroed once).
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

import ember.runtime  # noqa: F401  # registers backend="ember"
from ember.ir import scan as ir_scan
from ember.runtime.accuracy import compare_outputs


def cumsum(x: torch.Tensor) -> torch.Tensor:
    return x.cumsum(0)


def look_back(x: torch.Tensor) -> torch.Tensor:
    return x.cumsum(0)


def segmented(x: torch.Tensor) -> torch.Tensor:
    return x.cumsum(0)  # a code object of its own: Dynamo keeps its compiles apart


# ember's variants: (function, whether its first call per shape lowers long float32
# scans in one pass). The compile cache is off: both variants trace the same graph.
OPTIONS = {"cudagraphs": "off", "strict": True, "compile_cache": False}
VARIANTS = {"look-back": (look_back, True), "segmented": (segmented, False)}


def compiled_variant(name: str, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """Ember's variant `name`, compiled (and tuned) for `x` by a first call."""
    fn, single_pass = VARIANTS[name]
    compiled = torch.compile(fn, backend="ember", dynamic=False, options=OPTIONS)
    saved = ir_scan.SINGLE_PASS_DEVICES
    ir_scan.SINGLE_PASS_DEVICES = ("cuda",) if single_pass else ()
    try:
        compiled(x)
    finally:
        ir_scan.SINGLE_PASS_DEVICES = saved
    return compiled  # type: ignore[no-any-return]  # a compiled callable


def device_us_per_call(run: Callable[[], Any], calls: int) -> tuple[float, dict[str, int]]:
    """Profiled device microseconds per call, and the device activities per call."""
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    total = 0.0
    names: dict[str, int] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total += event.device_time
            names[event.name] = names.get(event.name, 0) + 1
    return total / calls, {n: c // calls for n, c in names.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=f"{1 << 20},{1 << 22}")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    header = "elements dtype     | eager us | look-back us (x eager) | segmented us (x eager)"
    print(header + "\n" + "-" * len(header))
    for size in (int(s) for s in args.sizes.split(",")):
        for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
            x = torch.randn(size, device="cuda").to(dtype)
            variants: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"eager": cumsum}
            reference = cumsum(x.double())
            for name in VARIANTS:
                compiled = variants[name] = compiled_variant(name, x)
                verdict = compare_outputs(compiled(x), cumsum(x), reference=reference)
                if verdict is not None:
                    raise SystemExit(f"{name} {size} {dtype}: {verdict[0].describe()}")
            times: dict[str, list[float]] = {n: [] for n in variants}
            kernels: dict[str, dict[str, int]] = {}
            for _ in range(args.rounds):
                for name, fn in variants.items():
                    us, kernels[name] = device_us_per_call(functools.partial(fn, x), args.calls)
                    times[name].append(us)
            median = {n: statistics.median(t) for n, t in times.items()}
            best = {n: min(t) for n, t in times.items()}
            cells = [f"{median['eager']:6.2f} [{best['eager']:.2f}]"]
            for name in ("look-back", "segmented"):
                ratio = median["eager"] / median[name]
                cells.append(f"{median[name]:6.2f} [{best[name]:.2f}] ({ratio:.2f}x)")
            print(f"{size:8d} {str(dtype).removeprefix('torch.'):10s} | " + " | ".join(cells))
            for name, found in kernels.items():
                print(f"    {name}: " + ", ".join(f"{n[:60]} x{c}" for n, c in found.items()))


if __name__ == "__main__":
    main()
