"""Host time per kernel launch: ember's launcher beside Triton's jit launch and ATen.

One tiny elementwise kernel (`y = x + 1` over `--size` float32 elements, one or a few
blocks) is lowered and compiled the way the runtime does it (make_fx, ember's lowering
and scheduler, `compile_triton_kernels`), and launched along several paths:

- `empty call`: a Python function that does nothing, the floor of the loop below;
- `aten add`: `torch.add(x, 1, out=y)`, ATen's launch, for reference;
- `triton jit`: the same compiled kernel through Triton's own launch,
  `kernel[grid](*args, BLOCK=..., num_warps=..., num_stages=...)`;
- `ember launcher`: ember's `TritonLauncher` for that kernel, as a compiled graph calls
  it (after its first call, the bound binary launched through the CUDA driver);
- `ember graph`, `inductor graph` (unless `--no-graphs`): the one-kernel function
  compiled whole by `torch.compile`, Dynamo's guards and each backend's wrapper
  included (a new output each call).

Method: a round launches one path `--launches` times in a row from a Python loop,
timed with `time.perf_counter()` around the loop; the clock stops before the one
`torch.cuda.synchronize()` that ends the round, so a round measures the host's work
to enqueue its launches. The rounds start with an empty queue and stay well under the
device's queue depth, so the host never waits for the GPU (the kernel takes a few
microseconds of GPU time). The time per launch is a round's time divided by its
launches; the table gives the median and the minimum over `--rounds` rounds, the
paths taking turns round by round so that clock drift touches all of them alike.
Warm-up rounds come first (Triton's compile, the first call's config choice and
binding). The garbage collector is off while timing. Each path's output is checked
against `x + 1`.

It exits 1 when the ember launcher's median exceeds `--limit-us` (default 5) or when
any of its launches needed the unaligned variant
(`ember.runtime.triton_kernels.unaligned_launches`), 2 without a CUDA device.

    python3 benchmarks/launch_overhead.py
    python3 benchmarks/launch_overhead.py --rounds 200 --launches 500 --limit-us 5

Runs with PYTHONPATH over packages/*/src or without it (it adds them itself).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
for _src in sorted((_ROOT / "packages").glob("*/src")):
    if str(_src) not in sys.path:
        sys.path.insert(0, str(_src))

import torch  # noqa: E402
import triton  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

import ember.runtime  # noqa: E402, F401  # registers backend="ember"
from ember.codegen.triton import TRITON_CHOICES  # noqa: E402
from ember.graphpasses import ember_decompositions  # noqa: E402
from ember.ir import LoweringOptions, lower_graph  # noqa: E402
from ember.runtime import triton_kernels  # noqa: E402
from ember.scheduler import schedule_program  # noqa: E402


def add_one(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def ember_launcher(x: torch.Tensor, y: torch.Tensor, cache: Path) -> tuple[Any, list[Any]]:
    """Ember's launcher for `add_one` over `x` (into `y`) and its tensor arguments."""
    gm = make_fx(add_one, decomposition_table=ember_decompositions())(x)
    program = lower_graph(gm, options=LoweringOptions(loops=True))
    schedule = schedule_program(program, TRITON_CHOICES)  # as the runtime does on a GPU
    (kernel,) = schedule.kernels
    if kernel.size_arguments():
        raise SystemExit(f"expected a kernel of static sizes, got {kernel.size_arguments()}")
    (launcher,) = triton_kernels.compile_triton_kernels([kernel], cache_dir=cache).values()
    assert isinstance(launcher, triton_kernels.TritonLauncher)
    tensors = [y if name in kernel.outputs else x for name in kernel.buffer_arguments()]
    return launcher, tensors


def triton_jit_launch(launcher: Any, tensors: list[Any]) -> Callable[[], Any]:
    """The launcher's kernel through Triton's own launch, with the config ember chose."""
    kernel = launcher.kernel
    config = triton_kernels._chosen.get((launcher.digest, (), tuple(t.dtype for t in tensors)))
    config = config or kernel.configs[0]
    operands = launcher._operands(tensors, [])
    grid = launcher.grid(config, [])
    jit = launcher.fn[grid]
    options = dict(config.blocks)
    options.update(kernel.launch_options)
    warps, stages = config.num_warps, config.num_stages
    return lambda: jit(*operands, num_warps=warps, num_stages=stages, **options)


