"""Memory-bound kernels: eager vs Inductor vs ember's Triton kernels, side by side.

For each workload (softmax, layer norm, RMS norm, GELU, residual add + layer norm, a
transpose, a sum over each axis) it checks ember's result against eager, then times
eager, `torch.compile` (Inductor, default mode) and ember's kernels (all kernels of the
workload's schedule, buffers preallocated) with `triton.testing.do_bench` medians, and
reports achieved bandwidth (ideal bytes: inputs read once, outputs written once) as a
fraction of a device-to-device copy measured in the same run, plus compile seconds
(Inductor: compile + first call; ember: render + load + first call, which compiles
and tunes). The table prints last.

    python benchmarks/triton_kernels.py                 # GPU, bf16, 32768 x 4096
    python benchmarks/triton_kernels.py --rows 8192     # smaller
    python benchmarks/triton_kernels.py --cpu-check     # tiny, Triton interpreter, no timing

Runs with PYTHONPATH over packages/*/src (no install needed); works with Triton 3.6
and 3.9.
"""

from __future__ import annotations

import argparse
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

import sympy  # noqa: E402
import torch  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from ember.codegen.triton import TRITON_CHOICES, render_kernel  # noqa: E402
from ember.graphpasses import ember_decompositions  # noqa: E402
from ember.ir import LoweringOptions, lower_graph  # noqa: E402
from ember.ir.interpreter import bind_symbols  # noqa: E402
from ember.ir.nodes import BufferRef  # noqa: E402
from ember.ir.symbolic import evaluate  # noqa: E402
from ember.runtime.triton_kernels import compile_triton_kernels  # noqa: E402
from ember.scheduler import ExternCall, KernelStep, SelectOutput, schedule_program  # noqa: E402

EPS = 1e-5


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    var, mean = torch.var_mean(x.float(), -1, correction=0, keepdim=True)
    return ((x.float() - mean) * torch.rsqrt(var + EPS) * w.float() + b.float()).to(x.dtype)


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def add_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
    h = x + r
    return h, layer_norm(h, w, b)


Workload = tuple[
    str, Callable[..., Any], Callable[..., Any], Callable[[int, int], list[tuple[int, ...]]]
]

WORKLOADS: list[Workload] = [
    # name, eager/inductor function, ember function (what ember lowers), input shapes
    (
        "softmax",
        lambda x: torch.softmax(x, -1),
        lambda x: torch.softmax(x, -1),
        lambda m, n: [(m, n)],
    ),
    (
        "layer_norm",
        lambda x, w, b: torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, EPS),
        layer_norm,
        lambda m, n: [(m, n), (n,), (n,)],
    ),
    ("rms_norm", rms_norm, rms_norm, lambda m, n: [(m, n), (n,)]),
    (
        "gelu",
        lambda x: torch.nn.functional.gelu(x),
        lambda x: torch.nn.functional.gelu(x),
        lambda m, n: [(m, n)],
    ),
    (
        "add_layer_norm",
        lambda x, r, w, b: (
            h := x + r,
            torch.nn.functional.layer_norm(h, (h.shape[-1],), w, b, EPS),
        ),
        add_norm,
        lambda m, n: [(m, n), (m, n), (n,), (n,)],
    ),
    (
        "transpose",
        lambda x: x.t().contiguous(),
        lambda x: x.t().contiguous(),
        lambda m, n: [(m, n)],
    ),
    ("sum_rows", lambda x: x.sum(1), lambda x: x.sum(1), lambda m, n: [(m, n)]),
    ("sum_cols", lambda x: x.sum(0), lambda x: x.sum(0), lambda m, n: [(m, n)]),
]


class EmberRunner:
    """One workload through ember: lower, schedule, Triton kernels; buffers are
    allocated once, so a call is just the schedule's launches."""

    def __init__(self, fn: Callable[..., Any], args: list[torch.Tensor], cache: Path) -> None:
        gm = make_fx(fn, decomposition_table=ember_decompositions())(*args)
        self.program = lower_graph(gm, options=LoweringOptions(loops=True))
        self.schedule = schedule_program(self.program, TRITON_CHOICES)  # as the runtime does
        self.kernels = self.schedule.kernels
        self.kinds = [render_kernel(k).kind for k in self.kernels]
        self.launchers = compile_triton_kernels(self.kernels, cache_dir=cache)
        self.bindings = {s: sympy.Integer(v) for s, v in bind_symbols(self.program, args).items()}
        self.env: dict[str, Any] = {
            n.name: a for n, a in zip(self.program.inputs, args, strict=True)
        }
        self.env.update({c.name: c.value for c in self.program.constants})
        device = args[0].device
        for kernel in self.kernels:
            for m in kernel.members:
                if m.stored and m.mutates is None:
                    layout = m.layout
                    size = [int(evaluate(s, self.bindings)) for s in layout.size]
                    stride = [int(evaluate(s, self.bindings)) for s in layout.stride]
                    extent = int(evaluate(layout.storage_extent(), self.bindings))
                    storage = torch.empty(max(extent, 1), dtype=layout.dtype, device=device)
                    offset = int(evaluate(layout.offset, self.bindings))
                    self.env[m.name] = storage.as_strided(size, stride, offset)
        self.calls = [
            (self.launchers[k.name], [k.buffer_arguments(), k.size_arguments()])
            for k in self.kernels
        ]

    def _value(self, tree: Any) -> Any:
        if isinstance(tree, BufferRef):
            return self.env[tree.name]
        if isinstance(tree, sympy.Basic):
            return evaluate(tree, self.bindings)  # type: ignore[arg-type]
        if isinstance(tree, (tuple, list)):
            return [self._value(t) for t in tree]
        return tree

    def __call__(self) -> list[Any]:
        env = self.env
        for step in self.schedule.steps:
            if isinstance(step, KernelStep):
                k = step.kernel
                for m in k.members:
                    if m.mutates is not None:
                        env[m.name] = env[m.mutates]
                sizes = [int(self.bindings[s]) for s in k.size_arguments()]
                self.launchers[k.name](*[env[b] for b in k.buffer_arguments()], *sizes)
            elif isinstance(step, ExternCall):
                node = step.node
                env[node.name] = node.op(
                    *self._value(node.args), **{k: self._value(v) for k, v in node.kwargs}
                )
            elif isinstance(step, SelectOutput):
                env[step.node.name] = env[step.node.source][step.node.index]
        return [self._value(o) for o in self.program.outputs]


