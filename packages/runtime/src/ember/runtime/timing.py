"""Timing helpers shared by the demo and benchmarks.

On CUDA the time of each run comes from device events, on the CPU from the host
clock. `median_ms` is the median of several runs after warm-up. `steady_ms` and
`compare_ms` are for machines shared with other work (the 2-core development VM):
the runs are split into rounds, each round's value is its median, and the result is
the fastest round's value. A neighbour that takes a core for a second or two slows
every run of the rounds it overlaps; the median of one run of 20 calls then measures
the neighbour (the demo once printed eager at 288 ms for a 1.4 ms training step), while
a quiet round still shows what the code costs. `compare_ms` interleaves the functions
round by round, so that what it compares ran on the same machine at the same time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch


def median_ms(
    fn: Callable[[], Any], device: torch.device, *, warmup: int = 3, runs: int = 20
) -> float:
    """Median wall time of `fn()` in milliseconds."""
    for _ in range(warmup):
        fn()
    return statistics.median(_times_ms(fn, device, runs))


def steady_ms(
    fn: Callable[[], Any], device: torch.device, *, warmup: int = 3, runs: int = 20, rounds: int = 4
) -> float:
    """The fastest of `rounds` round medians of `fn()`'s time (ms), `runs` calls in all."""
    return compare_ms({"fn": fn}, device, warmup=warmup, runs=runs, rounds=rounds)["fn"]


def compare_ms(
    fns: Mapping[str, Callable[[], Any]],
    device: torch.device,
    *,
    warmup: int = 3,
    runs: int = 100,
    rounds: int = 10,
) -> dict[str, float]:
    """For each function, the fastest round median of its time (ms): `rounds` rounds,
    in each every function in turn for `runs // rounds` calls (at least one)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    per_round = max(1, runs // max(1, rounds))
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(max(1, rounds)):
        for name, fn in fns.items():
            best[name] = min(best[name], statistics.median(_times_ms(fn, device, per_round)))
    return best


def _times_ms(fn: Callable[[], Any], device: torch.device, runs: int) -> list[float]:
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
    return times


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
