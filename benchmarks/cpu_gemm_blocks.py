"""CPU float32 linears with an epilogue: eager against ember's compiled graph with the
matmul kernels (the product blocked over the threads, one BLAS sgemm per block, the
bias and activation over each block in cache: ember.codegen.cpp.matmul_loops) and
without them (ATen's `addmm`, then ember's epilogue kernel).

    uv run python benchmarks/cpu_gemm_blocks.py [--threads 2,1] [--shapes 64x256x512,...]

Each graph is compiled with `compile_graph` from a `make_fx` trace and called
directly, so Dynamo's and AOTAutograd's per-call costs (the same for every variant)
are not in the numbers. Microseconds per call: each variant's fastest round median,
rounds interleaved (the 2-core machine is shared).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.graphpasses import ember_decompositions
from ember.runtime.compiler import compile_graph
from ember.runtime.config import config

SHAPES = "64x256x512,64x512x512,64x512x64,256x64x256,512x256x256,1024x1024x1024"
EPILOGUES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "bias": lambda t: t,
    "bias+silu": F.silu,
    "bias+gelu": F.gelu,
}


def compiled(fn: Callable[..., torch.Tensor], args: list[torch.Tensor], templates: str) -> Any:
    gm = make_fx(fn, decomposition_table=ember_decompositions())(*args)
    with config.scope(matmul_templates=templates):
        graph = compile_graph(gm, args)
    return lambda: graph(list(args))


def fastest_round_us(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    for f in fns.values():
        for _ in range(3):
            f()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, f in fns.items():
            times = []
            for _ in range(10):
                start = time.perf_counter()
                f()
                times.append(time.perf_counter() - start)
            best[name] = min(best[name], statistics.median(times))
    return {name: t * 1e6 for name, t in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default=str(torch.get_num_threads()))
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--rounds", type=int, default=20)
    options = parser.parse_args()
    print(f"torch {torch.__version__}")
    for threads in (int(t) for t in options.threads.split(",")):
        torch.set_num_threads(threads)
        print(f"\n{threads} thread(s)\n")
        columns = ("M x K x N", "epilogue", "eager", "ATen addmm + kernel", "matmul kernel")
        print("| " + " | ".join(columns) + " | eager / kernel |")
        print("|---|---|---:|---:|---:|---:|")
        for shape in options.shapes.split(","):
            m, k, n = (int(s) for s in shape.split("x"))
            torch.manual_seed(0)
            args = [torch.randn(m, k), torch.randn(n, k) / k**0.5, torch.randn(n)]
            for name, act in EPILOGUES.items():

                def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
                    return act(F.linear(x, w, b))  # noqa: B023  # traced at once

                with torch.no_grad():
                    fns = {
                        "eager": lambda: fn(*args),  # noqa: B023
                        "aten": compiled(fn, args, "off"),
                        "kernel": compiled(fn, args, "auto"),
                    }
                    ref = fn(*args)
                    for variant in ("aten", "kernel"):
                        torch.testing.assert_close(fns[variant]()[0], ref, rtol=1e-4, atol=1e-5)
                    us = fastest_round_us(fns, options.rounds)
                print(
                    f"| {shape} | {name} | {us['eager']:.1f} | {us['aten']:.1f} | "
                    f"{us['kernel']:.1f} | {us['eager'] / us['kernel']:.2f}x |"
                )


if __name__ == "__main__":
    main()
