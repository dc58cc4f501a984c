"""Linear + GELU: cuBLAS alone, cuBLAS + a separate epilogue, and ember's matmul
template with the epilogue fused (ember.codegen.triton.gemm), side by side.

For each of the suite's linear shapes (M in 512, 2048, 8192 rows; K, N in 768, 3072,
4096; bfloat16) it checks the template's result against eager under the accuracy
rule, then times with `triton.testing.do_bench` medians:

- `cublas`: `torch.mm(x, w.t())` alone (the floor the template has to meet);
- `cublas+epi`: eager `gelu(linear(x, w, b))`: cuBLAS's addmm, then a GELU kernel;
- `ember`: the template kernel alone, bias and GELU fused, on preallocated buffers,
  after its configs were compiled and tuned;
- `inductor` (with `--inductor`): `torch.compile(mode="max-autotune-no-cudagraphs")`
  of the same function; its autotuning costs minutes, hence off by default.

Then what `EMBER_MATMUL_TEMPLATES=auto` chooses for the shape (ember.runtime.
matmul_choice: `auto`, template or cuBLAS) and its epilogue model next to the
epilogue measured here (`epi us model/measured`: the copy of the epilogue's bytes it
times, and `cublas+epi` minus `cublas`).

TFLOP/s counts 2*M*N*K per call for every column. The table prints last.

    python benchmarks/matmul_templates.py              # GPU, all nine shapes
    python benchmarks/matmul_templates.py --quick      # GPU, three shapes
    python benchmarks/matmul_templates.py --cpu-check  # tiny, Triton interpreter, no timing

Runs with PYTHONPATH over packages/*/src (no install needed).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if "--cpu-check" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

_ROOT = Path(__file__).resolve().parent.parent
for _src in sorted((_ROOT / "packages").glob("*/src")):
    if str(_src) not in sys.path:
        sys.path.insert(0, str(_src))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from ember.codegen.triton import TRITON_CHOICES, render_kernel  # noqa: E402
from ember.graphpasses import ember_decompositions  # noqa: E402
from ember.ir import LoweringOptions, lower_graph  # noqa: E402
from ember.runtime.accuracy import compare  # noqa: E402
from ember.scheduler import FusedKernel, schedule_program  # noqa: E402

TEMPLATES = dataclasses.replace(TRITON_CHOICES, matmul_epilogues=True)
ROWS = (512, 2048, 8192)
WIDTHS = ((768, 3072), (3072, 768), (768, 768), (4096, 4096), (3072, 3072))


def linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, w, b))


def shapes(quick: bool, cpu: bool) -> list[tuple[int, int, int]]:
    """(M, K, N) to run: every row count with each (K, N) pair of the suite's Linears
    (an MLP's up and down projections, attention's, a 4096-wide model's)."""
    if cpu:
        return [(37, 53, 29), (64, 48, 80)]
    widths = WIDTHS[:1] if quick else WIDTHS
    return [(m, k, n) for m in ROWS for k, n in widths][: 3 if quick else None]


def template_kernel(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> FusedKernel:
    """The fused kernel ember schedules for `linear_gelu` with templates on."""
    gm = make_fx(linear_gelu, decomposition_table=ember_decompositions())(x, w, b)
    program = lower_graph(gm, options=LoweringOptions(loops=True))
    schedule = schedule_program(program, TEMPLATES)
    (kernel,) = schedule.kernels
    if kernel.matmul is None:
        raise RuntimeError(f"no matmul template was scheduled:\n{schedule.format()}")
    return kernel


def ember_call(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, cache: Path
) -> tuple[Callable[[], torch.Tensor], float]:
    """A call of the template on preallocated buffers, and its compile seconds (render,
    load, first call: compiles and tunes the configs)."""
    from ember.runtime.triton_kernels import compile_triton_kernels

    start = time.perf_counter()
    kernel = template_kernel(x, w, b)
    launcher = compile_triton_kernels([render_kernel(kernel)], cache_dir=cache)[kernel.name]
    # buffer arguments by name: the three inputs as lowered (weight through its
    # transposed view), the output
    (out_member,) = [m for m in kernel.members if m.stored]
    out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    by_role = {"x": x, "w": w.t(), "b": b}
    tensors = []
    for name in kernel.buffer_arguments():
        if name == out_member.name:
            tensors.append(out)
        else:
            tensors.append(by_role[_role(kernel, name)])
    sizes: list[int] = []  # static shapes: no size arguments

    def call() -> torch.Tensor:
        launcher(*tensors, *sizes)
        return out

    call()
    if x.is_cuda:
        torch.cuda.synchronize()
    return call, time.perf_counter() - start


def auto_choice(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, cache: Path) -> Any:
    """What EMBER_MATMUL_TEMPLATES=auto decides for `linear_gelu` on these inputs."""
    from ember.runtime.matmul_choice import CudaMatmulTimer, choose_matmuls

    gm = make_fx(linear_gelu, decomposition_table=ember_decompositions())(x, w, b)
    program = lower_graph(gm, options=LoweringOptions(loops=True))
    _, decisions = choose_matmuls(program, TEMPLATES, TRITON_CHOICES, CudaMatmulTimer(cache))
    (decision,) = decisions
    return decision


def _role(kernel: FusedKernel, name: str) -> str:
    """Which input a buffer of the lowered graph is: x (read along K with a stride
    along M), the weight (read along K with a stride along N) or the bias."""
    from ember.scheduler import matmul_operands

    operands = matmul_operands(kernel.members[0].body)
    assert operands is not None
    a, b = operands
    if name == a.buffer:
        return "x"
    if name == b.buffer:
        return "w"
    return "b"


def bench(fn: Callable[[], Any], cpu: bool) -> float:
    if cpu:
        fn()
        return float("nan")
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100))


