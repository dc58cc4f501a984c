"""Timing helpers shared by the demo and benchmarks: medians after warm-up.

On CUDA the time of each run comes from device events, on the CPU from the host
clock; either way the median of several runs after warm-up runs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def median_ms(
    fn: Callable[[], Any], device: torch.device, *, warmup: int = 3, runs: int = 20
) -> float:
    """Median wall time of `fn()` in milliseconds."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(runs):
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch stub
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch stub
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
