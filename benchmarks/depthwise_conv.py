"""Depthwise convolutions on a CUDA GPU: eager channels-last and NCHW, ember (its own
kernels: this script sets EMBER_DEPTHWISE=loops unless it is set) and Inductor's
default, forward and forward + backward, bfloat16, on MobileNetV3's and ConvNeXt's
depthwise shapes. Ember's output is checked against eager's channels-last output
(largest difference, `err`), and its kernel count (`kern`) shows it ran its own loops.

Also the first call's seconds of eager channels-last (cuDNN 9.10 and later compiles its
channels-last depthwise kernels at run time on first use, NVIDIA/cudnn-frontend#1066)
and of ember (its compile), each timed in this process before any warm-up of that
shape: a shape run earlier in the process (another direction) may have warmed cuDNN.

    export PYTHONPATH=$(printf '%s:' $PWD/packages/*/src)
    python3 benchmarks/depthwise_conv.py [--shapes mbv3,convnext] [--batch 32]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("EMBER_STRICT", "1")
os.environ.setdefault("EMBER_DEPTHWISE", "loops")

import torch
import torch._dynamo

from ember.runtime.timing import median_ms, synchronize

# name -> (channels, height/width, kernel, stride)
SHAPES: dict[str, dict[str, tuple[int, int, int, int]]] = {
    "mbv3": {
        "mbv3_16x112_k3s1": (16, 112, 3, 1),
        "mbv3_64x112_k3s2": (64, 112, 3, 2),
        "mbv3_72x56_k5s2": (72, 56, 5, 2),
        "mbv3_120x28_k5s1": (120, 28, 5, 1),
        "mbv3_240x28_k3s2": (240, 28, 3, 2),
        "mbv3_480x14_k3s1": (480, 14, 3, 1),
        "mbv3_672x14_k5s2": (672, 14, 5, 2),
        "mbv3_960x7_k5s1": (960, 7, 5, 1),
    },
    "convnext": {
        "convnext_96x56_k7": (96, 56, 7, 1),
        "convnext_192x28_k7": (192, 28, 7, 1),
        "convnext_384x14_k7": (384, 14, 7, 1),
        "convnext_768x7_k7": (768, 7, 7, 1),
    },
}


def _conv(channels: int, kernel: int, stride: int, fmt: torch.memory_format) -> torch.nn.Module:
    conv = torch.nn.Conv2d(channels, channels, kernel, stride, kernel // 2, groups=channels)
    return conv.to(device="cuda", dtype=torch.bfloat16, memory_format=fmt)


def _runner(module: Any, x: torch.Tensor, backward: bool) -> Callable[[], Any]:
    if not backward:

        def forward() -> Any:
            with torch.no_grad():
                return module(x)

        return forward

    def both() -> Any:
        out = module(x)
        out.backward(torch.ones_like(out))
        return out

    return both


def _first_s(fn: Callable[[], Any]) -> float:
    device = torch.device("cuda")
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def measure(shape: tuple[int, int, int, int], batch: int, backward: bool) -> dict[str, float]:
    channels, size, kernel, stride = shape
    device = torch.device("cuda")
    from ember.runtime.compiler import compile_records

    results: dict[str, float] = {}
    x = torch.randn(batch, channels, size, size, device="cuda", dtype=torch.bfloat16)
    reference: Any = None
    for label, fmt in (("eager_cl", torch.channels_last), ("eager_nchw", torch.contiguous_format)):
        torch.manual_seed(0)
        xf = x.detach().to(memory_format=fmt).requires_grad_(backward)
        fn = _runner(_conv(channels, kernel, stride, fmt), xf, backward)
        if label == "eager_cl":
            results["first_eager_cl_s"] = _first_s(fn)
            reference = fn().detach()
        results[label] = median_ms(fn, device)
    xc = x.detach().to(memory_format=torch.channels_last).requires_grad_(backward)
    for label, backend in (("ember", "ember"), ("inductor", "inductor")):
        torch._dynamo.reset()
        torch.manual_seed(0)  # the same weights as eager's channels-last module
        conv = _conv(channels, kernel, stride, torch.channels_last)
        module = torch.compile(conv, backend=backend)
        fn = _runner(module, xc, backward)
        if label == "ember":
            first = len(compile_records)
            results["first_ember_s"] = _first_s(fn)
            results["kern"] = sum(r.kernels for r in compile_records[first:])
            results["err"] = float((fn().detach().float() - reference.float()).abs().max())
        results[label] = median_ms(fn, device)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="mbv3,convnext", help="sets: " + ",".join(SHAPES))
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    import ember.runtime  # noqa: F401  # registers the "ember" backend

    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}, bf16, batch {args.batch}, EMBER_STRICT="
          f"{os.environ.get('EMBER_STRICT')}, "
          f"EMBER_DEPTHWISE={os.environ['EMBER_DEPTHWISE']}")  # fmt: skip
    rows: list[tuple[str, str, dict[str, float]]] = []
    for group in args.shapes.split(","):
        for name, shape in SHAPES[group].items():
            for direction, backward in (("fwd", False), ("fwd+bwd", True)):
                found = measure(shape, args.batch, backward)
                rows.append((name, direction, found))
                print(name, direction, {k: round(v, 4) for k, v in found.items()}, flush=True)
    columns = ("eager_cl", "eager_nchw", "ember", "inductor", "first_eager_cl_s", "first_ember_s")
    columns += ("kern", "err")
    header = f"{'shape':<22} {'dir':<8}" + "".join(f"{c:>17}" for c in columns)
    print()
    print("ms per call (median), first call in seconds")
    print(header)
    for name, direction, found in rows:
        print(f"{name:<22} {direction:<8}" + "".join(f"{found[c]:>17.3f}" for c in columns))


if __name__ == "__main__":
    main()
