"""Which CPU matmuls run as oneDNN linears: a fixed rule by shape, layout and CPU.

ember.graphpasses.cpu_linear rewrites a float32 CPU `addmm`/`mm` (and an activation
that only it reads) into oneDNN's linear where `prefer(case)` says so. `EMBER_CPU_GEMM`
picks `prefer`:

- "auto" (default): `rule`, on CPUs of a family the rule was measured on; ATen's
  addmm/mm elsewhere (logged once).
- "onednn": every candidate; "aten": none (the pass does not run).

Why a rule, not a timing: choices used to be timed at compile, ATen against oneDNN
for each case. On a loaded machine a timing can come out either way, and a compiled
graph keeps its choices in the compile cache: the schedule depended on the load at
compile time. The rule reads only the case (sizes, operand layouts, bias, post-op;
float32 is the only dtype the pass rewrites), the CPU's vendor and vector ISA, and
`torch.get_num_threads()`: the same graph on the same kind of machine gets the same
choices, whatever the load. Nothing is timed.

The rule (measured with `benchmarks/cpu_gemm.py --grid`: 3 runs x 1 and 2 threads,
M in 1..2048, K and N in 64..4096, 430 cases per run and thread count; tables in
benchmarks/results/cpu-gemm-2core-2026-11-24-*.md). Layout names the operands as the
matmul reads them, input M x K then weight: "nt" a forward linear (both row-major,
the weight N x K), "nn" an input gradient (`mm(g, W)`: the weight read as K x N
row-major), "tn" a weight gradient (`mm(g^T, x)`: the input read transposed too).

- oneDNN needs at least `THRESHOLD_MACS` (2^22) multiply-adds, per 2 threads above 2
  threads: its call costs a fixed 13-20 us here (ATen's addmm 2 us), which smaller
  matmuls do not win back (ATen / oneDNN 0.10-1.04 below 2^20);
- "nt": from the threshold on (geometric mean 1.75-2.14x per run and thread count;
  of its 954 measurements 9 were below 1.0, down to 0.81: 7 of them M = 1 with a
  fused GELU or SiLU on one thread, 2 of them 32x4096x64 at 0.92-0.98);
- "nn": also M >= 2 (M = 1 measured 0.6x in one run, 2.2x in another) and a weight of
  at least 2^13 elements (2048x64x64 measured 0.84-1.16x on 2 threads);
- "tn": also M >= 2 and N >= 128 (N = 64 lost up to 3x on 2 threads: 2048x4096x64);
- any other layout (both operands transposed the other way, or neither dimension of
  unit stride): ATen, never measured.

Between 2^20 and 2^22 multiply-adds the measurements disagree from run to run
(0.46-2.17x, the same case 0.96x in one run and 1.24x in another): there the rule is
unsure and keeps ATen, which eager runs, rather than timing (a timing there is what
the load decides). The table was measured on one family, `MEASURED_FAMILIES`: AMD
(Zen 5) with AVX-512, where MKL's sgemm was about 2x slower than oneDNN from the
threshold on. Intel CPUs, where MKL is known to do better, and CPUs without AVX-512
keep ATen until measured; `EMBER_CPU_GEMM=onednn` forces oneDNN there. Above 2
threads the threshold grows with the thread count, an extrapolation (only 1 and 2
threads were measured).

Weights are not prepacked. oneDNN's linear reorders a plain weight into its blocked
layout at every call; a weight reordered once (`mkldnn._reorder_linear_weight`) made
the call 10-35% faster for M <= 64 here and changed nothing for large M. But ember's
graphs take parameters as inputs, which the user may change between calls, and the
only cheap guard, the tensor's version counter with its address, misses writes
through `.data` (`p.data.add_(1)` leaves `p._version` as it was): a packed copy could
then be stale, and the numbers wrong. Comparing the weight at each call costs more
than the reorder saves.

`rule_key()` names everything the choices depend on besides the graph; the compile
cache keys compiled graphs with it, and each artifact lists its choices.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch

from ember.graphpasses import LinearCase, linear_op
from ember.graphpasses.cpu_linear import Prefer

log = logging.getLogger(__name__)

RULE_VERSION = 1  # bump when the rule's table changes: cached graphs compile again
THRESHOLD_MACS = 1 << 22
MEASURED_FAMILIES = frozenset({("AuthenticAMD", "AVX512")})


def layout(case: LinearCase) -> str | None:
    """ "nt", "nn", "tn" or "tt" (input, then weight: "n" as the matmul reads it
    row-major, "t" transposed), None for operands of neither order."""
    x = _order(case.m, case.k, case.input_strides)
    # the weight as oneDNN takes it is N x K: row-major there is the matmul's K x N
    # operand read transposed
    w = _order(case.n, case.k, case.weight_strides)
    if x is None or w is None:
        return None
    return ("n" if x == "row" else "t") + ("t" if w == "row" else "n")


def _order(rows: int, cols: int, strides: tuple[int, int]) -> str | None:
    s0, s1 = strides
    if (s1 == 1 or cols == 1) and (s0 >= cols or rows == 1):
        return "row"
    if (s0 == 1 or rows == 1) and (s1 >= rows or cols == 1):
        return "col"
    return None


def threshold(threads: int) -> int:
    """The fewest multiply-adds oneDNN runs with `threads` threads."""
    return THRESHOLD_MACS if threads <= 2 else THRESHOLD_MACS // 2 * threads


def rule(case: LinearCase, threads: int | None = None) -> bool:
    """Whether the measured family runs `case` as a oneDNN linear (the module's table),
    with `threads` threads (default `torch.get_num_threads()`)."""
    count = torch.get_num_threads() if threads is None else threads
    if case.m * case.k * case.n < threshold(count):
        return False
    kind = layout(case)
    if kind == "nt":
        return True
    if kind == "nn":
        return case.m >= 2 and case.k * case.n >= 1 << 13
    if kind == "tn":
        return case.m >= 2 and case.n >= 128
    return False


@functools.cache
def cpu_family() -> tuple[str, str]:
    """(vendor, vector ISA) of this CPU: /proc/cpuinfo's vendor_id ("unknown" where
    there is none) and the ISA ATen dispatches to ("AVX512", "AVX2", "DEFAULT", ...)."""
    vendor = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                vendor = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    isa = str(torch.backends.cpu.get_cpu_capability())
    return vendor, isa


def measured() -> bool:
    """Whether this CPU is of a family the rule was measured on."""
    return cpu_family() in MEASURED_FAMILIES


def rule_key(setting: str) -> str:
    """What the choices under `setting` depend on besides the graph: the compile
    cache's key holds it, so that another rule, CPU family or threshold compiles again."""
    if setting != "auto":
        return setting
    if linear_op() is None:
        return "auto: no oneDNN"
    vendor, isa = cpu_family()
    if not measured():
        return f"auto: ATen ({vendor} {isa} not measured)"
    return f"auto: rule {RULE_VERSION}, {vendor} {isa}, {threshold(torch.get_num_threads())} MACs"


