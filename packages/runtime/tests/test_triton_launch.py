"""The direct launch path: its guard, and the count of launches that miss it.

The guard: the direct path may bypass Triton's jit only while no launch hook (a
profiler's) is registered. Triton 3.6+ keeps each hook as a HookChain that is never
None; an empty one must count as no hook (before this was understood, every launch
took the slow jit path), a non-empty one must send launches through the jit.

The count: a launch through the jit after a kernel's first call for its sizes is
counted in `jit_launches` with its reason; on CUDA, no kernel of a few representative
models may take that path.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import triton
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from ember.graphpasses import ember_decompositions
from ember.ir import LoweringOptions, lower_graph
from ember.runtime.triton_kernels import _hooks_active
from ember.scheduler import schedule_program


def test_empty_hook_chains_are_no_hooks() -> None:
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None:
        pytest.skip(f"triton {triton.__version__} has no knobs.runtime (the guard says None)")
    assert _hooks_active() is False
    chain = runtime.launch_enter_hook
    if not hasattr(chain, "add"):
        pytest.skip("this Triton's launch hook is not a HookChain")

    def hook(*args: object) -> None:
        pass

    chain.add(hook)
    try:
        assert _hooks_active() is True
    finally:
        chain.remove(hook)
    assert _hooks_active() is False


# -- counting launches that take Triton's jit path -------------------------------------


def test_jit_launches_after_the_first_call_are_counted_with_their_reason() -> None:
    """In Triton's interpreter (a subprocess: TRITON_INTERPRET must be set before the
    kernels are defined) the direct path is unavailable, so every call after the
    first goes through the jit and is counted; a direct launch that refuses a call (a
    launch hook, a misaligned buffer) is counted with that reason, and falls back to a
    jit launch that still computes the right values."""
    done = subprocess.run(
        [sys.executable, __file__, "count-jit-launches"],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    seen = json.loads(lines[-1])
    interpreter, hooked, misaligned = seen["interpreter"], seen["hooked"], seen["misaligned"]
    # first call: no count; the next two: counted, logged once, at INFO (expected there)
    assert interpreter["counts"] == [0, 1, 2]
    assert interpreter["reason"] == "Triton's interpreter runs every launch (TRITON_INTERPRET=1)"
    assert interpreter["logs"] == [["INFO", interpreter["reason"]]]
    # a direct launch: taken without a hook (no count), refused with one (counted)
    assert hooked["direct_runs"] == [1, 1] and hooked["counts"] == [0, 1]
    assert hooked["reason"] == "a launch hook (a profiler's) is registered with Triton"
    assert hooked["right_values"] is True
    # a misaligned buffer: counted, named, and logged once as a warning
    assert misaligned["direct_runs"] == 0 and misaligned["counts"] == [1, 2]
    assert misaligned["reason"].startswith("buffer ") and "16-byte aligned" in misaligned["reason"]
    assert [level for level, _ in misaligned["logs"]] == ["WARNING"]
    assert misaligned["right_values"] is True


def _count_jit_launches() -> dict[str, Any]:
    """The subprocess of the test above: one small kernel, launched in the interpreter."""
    from types import SimpleNamespace

    from ember.runtime import triton_kernels as tk

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("ember.runtime")
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)

    def logs() -> list[list[str]]:
        marker = "(slower per launch): "  # the reason follows
        found = [[r.levelname, r.getMessage().split(marker, 1)[-1]] for r in records]
        records.clear()
        return found

    x = torch.randn(4, 32)
    gm = make_fx(lambda a: a * 2 + 1, decomposition_table=ember_decompositions())(x)
    schedule = schedule_program(lower_graph(gm, options=LoweringOptions(loops=True)))
    (kernel,) = schedule.kernels
    assert not kernel.size_arguments()

    def launcher_and_call() -> tuple[Any, Callable[[torch.Tensor], torch.Tensor]]:
        with tempfile.TemporaryDirectory() as cache:
            (launcher,) = tk.compile_triton_kernels([kernel], cache_dir=Path(cache)).values()

        def call(inp: torch.Tensor) -> torch.Tensor:
            out = torch.full_like(inp, float("nan"))
            launcher(*[out if b in kernel.outputs else inp for b in kernel.buffer_arguments()])
            return out

        return launcher, call

    name = kernel.name
    seen: dict[str, Any] = {}
    launcher, call = launcher_and_call()
    counts = []
    for _ in range(3):
        call(x)
        counts.append(tk.jit_launches.get(name, 0))
    seen["interpreter"] = {"counts": counts, "reason": tk.jit_launch_reasons[name], "logs": logs()}

    # A direct launch bound to a stand-in binary that records its runs.
    direct_runs = [0]

    def run(*args: Any) -> None:
        direct_runs[0] += 1

    binary = SimpleNamespace(run=run, function=None, packed_metadata=None)
    tk._stream = lambda device: 0  # no CUDA stream here
    names = kernel.buffer_arguments()
    launcher._direct[()] = tk._DirectLaunch(binary, (1, 1, 1), [], [], 0, names)
    tk.jit_launches.clear()
    counts, runs = [], []
    call(x)  # no hook: the stand-in runs, nothing goes through the jit
    counts.append(tk.jit_launches.get(name, 0))
    runs.append(direct_runs[0])
    chain = triton.knobs.runtime.launch_enter_hook

    def hook(*args: object) -> None:
        pass

    chain.add(hook)
    try:
        out = call(x)
    finally:
        chain.remove(hook)
    counts.append(tk.jit_launches.get(name, 0))
    runs.append(direct_runs[0])
    seen["hooked"] = {
        "counts": counts,
        "direct_runs": runs,
        "reason": tk.jit_launch_reasons[name],
        "right_values": bool(torch.equal(out, x * 2 + 1)),
    }

    # A fresh launcher (its own log-once flag) given a buffer whose storage starts 4
    # bytes past a 16-byte boundary.
    launcher, call = launcher_and_call()
    launcher._direct[()] = tk._DirectLaunch(binary, (1, 1, 1), [], [], 0, names)
    raw = bytearray(x.numel() * 4 + 64)
    base = torch.frombuffer(raw, dtype=torch.uint8).data_ptr()
    skip = next(k for k in range(0, 64, 4) if (base + k) % 16 == 4)
    shifted = torch.frombuffer(raw, dtype=torch.float32, offset=skip, count=x.numel())
    shifted = shifted.view(x.shape)
    shifted.copy_(x)
    assert shifted.data_ptr() % 16 == 4 and shifted.storage_offset() == 0
    tk.jit_launches.clear()
    direct_runs[0] = 0
    counts = []
    for _ in range(2):
        out = call(shifted)
        counts.append(tk.jit_launches.get(name, 0))
    seen["misaligned"] = {
        "counts": counts,
        "direct_runs": direct_runs[0],
        "reason": tk.jit_launch_reasons[name],
        "logs": logs(),
        "right_values": bool(torch.equal(out, x * 2 + 1)),
    }
    return seen


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["mlp", "transformer_block", "cnn"])
@pytest.mark.parametrize("mode", ["inference", "train"])
def test_no_kernel_takes_the_jit_path_after_its_first_call(name: str, mode: str) -> None:
    """Representative models in bf16 on CUDA, compiled with ember and run three times:
    every Triton launch after a kernel's first call for its sizes is direct."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from ember.runtime import triton_kernels as tk
    from ember.runtime.bench.blocks import CNNBlock
    from ember.runtime.models import MLP, TransformerBlock
    from ember.runtime.testing import no_eager_fallback

    models: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
        "mlp": lambda: (MLP(256, 1024, 256), torch.randn(64, 256)),
        "transformer_block": lambda: (TransformerBlock(256, 4, 1024), torch.randn(4, 128, 256)),
        "cnn": lambda: (
            nn.Sequential(CNNBlock(32), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)),
            torch.randn(8, 32, 28, 28),
        ),
    }
    model, x = models[name]()
    model = model.to(device="cuda", dtype=torch.bfloat16)
    x = x.to(device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(model, backend="ember")
    tk.jit_launches.clear()
    tk.jit_launch_reasons.clear()
    with no_eager_fallback() as graphs:
        for _ in range(3):
            if mode == "inference":
                model.eval()
                with torch.no_grad():
                    compiled(x)
            else:
                model.train()
                compiled(x).float().square().mean().backward()
        torch.cuda.synchronize()
    assert sum(g.fused_kernels for g in graphs) > 0  # Triton kernels did launch
    assert tk.jit_launches == {}, tk.jit_launch_reasons


if __name__ == "__main__" and sys.argv[1:] == ["count-jit-launches"]:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    print(json.dumps(_count_jit_launches()), flush=True)
