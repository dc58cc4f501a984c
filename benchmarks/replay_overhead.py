"""Host time per call of small, launch-bound models: eager, Inductor (default and
`mode="reduce-overhead"`), ember with CUDA graphs off and on (GPU only).

Method: after warm-up (compile, tuning, recording), `--calls` calls are enqueued back
to back and timed with `time.perf_counter` up to the last call's return, without a
sync: the host time per call. The models' kernels are tiny, so the GPU keeps up and
the queue never fills; a second figure, wall time per call including the final
synchronize, shows whether it did. Outputs of every backend are checked against
eager before timing. Each backend runs in this process one after another with
Dynamo reset between them (small models; the comparison is of host paths).

    PYTHONPATH=$(printf '%s:' $PWD/packages/*/src) python3 benchmarks/replay_overhead.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def _mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(256, 256), nn.LayerNorm(256), nn.GELU()]
    return nn.Sequential(*layers), (torch.randn(8, 256),)


def _convs() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU()]
    return nn.Sequential(*layers).eval(), (torch.randn(4, 32, 16, 16),)


MODELS: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "mlp4_ln_gelu_b8": _mlp,
    "conv4_bn_relu_b4": _convs,
}
BACKENDS = ("eager", "inductor", "inductor-ro", "ember-off", "ember")


def _compiled(model: nn.Module, backend: str) -> Callable[..., Any]:
    torch._dynamo.reset()
    if backend == "eager":
        return model
    if backend == "inductor":
        return torch.compile(model)
    if backend == "inductor-ro":
        return torch.compile(model, mode="reduce-overhead")
    setting = "off" if backend == "ember-off" else "on"
    return torch.compile(model, backend="ember", options={"cudagraphs": setting})


def _time(fn: Callable[[], Any], calls: int, repeats: int = 5) -> tuple[float, float]:
    host, wall = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        enqueued = time.perf_counter()
        torch.cuda.synchronize()
        done = time.perf_counter()
        host.append((enqueued - start) / calls * 1e6)
        wall.append((done - start) / calls * 1e6)
    return statistics.median(host), statistics.median(wall)


class _InsideReplays:
    """Time spent inside ember's `GraphedCall.__call__` (the replay path alone:
    key, parameter check, copies in, replay, copies out), per call."""

    def __init__(self) -> None:
        from ember.runtime import cudagraphs

        self.seconds, self.calls = 0.0, 0
        original = cudagraphs.GraphedCall.__call__

        def timed(graphed: Any, args: list[Any]) -> Any:
            start = time.perf_counter()
            try:
                return original(graphed, args)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1

        cudagraphs.GraphedCall.__call__ = timed  # type: ignore[method-assign]

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def us_per_call(self) -> float:
        return self.seconds / max(1, self.calls) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    os.environ.setdefault("EMBER_STRICT", "1")
    import ember.runtime  # noqa: F401  # registers backend="ember"

    dtype = getattr(torch, args.dtype)
    inside = _InsideReplays()
    rows = []
    for name in args.models:
        model, inputs = MODELS[name]()
        model = model.cuda().to(dtype)
        inputs = tuple(x.cuda().to(dtype) for x in inputs)
        with torch.no_grad():
            expected = model(*inputs)
            for backend in BACKENDS:
                fn = _compiled(model, backend)

                def call(
                    fn: Callable[..., Any] = fn,
                    mark: bool = backend == "inductor-ro",
                    inputs: tuple[torch.Tensor, ...] = inputs,
                ) -> Any:
                    if mark:
                        torch.compiler.cudagraph_mark_step_begin()
                    return fn(*inputs)

                for _ in range(5):
                    out = call()
                torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)
                inside.reset()
                host, wall = _time(call, args.calls)
                replay = inside.us_per_call() if backend == "ember" else float("nan")
                rows.append((name, backend, host, wall, replay))
    print(
        f"{'model':<18} {'backend':<12} {'host us/call':>13} {'wall us/call':>13} "
        f"{'ember replay us':>16}"
    )
    for name, backend, host, wall, replay in rows:
        print(f"{name:<18} {backend:<12} {host:>13.1f} {wall:>13.1f} {replay:>16.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
