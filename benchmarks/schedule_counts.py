"""Kernel counts and fused-kernel bytes of a suite model's graphs, as the runtime would
schedule them on the CPU or on CUDA, without compiling a kernel.

    uv run python benchmarks/schedule_counts.py --models resnet18 cnn_block [--device cuda]

Traces the model through Dynamo and AOTAutograd with the runtime's decomposition table
and partitioner (CPU: float32, save-all; CUDA: bfloat16 at the GPU size, min-cut after
the channels-last pass, shared values recomputed), traced on the CPU either way, so it
runs on a machine without a GPU. For each graph prints its FX node count, the kernels
(fused and extern calls that launch one), the bytes the fused kernels read and write
(ember.scheduler.kernel_bytes), and the batch norm ops that reached the IR whole.
"""

from __future__ import annotations

import argparse
import collections
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd

import ember.runtime  # noqa: F401
from ember.graphpasses import aot_decompositions, default_pipeline, rewrite_attention_pregrad
from ember.ir import LoweringOptions, lower_graph, verify
from ember.runtime.backend import _channels_last_then, partition_fn
from ember.runtime.bench.measure import step_fn
from ember.runtime.bench.registry import MODELS
from ember.scheduler import DeviceChoices, kernel_bytes, schedule_program


class _Captured(Exception):
    pass


def capture(name: str, device: str, mode: str) -> list[tuple[str, torch.fx.GraphModule]]:
    torch._dynamo.reset()
    model, inputs = MODELS[name].build("gpu" if device == "cuda" else "cpu")
    if device == "cuda":
        model = model.to(torch.bfloat16)
        inputs = [t.to(torch.bfloat16) if t.is_floating_point() else t for t in inputs]
    found: list[tuple[str, torch.fx.GraphModule]] = []

    def compiler(kind: str) -> Any:
        def keep(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
            found.append((kind, gm))
            if kind != "forward":  # the backward is traced after the forward returns
                raise _Captured
            return gm.forward

        return keep

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        rewrite_attention_pregrad(gm)
        split = partition_fn(device)
        if device == "cuda":  # traced on the CPU: the layout pass is asked for it there
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
        if "_Captured" not in repr(exc):
            raise
    return found


def report(name: str, device: str, mode: str) -> None:
    choices: DeviceChoices
    unsupported: frozenset[str] = frozenset()
    if device == "cuda":
        from ember.codegen.triton import TRITON_CHOICES, UNSUPPORTED

        choices, unsupported = TRITON_CHOICES, frozenset(UNSUPPORTED)
    else:
        from ember.codegen.cpp import CPP_CHOICES

        choices = CPP_CHOICES
    for kind, gm in capture(name, device, mode):
        ops = collections.Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        norms = {op: k for op, k in ops.items() if "batch_norm" in op}
        gm, _ = default_pipeline().run(gm)
        options = LoweringOptions(
            loops=True, unsupported_ops=unsupported, recompute_shared=device == "cuda"
        )
        program = lower_graph(gm, name=kind, options=options)
        verify(program)
        schedule = schedule_program(program, choices)
        total = sum(kernel_bytes(k, program) for k in schedule.kernels)
        print(
            f"{name} {device} {kind}: {len(gm.graph.nodes)} FX nodes, "
            f"{schedule.kernel_count} kernels ({len(schedule.kernels)} fused), "
            f"{total / 1e6:.2f} MB fused, batch norm ops {norms or '-'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=["resnet18"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--mode", default="train", choices=["inference", "train"])
    args = parser.parse_args()
    for name in args.models:
        report(name, args.device, args.mode)


if __name__ == "__main__":
    main()
