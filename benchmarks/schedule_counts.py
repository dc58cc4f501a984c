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

from traffic_report import capture_graphs  # benchmarks/ is on sys.path when run as a script

import ember.runtime  # noqa: F401
from ember.graphpasses import default_pipeline
from ember.ir import LoweringOptions, lower_graph, verify
from ember.scheduler import DeviceChoices, kernel_bytes, schedule_program


def report(name: str, device: str, mode: str) -> None:
    choices: DeviceChoices
    unsupported: frozenset[str] = frozenset()
    if device == "cuda":
        from ember.codegen.triton import TRITON_CHOICES, UNSUPPORTED

        choices, unsupported = TRITON_CHOICES, frozenset(UNSUPPORTED)
    else:
        from ember.codegen.cpp import CPP_CHOICES

        choices = CPP_CHOICES
    for kind, gm in capture_graphs(name, mode, device, layout=True):
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
