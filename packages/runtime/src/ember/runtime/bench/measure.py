"""One benchmark measurement, in its own process: one model, mode, backend, phase.

The harness (`ember.runtime.bench.harness`) starts this module as
`python -m ember.runtime.bench.measure ...` with the cache variables (EMBER_CACHE_DIR,
TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR) pointing into a directory of its own: fresh
for the "cold" phase, the cold run's for the "warm" phase. A process per measurement
keeps compile caches, allocator state and peak memory from leaking between rows.

- cold: time the first call (compile + one run), check it against eager with the
  accuracy rule (float64 reference), then time calls (median after warm-up; CUDA
  events on GPU; on the CPU the fastest of four round medians, `step_ms`) and
  measure peak memory over one call: on CUDA the caching allocator's peak
  (`max_memory_allocated`, weights and inputs included); on the CPU the peak of
  tensor memory allocated during the call above what was allocated when it began
  (`cpu_peak_allocated`: weights and inputs excluded, since torch keeps no running
  CPU allocator statistics to read them from).
- warm: only the first call, with the caches the cold run filled.

A training step is forward + loss + backward; the loss is taken outside the model.

"inductor-ro" is `torch.compile(model, backend="inductor", mode="reduce-overhead")`:
Inductor's CUDA graphs. A replay writes its outputs into the same memory as the one
before, so each step (first call, timed calls) begins with
`torch.compiler.cudagraph_mark_step_begin()`, and the first call's outputs are cloned
before they are compared with eager (for every compiling backend: ember's own CUDA
graphs, under `--ember-mode reduce-overhead`, get the same treatment).

Inductor's kernel count comes from `torch._inductor.metrics`, imported through
importlib only in the inductor measurement (product code does not depend on Inductor;
here it is the comparator). It counts generated kernels; ember's count (from its
compile records) also counts extern calls such as matmuls. On CUDA, `device_kernels`
counts kernel launches in one call with the profiler, the same way for every backend.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ember.runtime.accuracy import compare_outputs, largest_error
from ember.runtime.bench.registry import MODELS, loss_input
from ember.runtime.timing import median_ms, steady_ms, synchronize


def prepare(name: str, device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, list[Any]]:
    torch.manual_seed(0)
    model, inputs = MODELS[name].build("cpu" if device.type == "cpu" else "gpu")
    model = model.to(device=device, dtype=dtype)
    cast = [
        t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device) for t in inputs
    ]
    return model, cast


def step_fn(model: nn.Module, inputs: list[Any], mode: str) -> Callable[[], Any]:
    """One inference call, or one training step returning (loss, gradients)."""
    if mode == "inference":
        model.eval()

        def infer() -> Any:
            with torch.no_grad():
                return model(*inputs)

        return infer
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:  # a block without weights: differentiate with respect to its inputs
        params = [t.requires_grad_(True) for t in inputs if t.is_floating_point()]

    def train() -> Any:
        for p in params:
            p.grad = None
        loss = loss_input(model(*inputs)).float().square().mean()
        loss.backward()  # type: ignore[no-untyped-call]  # torch stub
        # torch.compile may return zeros where eager leaves an unused weight's grad None.
        return (loss.detach(), [torch.zeros_like(p) if p.grad is None else p.grad for p in params])

    return train


def _graph_steps(fn: Callable[[], Any]) -> Callable[[], Any]:
    """`fn`, each call marked as a new step for Inductor's CUDA graph trees: outputs of
    the step before may then be overwritten, and none is kept across steps here."""

    def step() -> Any:
        torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]  # torch stub
        return fn()

    return step


def _cloned(tree: Any) -> Any:
    """A copy of every tensor in an output (tuples, lists, dicts, model outputs), so
    that a later replay of a CUDA graph cannot change what is compared."""
    if isinstance(tree, torch.Tensor):
        return tree.clone()
    if isinstance(tree, (tuple, list)):
        return [_cloned(t) for t in tree]  # the accuracy rule reads lists and tuples alike
    if isinstance(tree, dict):  # transformers' ModelOutput too (an OrderedDict)
        return {key: _cloned(value) for key, value in tree.items()}
    return tree


def _device_kernels(fn: Callable[[], Any], device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            synchronize(device)
        return len([e for e in prof.events() if getattr(e.device_type, "name", "") == "CUDA"])
    except Exception:
        return None


def cpu_peak_allocated(fn: Callable[[], Any]) -> int | None:
    """The peak of CPU tensor memory in use during one call of `fn`, above what was in
    use when it began: the running sum of the CPU allocator's allocations and frees,
    as torch's profiler records them (`profile_memory=True`: c10's CPU allocator
    reports each one), in time order. None when the profiler recorded none: a peak
    of zero would be a wrong number.

    Not the process's resident set (`ru_maxrss`), which counts torch's own code and
    every earlier measurement's high water mark, and not tracemalloc, which sees
    Python objects and not tensor storage. A tensor allocated before the call and
    freed during it counts as a negative step, so the result is the call's own
    high-water mark over its starting point."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    steps: list[tuple[int, int]] = []
    pending = list(prof.profiler.kineto_results.experimental_event_tree())
    while pending:
        event = pending.pop()
        pending.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            steps.append((event.start_time_ns, event.extra_fields.alloc_size))
    if not steps:
        return None
    in_use = peak = 0
    for _, size in sorted(steps):
        in_use += size
        peak = max(peak, in_use)
    return peak


