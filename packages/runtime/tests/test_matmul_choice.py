"""EMBER_MATMUL_TEMPLATES=auto (ember.runtime.matmul_choice): the decision between a
matmul template and cuBLAS followed by the separate epilogue.

On the CPU the decision logic runs with an injected timer (programs lowered here; no
kernel runs); the `cuda` tests measure for real inside a compile and check that the
kernels launched are the ones chosen, and that a graph from the compile cache
measures nothing again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.codegen.triton import TRITON_CHOICES
from ember.graphpasses import ember_decompositions
from ember.ir import ExternKernel, Layout, LoweringOptions, Program, lower_graph
from ember.runtime import matmul_choice
from ember.runtime.kernels import measures_matmuls
from ember.runtime.matmul_choice import (
    WIN,
    MatmulDecision,
    MatmulTiming,
    choose_matmuls,
    epilogue_bytes,
)
from ember.scheduler import FusedKernel, buffer_layouts, schedule_program

TEMPLATES = dataclasses.replace(TRITON_CHOICES, matmul_epilogues=True)
PLAIN = TRITON_CHOICES


class FakeTimer:
    """Times by the ATen call a template would replace (`by_call`: name -> (template
    ms, cuBLAS ms)); the copy takes `copy_ms`. Records what it was asked."""

    def __init__(self, by_call: Mapping[str, tuple[float, float]], copy_ms: float = 0.0) -> None:
        self.by_call = dict(by_call)
        self.copy_ms = copy_ms
        self.templates: list[str] = []
        self.externs: list[str] = []
        self.copies: list[int] = []
        self.kernel_calls: dict[str, str] = {}  # kernel name -> call, from extern()

    def _call_of(self, kernel: FusedKernel) -> str:
        members = {m.name for m in kernel.members} | set(kernel.computes)
        (call,) = [c for c in self.by_call if c in members]
        return call

    def template(self, kernel: FusedKernel, layouts: Mapping[str, Layout]) -> float:
        call = self._call_of(kernel)
        self.templates.append(call)
        return self.by_call[call][0]

    def extern(self, call: ExternKernel, layouts: Mapping[str, Layout]) -> float:
        self.externs.append(call.name)
        return self.by_call[call.name][1]

    def copy(self, nbytes: int, device: torch.device) -> float:
        self.copies.append(nbytes)
        return self.copy_ms

    def prepare(self, kernels: list[FusedKernel]) -> None:
        self.prepared = [self._call_of(k) for k in kernels]


def _lower(fn: Callable[..., Any], *args: torch.Tensor) -> Program:
    gm = make_fx(fn, decomposition_table=ember_decompositions())(*args)
    return lower_graph(gm, options=LoweringOptions(loops=True))


def _two_linears(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> Any:
    return F.gelu(F.linear(x, w1, b1)), torch.tanh(x @ w2) * 0.5


def _two_linears_args() -> tuple[torch.Tensor, ...]:
    return (torch.randn(64, 32), torch.randn(48, 32), torch.randn(48), torch.randn(32, 48))


def _matmul_calls(program: Program, *ops: str) -> list[str]:
    """The names of the program's matmul calls (of `ops` only, where given)."""
    ops = ops or ("mm", "addmm", "bmm")
    return [
        n.name
        for n in program.nodes
        if isinstance(n, ExternKernel) and n.op.__name__.split(".")[0] in ops
    ]


def _extern_matmuls(schedule: Any) -> list[str]:
    return [
        s.node.name
        for s in schedule.steps
        if hasattr(s, "node") and s.node.op.__name__.split(".")[0] in ("mm", "addmm", "bmm")
    ]


def test_timing_needs_the_margin_to_keep_a_template() -> None:
    assert MatmulTiming(template_ms=1.0, extern_ms=1.0, epilogue_ms=0.5).template_wins
    assert MatmulTiming(1.0, 1.0, 0.5).unfused_ms == 1.5
    # faster, but within the margin: cuBLAS
    assert not MatmulTiming(template_ms=0.97, extern_ms=0.8, epilogue_ms=0.2).template_wins
    assert not MatmulTiming(template_ms=WIN, extern_ms=1.0, epilogue_ms=0.0).template_wins
    assert MatmulTiming(template_ms=WIN * 0.99, extern_ms=1.0, epilogue_ms=0.0).template_wins