def _flat(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in _flat(v)]


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _bench(fn: Callable[[], Any]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, return_mode="median"))


def copy_bandwidth(device: str) -> float:
    """Bytes per ms of a device-to-device copy (read + write), 1 GiB each way."""
    x = torch.randn(1 << 28, device=device)
    y = torch.empty_like(x)
    ms = _bench(lambda: y.copy_(x))
    return 2 * x.numel() * x.element_size() / ms


def run(args: argparse.Namespace) -> None:
    cpu = args.cpu_check
    device = "cpu" if cpu else "cuda"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    rows, cols = (64, 48) if cpu else (args.rows, args.cols)
    copy_bw = None if cpu else copy_bandwidth(device)
    table = []
    cache = Path(tempfile.mkdtemp(prefix="ember-bench-"))
    for name, eager_fn, ember_fn, shapes in WORKLOADS:
        if args.only and name not in args.only.split(","):
            continue
        g = torch.Generator().manual_seed(0)
        inputs = [torch.randn(s, generator=g).to(dtype).to(device) for s in shapes(rows, cols)]
        expected = _flat(eager_fn(*inputs))
        start = time.perf_counter()
        runner = EmberRunner(ember_fn, inputs, cache)
        actual = _flat(runner())
        if not cpu:
            torch.cuda.synchronize()
        ember_compile = time.perf_counter() - start
        ok = all(
            torch.allclose(a.float(), e.float(), atol=3e-2, rtol=3e-2)
            for a, e in zip(actual, expected, strict=True)
        )
        row: dict[str, Any] = {
            "name": name,
            "ok": ok,
            "kernels": len(runner.kernels),
            "kinds": "+".join(sorted(set(runner.kinds))),
            "ember_compile_s": ember_compile,
        }
        if not cpu:
            torch._dynamo.reset()
            compiled = torch.compile(eager_fn)
            start = time.perf_counter()
            compiled(*inputs)
            torch.cuda.synchronize()
            row["inductor_compile_s"] = time.perf_counter() - start
            row["eager_ms"] = _bench(lambda f=eager_fn, i=inputs: f(*i))
            row["inductor_ms"] = _bench(lambda f=compiled, i=inputs: f(*i))
            row["ember_ms"] = _bench(runner)
            moved = _bytes(inputs) + _bytes(expected)
            assert copy_bw is not None
            for who in ("eager", "inductor", "ember"):
                row[f"{who}_bw"] = moved / row[f"{who}_ms"] / copy_bw
        table.append(row)
        print(f"done {name}: {row}", flush=True)
    print_table(table, copy_bw, cpu, rows, cols, args.dtype)


def print_table(
    table: list[dict[str, Any]], copy_bw: float | None, cpu: bool, rows: int, cols: int, dtype: str
) -> None:
    print()
    print(f"memory-bound kernels, {rows} x {cols} {dtype}" + (" (CPU check)" if cpu else ""))
    if copy_bw is not None:
        print(f"device-to-device copy: {copy_bw / 1e9:.2f} TB/s (read + write)")
    head = f"{'kernel':16} {'ok':3} {'k':>2} {'kinds':40}"
    if not cpu:
        head += (
            f" {'eager ms':>9} {'ind ms':>8} {'ember ms':>9} {'x eager':>7} {'x ind':>6}"
            f" {'bw eag':>6} {'bw ind':>6} {'bw emb':>6} {'ind cs':>6} {'emb cs':>6}"
        )
    print(head)
    for r in table:
        line = f"{r['name']:16} {'yes' if r['ok'] else 'NO':3} {r['kernels']:>2} {r['kinds']:40}"
        if not cpu:
            line += (
                f" {r['eager_ms']:9.3f} {r['inductor_ms']:8.3f} {r['ember_ms']:9.3f}"
                f" {r['eager_ms'] / r['ember_ms']:7.2f} {r['inductor_ms'] / r['ember_ms']:6.2f}"
                f" {r['eager_bw']:6.0%} {r['inductor_bw']:6.0%} {r['ember_bw']:6.0%}"
                f" {r['inductor_compile_s']:6.1f} {r['ember_compile_s']:6.1f}"
            )
        print(line)
    if not cpu:
        print("bw: ideal bytes (inputs once + outputs once) / time, as a fraction of the copy;")
        print("cs: compile seconds (first call included).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32768)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    parser.add_argument("--only", default="", help="comma-separated workload names")
    parser.add_argument("--cpu-check", action="store_true", help="tiny sizes, interpreter")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
