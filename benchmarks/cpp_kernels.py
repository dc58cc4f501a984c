"""Memory-bound kernels on the CPU: eager vs Inductor vs ember's C++ kernels vs a
memcpy of the same bytes, and cold compile times of Inductor and ember.

    uv run python benchmarks/cpp_kernels.py [--repeat 20] [--scale 1.0] [--threads N]
        [--only softmax,gelu] [--no-inductor] [--libm]

`--libm` adds "libm ms": ember's kernels compiled with `EMBER_LIBM_MATH`, the
prelude's float exp, log, erf, tanh and sigmoid as libm calls (the scalar path the
vectorisable ones replace), outputs preallocated like "kernel ms". "eager out ms" is
eager's ATen kernel writing into a preallocated output (its `.out` overload, where the
case has one): the kernel-to-kernel comparison that "eager ms", mostly page faults of
the fresh output at these sizes, is not.

"inductor ms" is `torch.compile(fn, backend="inductor")` timed like eager (outputs
allocated per call); "ind cold s" is its first call with a fresh Inductor cache (it
includes Dynamo and AOTAutograd, a few seconds that every torch.compile backend pays);
ember's cold time is "trace+sched s" (make_fx, lowering, scheduling) plus "compile s"
(rendering and the C++ compiler).

"MB" is what the fused kernels must move (ember.scheduler.kernel_bytes); "memcpy" is
torch's copy_ of half that many bytes into a preallocated tensor (a copy reads and
writes, so it moves them all); "of memcpy" is memcpy ms / kernel ms (the target is
80%). "kernel ms" is ember's kernels alone, outputs preallocated (what the memcpy
does too); "ember ms" allocates fresh outputs per call like ember's wrapper, eager and
Inductor do (large CPU allocations are fresh pages: their first touch faults; ember's
wrapper marks those of 32 MiB or more for huge pages, and so does this), and is
what "vs eager" and "vs ind" compare. Times are the fastest
of the repeats: the 2-core machine is shared, medians mostly measure the neighbours.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sympy
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.codegen.cpp import CPP_CHOICES, CppSource, render_kernels
from ember.graphpasses import ember_decompositions
from ember.ir import LoweringOptions, evaluate, lower_graph
from ember.runtime.cpp_kernels import CppKernel, compile_cpp_kernels, compile_cpp_source
from ember.runtime.hugepages import advise_huge_pages
from ember.scheduler import kernel_bytes, schedule_program


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True, correction=0)
    return (x - mean) * torch.rsqrt(var + 1e-5) * w + b


def cases(
    scale: float,
) -> dict[str, tuple[Callable[..., Any], Callable[..., Any], tuple[Any, ...]]]:
    rows = int(4096 * scale)
    x = torch.randn(rows, 2048)
    y = torch.randn(rows, 2048)
    w, b = torch.randn(2048), torch.randn(2048)
    return {
        "softmax": (lambda x: x.softmax(-1), lambda x: x.softmax(-1), (x,)),
        "layer_norm": (layer_norm, lambda x, w, b: F.layer_norm(x, (2048,), w, b), (x, w, b)),
        "sum(-1)": (lambda x: x.sum(-1), lambda x: x.sum(-1), (x,)),
        "sum(0)": (lambda x: x.sum(0), lambda x: x.sum(0), (x,)),
        "gelu": (lambda x: F.gelu(x), lambda x: F.gelu(x), (x,)),
        "gelu tanh": (
            lambda x: F.gelu(x, approximate="tanh"),
            lambda x: F.gelu(x, approximate="tanh"),
            (x,),
        ),
        "silu": (lambda x: F.silu(x), lambda x: F.silu(x), (x,)),
        "sigmoid": (lambda x: torch.sigmoid(x), lambda x: torch.sigmoid(x), (x,)),
        "tanh": (lambda x: torch.tanh(x), lambda x: torch.tanh(x), (x,)),
        "exp": (lambda x: torch.exp(x), lambda x: torch.exp(x), (x,)),
        "log_softmax": (lambda x: x.log_softmax(-1), lambda x: x.log_softmax(-1), (x,)),
        "transpose": (lambda x: x.t().contiguous(), lambda x: x.t().contiguous(), (x,)),
        "transpose bf16": (
            lambda x: x.t().contiguous(),
            lambda x: x.t().contiguous(),
            (x.to(torch.bfloat16),),
        ),
        "residual add": (lambda x, y: x + y, lambda x, y: x + y, (x, y)),
    }


# eager's kernel into a preallocated output: case -> fn(out, *args)
EAGER_OUT: dict[str, Callable[..., Any]] = {
    "softmax": lambda out, x: torch.ops.aten._softmax.out(x, -1, False, out=out),
    "log_softmax": lambda out, x: torch.ops.aten._log_softmax.out(x, -1, False, out=out),
    "gelu": lambda out, x: torch.ops.aten.gelu.out(x, out=out),
    "gelu tanh": lambda out, x: torch.ops.aten.gelu.out(x, approximate="tanh", out=out),
    "silu": lambda out, x: torch.ops.aten.silu.out(x, out=out),
    "sigmoid": lambda out, x: torch.ops.aten.sigmoid.out(x, out=out),
    "tanh": lambda out, x: torch.ops.aten.tanh.out(x, out=out),
    "exp": lambda out, x: torch.ops.aten.exp.out(x, out=out),
    "residual add": lambda out, x, y: torch.add(x, y, out=out),
}


def timed(fn: Callable[[], Any], repeat: int) -> float:
    fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return min(samples) * 1e3  # the machine is shared: the least disturbed run


def inductor(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Callable[[], Any], float]:
    """Inductor's compiled `fn` and its cold compile seconds (fresh cache directory)."""
    import torch._dynamo
    import torch._inductor.config

    torch._dynamo.reset()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
    torch._inductor.config.fx_graph_cache = False
    compiled = torch.compile(fn, backend="inductor")
    start = time.perf_counter()
    compiled(*args)
    return (lambda: compiled(*args)), time.perf_counter() - start