def test_each_matmul_goes_the_way_its_times_say() -> None:
    program = _lower(_two_linears, *_two_linears_args())
    (mm,), (addmm,) = _matmul_calls(program, "mm"), _matmul_calls(program, "addmm")
    # the addmm's template wins (1.0 < 0.95 * (1.0 + 0.2)); the mm's loses
    timer = FakeTimer({addmm: (1.0, 1.0), mm: (2.0, 1.0)}, copy_ms=0.2)
    schedule, decisions = choose_matmuls(program, TEMPLATES, PLAIN, timer)
    by_call = {d.call: d for d in decisions}
    assert set(by_call) == {mm, addmm}
    assert by_call[addmm].template and not by_call[mm].template
    assert sorted(timer.externs) == sorted([mm, addmm])  # each measured once
    assert sorted(timer.prepared) == sorted([mm, addmm])  # compiled together, first
    assert _extern_matmuls(schedule) == [mm]  # the loser stays cuBLAS ...
    (template,) = [k for k in schedule.kernels if k.matmul is not None]
    assert schedule.matmuls == {template.name: addmm}  # ... the winner is a template
    assert "template" in by_call[addmm].describe() and "cuBLAS 1000.0 us" in (
        by_call[mm].describe()
    )


def test_templates_that_all_lose_give_the_schedule_without_templates() -> None:
    program = _lower(_two_linears, *_two_linears_args())
    calls = _matmul_calls(program)
    timer = FakeTimer(dict.fromkeys(calls, (3.0, 1.0)), copy_ms=0.5)
    schedule, decisions = choose_matmuls(program, TEMPLATES, PLAIN, timer)
    assert [d.template for d in decisions] == [False, False]
    plain = schedule_program(program, PLAIN)
    assert schedule.format() == plain.format()
    assert not schedule.matmuls


def test_templates_that_all_win_give_the_schedule_with_templates() -> None:
    program = _lower(_two_linears, *_two_linears_args())
    calls = _matmul_calls(program)
    timer = FakeTimer(dict.fromkeys(calls, (0.5, 1.0)))
    schedule, decisions = choose_matmuls(program, TEMPLATES, PLAIN, timer)
    assert all(d.template for d in decisions) and len(decisions) == 2
    assert schedule.format() == schedule_program(program, TEMPLATES).format()
    assert _extern_matmuls(schedule) == []


def test_a_measurement_that_fails_keeps_cublas_and_says_why() -> None:
    program = _lower(_two_linears, *_two_linears_args())

    class Failing(FakeTimer):
        def template(self, kernel: FusedKernel, layouts: Mapping[str, Layout]) -> float:
            raise RuntimeError("out of resources")

    timer = Failing(dict.fromkeys(_matmul_calls(program), (0.1, 1.0)))
    schedule, decisions = choose_matmuls(program, TEMPLATES, PLAIN, timer)
    assert not any(d.template for d in decisions)
    assert all("RuntimeError: out of resources" in d.describe() for d in decisions)
    assert sorted(_extern_matmuls(schedule)) == sorted(_matmul_calls(program))


def test_symbolic_sizes_are_not_measured() -> None:
    x, w, b = torch.randn(64, 32), torch.randn(48, 32), torch.randn(48)
    gm = make_fx(lambda x, w, b: F.relu(F.linear(x, w, b)), tracing_mode="symbolic")(x, w, b)
    program = lower_graph(gm, options=LoweringOptions(loops=True))
    timer = FakeTimer(dict.fromkeys(_matmul_calls(program), (0.1, 1.0)))
    schedule, decisions = choose_matmuls(program, TEMPLATES, PLAIN, timer)
    assert len(decisions) == 1 and not decisions[0].template
    assert "symbolic sizes" in decisions[0].reason
    assert timer.templates == [] and timer.externs == []  # nothing was timed
    assert _extern_matmuls(schedule) == _matmul_calls(program)


