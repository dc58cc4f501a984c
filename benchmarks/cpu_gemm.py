"""CPU matmuls with an epilogue: ATen's addmm (MKL's sgemm) against oneDNN's linear
with post-ops (`torch.ops.mkldnn._linear_pointwise`), float32.

    uv run python benchmarks/cpu_gemm.py [--threads 2,1] [--shapes 64x512x512,...]

For each M x K x N (input M x K, weight N x K, bias N), in microseconds, the fastest
of the repeats (the 2-core machine is shared: medians measure the neighbours), each
variant timed in turn, round after round, so that they see the same machine:

- "addmm": `torch.addmm(b, x, w.t())`, what eager's `nn.Linear` runs;
- "addmm+silu": the same, then an in-place SiLU (two passes over the output);
- "addmm+add": the same, then a residual add into a fresh tensor;
- "dnn": `_linear_pointwise(x, w, b, "none")`, the bias added in oneDNN's output pass;
- "dnn+silu": post-op "swish" (SiLU) in the output pass;
- "dnn+add": `_linear_pointwise.binary(x, r, w, b, "add")`, the residual in it.

"err" columns: the largest |result - float64 reference| of the plain matmul and of
the SiLU variants, to show that oneDNN stays within float32 rounding of eager's.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

SHAPES = (
    "64x256x512,64x512x512,64x512x64,256x64x192,256x64x256,256x256x64,"
    "512x768x3072,8x1024x1024,1024x1024x1024"
)


def variants(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor
) -> dict[str, Callable[[], Any]]:
    linear = torch.ops.mkldnn._linear_pointwise
    return {
        "addmm": lambda: torch.addmm(b, x, w.t()),
        "addmm+silu": lambda: F.silu(torch.addmm(b, x, w.t()), inplace=True),
        "addmm+add": lambda: torch.addmm(b, x, w.t()) + r,
        "dnn": lambda: linear(x, w, b, "none", [], ""),
        "dnn+silu": lambda: linear(x, w, b, "swish", [], ""),
        "dnn+add": lambda: linear.binary(x, r, w, b, "add"),
    }


def fastest_us(fns: dict[str, Callable[[], Any]], rounds: int, per_round: int) -> dict[str, float]:
    best = dict.fromkeys(fns, float("inf"))
    for f in fns.values():
        f()
    for _ in range(rounds):
        for name, f in fns.items():
            for _ in range(per_round):
                start = time.perf_counter()
                f()
                best[name] = min(best[name], time.perf_counter() - start)
    return {name: t * 1e6 for name, t in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default=str(torch.get_num_threads()))
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, oneDNN {torch.backends.mkldnn.is_available()}")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        print(f"\n{threads} thread(s)\n")
        print(
            "| M x K x N | addmm | addmm+silu | addmm+add | dnn | dnn+silu | dnn+add "
            "| addmm / dnn | err addmm | err dnn | err silu eager | err dnn+silu |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for shape in args.shapes.split(","):
            m, k, n = (int(s) for s in shape.split("x"))
            torch.manual_seed(0)
            x, w, b = torch.randn(m, k), torch.randn(n, k) / k**0.5, torch.randn(n)
            r = torch.randn(m, n)
            fns = variants(x, w, b, r)
            per_round = max(1, min(20, int(2e7 / (m * k * n))))
            t = fastest_us(fns, args.rounds, per_round)
            ref = torch.addmm(b.double(), x.double(), w.double().t())
            silu_ref = F.silu(ref)

            def err(value: torch.Tensor, reference: torch.Tensor) -> float:
                return float((value.double() - reference).abs().max())

            errors = [
                err(fns["addmm"](), ref),
                err(fns["dnn"](), ref),
                err(fns["addmm+silu"](), silu_ref),
                err(fns["dnn+silu"](), silu_ref),
            ]
            add_err = err(fns["dnn+add"](), ref + r.double())
            assert add_err < 1e-4, add_err
            cells = [f"{t[name]:.1f}" for name in fns]
            print(
                f"| {shape} | {' | '.join(cells)} | {t['addmm'] / t['dnn']:.2f}x | "
                + " | ".join(f"{e:.1e}" for e in errors)
                + " |"
            )


if __name__ == "__main__":
    main()