def step_ms(fn: Callable[[], Any], device: torch.device, runs: int) -> float:
    """A step's time: on the CPU the fastest of four round medians (`steady_ms`: the
    CPU machines are shared, and a neighbour's burst would otherwise be the median);
    on CUDA the median of `runs` timed with events."""
    if device.type == "cpu":
        return steady_ms(fn, device, runs=runs)
    return median_ms(fn, device, runs=runs)


def _peak_memory(fn: Callable[[], Any], device: torch.device) -> int | None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    return cpu_peak_allocated(fn)


def measure(
    name: str,
    mode: str,
    backend: str,
    device: torch.device,
    dtype: torch.dtype,
    phase: str,
    runs: int,
    ember_mode: str | None = None,
) -> dict[str, Any]:
    record: dict[str, Any] = {}
    model, inputs = prepare(name, device, dtype)
    if backend == "eager":
        fn = step_fn(model, inputs, mode)
        record["ms"] = step_ms(fn, device, runs)
        record["peak_mem_bytes"] = _peak_memory(fn, device)
        record["device_kernels"] = _device_kernels(fn, device)
        return record
    reference_model = copy.deepcopy(model)
    torch._dynamo.reset()
    inductor = backend in ("inductor", "inductor-ro")
    if inductor:
        metrics = importlib.import_module("torch._inductor.metrics")  # comparator only
        vars(metrics)["generated_kernel_count"] = 0
    from ember.runtime.compiler import compile_records

    first_record = len(compile_records)
    if backend == "inductor-ro":
        compiled = torch.compile(model, backend="inductor", mode="reduce-overhead")
    elif backend == "ember" and ember_mode is not None:
        compiled = torch.compile(model, backend="ember", mode=ember_mode)
    else:
        compiled = torch.compile(model, backend=backend)
    fn = step_fn(compiled, inputs, mode)  # type: ignore[arg-type]  # compiled module
    if backend == "inductor-ro" or ember_mode == "reduce-overhead":
        fn = _graph_steps(fn)
    start = time.perf_counter()
    actual = fn()
    synchronize(device)
    record["compile_s"] = time.perf_counter() - start
    if phase == "warm":
        return record
    actual = _cloned(actual)
    if inductor:
        record["kernels"] = int(vars(metrics)["generated_kernel_count"])
    elif backend == "ember":
        records = compile_records[first_record:]
        record["kernels"] = sum(r.kernels for r in records)
        record["graphs"] = len(records)
        record["ran_eagerly"] = sum(1 for r in records if r.ran_eagerly)
    expected = step_fn(reference_model, inputs, mode)()
    exact = copy.deepcopy(reference_model).to(torch.float64)
    # detached: a weightless block's inputs require grad, and their float64 copies
    # must be leaves of their own for the reference step to get their gradients
    upcast = [t.detach().to(torch.float64) if t.is_floating_point() else t for t in inputs]
    reference = step_fn(exact, upcast, mode)()
    record["max_abs_err"] = largest_error(actual, expected)
    verdict = compare_outputs(actual, expected, reference=reference)
    record["matches_eager"] = verdict is None
    if verdict is not None:
        record["mismatch"] = f"output{verdict[1]}: {verdict[0].describe()}"
    del exact, reference, expected, reference_model
    record["ms"] = step_ms(fn, device, runs)
    record["peak_mem_bytes"] = _peak_memory(fn, device)
    record["device_kernels"] = _device_kernels(fn, device)
    if backend == "ember":  # whether each graph replayed CUDA graphs, or why not
        states = [f"{r.graph}: {r.cudagraphs}" for r in compile_records[first_record:]]
        record["cudagraphs"] = "; ".join(states)
    return record


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ember.runtime.bench.measure")
    parser.add_argument("--model", required=True, choices=sorted(MODELS))
    parser.add_argument("--mode", required=True, choices=["inference", "train"])
    parser.add_argument(
        "--backend",
        required=True,
        choices=["eager", "aot_eager", "inductor", "inductor-ro", "ember"],
    )
    parser.add_argument(
        "--ember-mode", default=None, help="torch.compile's mode for ember (default: none)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--phase", default="cold", choices=["cold", "warm"])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--wait", action="store_true", help="import, then wait for 'go' on stdin (prefetch)"
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import ember.runtime  # noqa: F401  # registers backend="ember"

    if args.wait:
        library = MODELS[args.model].requires
        if library is not None:
            importlib.import_module(library)
        if args.device.startswith("cuda"):
            torch.cuda.init()  # type: ignore[no-untyped-call]  # torch stub
        if sys.stdin.readline().strip() != "go":
            return 0  # not run after all (the harness's time limit)

    warnings.simplefilter("ignore")
    record = measure(
        args.model,
        args.mode,
        args.backend,
        torch.device(args.device),
        getattr(torch, args.dtype),
        args.phase,
        args.runs,
        args.ember_mode,
    )
    args.out.write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