def run_shape(
    m: int, k: int, n: int, dtype: torch.dtype, cpu: bool, inductor: bool, cache: Path
) -> tuple[dict[str, float], float, str]:
    """One shape: ms per call of each column, ember's compile seconds, the check."""
    device = torch.device("cpu" if cpu else "cuda")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g).to(device, dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(device, dtype)
    b = torch.randn(n, generator=g).to(device, dtype)
    expected = linear_gelu(x, w, b)
    call, seconds = ember_call(x, w, b, cache)
    verdict = compare(call(), expected)
    timings = {
        "cublas": bench(lambda: torch.mm(x, w.t()), cpu),
        "cublas+epi": bench(lambda: linear_gelu(x, w, b), cpu),
        "ember": bench(call, cpu),
    }
    if inductor and not cpu:
        compiled = torch.compile(linear_gelu, mode="max-autotune-no-cudagraphs")
        compiled(x, w, b)
        timings["inductor"] = bench(lambda: compiled(x, w, b), cpu)
    check = "ok" if verdict.ok else f"WRONG ({verdict.reason})"
    if not cpu:
        decision = auto_choice(x, w, b, cache)
        measured_us = (timings["cublas+epi"] - timings["cublas"]) * 1e3
        model_us = decision.timing.epilogue_ms * 1e3 if decision.timing else float("nan")
        auto = "template" if decision.template else "cuBLAS"
        check += f"  auto={auto}  epi us model/measured={model_us:.1f}/{measured_us:.1f}"
    return timings, seconds, check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="three shapes only")
    parser.add_argument("--cpu-check", action="store_true", help="tiny shapes, interpreter")
    parser.add_argument("--inductor", action="store_true", help="add Inductor max-autotune")
    args = parser.parse_args()
    cpu = args.cpu_check
    if not cpu and not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU (or --cpu-check)")
    dtype = torch.float32 if cpu else torch.bfloat16
    rows: list[list[str]] = []
    columns: list[str] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as cache:
        for m, k, n in shapes(args.quick, cpu):
            timings, seconds, check = run_shape(m, k, n, dtype, cpu, args.inductor, Path(cache))
            flops = 2.0 * m * n * k
            columns = ["MxKxN", *(f"{c} TF/s" for c in timings), "epi/ember", "compile s", "check"]
            row = [f"{m}x{k}x{n}"]
            row += [f"{flops / (ms * 1e-3) / 1e12:.1f}" for ms in timings.values()]
            row += [f"{timings['cublas+epi'] / timings['ember']:.2f}", f"{seconds:.1f}", check]
            rows.append(row)
            print(" ".join(row), flush=True)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    where = "interpreter" if cpu else torch.cuda.get_device_name()
    print(f"\nLinear + GELU, {dtype}, {where}")
    print("  ".join(c.rjust(wd) for c, wd in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(v.rjust(wd) for v, wd in zip(row, widths, strict=True)))
    print(f"({time.perf_counter() - started:.0f} s; epi/ember above 1: the template is faster)")


if __name__ == "__main__":
    main()