def libm_kernels(kernels: Any, cache: Path) -> dict[str, Callable[..., None]]:
    """The kernels compiled with the prelude's float math as libm calls."""
    source = render_kernels(kernels)
    unit = compile_cpp_source(
        CppSource("#define EMBER_LIBM_MATH\n" + source.source, source.kernels), cache_dir=cache
    )
    return {info.name: CppKernel(unit, info) for info in source.kernels}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--only", default="", help="comma-separated kernel names")
    parser.add_argument("--no-inductor", action="store_true", help="skip the Inductor columns")
    parser.add_argument("--libm", action="store_true", help="add the libm-math kernels' ms")
    options = parser.parse_args()
    if options.threads:
        torch.set_num_threads(options.threads)
    only = {n for n in options.only.split(",") if n}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    header = f"{'kernel':<14} {'MB':>6} {'eager ms':>9} {'eager out ms':>12} {'inductor ms':>11}"
    header += f" {'ember ms':>9}"
    header += f" {'kernel ms':>9} {'libm ms':>8} {'memcpy ms':>9} {'of memcpy':>9} {'vs eager':>8}"
    header += f" {'vs ind':>7} {'kernels':>7}"
    header += f" {'trace+sched s':>13} {'compile s':>9} {'ind cold s':>10}"
    print(header)
    for name, (traced_fn, eager_fn, args) in cases(options.scale).items():
        if only and name not in only:
            continue
        start = time.perf_counter()
        gm = make_fx(traced_fn, decomposition_table=ember_decompositions())(*args)
        program = lower_graph(gm, options=LoweringOptions(loops=True))
        schedule = schedule_program(program, CPP_CHOICES)  # as the runtime does
        program = schedule.program  # with the partial buffers of split reductions
        frontend = time.perf_counter() - start
        kernels = schedule.kernels
        with tempfile.TemporaryDirectory() as cache:
            start = time.perf_counter()
            compiled = compile_cpp_kernels(kernels, cache_dir=Path(cache))
            compile_seconds = time.perf_counter() - start
            with_libm = libm_kernels(kernels, Path(cache)) if options.libm else {}
        env: dict[str, Any] = {n.name: a for n, a in zip(program.inputs, args, strict=True)}
        for kernel in kernels:
            for member in kernel.members:
                if member.stored and member.mutates is None:
                    layout = member.layout
                    size = [int(evaluate(sympy.sympify(s), {})) for s in layout.size]
                    stride = [int(evaluate(sympy.sympify(s), {})) for s in layout.stride]
                    env[member.name] = torch.empty_strided(size, stride, dtype=layout.dtype)
        calls = [(compiled[k.name], [env[n] for n in k.buffer_arguments()]) for k in kernels]

        def run_ember(calls: list[tuple[Any, list[Any]]] = calls) -> None:
            for kernel, tensors in calls:
                kernel(*tensors)

        libm_calls = [
            (with_libm[k.name], [env[n] for n in k.buffer_arguments()])
            for k in kernels
            if options.libm
        ]

        outputs = [n for n in env if n not in {i.name for i in program.inputs}]
        alloc_calls = [(compiled[k.name], k.buffer_arguments()) for k in kernels]

        def run_ember_alloc(
            env: dict[str, Any] = env,
            outputs: list[str] = outputs,
            calls: list[tuple[Any, Any]] = alloc_calls,
        ) -> None:
            # like the wrapper (and eager, and Inductor): fresh outputs every call, those
            # of 32 MiB or more marked for huge pages as the wrapper marks them
            fresh = dict(env)
            for n in outputs:
                fresh[n] = advise_huge_pages(
                    torch.empty_strided(env[n].size(), env[n].stride(), dtype=env[n].dtype)
                )
            for kernel, names in calls:
                kernel(*[fresh[n] for n in names])

        moved = sum(kernel_bytes(k, program) for k in kernels)
        # filled: untouched pages of torch.empty all map the kernel's zero page
        source = torch.ones(moved // 2, dtype=torch.uint8)
        target = torch.zeros_like(source)
        eager_ms = timed(lambda f=eager_fn, a=args: f(*a), options.repeat)
        eager_out_ms = float("nan")
        if name in EAGER_OUT:
            out = torch.empty_like(eager_fn(*args))

            def run_eager_out(
                f: Callable[..., Any] = EAGER_OUT[name], o: Any = out, a: Any = args
            ) -> None:
                f(o, *a)

            eager_out_ms = timed(run_eager_out, options.repeat)
        kernel_ms = timed(run_ember, options.repeat)
        libm_ms = float("nan")
        if options.libm:
            libm_ms = timed(lambda c=libm_calls: run_ember(c), options.repeat)
        ember_ms = timed(run_ember_alloc, options.repeat)
        memcpy_ms = timed(lambda s=source, t=target: t.copy_(s), options.repeat)
        inductor_ms, inductor_cold, versus = float("nan"), float("nan"), float("nan")
        if not options.no_inductor:
            run_inductor, inductor_cold = inductor(eager_fn, args)
            inductor_ms = timed(run_inductor, options.repeat)
            versus = inductor_ms / ember_ms
        print(
            f"{name:<14} {moved / 1e6:>6.0f} {eager_ms:>9.2f} {eager_out_ms:>12.2f}"
            f" {inductor_ms:>11.2f} {ember_ms:>9.2f}"
            f" {kernel_ms:>9.2f} {libm_ms:>8.2f} {memcpy_ms:>9.2f} {memcpy_ms / kernel_ms:>9.0%}"
            f" {eager_ms / ember_ms:>7.2f}x"
            f" {versus:>6.2f}x {len(kernels):>7} {frontend:>13.2f} {compile_seconds:>9.2f}"
            f" {inductor_cold:>10.1f}"
        )


if __name__ == "__main__":
    main()
