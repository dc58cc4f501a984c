"""EMBER_MATMUL_TEMPLATES=auto: a matmul becomes a Triton template with its epilogue
fused in only where a measurement at compile time says that beats cuBLAS followed by
the separate epilogue kernel.

`choose_matmuls` schedules the graph with templates on, then for each matmul kernel
of that schedule compares

- the template (measured): the kernel compiled, every candidate config timed as the
  graph's first call would time them, and the fastest timed again, fused epilogue
  included, on random operands of the graph's sizes, strides and dtypes. The config
  it keeps is the one the graph's first call then uses without tuning again;
- the ATen call it replaces (measured): `mm`, `addmm` or `bmm` (cuBLAS) on tensors of
  the same sizes, strides and dtypes;
- the separate epilogue kernel (modeled from a measurement): a device copy moving
  the bytes that kernel would move, measured at that size, launch included. The
  bytes are the product read back, the epilogue's other inputs read (not the call's
  own operands: cuBLAS reads those) and its outputs written (not the product itself:
  cuBLAS writes it). The epilogue's arithmetic (an erf, a tanh) is not counted, so
  the estimate of the unfused pair is low: a template has to win on its own time.
  Where the schedule without templates computes no epilogue kernel of its own (each
  epilogue member joined a larger kernel: a Llama block's residual add inside the
  next RMSNorm's reduction), the epilogue is counted as free: fusing it into the
  matmul saves no launch and no bytes there.

A template stays where its time is under `WIN` times the unfused estimate (a margin
for timing noise). Everything else stays an ATen call: a template that loses, one
whose sizes are symbolic (one measurement would not speak for every size), one that
does not compile or run. The decisions go into the compile record and the info log.

Measurements are remembered for the process (`CudaMatmulTimer`: by kernel source,
by call shape, by copy size), so the twelve identical layers of a model measure
once. The graph's compiled artifact holds the schedule that came out, with the
template's tuned config (`TritonLauncher.export`'s chosen configs), so a graph loaded
from the compile cache or an artifact measures nothing again.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import sympy
import torch

from ember.ir import BufferRef, ExternKernel, Layout, Program
from ember.runtime.bounded import LRUCache
from ember.scheduler import DeviceChoices, FusedKernel, Schedule, buffer_layouts, schedule_program

log = logging.getLogger("ember.runtime")

# A template stays where it takes less than this fraction of the unfused estimate.
WIN = 0.95


@dataclass(frozen=True)
class MatmulTiming:
    """Milliseconds of one matmul's two ways (see the module docstring)."""

    template_ms: float  # measured: the template with its fused epilogue, best config
    extern_ms: float  # measured: the ATen call (cuBLAS)
    epilogue_ms: float  # modeled: a measured copy of the separate epilogue's bytes

    @property
    def unfused_ms(self) -> float:
        return self.extern_ms + self.epilogue_ms

    @property
    def template_wins(self) -> bool:
        return self.template_ms < WIN * self.unfused_ms


@dataclass(frozen=True)
class MatmulDecision:
    """What `choose_matmuls` chose for one matmul call, and why."""

    call: str  # the ATen call's node name
    kernel: str  # the template kernel that would replace it
    template: bool  # True: the template runs; False: the call stays (cuBLAS)
    timing: MatmulTiming | None = None  # None where nothing was measured
    reason: str = ""  # why nothing was measured

    def describe(self) -> str:
        choice = "template" if self.template else "cuBLAS"
        if self.timing is None:
            return f"{self.call}: {choice} ({self.reason})"
        t = self.timing
        return (
            f"{self.call}: {choice} (template {t.template_ms * 1e3:.1f} us; cuBLAS "
            f"{t.extern_ms * 1e3:.1f} us + epilogue ~{t.epilogue_ms * 1e3:.1f} us)"
        )


class MatmulTimer(Protocol):
    """The measurements `choose_matmuls` needs, in milliseconds (injected by tests)."""

    def template(self, kernel: FusedKernel, layouts: Mapping[str, Layout]) -> float: ...

    def extern(self, call: ExternKernel, layouts: Mapping[str, Layout]) -> float: ...

    def copy(self, nbytes: int, device: torch.device) -> float: ...

    def prepare(self, kernels: list[FusedKernel]) -> None:
        """Start whatever `template` will need for `kernels` (their compiles), so the
        measurements that follow wait for all of them at once, not one by one."""


