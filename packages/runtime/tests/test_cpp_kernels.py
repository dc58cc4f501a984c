"""Compile and run ember's C++ kernels: every kernel type against the IR interpreter
(`ember.ir.run_program`, the oracle) and against eager.

All graph cases share one translation unit (one compile, ~2 s); the op-table sweep is a
second one. Kernel names are prefixed with the case name so they can share a unit.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from cpp_harness import Case, case_fixtures, check_case, run_compiled

from ember.runtime import cpp_kernels, threads
from ember.runtime.cpp_kernels import CppCompileError, CppKernel, compile_cpp_kernels

torch.manual_seed(0)
NAN, INF = float("nan"), float("inf")


def _softmax_epilogue(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
    y = torch.softmax(x, -1)
    return ((x + y) * w + b).relu(), y.sum(0), (x * 2).transpose(1, 2).contiguous()


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True, correction=0)
    return (x - mean) * torch.rsqrt(var + 1e-5) * w + b


def _with_nans(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x[1, 3] = NAN
    x[2, 0] = NAN
    x[2, 5] = NAN
    return x


def _extreme_in_every_lane() -> torch.Tensor:
    """Rows of three 16-lane chunks, row k's maximum in lane k (also tied by a later
    column in another lane), the last row's NaN in lane 12: the lanes' accumulators
    fold into one in a tree (lane l takes l + 8, 4, 2, 1), every lane must reach it."""
    x = torch.randn(17, 48)
    for k in range(16):
        x[k, 16 + k] = 10.0
        x[k, 32 + (k + 5) % 16] = 10.0
        x[k, 16 + (k + 3) % 16] = -10.0
    x[16, 28] = NAN
    return x


def _odd_nans(dtype: torch.dtype) -> torch.Tensor:
    """A [40, 70] half tensor holding NaNs of both signs with payloads other than the
    canonical quiet NaN (bits 0x7fc1, 0xffc3 in bfloat16; 0x7e01, 0xfe03 in float16)."""
    bits = torch.randn(40, 70).to(dtype).view(torch.int16)
    payloads = (0x7FC1, -0x003D) if dtype == torch.bfloat16 else (0x7E01, -0x01FD)
    bits[3, 5], bits[20, 33], bits[39, 69] = payloads[0], payloads[1], payloads[0]
    return bits.view(dtype)


SPECIAL = torch.tensor([0.0, -0.0, 1.0, -1.5, 2.5, 3.5, 1e-40, -1e-40, 65519.0, 65520.0, 1e30])
SPECIAL = torch.cat([SPECIAL, torch.tensor([NAN, INF, -INF]), torch.randn(50) * 100])

# name -> (function, example inputs, symbolic?, other inputs to run with)
CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...], bool]] = {
    "pointwise": (
        lambda x, y: (x * 2 + y.sigmoid(), torch.where(x > 0, x, y).exp(), (x - y).abs().sqrt()),
        (torch.randn(33, 70), torch.randn(70)),
        False,
    ),
    "transpose": (
        lambda x: (x.t().contiguous() + 1, x.permute(1, 0).contiguous()),
        (torch.randn(300, 200),),
        False,
    ),
    "tiles_and_tails": (  # transpose tiles, row chunks and column blocks with partial ends
        lambda x, y: (
            x.transpose(1, 2).contiguous(),
            x.permute(2, 0, 1).contiguous() * 2,
            y.sum(0),
            y.sum(-1),
            y.softmax(-1),
            F.gelu(y),
            F.gelu(y, approximate="tanh"),
            torch.var_mean(x, (0, 2)),  # two reduction dims, partial chunks between
            torch.var_mean(x[:, :, :48] + 5, (0, 2)),  # whole chunks only: 1 / count
            torch.var_mean(y + 100, 1),
        ),
        (torch.randn(3, 40, 50), torch.randn(70, 1000) * 3),
        False,
    ),
    "transpose_dtypes": (  # register-transposed tiles of 1, 2, 4 and 8-byte elements
        lambda a, h, d, i, x: (
            a.t().contiguous(),
            (h.t() * 2).contiguous(),
            d.t().contiguous() + 1,
            i.t().contiguous(),
            (i.t() % 100).to(torch.int8).contiguous(),
            (x.t() > 0).contiguous(),
            x.t().to(torch.bfloat16).contiguous(),
        ),
        (
            torch.randn(40, 70).to(torch.bfloat16),
            torch.randn(40, 70).to(torch.float16),
            torch.randn(40, 70, dtype=torch.float64),
            torch.randint(-(2**40), 2**40, (40, 70)),
            torch.randn(40, 70),
        ),
        False,
    ),
    "transpose_stream": (  # outputs over ember::kStreamMin: non-temporal rows, tails
        lambda x, y: (y + x.t(), (y * x.t()).to(torch.bfloat16)),
        (torch.randn(1043, 1030), torch.randn(1030, 1043)),
        False,
    ),
    "dynamic_transpose": (  # symbolic sizes and strides: tiles, tails, a runtime stream test
        lambda x: x.t().contiguous() * 2,
        (torch.randn(40, 70),),
        True,
    ),
    "half_copies": (  # copies of half types keep their bits (NaN sign and payload)
        lambda x, h: (x.t().contiguous(), h.t().contiguous(), h[:, 1:] + 0, torch.cat([x, x], 1)),
        (_odd_nans(torch.bfloat16), _odd_nans(torch.float16)),
        False,
    ),
    "softmax": (_softmax_epilogue, (torch.randn(4, 6, 8), torch.randn(8), torch.randn(8)), False),
    "layer_norm": (_layer_norm, (torch.randn(16, 100), torch.randn(100), torch.randn(100)), False),
    "sum_axes": (
        lambda x: (x.sum(-1), x.sum(0), x.sum(1), x.sum((0, 2))),
        (torch.randn(20, 30, 40),),
        False,
    ),
    "max_arg": (
        lambda x: (x.amax(1), x.amin(0), x.argmax(1), x.argmin(0), x.argmax(0)),
        (_with_nans(torch.randn(5, 37)),),
        False,
    ),
    "arg_ties": (
        lambda x: (x.argmax(-1), x.argmin(0)),
        (torch.randint(0, 3, (6, 40)).float(),),
        False,
    ),
    "lane_tree": (
        lambda x: (x.amax(1), x.argmax(1), x.argmin(1), x.sum(1), torch.var_mean(x, 1)),
        (_extreme_in_every_lane(),),
        False,
    ),
    "any_all": (
        lambda x: ((x > 1).any(1), (x > -2).all(0), x.prod(1)),
        (torch.randn(7, 9),),
        False,
    ),
    "welford": (lambda x: (torch.var_mean(x, 1), torch.std(x, 0)), (torch.randn(5, 300),), False),
    "masked": (
        lambda x, y: (torch.cat([x, y], 1), F.pad(x, (1, 2)), F.pad(x, (2, 1), value=-3.0)),
        (torch.randn(4, 3), torch.randn(4, 5)),
        False,
    ),
    "indirect": (
        lambda w, i, x, j: (F.embedding(i, w), torch.gather(x, 1, j), w[i - 2]),
        (
            torch.randn(10, 4),
            torch.tensor([1, 3, 9]),
            torch.randn(3, 5),
            torch.tensor([[0, 4], [1, 1], [2, 3]]),
        ),
        False,
    ),
    "scatter": (
        lambda x, i, v: (
            torch.index_put(x, (i,), v, accumulate=True),
            x.scatter_add(0, i.view(-1, 1).expand(3, 4), v),
            torch.index_put(x, (torch.tensor([4, 1, 3]),), v),
        ),
        (torch.randn(5, 4), torch.tensor([0, 2, 0]), torch.randn(3, 4)),
        False,
    ),
    "uniform": (
        lambda x: (torch.ops.aten.native_dropout(x, 0.3, True), torch.rand_like(x)),
        (torch.randn(64, 33),),
        False,
    ),
    "normal": (lambda x: torch.randn_like(x) * 2 + x, (torch.randn(64, 33),), False),
    "bf16": (
        lambda x, y: (
            x.float().sum(1).to(torch.bfloat16),
            x * 2 + y,
            x.half(),
            x.amax(0),
            y.argmax(1),
        ),
        (torch.randn(9, 40).to(torch.bfloat16), torch.randn(9, 40).to(torch.bfloat16)),
        False,
    ),
    "bf16_signbit": (  # alone in its kernel, std::signbit of it crashed GCC 12 (ICE)
        lambda x: torch.signbit(x),
        (torch.cat([SPECIAL, -SPECIAL]).to(torch.bfloat16).view(4, -1),),
        False,
    ),
    "zero_dim": (  # reductions of a 0-dim tensor: argmax is 0, not the value
        lambda x: (x.argmax(), x.argmin(0), x.max(0), torch.var_mean(x, correction=0), x.sum()),
        (torch.tensor(-8.5),),
        False,
    ),
    "half_casts": (
        lambda x: (x.to(torch.bfloat16), x.to(torch.float16), x.to(torch.float64) * 3),
        (SPECIAL,),
        False,
    ),
    "integers": (
        lambda a, b: (
            a * b + 3,
            a // b,
            a % b,
            (a & 12) ^ b,
            a.sum(0),
            torch.maximum(a, b),
            a.to(torch.int8) * 3,
        ),
        (torch.randint(-50, 50, (6, 8)), torch.tensor([1, -2, 3, -4, 5, 7, -9, 11])),
        False,
    ),
    "dynamic": (
        lambda x, y: (x.softmax(-1) + y, x.sum(0), torch.var_mean(x, -1)),
        (torch.randn(4, 8), torch.randn(8)),
        True,
    ),
    "split": (
        lambda x, y: (x.sum(-1), y.sum(0), torch.var_mean(x, -1), x.argmax(-1), y.amax(0)),
        (torch.randn(1, 100000), torch.randn(30000, 8)),
        False,
    ),
    "split_softmax": (lambda x: x.softmax(-1), (torch.randn(1, 50000),), False),
}

# Inputs to run dynamic cases with, besides the traced example.
OTHER_INPUTS = {
    "dynamic": [(torch.randn(5, 11), torch.randn(11)), (torch.randn(3, 20000), torch.randn(20000))],
    "dynamic_transpose": [(torch.randn(5, 11),), (torch.randn(1100, 1000),)],
}


# the IR patch (see `cpp_harness.exact_evaluate`), the traced cases, one compiled unit
_exact_ir_evaluation, traced, compiled = case_fixtures(CASES, "cpp-cache")

RANDOM = {"uniform", "normal"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_matches_interpreter_and_eager(
    name: str, traced: dict[str, Case], compiled: dict[str, Any]
) -> None:
    case = traced[name]
    assert case.kernels, "the case should produce fused kernels"
    loose = name in ("split", "split_softmax", "sum_axes")  # long float sums, other order

    def against_eager(output: torch.Tensor) -> tuple[float, float]:
        return (1e-4 if loose else 1e-5, 1e-5) if output.dtype.is_floating_point else (0.0, 0.0)

    def against_interpreter(output: torch.Tensor) -> tuple[float, float]:
        return (0.0, 0.0) if name == "uniform" else against_eager(output)

    check_case(
        case,
        compiled,
        OTHER_INPUTS.get(name, []),
        tolerance=against_interpreter,
        eager_tolerance=against_eager,
        eager=name not in RANDOM,
        seed=1234,
    )


def test_half_copies_keep_bits(traced: dict[str, Case], compiled: dict[str, Any]) -> None:
    case = traced["half_copies"]
    got = run_compiled(case, compiled, case.args)
    want = case.fn(*case.args)
    for g, w in zip(got[:2], want[:2], strict=True):
        assert torch.equal(g.view(torch.int16), w.view(torch.int16))
    # computed (+ 0), or selected between masked loads (cat): NaN, not its bits (yet)
    assert got[2].isnan().sum() == 3 and got[3].isnan().sum() == 6


def test_random_numbers_look_random(traced: dict[str, Case], compiled: dict[str, Any]) -> None:
    x = torch.zeros(64, 33)  # the traced (static) shape: 2112 draws
    uniform = run_compiled(traced["uniform"], compiled, (x,), seed=7)[-1]
    assert 0.47 < uniform.mean().item() < 0.53 and uniform.min() >= 0 and uniform.max() < 1
    normal = run_compiled(traced["normal"], compiled, (x,), seed=7)[0] / 2
    assert abs(normal.mean().item()) < 0.07 and 0.94 < normal.std().item() < 1.06
    other_seed = run_compiled(traced["normal"], compiled, (x,), seed=8)[0]
    assert not torch.equal(normal * 2, other_seed)


def test_one_unit_per_graph_and_cache(traced: dict[str, Case], tmp_path: Path) -> None:
    kernels = traced["softmax"].kernels
    first = compile_cpp_kernels(kernels, cache_dir=tmp_path)
    again = compile_cpp_kernels(kernels, cache_dir=tmp_path)
    units = {k.unit.path for k in [*first.values(), *again.values()] if isinstance(k, CppKernel)}
    assert len(units) == 1
    (path,) = units
    assert path.exists() and path.with_suffix(".cpp").exists()
    assert next(iter(again.values())).unit.compile_seconds == 0.0  # type: ignore[attr-defined]
    assert not list((tmp_path / "cpp").glob("build-*")), "temporary build directories are removed"


def test_threads_follow_torch(traced: dict[str, Case], compiled: dict[str, Any]) -> None:
    case = traced["sum_axes"]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        run_compiled(case, compiled, case.args)
        kernel = compiled[case.kernels[0].name]
        assert kernel.unit.threads == 1
        assert kernel.unit.library.ember_get_max_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_each_python_thread_sets_its_own_count(
    traced: dict[str, Case], compiled: dict[str, Any]
) -> None:
    """OpenMP keeps a thread count per calling thread: a count set by the main thread
    does not spare another Python thread from setting its own before a launch."""
    import threading

    case = traced["sum_axes"]
    kernel = compiled[case.kernels[0].name]
    before = torch.get_num_threads()
    seen: list[int] = []

    def other() -> None:
        run_compiled(case, compiled, case.args)
        seen.append(kernel.unit.threads)

    try:
        torch.set_num_threads(1)
        run_compiled(case, compiled, case.args)
        assert kernel.unit.threads == 1
        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
        assert seen == [torch.get_num_threads()]  # set in that thread too, not skipped
        assert kernel.unit.threads == 1  # the main thread's own record is untouched
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc/self/maps")
def test_kernels_share_atens_openmp_runtime(
    traced: dict[str, Case], compiled: dict[str, Any]
) -> None:
    """One runtime, one pool: the kernels' library reads the thread count torch set,
    without ember setting it (two runtimes keep two counts)."""
    kernel = compiled[traced["sum_axes"].kernels[0].name]
    assert len(threads.openmp_runtimes()) == 1
    before = torch.get_num_threads()
    try:
        for count in (1, 3):
            torch.set_num_threads(count)
            assert kernel.unit.library.ember_get_max_threads() == count
    finally:
        torch.set_num_threads(before)


def test_wrong_argument_count(traced: dict[str, Case], compiled: dict[str, Any]) -> None:
    kernel = compiled[traced["pointwise"].kernels[0].name]
    with pytest.raises(TypeError, match="takes"):
        kernel(torch.zeros(1))


def test_missing_compiler_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    cpp_kernels.find_compiler.cache_clear()
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(cpp_kernels.shutil, "which", lambda name: None)
    try:
        with pytest.raises(CppCompileError, match="install"):
            cpp_kernels.find_compiler()
    finally:
        cpp_kernels.find_compiler.cache_clear()


def test_compiler_errors_are_reported(tmp_path: Path) -> None:
    from ember.codegen.cpp import CppSource

    with pytest.raises(CppCompileError, match="failed"):
        cpp_kernels.compile_cpp_source(CppSource("this is not C++", ()), cache_dir=tmp_path)
