"""Which CPU matmuls run as oneDNN linears: measured on this machine, once per case.

ember.graphpasses.cpu_linear rewrites a float32 CPU `addmm`/`mm` (and an activation
that only it reads) into oneDNN's linear where `prefer(case)` says so. `EMBER_CPU_GEMM`
picks `prefer`:

- "auto" (default): time both on this machine, with operands of the case's sizes and
  strides and `torch.get_num_threads()` threads: ATen's matmul (then the activation as
  its own op) against oneDNN's linear with the post-op, in turn, five rounds of a few
  calls each, the fastest call of each. oneDNN is chosen where it is at least 5%
  faster; otherwise, and for matmuls too large to time cheaply (over 2^28
  multiply-adds, ~10 ms on one core), ATen: the pass falls back to ATen where unsure.
  The verdict is kept for the process (a few milliseconds per new case; a compiled
  graph in ember's compile cache keeps the choices it was compiled with).
- "onednn": every candidate; "aten": none (the pass does not run).

Why measure: on the 2-core AMD Zen 5 VM MKL's sgemm is 1.2-2.3x slower than oneDNN for
most of the demo's shapes, but faster for some small ones (256x64x64, and an mm whose
left operand is transposed); on Intel CPUs MKL is known to do better. A fixed rule
would be wrong somewhere.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ember.graphpasses import LinearCase, linear_op
from ember.graphpasses.cpu_linear import Prefer
from ember.runtime.bounded import LRUCache

log = logging.getLogger(__name__)

MARGIN = 0.95  # oneDNN must take at most this fraction of ATen's time
MAX_TIMED_MACS = 1 << 28  # larger matmuls are not timed: ATen
# (case, threads) -> whether oneDNN won: one per distinct linear shape, so dynamic
# shapes add one per size; the most recent 1024 are kept, a forgotten one is timed again.
_verdicts: LRUCache[tuple[LinearCase, int], bool] = LRUCache(1024)

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda t: t,
    "swish": F.silu,
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
}
_POST_OPS = {"gelu_tanh": ("gelu", "tanh"), "gelu": ("gelu", "none")}


def prefer_for(setting: str) -> Prefer | None:
    """`prefer` for an `EMBER_CPU_GEMM` value; None for "aten" or without oneDNN."""
    if setting == "aten" or linear_op() is None:
        return None
    if setting == "onednn":
        return lambda case: True
    return measured_prefer


def measured_prefer(case: LinearCase) -> bool:
    """Whether oneDNN runs `case` at least 5% faster than ATen here (measured once)."""
    key = (case, torch.get_num_threads())
    if key not in _verdicts:
        try:
            # real tensors, whatever fake mode the compile runs under
            with unset_fake_temporarily(), torch.no_grad():
                _verdicts[key] = _measure(case)
        except Exception as exc:  # anything odd: ATen, which eager runs
            log.info("oneDNN linear not used for %s: %r", case, exc)
            _verdicts[key] = False
    return _verdicts[key]


def _strided(rows: int, cols: int, strides: tuple[int, int]) -> torch.Tensor:
    """A rows x cols float tensor with `strides` (over storage just large enough)."""
    extent = 1 + (rows - 1) * strides[0] + (cols - 1) * strides[1]
    return torch.randn(extent).as_strided((rows, cols), strides)


def _measure(case: LinearCase) -> bool:
    if case.m * case.k * case.n > MAX_TIMED_MACS:
        return False
    op = linear_op()
    assert op is not None
    x = _strided(case.m, case.k, case.input_strides)
    weight = _strided(case.n, case.k, case.weight_strides)  # N x K, as oneDNN takes it
    bias = torch.randn(case.n) if case.bias else None
    activation = _ACTIVATIONS[case.post_op]
    attr, algorithm = _POST_OPS.get(case.post_op, (case.post_op, ""))

    def aten() -> torch.Tensor:
        out = torch.addmm(bias, x, weight.t()) if bias is not None else torch.mm(x, weight.t())
        return activation(out)

    def onednn() -> torch.Tensor:
        result: torch.Tensor = op(x, weight, bias, attr, [], algorithm)
        return result

    calls = max(1, min(8, (1 << 22) // max(1, case.m * case.k * case.n)))
    times = _fastest({"aten": aten, "onednn": onednn}, rounds=5, calls=calls)
    chosen = times["onednn"] <= MARGIN * times["aten"]
    log.info(
        "CPU matmul %s: ATen %.1f us, oneDNN %.1f us: %s",
        case,
        times["aten"] * 1e6,
        times["onednn"] * 1e6,
        "oneDNN" if chosen else "ATen",
    )
    return chosen


def _fastest(fns: dict[str, Callable[[], Any]], *, rounds: int, calls: int) -> dict[str, float]:
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():
        fn()  # first calls: oneDNN builds its primitive, MKL its buffers
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(calls):
                start = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - start)
    return best