def choose_matmuls(
    program: Program, templates: DeviceChoices, plain: DeviceChoices, timer: MatmulTimer
) -> tuple[Schedule, list[MatmulDecision]]:
    """The schedule of `program` with a template for each matmul call that `timer`'s
    measurements say it should have (`templates` turns them on, `plain` is the
    schedule without any), and the decision for each call a template could take."""
    with_templates = schedule_program(program, templates)
    if not with_templates.matmuls:
        return with_templates, []
    without = schedule_program(program, plain)
    layouts = {**buffer_layouts(program), **buffer_layouts(with_templates.program)}
    calls = {n.name: n for n in program.nodes if isinstance(n, ExternKernel)}
    kernels = [k for k in with_templates.kernels if k.name in with_templates.matmuls]
    timer.prepare(kernels)
    decisions = [
        decide(
            kernel,
            calls[with_templates.matmuls[kernel.name]],
            layouts,
            timer,
            standalone=epilogue_stands_alone(kernel, without),
        )
        for kernel in kernels
    ]
    for decision in decisions:
        log.info("matmul templates (auto): %s", decision.describe())
    keep = frozenset(d.call for d in decisions if not d.template)
    if not keep:
        return with_templates, decisions
    if len(keep) == len(decisions):
        return without, decisions
    return schedule_program(program, templates, keep), decisions


def epilogue_stands_alone(kernel: FusedKernel, without: Schedule) -> bool:
    """Whether the schedule without templates runs some of `kernel`'s epilogue as a
    kernel of its own (one computing nothing but epilogue members). Where each
    epilogue member joined a larger kernel instead (a residual add computed inside the
    next norm's reduction), the unfused way launches no epilogue kernel and reads the
    product once either way: its epilogue costs nothing extra."""
    mine = {m.name for m in kernel.members}
    return any(
        names & mine and names <= mine
        for names in ({m.name for m in other.members} for other in without.kernels)
    )


def decide(
    kernel: FusedKernel,
    call: ExternKernel,
    layouts: Mapping[str, Layout],
    timer: MatmulTimer,
    standalone: bool = True,
) -> MatmulDecision:
    """Template or cuBLAS for one matmul kernel and the call it would replace
    (`standalone`: whether the unfused way runs the epilogue as a kernel of its own,
    `epilogue_stands_alone`; where not, the epilogue is counted as free)."""
    unmeasured = _unmeasurable(kernel, call, layouts)
    if unmeasured:
        return MatmulDecision(call.name, kernel.name, False, reason=unmeasured)
    try:
        epilogue_ms = 0.0
        if standalone:
            epilogue_ms = timer.copy(epilogue_bytes(kernel, call, layouts), kernel.device)
        timing = MatmulTiming(
            template_ms=timer.template(kernel, layouts),
            extern_ms=timer.extern(call, layouts),
            epilogue_ms=epilogue_ms,
        )
    except Exception as exc:  # a template that does not compile or run: cuBLAS
        reason = f"not measured: {type(exc).__name__}: {exc}"
        return MatmulDecision(call.name, kernel.name, False, reason=reason)
    return MatmulDecision(call.name, kernel.name, timing.template_wins, timing)


def _unmeasurable(kernel: FusedKernel, call: ExternKernel, layouts: Mapping[str, Layout]) -> str:
    """Why the two ways cannot be measured ('' where they can)."""
    if kernel.size_arguments():
        return "symbolic sizes: not measured"
    names = [*kernel.buffer_arguments(), *_call_buffers(call)]
    missing = [n for n in names if n not in layouts]
    if missing:
        return f"no layout for {missing[0]}: not measured"
    if not all(layouts[n].is_static for n in names):
        return "symbolic sizes: not measured"
    return ""


def epilogue_bytes(kernel: FusedKernel, call: ExternKernel, layouts: Mapping[str, Layout]) -> int:
    """Bytes the separate epilogue kernel would move: the product read back, the
    epilogue's other inputs read, its outputs written (see the module docstring)."""
    out = call.layout
    assert out is not None
    total = _nbytes(out)
    operands = set(_call_buffers(call))
    total += sum(_nbytes(layouts[n]) for n in kernel.inputs if n not in operands)
    for member in kernel.members[1:]:
        target = member.mutates or member.name
        if (member.stored or member.mutates) and target != call.name:
            total += _nbytes(member.layout)
    return total


def _call_buffers(call: ExternKernel) -> list[str]:
    values = [*call.args, *(v for _, v in call.kwargs)]
    return [v.name for v in values if isinstance(v, BufferRef)]