def compiled_graph(backend: str, x: torch.Tensor) -> Callable[[], torch.Tensor]:
    """`add_one` compiled whole by `backend`, called once (the compile), then as a path."""
    compiled = torch.compile(add_one, backend=backend)
    compiled(x)
    torch.cuda.synchronize()
    return lambda: compiled(x)


def time_paths(
    paths: dict[str, Callable[[], Any]], rounds: int, launches: int, warmup: int
) -> dict[str, list[float]]:
    """Microseconds per launch of each path, one sample per round (see the docstring)."""
    samples: dict[str, list[float]] = {name: [] for name in paths}
    clock = time.perf_counter
    gc.collect()
    gc.disable()
    try:
        for number in range(warmup + rounds):
            for name, launch in paths.items():
                torch.cuda.synchronize()
                start = clock()
                for _ in range(launches):
                    launch()
                elapsed = clock() - start
                torch.cuda.synchronize()
                if number >= warmup:
                    samples[name].append(elapsed / launches * 1e6)
    finally:
        gc.enable()
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024, help="elements of x (float32)")
    parser.add_argument("--rounds", type=int, default=100, help="timed rounds per path")
    parser.add_argument("--launches", type=int, default=200, help="launches per round")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds first")
    parser.add_argument(
        "--limit-us", type=float, default=5.0, help="fail above this ember launcher median"
    )
    parser.add_argument("--no-graphs", action="store_true", help="skip the torch.compile rows")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("launch_overhead: needs a CUDA device", file=sys.stderr)
        return 2
    if args.launches > 1000:
        print("launch_overhead: --launches above 1000 may fill the launch queue", file=sys.stderr)

    x = torch.randn(args.size, device="cuda")
    expected = x + 1
    outputs: dict[str, torch.Tensor] = {}
    with tempfile.TemporaryDirectory(prefix="ember-launch-") as cache:
        launcher, tensors = ember_launcher(x, torch.empty_like(x), Path(cache))
        launcher(*tensors)  # the first call: compile, choose a config, bind the launch
        torch.cuda.synchronize()
        triton_kernels.unaligned_launches.clear()
        ember_out = next(t for t in tensors if t is not x)
        outputs["ember launcher"] = ember_out

        jit_out = torch.empty_like(x)
        jit_tensors = [jit_out if t is ember_out else t for t in tensors]
        aten_out = torch.empty_like(x)
        outputs["triton jit"], outputs["aten add"] = jit_out, aten_out

        def empty() -> None:
            pass

        paths: dict[str, Callable[[], Any]] = {
            "empty call": empty,
            "aten add": lambda: torch.add(x, 1, out=aten_out),
            "triton jit": triton_jit_launch(launcher, jit_tensors),
            "ember launcher": lambda: launcher(*tensors),
        }
        if not args.no_graphs:
            for backend in ("ember", "inductor"):
                start = time.perf_counter()
                paths[f"{backend} graph"] = compiled_graph(backend, x)
                print(f"{backend} graph: compiled in {time.perf_counter() - start:.1f} s")
        samples = time_paths(paths, args.rounds, args.launches, args.warmup)
        if not args.no_graphs:
            for backend in ("ember", "inductor"):
                outputs[f"{backend} graph"] = paths[f"{backend} graph"]()
        torch.cuda.synchronize()

    failures = []
    for path, out in outputs.items():
        if not torch.equal(out, expected):
            failures.append(f"{path}: wrong values (max error {(out - expected).abs().max()})")
    for kernel_name, slow in triton_kernels.unaligned_launches.items():
        failures.append(f"ember: {slow} launches of {kernel_name} were not aligned")
    ember_median = statistics.median(samples["ember launcher"])
    if ember_median > args.limit_us:
        failures.append(
            f"ember launcher: {ember_median:.2f} us per launch, above --limit-us {args.limit_us:g}"
        )

    props = torch.cuda.get_device_properties(0)
    print(
        f"\nhost time per launch ({props.name}; torch {torch.__version__}, "
        f"triton {triton.__version__}; {args.rounds} rounds of "
        f"{args.launches} launches, {args.size} float32 elements)"
    )
    print(f"{'path':<16}  {'median us':>9}  {'min us':>7}")
    print(f"{'-' * 16}  {'-' * 9}  {'-' * 7}")
    for path, values in samples.items():
        print(f"{path:<16}  {statistics.median(values):9.2f}  {min(values):7.2f}")
    verdict = "FAIL" if failures else "ok"
    print(f"ember launcher limit {args.limit_us:g} us: {verdict}")
    for failure in failures:
        print(f"  {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