def test_a_graph_without_matmuls_measures_nothing() -> None:
    program = _lower(lambda x: torch.relu(x) * 2, torch.randn(8, 8))
    timer = FakeTimer({})
    schedule, decisions = choose_matmuls(program, TEMPLATES, PLAIN, timer)
    assert decisions == [] and timer.copies == []
    assert schedule.format() == schedule_program(program, PLAIN).format()


def test_the_epilogue_model_counts_what_a_separate_kernel_would_move() -> None:
    m, k, n = 64, 32, 48
    args = (torch.randn(m, k), torch.randn(n, k), torch.randn(n), torch.randn(k, n))
    program = _lower(_two_linears, *[a.to(torch.bfloat16) for a in args])
    with_templates = schedule_program(program, TEMPLATES)
    layouts = {**buffer_layouts(program), **buffer_layouts(with_templates.program)}
    calls = {n.name: n for n in program.nodes if isinstance(n, ExternKernel)}
    moved = {}
    for kernel in with_templates.kernels:
        if kernel.name in with_templates.matmuls:
            call = calls[with_templates.matmuls[kernel.name]]
            moved[call.op.__name__.split(".")[0]] = epilogue_bytes(kernel, call, layouts)
    # gelu(addmm): the product read back and gelu's result written (the bias is the
    # call's own operand); bf16
    assert moved["addmm"] == 2 * m * n * 2
    # tanh(mm) * 0.5: likewise, the product read and the result written
    assert moved["mm"] == 2 * m * n * 2


def _residual_then_norm(x: torch.Tensor, w: torch.Tensor, h: torch.Tensor) -> Any:
    """A Llama block's output projection: the residual add, then the next RMSNorm."""
    y = h + x @ w
    return y, y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)


def test_an_epilogue_the_next_kernel_absorbs_is_counted_as_free() -> None:
    # Without templates the residual add joins the norm's reduction kernel: no
    # separate epilogue kernel runs, so the template must beat cuBLAS alone.
    program = _lower(
        _residual_then_norm, torch.randn(64, 32), torch.randn(32, 48), torch.randn(64, 48)
    )
    (mm,) = _matmul_calls(program)
    timer = FakeTimer({mm: (0.9, 0.8)}, copy_ms=0.5)  # wins only with the epilogue
    schedule, (decision,) = choose_matmuls(program, TEMPLATES, PLAIN, timer)
    assert decision.timing is not None and decision.timing.epilogue_ms == 0.0
    assert not decision.template and timer.copies == []
    assert _extern_matmuls(schedule) == [mm]
    # the same template over a GELU that runs as a kernel of its own does count it
    program = _lower(lambda x, w: F.gelu(x @ w), torch.randn(64, 32), torch.randn(32, 48))
    (mm,) = _matmul_calls(program)
    timer = FakeTimer({mm: (0.9, 0.8)}, copy_ms=0.5)
    _, (decision,) = choose_matmuls(program, TEMPLATES, PLAIN, timer)
    assert decision.template and decision.timing is not None
    assert decision.timing.epilogue_ms == 0.5


def test_decisions_describe_their_times() -> None:
    decision = MatmulDecision("addmm", "k3_mm", True, MatmulTiming(0.010, 0.008, 0.004))
    assert decision.describe() == (
        "addmm: template (template 10.0 us; cuBLAS 8.0 us + epilogue ~4.0 us)"
    )
    unmeasured = MatmulDecision("mm", "k1_mm", False, reason="symbolic sizes: not measured")
    assert unmeasured.describe() == "mm: cuBLAS (symbolic sizes: not measured)"


def test_only_auto_on_cuda_measures() -> None:
    assert not measures_matmuls({}, "auto", "auto")
    from ember.runtime.devices import device_record

    cpu = {torch.device("cpu"): device_record(torch.device("cpu"))}
    assert not measures_matmuls(cpu, "auto", "auto")  # the C++ codegen renders none


# -- CUDA -------------------------------------------------------------------------------


