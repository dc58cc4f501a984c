"""CPU matmuls with an epilogue: ATen's addmm (MKL's sgemm) against oneDNN's linear
with post-ops (`torch.ops.mkldnn._linear_pointwise`), float32.

    uv run python benchmarks/cpu_gemm.py [--threads 2,1] [--shapes 64x512x512,...]
    uv run python benchmarks/cpu_gemm.py --grid [--threads 2,1] [--json PATH]
    uv run python benchmarks/cpu_gemm.py --prepack [--threads 2,1] [--shapes ...]

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

`--grid` times the cases ember's `cpu_linear` pass asks about (ember.runtime.cpu_gemm
decides them) over a grid of sizes, ATen (addmm or mm, then the activation) against
oneDNN's linear with the post-op, for each operand layout a training graph holds:
"nt" the forward linear (input M x K, weight N x K, both contiguous; with a bias and
post-op none, gelu or swish), "nn" the input gradient (`mm(g, W)`: the weight read
transposed), "tn" the weight gradient (`mm(g^T, x)`: both read transposed). Rounds
run over the whole grid in turn (each round every case, both sides), so a burst of
load on the shared machine costs one round of many cases rather than every round of
one; each side's value is its fastest call. Printed: ATen / oneDNN per case, and the
verdict of ember's rule beside it.
"""

from __future__ import annotations

import argparse
import json
import os
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


GRID_M = (1, 8, 32, 128, 512, 2048)
GRID_KN = (64, 256, 1024, 4096)
GRID_MAX_MACS = 1 << 29
# layout -> post-ops timed (a bias with each forward post-op; none in the backward)
GRID_CASES = {"nt": ("none", "gelu", "swish"), "nn": ("none",), "tn": ("none",)}
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda t: t,
    "gelu": F.gelu,
    "swish": F.silu,
}


def _grid_operands(layout: str, m: int, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, weight as oneDNN takes it, N x K) with the layout's strides."""
    x = torch.randn(m, k) if layout[0] == "n" else torch.randn(k, m).t()
    # "nt": N x K row-major; else the matmul's right operand is a contiguous K x N
    # matrix, read transposed
    weight = torch.randn(n, k) if layout == "nt" else torch.randn(k, n).t()
    weight = weight / k**0.5
    return x, weight


def grid(rounds: int, threads: int) -> list[dict[str, Any]]:
    """Every grid case's fastest ATen and oneDNN call, rounds over the whole grid."""
    from ember.graphpasses import LinearCase

    try:
        from ember.runtime.cpu_gemm import rule
    except ImportError:  # a tree before the rule: measurements only

        def rule(case: LinearCase) -> bool | None:
            return None

    linear = torch.ops.mkldnn._linear_pointwise
    cases: list[dict[str, Any]] = []
    for layout, post_ops in GRID_CASES.items():
        for m in GRID_M:
            for k in GRID_KN:
                for n in GRID_KN:
                    if m * k * n > GRID_MAX_MACS:
                        continue
                    torch.manual_seed(0)
                    x, w = _grid_operands(layout, m, k, n)
                    for post in post_ops:
                        bias = torch.randn(n) if layout == "nt" else None
                        act = _ACTIVATIONS[post]

                        def aten(x=x, w=w, bias=bias, act=act) -> torch.Tensor:  # type: ignore[no-untyped-def]
                            out = torch.addmm(bias, x, w.t()) if bias is not None else x @ w.t()
                            return act(out)

                        def onednn(x=x, w=w, bias=bias, post=post) -> torch.Tensor:  # type: ignore[no-untyped-def]
                            return linear(x, w, bias, post, [], "none" if post == "gelu" else "")

                        linear_case = LinearCase(
                            m, k, n, tuple(x.stride()), tuple(w.stride()), bias is not None, post
                        )
                        cases.append(
                            {
                                "layout": layout,
                                "m": m,
                                "k": k,
                                "n": n,
                                "post_op": post,
                                "threads": threads,
                                "rule": rule(linear_case),
                                "fns": {"aten": aten, "onednn": onednn},
                                "calls": max(1, min(10, int(2e6 / (m * k * n)))),
                                "best": {"aten": float("inf"), "onednn": float("inf")},
                            }
                        )
    for case in cases:  # first calls: oneDNN's primitive, MKL's buffers
        for f in case["fns"].values():
            f()
    for r in range(rounds):
        order = ("aten", "onednn") if r % 2 == 0 else ("onednn", "aten")
        for case in cases:
            for side in order:
                f = case["fns"][side]
                for _ in range(case["calls"]):
                    start = time.perf_counter()
                    f()
                    case["best"][side] = min(case["best"][side], time.perf_counter() - start)
    for case in cases:
        del case["fns"]
        case["aten_us"] = case["best"]["aten"] * 1e6
        case["onednn_us"] = case["best"]["onednn"] * 1e6
        del case["best"]
        case["ratio"] = case["aten_us"] / case["onednn_us"]
    return cases


