"""A/B of one ember setting on suite models, both variants timed in one process.

    python benchmarks/ab_knob.py --models cnn_block,resnet50 --modes train \
        --knob recompute --values off,cuda [--inductor] [--rounds 5]

Small models' step times moved by 10-25% between `ember bench` runs on the H100
machine (transformer_block inference: 0.596 and 0.684 ms for the same kernels), more
than most changes a setting makes. Here each variant compiles a copy of the model
under `config.scope(knob=value)` (the backward too: it compiles with the forward on
CUDA), then the variants' timings alternate round by round, so drift of the machine
falls on all of them alike. Prints the median over rounds of each variant's median
step (ms) and the first variant's time over it (above 1: faster than the first);
`--inductor` adds Inductor as a yardstick (product code never imports it; this
benchmark may).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import statistics
from collections.abc import Callable
from typing import Any

import torch

import ember.runtime  # noqa: F401  (registers the backend)
from ember.runtime import compile_records, config
from ember.runtime.bench.measure import prepare, step_fn
from ember.runtime.config import KNOBS
from ember.runtime.timing import median_ms, synchronize

_counter = itertools.count()


def variants(
    name: str, mode: str, knob: str, values: list[str], inductor: bool, device: torch.device
) -> dict[str, Callable[[], Any]]:
    """A compiled step per value of `knob` (and Inductor's), each on its own copy of
    the model; each is called once here, under its setting, so it compiles now."""
    model, inputs = prepare(name, device, torch.bfloat16)
    steps: dict[str, Callable[[], Any]] = {}
    for value in [*values, *([None] if inductor else [])]:
        before = len(compile_records)
        compiled = _fresh_code(copy.deepcopy(model), "ember" if value else "inductor")
        step = step_fn(compiled, inputs, mode)
        with config.scope(**({knob: KNOBS[knob].parse(value)} if value else {})):
            step()
        if value and len(compile_records) == before:
            raise RuntimeError(f"{name} {mode}: {knob}={value} compiled nothing (cache hit)")
        steps[f"{knob}={value}" if value else "inductor"] = step
    synchronize(device)
    return steps


def _fresh_code(model: torch.nn.Module, backend: str) -> torch.nn.Module:
    """`model` behind a forward of its own code object. Dynamo caches compiled graphs
    on code objects and, with nn modules inlined, guards on a module's tensors'
    properties rather than its identity: a deep copy compiled a second time reused the
    first copy's graphs, compiled under the other setting."""
    namespace: dict[str, Any] = {}
    name = f"forward_{next(_counter)}"
    exec(f"def {name}(self, *args):\n    return self.inner(*args)", namespace)
    wrapper_type = type("Fresh", (torch.nn.Module,), {"forward": namespace[name]})
    wrapper = wrapper_type()
    wrapper.inner = model
    return torch.compile(wrapper, backend=backend)  # type: ignore[return-value]  # compiled module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", required=True)
    parser.add_argument("--modes", default="inference,train")
    parser.add_argument("--knob", required=True)
    parser.add_argument("--values", required=True)
    parser.add_argument("--inductor", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of the script")
    args = parser.parse_args()
    values = args.values.split(",")
    device = torch.device(args.device)
    print(
        f"{'model':18s} {'mode':9s} "
        + "".join(f"{v:>18s}" for v in [*values, *(["inductor"] if args.inductor else [])])
    )
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            steps = variants(name, mode, args.knob, values, args.inductor, device)
            times: dict[str, list[float]] = {key: [] for key in steps}
            compiled = len(compile_records)
            for _ in range(args.rounds):
                for key, step in steps.items():
                    times[key].append(median_ms(step, device, runs=20))
            if len(compile_records) != compiled:  # it would compile under the default
                raise RuntimeError(f"{name} {mode}: recompiled while timing")
            medians = {key: statistics.median(t) for key, t in times.items()}
            first = next(iter(medians.values()))
            cells = "".join(f"{m:9.3f} ({first / m:5.3f})" for m in medians.values())
            print(f"{name:18s} {mode:9s} {cells}", flush=True)
            del steps
            torch._dynamo.reset()


if __name__ == "__main__":
    main()