def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.cuda
def test_launch_timing_leaves_a_slow_host_out() -> None:
    # A 4 us cuBLAS call queued by a host slowed to ~300 us a call (other threads
    # inside a compile) measured 170 us before the wait was sized and checked.
    _needs_cuda()
    import time

    from ember.runtime.triton_kernels import launch_ms

    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    fast = launch_ms(lambda: a @ a)

    def slow_host() -> torch.Tensor:
        time.sleep(300e-6)
        return a @ a

    slow = launch_ms(slow_host)
    assert slow < max(3 * fast, fast + 0.02), (fast, slow)


class _MLP(torch.nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


def _compile_and_count(model: torch.nn.Module, x: torch.Tensor, **settings: Any) -> Any:
    """(output, eager output, template launches of a second call, the records)."""
    import torch._dynamo
    from torch.profiler import ProfilerActivity, profile

    from ember.runtime.config import config
    from ember.runtime.testing import no_eager_fallback

    torch._dynamo.reset()
    with torch.no_grad():
        expected = model(x)
        with (
            config.scope(matmul_templates="auto", cudagraphs="off", **settings),
            no_eager_fallback() as records,
        ):
            compiled = torch.compile(model, backend="ember")
            actual = compiled(x)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                compiled(x)
                torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return actual, expected, sum(1 for n in names if n.startswith("mm_")), list(records)


@pytest.mark.cuda
@pytest.mark.parametrize("win", [1e9, 0.0])
def test_auto_launches_what_it_chose(win: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the margin forced, both Linears go one way: templates (launched, and tuned
    while measured: the first call tunes nothing), or cuBLAS (no template launched)."""
    _needs_cuda()
    from ember.runtime import triton_kernels
    from ember.runtime.accuracy import compare_outputs

    monkeypatch.setattr(matmul_choice, "WIN", win)
    tuned: list[str] = []
    original = triton_kernels.TritonLauncher._tune

    def counting(self: Any, *args: Any) -> Any:
        tuned.append(self.kernel.name)
        return original(self, *args)

    torch.manual_seed(0)
    model = _MLP(256, 1024).cuda().to(torch.bfloat16).eval()
    x = torch.randn(4, 77, 256, device="cuda", dtype=torch.bfloat16)
    monkeypatch.setattr(triton_kernels.TritonLauncher, "_tune", counting)
    before = len(tuned)
    actual, expected, launches, records = _compile_and_count(model, x, compile_cache=False)
    assert compare_outputs(actual, expected) is None, compare_outputs(actual, expected)
    choices = [c for r in records for c in r.matmul_choices]
    assert len(choices) == 2, choices
    if win > 1:
        assert all(": template (" in c for c in choices), choices
        assert launches == 2
        # the template kernels were tuned once, while measured, not again at the call
        assert sum(1 for n in tuned[before:] if "_mm_" in n) <= 2
    else:
        assert all(": cuBLAS (" in c for c in choices), choices
        assert launches == 0


@pytest.mark.cuda
def test_auto_measures_and_a_cached_graph_does_not_measure_again(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _needs_cuda()
    from ember.runtime.accuracy import compare_outputs

    measured: list[str] = []
    original = matmul_choice.CudaMatmulTimer.extern

    def counting(self: Any, call: ExternKernel, layouts: Mapping[str, Layout]) -> float:
        measured.append(call.name)
        return original(self, call, layouts)

    monkeypatch.setattr(matmul_choice.CudaMatmulTimer, "extern", counting)
    torch.manual_seed(0)
    model = _MLP(768, 3072).cuda().to(torch.bfloat16).eval()
    x = torch.randn(8, 256, 768, device="cuda", dtype=torch.bfloat16)
    settings = {"compile_cache": True, "cache_dir": str(tmp_path)}
    actual, expected, launches, records = _compile_and_count(model, x, **settings)
    assert compare_outputs(actual, expected) is None
    choices = [c for r in records for c in r.matmul_choices]
    assert len(choices) == 2 and len(measured) == 2, (choices, measured)
    assert launches == sum(1 for c in choices if ": template (" in c)
    # the same graph again, from the compile cache: the schedule comes back as chosen
    actual, _, again, records = _compile_and_count(model, x, **settings)
    assert compare_outputs(actual, expected) is None
    assert len(measured) == 2  # nothing measured
    assert again == launches