def prefer_for(setting: str) -> Prefer | None:
    """`prefer` for an `EMBER_CPU_GEMM` value; None for "aten", without oneDNN, and for
    "auto" on a CPU family the rule was not measured on."""
    if setting == "aten" or linear_op() is None:
        return None
    if setting == "onednn":
        return lambda case: True
    if not measured():
        _log_unmeasured()
        return None
    return rule


@functools.cache
def _log_unmeasured() -> None:
    vendor, isa = cpu_family()
    log.info(
        "CPU matmuls stay ATen's: the oneDNN rule was not measured on %s %s "
        "(EMBER_CPU_GEMM=onednn uses oneDNN for every candidate)",
        vendor,
        isa,
    )


def recorded(prefer: Prefer | None, choices: dict[str, str]) -> Prefer | None:
    """`prefer`, writing each verdict into `choices` ("oneDNN" or "ATen", by
    `describe(case)`), for the artifact's list."""
    if prefer is None:
        return None
    inner = prefer

    def recording(case: LinearCase) -> bool:
        chosen = inner(case)
        choices[describe(case)] = "oneDNN" if chosen else "ATen"
        return chosen

    return recording


def describe(case: LinearCase) -> str:
    """A case as the artifact lists it: M x K x N, layout, bias, post-op."""
    bias = "+bias" if case.bias else ""
    return f"{case.m}x{case.k}x{case.n} {layout(case) or 'strided'}{bias} {case.post_op}"


__all__ = [
    "MEASURED_FAMILIES",
    "RULE_VERSION",
    "THRESHOLD_MACS",
    "cpu_family",
    "describe",
    "layout",
    "measured",
    "prefer_for",
    "recorded",
    "rule",
    "rule_key",
    "threshold",
]
