"""The prelude's vectorised float math (ember::exp, log, erf, tanh, and sigmoid through
exp) against torch, in ulps of the float32 result, over wide ranges: every exponent
from subnormals to overflow, the branch boundaries, NaN, infinities, signed zeros."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.codegen.cpp import CPP_CHOICES, render_kernels
from ember.graphpasses import ember_decompositions
from ember.ir import Const, Layout, Load, LoweringOptions, Op, lower_graph
from ember.ir.symbolic import index_var
from ember.runtime.cpp_kernels import (
    FLAG_CHOICES,
    compile_cpp_kernels,
    compiler_identity,
    find_compiler,
)
from ember.scheduler import POINTWISE, FusedKernel, KernelMember, schedule_program

OPS = ("exp", "log", "erf", "tanh", "sigmoid")
# ulps from the float64 result (test_ulps.py measures them against libm over many more
# inputs); torch's own float32 kernels are within 1
MAX_ULPS = {"exp": 1.5, "log": 1.5, "erf": 2.0, "tanh": 2.0, "sigmoid": 2.0}
SPECIAL = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, -1e-45, 1e-40]
SPECIAL += [1.17e-38, 88.72, 88.73, 89.0, -87.3, -103.0, -103.9, -104.0, -150.0, 3.92, 4.0]
SPECIAL += [0.921875, 0.92187494, -0.921875, 0.625, 0.62499994, 9.5, 10.0, 1e30, -1e30]
SPECIAL += [1.0, 1.0000001, 0.99999994, 0.70710677, 0.7071068, 1.4142135, 3.4028235e38, 2.0**-126]


def _inputs() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    magnitudes = torch.logspace(-45, 38, 20_000, dtype=torch.float64).float()
    return torch.cat(
        [
            torch.tensor(SPECIAL),
            torch.linspace(-110, 100, 200_001),
            torch.randn(100_000, generator=g) * 3,
            magnitudes,
            -magnitudes,
        ]
    ).contiguous()


def _ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|got - want| in units of the float32 spacing at want (want in float64)."""
    rounded = want.float()
    spacing = (torch.nextafter(rounded.abs(), torch.tensor(float("inf"))) - rounded.abs()).double()
    spacing = spacing.clamp(min=2.0**-149)
    distance = (got.double() - want).abs() / spacing
    agree = (got.isnan() & want.isnan()) | (got.double() == rounded.double())
    return torch.where(agree, torch.zeros_like(distance), distance)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    x = _inputs()
    n = sympy.Integer(x.numel())
    i0 = index_var("i", 0)
    layout = Layout.contiguous(torch.device("cpu"), torch.float32, (n,))
    members = tuple(
        KernelMember(
            f"o_{op}",
            layout,
            POINTWISE,
            Op(op, (Load("x", i0, torch.float32),), torch.float32),
            i0,
            stored=True,
        )
        for op in OPS
    )
    kernel = FusedKernel("math_f32", (n,), (), members, ("x",), tuple(m.name for m in members))
    compiled = compile_cpp_kernels([kernel], cache_dir=tmp_path_factory.mktemp("math"))
    outs = {m.name: torch.empty_like(x) for m in members}
    buffers = {"x": x, **outs}
    compiled[kernel.name](*[buffers[b] for b in kernel.buffer_arguments()])
    return {"x": x, **{op: outs[f"o_{op}"] for op in OPS}}


