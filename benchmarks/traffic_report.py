"""Memory traffic of ember's GPU schedule for a suite model, without a GPU.

    uv run python benchmarks/traffic_report.py --models gpt2 [--mode inference] [--top 10]

Traces the model at its GPU benchmark size in bfloat16 on the CPU through Dynamo and
AOTAutograd (fake tensors: nothing runs), lowers and schedules each graph with the
Triton codegen's choices, and prints the bytes every fused kernel reads and writes,
the total, and the time those bytes take at the H200's measured copy bandwidth
(4.2 TB/s): the floor of the fused kernels' share of a step. Matmul and attention
calls are not counted. Use it to find the kernels worth a look before spending GPU
time on a profile (benchmarks/profile_kernels.py).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd

import ember.runtime  # noqa: F401
from ember.codegen.triton import TRITON_CHOICES, UNSUPPORTED
from ember.graphpasses import aot_decompositions, default_pipeline, rewrite_attention_pregrad
from ember.ir import LoweringOptions, lower_graph
from ember.runtime.backend import _channels_last_then, partition_fn
from ember.runtime.bench.measure import step_fn
from ember.runtime.bench.registry import MODELS
from ember.scheduler import kernel_bytes, schedule_program

COPY_BYTES_PER_S = 4.2e12


class _Captured(Exception):
    pass


def report(gm: torch.fx.GraphModule, name: str, top: int, recompute: bool = False) -> None:
    gm, _ = default_pipeline().run(gm)
    options = LoweringOptions(
        loops=True, unsupported_ops=frozenset(UNSUPPORTED), recompute_shared=recompute
    )
    program = lower_graph(gm, name=name, options=options)
    schedule = schedule_program(program, TRITON_CHOICES)
    sizes = sorted(((kernel_bytes(k, program), k.name) for k in schedule.kernels), reverse=True)
    total = sum(b for b, _ in sizes)
    print(
        f"{name}: {len(sizes)} fused kernels, {total / 1e6:.1f} MB, "
        f"floor {total / COPY_BYTES_PER_S * 1e3:.3f} ms at 4.2 TB/s"
    )
    for size, kernel in sizes[:top]:
        print(f"  {size / 1e6:9.1f} MB  {kernel}")


def capture_graphs(
    name: str, mode: str, device: str = "cuda", layout: bool = False
) -> list[tuple[str, torch.fx.GraphModule]]:
    """(kind, graph) for each graph AOTAutograd hands ember's backend for the model
    ('inference', or 'forward' and 'backward'), traced on fake values on the CPU:
    nothing runs. `device` 'cuda': the GPU size in bfloat16, split as on CUDA (min-cut);
    'cpu': the CPU size in float32, split as on the CPU. `layout` also turns a CUDA
    training step's joint graph channels-last first, as the runtime does there (asked
    for on the CPU, where the tracing happens)."""
    torch._dynamo.reset()
    model, inputs = MODELS[name].build("gpu" if device == "cuda" else "cpu")
    if device == "cuda":
        model = model.to(torch.bfloat16)
        inputs = [t.to(torch.bfloat16) if t.is_floating_point() else t for t in inputs]
    found: list[tuple[str, torch.fx.GraphModule]] = []

    def compiler(kind: str) -> Any:
        def capture(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
            found.append((kind, gm))
            if kind != "forward":  # the forward's backward is traced after it returns
                raise _Captured
            return gm.forward

        return capture

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        rewrite_attention_pregrad(gm)
        split = partition_fn(device)
        if layout and device == "cuda":
            split = _channels_last_then(split, ("cpu",))
        inner = aot_autograd(
            fw_compiler=compiler("forward"),
            bw_compiler=compiler("backward"),
            inference_compiler=compiler("inference"),
            decompositions=aot_decompositions(),
            partition_fn=split,
            keep_inference_input_mutations=True,
        )
        return inner(gm, example_inputs)

    try:
        step_fn(torch.compile(model, backend=backend), list(inputs), mode)()
    except Exception as exc:  # Dynamo wraps the capture signal
        if "_Captured" not in repr(exc) and not isinstance(exc, _Captured):
            raise
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="gpt2")
    parser.add_argument("--mode", default="inference")
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument(
        "--no-recompute",
        action="store_true",
        help="as EMBER_RECOMPUTE=off (the runtime recomputes on CUDA by default)",
    )
    args = parser.parse_args()
    for model_name in args.models.split(","):
        for kind, gm in capture_graphs(model_name, args.mode):
            report(gm, f"{model_name} {kind}", args.top, not args.no_recompute)


if __name__ == "__main__":
    main()
