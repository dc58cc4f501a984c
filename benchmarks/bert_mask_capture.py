"""BERT's GPU inference graph without a GPU: ember's kernels and bytes per kernel.

    uv run python benchmarks/bert_mask_capture.py [--mask none|index|padding] [--dump DIR]

traffic_report.py traces on CPU tensors, where SDPA takes the CPU flash op. This
script moves the model and inputs to *fake* CUDA tensors (FakeTensorMode works
without a GPU), so AOTAutograd decomposes SDPA through torch's math path in fp32,
as on the H100. `--mask` picks HF's attention mask:
  none     no mask: HF skips it (create_bidirectional_mask -> None without a 2-D mask)
  index    the all-True bidirectional mask built from aranges (`q_idx >= 0`), as the
           H100 profile shows (Inductor's softmax kernel lists arange, ge, scalar_tensor;
           ember runs 48 pw_bmm + 12 red_softmax_any): HF's skip forced off
  padding  a 2-D attention_mask of ones passed in (padding mask)
Prints kernels by kind (name without the k<n>_ prefix): count and MB, then the
kernels of the first layer. `--dump DIR` writes the schedule and those kernels' Triton.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._subclasses.fake_tensor import FakeTensorMode

import ember.runtime  # noqa: F401
from ember.codegen.triton import TRITON_CHOICES, UNSUPPORTED, render_kernel
from ember.graphpasses import default_pipeline, ember_decompositions, rewrite_attention_pregrad
from ember.ir import LoweringOptions, lower_graph
from ember.runtime.backend import partition_fn
from ember.runtime.bench.registry import MODELS
from ember.scheduler import kernel_bytes, schedule_program


class _Captured(Exception):
    pass


def capture(mask: str) -> torch.fx.GraphModule:
    if mask == "index":
        import transformers.masking_utils as masking

        masking._ignore_bidirectional_mask_sdpa = lambda *args, **kwargs: False  # type: ignore[assignment]
    torch._dynamo.reset()
    model, inputs = MODELS["bert"].build("gpu")
    model = model.to(torch.bfloat16).eval()
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to("cuda")
        args = [t.to("cuda") for t in inputs]
        if mask == "padding":
            args.append(torch.ones(args[0].shape, dtype=torch.long, device="cuda"))
    found: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        found.append(gm)
        raise _Captured  # nothing runs: the inputs are fake

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        rewrite_attention_pregrad(gm)
        return aot_autograd(
            fw_compiler=keep,
            inference_compiler=keep,
            decompositions=ember_decompositions(),
            partition_fn=partition_fn(),
            keep_inference_input_mutations=True,
        )(gm, example_inputs)

    try:
        with torch.no_grad():
            torch.compile(model, backend=backend)(*args)
    except Exception as exc:  # Dynamo wraps the capture signal
        if "_Captured" not in repr(exc) and not isinstance(exc, _Captured):
            raise
    assert len(found) == 1, f"expected one graph, got {len(found)}"
    return found[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mask", choices=("none", "index", "padding"), default="index")
    parser.add_argument("--dump", type=Path, default=None)
    args = parser.parse_args()
    gm = capture(args.mask)
    gm, _ = default_pipeline(layout_devices=("cuda",)).run(gm)
    options = LoweringOptions(loops=True, unsupported_ops=frozenset(UNSUPPORTED))
    program = lower_graph(gm, name="bert", options=options)
    schedule = schedule_program(program, TRITON_CHOICES)
    rows = [(kernel_bytes(k, program), k) for k in schedule.kernels]
    count: collections.Counter[str] = collections.Counter()
    size: collections.Counter[str] = collections.Counter()
    for nbytes, kernel in rows:
        kind = kernel.name.split("_", 1)[1]
        count[kind] += 1
        size[kind] += nbytes
    total = sum(b for b, _ in rows)
    print(f"bert inference, mask={args.mask}: {len(rows)} kernels, {total / 1e6:.1f} MB")
    for kind in count:
        print(f"  {kind:<32}{count[kind]:4d} {size[kind] / 1e6:10.1f} MB")
    first = next(i for i, (_, k) in enumerate(rows) if "softmax" in k.name)
    print("first layer's attention kernels:")
    for nbytes, kernel in rows[max(first - 2, 0) : first + 4]:
        print(f"  {nbytes / 1e6:9.1f} MB  {kernel.name}")
    if args.dump is not None:
        args.dump.mkdir(parents=True, exist_ok=True)
        (args.dump / "schedule.txt").write_text(schedule.format())
        for _, kernel in rows[max(first - 2, 0) : first + 4]:
            (args.dump / f"{kernel.name}.py").write_text(render_kernel(kernel).source)


if __name__ == "__main__":
    main()
