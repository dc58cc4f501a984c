"""`EMBER_PROFILE=1` (with `EMBER_DEBUG_DIR`): the time of every step of a compiled graph.

The wrapper of a profiled graph calls its `StepTimer` around each step that runs
device code (generated kernels and ATen calls; views and tuple picks run none):
`begin(i)` and `end(i)`, and `call_begin()` / `call_end()` around the whole call.
On the CPU each is a read of the host clock (the time a step takes on the host is
its time); on a GPU each records a CUDA event on the current stream, and the pairs
are read when the times are written, so profiling adds no synchronisation to a call.
A profiled graph never replays CUDA graphs (ember.runtime.compiler): the events
would be recorded once, at capture.

At exit (or at `write_profiles()`), each timer writes `profile.json` into its
graph's debug directory: per step the number of timed calls and the median and
mean milliseconds, the first call left out (it includes first-call work such as
Triton's choice of configs), and the roofs of the device measured in this process
(`measure_roofs`), which `ember explain` divides by.

Roofs are measured, not taken from a data sheet: the bandwidth of copies of growing
sizes (bytes read + written over the best of a few copies' time), a step being held
to the copy that moves as many bytes as it does (cache-sized steps to cache-sized
copies, `bandwidth_for`), and the FLOP rate of a large matmul in each dtype the
graph's matmul-like calls use, with the thread count the kernels ran with. A kernel
may come out somewhat above 100% of a copy; a data sheet's figure is rarely reached.
"""

from __future__ import annotations

import atexit
import functools
import json
import math
import statistics
import time
import weakref
from pathlib import Path
from typing import Any

import torch

PROFILE_FILE = "profile.json"
_KEEP = 1000  # samples kept per step: the first thousand timed calls
_timers: weakref.WeakSet[StepTimer] = weakref.WeakSet()


class StepTimer:
    """The times of one compiled graph's steps (see the module's docstring)."""

    def __init__(
        self,
        graph: str,
        directory: Path,
        steps: dict[int, str],
        device: torch.device,
        matmul_dtypes: tuple[torch.dtype, ...] = (),
    ) -> None:
        self.graph, self.directory, self.steps = graph, directory, steps
        self.device = device
        self.matmul_dtypes = matmul_dtypes
        self.cuda = device.type == "cuda"
        self.calls = 0
        self._open: dict[int, Any] = {}
        self._samples: dict[int, list[Any]] = {i: [] for i in steps}
        self._call_start: Any = None
        self._call_samples: list[Any] = []
        _timers.add(self)

    def _mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            return event
        return time.perf_counter_ns()

    def _timing(self) -> bool:
        return 1 <= self.calls <= _KEEP  # the first call is not timed

    def call_begin(self) -> None:
        if self._timing():
            self._call_start = self._mark()

    def call_end(self) -> None:
        if self._timing() and self._call_start is not None:
            self._call_samples.append((self._call_start, self._mark()))
        self.calls += 1

    def begin(self, index: int) -> None:
        if self._timing():
            self._open[index] = self._mark()

    def end(self, index: int) -> None:
        if self._timing():
            self._samples[index].append((self._open.pop(index), self._mark()))

    def _ms(self, pairs: list[Any]) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return [float(start.elapsed_time(end)) for start, end in pairs]
        return [(end - start) / 1e6 for start, end in pairs]

    def summary(self) -> dict[str, Any]:
        """What `profile.json` holds."""
        steps = {}
        for index, name in self.steps.items():
            ms = self._ms(self._samples[index])
            steps[name] = _stats(ms)
        return {
            "graph": self.graph,
            "device": str(self.device),
            "calls": self.calls,
            "timed_calls": len(self._call_samples),
            "call": _stats(self._ms(self._call_samples)),
            "steps": steps,
            "roofs": measure_roofs(self.device, self.matmul_dtypes),
            "threads": torch.get_num_threads(),
        }

    def write(self) -> Path | None:
        """Write `profile.json` (None when no call was timed: nothing to say)."""
        if not self._call_samples:
            return None
        path = self.directory / PROFILE_FILE
        self.directory.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.summary(), indent=1))
        return path