def _nbytes(layout: Layout) -> int:
    return math.prod(int(s) for s in layout.size) * layout.dtype.itemsize


# -- measuring on a GPU -----------------------------------------------------------------


# Measurements so far, for the process (the most recent 1024 of each kind).
_templates: LRUCache[tuple[Any, ...], float] = LRUCache(1024)
_externs: LRUCache[tuple[Any, ...], float] = LRUCache(1024)
_copies: LRUCache[tuple[str, int], float] = LRUCache(1024)


class CudaMatmulTimer:
    """`MatmulTimer` on the GPU, each measurement remembered for the process."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self._launchers: dict[str, Any] = {}  # kernel name -> launcher (`prepare`)

    def prepare(self, kernels: list[FusedKernel]) -> None:
        """Render every template and start all their configs compiling together (the
        compile pool works on the graph's distinct templates at once; one by one,
        each measurement waited for its own compiles)."""
        from ember.runtime.triton_kernels import compile_triton_kernels

        try:
            self._launchers.update(compile_triton_kernels(kernels, cache_dir=self.cache_dir))
        except Exception:  # each template is compiled again, and fails, on its own
            log.debug("matmul templates: compiling them together failed", exc_info=True)

    def template(self, kernel: FusedKernel, layouts: Mapping[str, Layout]) -> float:
        from ember.runtime.triton_kernels import TritonLauncher, compile_triton_kernels

        launcher = self._launchers.get(kernel.name)
        if launcher is None:
            launcher = compile_triton_kernels([kernel], cache_dir=self.cache_dir)[kernel.name]
        assert isinstance(launcher, TritonLauncher)
        names = kernel.buffer_arguments()
        key = (launcher.digest, *(_describe(layouts[n]) for n in names))
        if key not in _templates:
            with _real_tensors():
                tensors = [random_tensor(layouts[n]) for n in names]
                _templates[key] = launcher.benchmark(tensors, [])
        return _templates[key]

    def extern(self, call: ExternKernel, layouts: Mapping[str, Layout]) -> float:
        from ember.runtime.triton_kernels import launch_ms

        key = (str(call.op), *(_describe(layouts[n]) for n in _call_buffers(call)))
        key += (repr([a for a in call.args if not isinstance(a, BufferRef)]), repr(call.kwargs))
        if key not in _externs:

            def value(v: Any) -> Any:
                return random_tensor(layouts[v.name]) if isinstance(v, BufferRef) else v

            with _real_tensors():
                args = [value(a) for a in call.args]
                kwargs = {k: value(v) for k, v in call.kwargs}
                _externs[key] = launch_ms(lambda: call.op(*args, **kwargs))
        return _externs[key]

    def copy(self, nbytes: int, device: torch.device) -> float:
        from ember.runtime.triton_kernels import launch_ms

        elements = max(1, nbytes // 8)  # half read, half written, in float32
        key = (str(device), elements)
        if key not in _copies:
            with _real_tensors():
                source = torch.zeros(elements, device=device)
                target = torch.empty_like(source)
                _copies[key] = launch_ms(lambda: target.copy_(source))
        return _copies[key]


def random_tensor(layout: Layout) -> torch.Tensor:
    """A tensor of `layout` (static) over fresh storage: small random values for
    floating dtypes, zeros for the others (indices that stay in bounds)."""
    extent = int(layout.storage_extent())
    dtype, device = layout.dtype, layout.device
    if dtype.is_floating_point:
        # a generator of its own: the graph's users' random streams stay untouched
        generator = torch.Generator(device).manual_seed(0)
        storage = torch.randn(max(extent, 1), device=device, generator=generator)
        storage = storage.mul_(0.1).to(dtype)
    else:
        storage = torch.zeros(max(extent, 1), dtype=dtype, device=device)
    size = [int(s) for s in layout.size]
    stride = [int(s) for s in layout.stride]
    return storage.as_strided(size, stride, int(layout.offset))


@contextlib.contextmanager
def _real_tensors() -> Iterator[None]:
    """Real tensors, no autograd, while measuring inside a compile (where a fake
    tensor mode may be active)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), torch.no_grad():
        yield


def _describe(layout: Layout) -> tuple[Any, ...]:
    return (
        str(layout.device),
        str(layout.dtype),
        tuple(sympy.sympify(s) for s in layout.size),
        tuple(sympy.sympify(s) for s in layout.stride),
        sympy.sympify(layout.offset),
    )