@pytest.mark.parametrize("op", OPS)
def test_vectorised_math_within_ulps(op: str, results: dict[str, torch.Tensor]) -> None:
    x, got = results["x"], results[op]
    want = getattr(torch, op)(x.double())
    ulps = _ulps(got, want)
    worst = int(ulps.argmax())
    assert ulps.max().item() <= MAX_ULPS[op], (
        f"{op}({x[worst].item()!r}) = {got[worst].item()!r}, want {want[worst].item()!r}"
    )
    assert torch.equal(got.isnan(), want.isnan())
    zeros = want == 0
    assert torch.equal(got[zeros].signbit(), want[zeros].signbit())  # tanh(-0) is -0
    torch.testing.assert_close(got, getattr(torch, op)(x), equal_nan=True, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("op", OPS)
def test_vectorised_math_vectorises(op: str, tmp_path: Path) -> None:
    """The loop of a kernel computing `op` vectorises (GCC's report): a select or a
    libm call that the vectoriser cannot see through makes it scalar, 5-10x slower,
    with every number still right."""
    compiler = find_compiler()
    if "Free Software Foundation" not in compiler_identity(compiler):  # GCC's banner
        pytest.skip("the vectorisation report is GCC's")
    n = sympy.Integer(4096)
    i0 = index_var("i", 0)
    layout = Layout.contiguous(torch.device("cpu"), torch.float32, (n,))
    body = Op(op, (Load("x", i0, torch.float32),), torch.float32)
    member = KernelMember("o", layout, POINTWISE, body, i0, stored=True)
    kernel = FusedKernel(f"only_{op}", (n,), (), (member,), ("x",), ("o",))
    source = render_kernels([kernel]).source
    first = source.count("\n", 0, source.index(f"void {kernel.name}(")) + 1  # its line
    vectorised, report = _vectorised_lines(compiler, source, tmp_path)
    assert any(line > first for line in vectorised), report  # a loop of the kernel


def _vectorised_lines(compiler: str, source: str, tmp_path: Path) -> tuple[set[int], str]:
    """The lines of `source` where GCC reports a loop vectorised, and its report."""
    path = tmp_path / "unit.cpp"
    path.write_text(source)
    flags = [f for f in FLAG_CHOICES[0] if f != "-shared"]
    report = subprocess.run(
        [compiler, *flags, "-c", str(path), "-o", str(tmp_path / "unit.o"), "-fopt-info-vec"],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    found = re.findall(r"unit\.cpp:(\d+):\d+: optimized: loop vectorized", report)
    return {int(line) for line in found}, report


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_row_loops_calling_math_vectorise(name: str, tmp_path: Path) -> None:
    """Each whole-chunk loop of a row reduction that calls exp or log vectorises. In
    log_softmax, log's argument (the row sum) is the same for the whole loop: GCC
    hoisted the selects of an earlier log out of it and then left the loop scalar
    (4096x2048: 21 ms instead of 3)."""
    compiler = find_compiler()
    if "Free Software Foundation" not in compiler_identity(compiler):  # GCC's banner
        pytest.skip("the vectorisation report is GCC's")
    fn = torch.softmax if name == "softmax" else torch.log_softmax
    gm = make_fx(lambda x: fn(x, -1), decomposition_table=ember_decompositions())(
        torch.randn(64, 2048)
    )
    schedule = schedule_program(lower_graph(gm, options=LoweringOptions(loops=True)), CPP_CHOICES)
    source = render_kernels(schedule.kernels).source
    lines = source.split("\n")
    loops = []  # 1-based first and last lines of simd chunk loops calling exp or log
    for at, text in enumerate(lines[:-1]):
        if "#pragma omp simd" in text and "l < ember::kLanes" in lines[at + 1]:
            indent = lines[at + 1][: len(lines[at + 1]) - len(lines[at + 1].lstrip())]
            end = lines.index(indent + "}", at + 1)
            if any("ember::exp(" in b or "ember::log(" in b for b in lines[at + 2 : end]):
                loops.append(range(at + 2, end + 2))
    assert len(loops) == (1 if name == "softmax" else 2), source
    vectorised, report = _vectorised_lines(compiler, source, tmp_path)
    # GCC reports a loop at a line of its body
    assert all(any(line in loop for line in vectorised) for loop in loops), report


def _gelu_kernel(n: int) -> FusedKernel:
    """A kernel computing float32 GELU as ember.ir lowers it (the emitter makes it one
    `ember::gelu` call)."""
    i0 = index_var("i", 0)
    f32 = torch.float32
    x = Load("x", i0, f32)
    inner = Op("erf", (Op("mul", (x, Const(math.sqrt(0.5), f32)), f32),), f32)
    body = Op(
        "mul", (Op("mul", (x, Const(0.5, f32)), f32), Op("add", (Const(1.0, f32), inner), f32)), f32
    )
    layout = Layout.contiguous(torch.device("cpu"), f32, (sympy.Integer(n),))
    member = KernelMember("o", layout, POINTWISE, body, i0, stored=True)
    return FusedKernel("gelu_f32", (sympy.Integer(n),), (), (member,), ("x",), ("o",))


def test_gelu_error_bounds(tmp_path: Path) -> None:
    """`ember::gelu` against x Phi(x) in float64 (Phi through erfc: no cancellation):
    within 2 ulps for x >= 0, 16 ulps for -3 < x < 0 (the formula it replaces, which
    rounds 1 + erf(z), was 103 ulps off there), 5e-8 absolute below -3, where GELU is
    above -0.0041 and tends to 0; NaN for NaN and -inf, inf for inf, -0 for -0."""
    x = _inputs()
    kernel = _gelu_kernel(x.numel())
    assert "ember::gelu(" in render_kernels([kernel]).source
    compiled = compile_cpp_kernels([kernel], cache_dir=tmp_path)
    got = torch.empty_like(x)
    compiled[kernel.name](x, got)
    xd = x.double()
    want = xd * 0.5 * torch.special.erfc(-xd / math.sqrt(2.0))
    finite = torch.isfinite(x)
    ulps = _ulps(got, want)
    assert ulps[finite & (x >= 0)].max().item() <= 2.0
    negative = finite & (x < 0) & (x > -3)
    assert ulps[negative].max().item() <= 16.0
    tail = finite & (x <= -3)
    assert (got.double() - want)[tail].abs().max().item() <= 5e-8
    special = torch.tensor([math.nan, -math.inf, math.inf, -0.0, 0.0])
    out = torch.empty_like(special)
    small = compile_cpp_kernels([_gelu_kernel(5)], cache_dir=tmp_path)
    small["gelu_f32"](special, out)
    assert out[:2].isnan().all() and out[2].item() == math.inf
    assert out[3].item() == 0.0 and out[3].signbit() and not out[4].signbit()


def test_gelu_loop_vectorises(tmp_path: Path) -> None:
    compiler = find_compiler()
    if "Free Software Foundation" not in compiler_identity(compiler):  # GCC's banner
        pytest.skip("the vectorisation report is GCC's")
    kernel = _gelu_kernel(4096)
    source = render_kernels([kernel]).source
    first = source.count("\n", 0, source.index(f"void {kernel.name}(")) + 1
    vectorised, report = _vectorised_lines(compiler, source, tmp_path)
    assert any(line > first for line in vectorised), report