def _verdict(choice: bool | None) -> str:
    return "?" if choice is None else "d" if choice else "a"


def print_grid(cases: list[dict[str, Any]]) -> None:
    """One table per layout and post-op: rows M, columns K x N, cells ATen / oneDNN
    (above 1: oneDNN faster), with the rule's verdict (d: oneDNN, a: ATen)."""
    keys = sorted({(c["layout"], c["post_op"]) for c in cases}, key=str)
    kn = [(k, n) for k in GRID_KN for n in GRID_KN]
    for layout, post in keys:
        print(f"\n{layout}, post-op {post} (ATen / oneDNN; rule: d oneDNN, a ATen)\n")
        print("| M | " + " | ".join(f"{k}x{n}" for k, n in kn) + " |")
        print("|---|" + "---:|" * len(kn))
        for m in GRID_M:
            row = {
                (c["k"], c["n"]): c
                for c in cases
                if (c["layout"], c["post_op"], c["m"]) == (layout, post, m)
            }
            cells = [
                f"{row[kn_]['ratio']:.2f} {_verdict(row[kn_]['rule'])}" if kn_ in row else ""
                for kn_ in kn
            ]
            print(f"| {m} | " + " | ".join(cells) + " |")


def prepack(shapes: str, rounds: int) -> None:
    """oneDNN's linear with the weight as a plain tensor against the weight reordered
    once into oneDNN's blocked layout (`mkldnn._reorder_linear_weight`, what a
    prepacked inference graph would hold), and MKL's packed sgemm
    (`mkl._mkl_reorder_linear_weight` + `mkl._mkl_linear`, no post-op), each with a
    bias and post-op "swish" where it has one; plus the reorders' own cost."""
    print(
        "| M x K x N | dnn+silu | dnn+silu packed | packed / plain | mkl packed + silu "
        "| reorder (dnn) | reorder (mkl) | err packed |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for shape in shapes.split(","):
        m, k, n = (int(s) for s in shape.split("x"))
        print(f"| {shape} | " + " | ".join(_prepack_row(m, k, n, rounds)) + " |")


def _prepack_row(m: int, k: int, n: int, rounds: int) -> list[str]:
    linear = torch.ops.mkldnn._linear_pointwise
    mkl = getattr(torch.ops, "mkl", None)
    torch.manual_seed(0)
    x, w, b = torch.randn(m, k), torch.randn(n, k) / k**0.5, torch.randn(n)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, m)
    fns: dict[str, Callable[[], Any]] = {
        "plain": lambda: linear(x, w, b, "swish", [], ""),
        "packed": lambda: linear(x, packed, b, "swish", [], ""),
        "reorder dnn": lambda: torch.ops.mkldnn._reorder_linear_weight(w, m),
    }
    if mkl is not None and torch._C.has_mkl:
        mkl_packed = mkl._mkl_reorder_linear_weight(w, m)
        fns["mkl"] = lambda: F.silu(mkl._mkl_linear(x, mkl_packed, w, b, m), inplace=True)
        fns["reorder mkl"] = lambda: mkl._mkl_reorder_linear_weight(w, m)
    per_round = max(1, min(20, int(2e7 / (m * k * n))))
    t = fastest_us(fns, rounds, per_round)
    err = float((fns["packed"]() - fns["plain"]()).abs().max())
    return [
        f"{t['plain']:.1f}",
        f"{t['packed']:.1f}",
        f"{t['packed'] / t['plain']:.2f}",
        f"{t.get('mkl', float('nan')):.1f}",
        f"{t['reorder dnn']:.1f}",
        f"{t.get('reorder mkl', float('nan')):.1f}",
        f"{err:.1e}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default=str(torch.get_num_threads()))
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--grid", action="store_true", help="the rule's grid of cases")
    parser.add_argument("--json", help="with --grid: write every case's times here")
    parser.add_argument("--prepack", action="store_true", help="prepacked weights")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, oneDNN {torch.backends.mkldnn.is_available()}")
    if args.prepack:
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            print(f"\n{threads} thread(s), load average {os.getloadavg()}\n")
            prepack(args.shapes, args.rounds)
        return
    if args.grid:
        results = []
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            print(f"\n{threads} thread(s), load average {os.getloadavg()}")
            cases = grid(args.rounds, threads)
            print_grid(cases)
            results.extend(cases)
            print(f"load average after: {os.getloadavg()}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=0)
        return
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