def _stats(ms: list[float]) -> dict[str, Any]:
    if not ms:
        return {"n": 0, "median_ms": None, "mean_ms": None}
    return {"n": len(ms), "median_ms": statistics.median(ms), "mean_ms": statistics.fmean(ms)}


def write_profiles() -> list[Path]:
    """Write every live timer's `profile.json`; the paths written."""
    written = []
    for timer in list(_timers):
        path = timer.write()
        if path is not None:
            written.append(path)
    return written


atexit.register(write_profiles)


def _best_ms(run: Any, device: torch.device, repeats: int = 5) -> float:
    """The best of at least `repeats` timed runs of `run()`, in milliseconds, after one
    warm-up: more runs, up to 200, while they have taken less than 50 ms in all, so
    that on a shared machine a short copy gets many chances to run undisturbed."""
    run()
    best, spent, count = float("inf"), 0.0, 0
    while count < repeats or (spent < 50.0 and count < 200):
        count += 1
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            run()
            end.record()
            torch.cuda.synchronize(device)
            ms = float(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            run()
            ms = (time.perf_counter() - begin) * 1e3
        best, spent = min(best, ms), spent + ms
    return best


@functools.cache
def _copy_bandwidths(device: torch.device, threads: int) -> tuple[tuple[int, float], ...]:
    """(bytes moved, bytes per second) of copies of growing sizes (read + write): from
    sizes that stay in cache to sizes far larger than the caches. A kernel is held to
    the copy that moves as many bytes as it does, so that a small kernel, whose data
    the step before it left in cache, is not measured against memory's bandwidth."""
    exponents = range(18, 29, 2) if device.type == "cuda" else range(14, 26, 2)
    found = []
    for exponent in exponents:
        source = torch.ones(1 << exponent, dtype=torch.float32, device=device)
        target = torch.empty_like(source)
        ms = _best_ms(lambda: target.copy_(source), device)  # noqa: B023  # called here
        found.append((2 * source.nbytes, 2 * source.nbytes / (ms / 1e3)))
    return tuple(found)


def bandwidth_for(roofs: dict[str, Any], moved: int) -> float | None:
    """The measured copy bandwidth for a step that moves `moved` bytes: the copy
    nearest in size (on a log scale)."""
    table = roofs.get("copy_bandwidth") or []
    if not table or moved <= 0:
        return None
    _, rate = min(table, key=lambda item: abs(math.log(item[0] / moved)))
    return float(rate)


@functools.cache
def _matmul_rate(device: torch.device, dtype: torch.dtype, threads: int) -> float:
    """FLOP per second of a large square matmul in `dtype`."""
    n = 8192 if device.type == "cuda" else 1024
    a = torch.ones(n, n, dtype=dtype, device=device)
    b = torch.ones(n, n, dtype=dtype, device=device)
    ms = _best_ms(lambda: a @ b, device, repeats=3)
    return 2 * n**3 / (ms / 1e3)


def measure_roofs(device: torch.device, matmul_dtypes: tuple[torch.dtype, ...]) -> dict[str, Any]:
    """This process's roofs on `device` (measured once per process, device and thread
    count): `bandwidth_bytes_s`, and `matmul_flop_s` per dtype name."""
    threads = torch.get_num_threads()
    rates = {}
    for dtype in matmul_dtypes:
        try:
            rates[str(dtype).removeprefix("torch.")] = _matmul_rate(device, dtype, threads)
        except RuntimeError:  # no matmul for that dtype on this device
            continue
    copies = _copy_bandwidths(device, threads)
    return {
        "copy_bandwidth": [list(item) for item in copies],
        "bandwidth_bytes_s": copies[-1][1],  # the largest copy: memory's bandwidth
        "bandwidth_how": "float32 copies of growing sizes (bytes read + written), best of 5 to 200",
        "matmul_flop_s": rates,
        "matmul_how": "square matmul (1024 on CPUs, 8192 on GPUs), best of 3",
    }
