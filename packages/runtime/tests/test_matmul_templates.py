"""Matmul templates with fused epilogues (ember.codegen.triton.gemm), run and compared
with eager and with the IR interpreter.

On the CPU the kernels run in Triton's interpreter, one subprocess for the module
(triton_harness); the `cuda` tests run the same cases on a GPU, then a compiled MLP
end to end under EMBER_MATMUL_TEMPLATES=on, counting the template's launches.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_triton_kernels import _same_layout
from triton_harness import interpret, lower_for_triton, report, run_with_triton

from ember.codegen.triton import TRITON_CHOICES
from ember.ir import run_program

TEMPLATES = dataclasses.replace(TRITON_CHOICES, matmul_epilogues=True)

Case = tuple[Callable[..., Any], Callable[[str], list[Any]], dict[str, Any]]


def _randn(*shapes: Any, dtype: torch.dtype = torch.float32) -> Callable[[str], list[Any]]:
    """Inputs of `shapes`; a shape given as ('t', rows, cols) is a transposed
    [cols, rows] tensor (a Linear's weight read as w.t())."""

    def make(device: str) -> list[Any]:
        g = torch.Generator().manual_seed(0)
        made = []
        for shape in shapes:
            if shape[0] == "t":
                made.append(torch.randn(shape[2], shape[1], generator=g).t())
            else:
                made.append(torch.randn(shape, generator=g))
        return [t.to(dtype).to(device) for t in made]

    return make


def _linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, w, b))


def _mlp_block(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> Any:
    return F.gelu(F.linear(x, w, b), approximate="tanh") + r


def _mm_scale_residual(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor) -> Any:
    return (x @ w) * 0.5 + r


def _mm_kept(x: torch.Tensor, w: torch.Tensor) -> Any:
    y = x @ w
    return torch.tanh(y), y  # the product is an output too: stored as well


def _bmm_relu_cast(a: torch.Tensor, b: torch.Tensor) -> Any:
    return torch.relu(torch.bmm(a, b)).to(torch.bfloat16)


def _linear_relu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
    return torch.relu(F.linear(x, w, b))


def _linear_silu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
    return F.silu(F.linear(x, w, b))


BF16 = {"atol": 2e-2, "rtol": 2e-2}
CASES: dict[str, Case] = {
    "linear_gelu_fp32": (_linear_gelu, _randn((37, 53), (29, 53), (29,)), {"atol": 1e-4}),
    "linear_gelu_bf16": (
        _linear_gelu,
        _randn((37, 53), (29, 53), (29,), dtype=torch.bfloat16),
        BF16,
    ),
    "mlp_block_fp16": (
        _mlp_block,
        _randn((37, 53), (29, 53), (29,), (37, 29), dtype=torch.float16),
        {"atol": 5e-3, "rtol": 5e-3},
    ),
    "mm_transposed_weight": (
        _mm_scale_residual,
        _randn((37, 53), ("t", 53, 29), (37, 29)),
        {"atol": 1e-4},
    ),
    # K = 64: every config's RBLOCK divides it, so the K loop runs without a K mask
    "linear_relu_even_k": (_linear_relu, _randn((40, 64), (48, 64), (48,)), {"atol": 1e-4}),
    # M, N and K divide every config's blocks: no mask in the K loop at all
    "linear_relu_even_all": (_linear_relu, _randn((64, 64), (32, 64), (32,)), {"atol": 1e-4}),
    "mm_product_kept": (_mm_kept, _randn((37, 53), (53, 29)), {"atol": 1e-4}),
    "bmm_relu_cast": (_bmm_relu_cast, _randn((3, 37, 53), (3, 53, 29)), BF16),
    "linear_silu_dynamic": (
        _linear_silu,
        _randn((37, 53), (29, 53), (29,)),
        {"atol": 1e-4, "dynamic": True, "resize": _randn((21, 53), (29, 53), (29,))},
    ),
}


def run_case(name: str, device: str) -> dict[str, Any]:
    fn, make_args, options = CASES[name]
    args = make_args(device)
    atol, rtol = options.get("atol", 1e-5), options.get("rtol", 1e-4)
    program, schedule = lower_for_triton(
        fn, [a.cpu() for a in args], options.get("dynamic", False), TEMPLATES
    )
    runs = [args] + ([options["resize"](device)] if "resize" in options else [])
    with tempfile.TemporaryDirectory() as cache:
        for run_args in runs:
            actual, kinds = run_with_triton(
                program,
                schedule,
                [_same_layout(a) for a in run_args],
                seed=0,
                cache_dir=Path(cache),
            )
            expected = fn(*[_same_layout(a) for a in run_args])
            expected = list(expected) if isinstance(expected, tuple) else [expected]
            reference = run_program(program, [_same_layout(a.cpu()) for a in run_args])
            for got, want, ref in zip(actual, expected, reference, strict=True):
                assert got.dtype == want.dtype, (got.dtype, want.dtype)
                torch.testing.assert_close(got.cpu(), want.cpu(), atol=atol, rtol=rtol)
                torch.testing.assert_close(got.cpu(), ref.cpu(), atol=atol, rtol=rtol)
    externs = [s.node.op.__name__ for s in schedule.steps if hasattr(s, "node")]
    return {"case": name, "ok": True, "kinds": kinds, "externs": externs}


# -- CPU: the interpreter, in a subprocess ----------------------------------------------


@pytest.fixture(scope="module")
def interpreter_results() -> dict[str, dict[str, Any]]:
    return interpret(__file__, list(CASES), workers=2)


@pytest.mark.parametrize("case", list(CASES))
def test_template_in_interpreter(case: str, interpreter_results: dict[str, dict[str, Any]]) -> None:
    record = interpreter_results.get(case)
    assert record is not None, f"case {case} did not report"
    assert record["ok"], record.get("error")
    assert "gemm" in record["kinds"], record["kinds"]  # the template ran, not ATen
    assert not any(op.split(".")[0] in ("mm", "addmm", "bmm") for op in record["externs"])


# -- CUDA -------------------------------------------------------------------------------


def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.cuda
@pytest.mark.parametrize("case", list(CASES))
def test_template_on_gpu(case: str) -> None:
    _needs_cuda()
    record = run_case(case, "cuda")
    assert "gemm" in record["kinds"]


class _MLP(torch.nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


def _template_launches(call: Callable[[], Any]) -> tuple[int, list[str]]:
    """Launches of ember's matmul template kernels (`mm_...`, from the scheduler's
    `k<n>_mm_...` names) in one profiled call, and every kernel name seen."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(1 for n in names if n.startswith("mm_")), names


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_mlp_uses_the_template(dtype: torch.dtype) -> None:
    _needs_cuda()
    import torch._dynamo

    from ember.runtime.accuracy import compare_outputs
    from ember.runtime.config import config
    from ember.runtime.testing import no_eager_fallback

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _MLP(256, 1024).cuda().to(dtype).eval()
    x = torch.randn(8, 77, 256, device="cuda", dtype=dtype)
    with torch.no_grad():
        expected = model(x)
        with (
            config.scope(matmul_templates="on", cudagraphs="off", compile_cache=False),
            no_eager_fallback() as records,
        ):
            compiled = torch.compile(model, backend="ember")
            actual = compiled(x)
            launches, names = _template_launches(lambda: compiled(x))
    assert compare_outputs(actual, expected) is None, compare_outputs(actual, expected)
    kernels = {n for r in records if r.artifact for n in r.artifact.launchers}
    assert sum(1 for n in kernels if "_mm_" in n) == 2, kernels  # both Linears, fused
    assert launches == 2, names  # and both launched


@pytest.mark.cuda
def test_templates_off_keeps_cublas() -> None:
    _needs_cuda()
    import torch._dynamo

    from ember.runtime.config import config

    torch._dynamo.reset()
    model = _MLP(128, 256).cuda().eval()
    x = torch.randn(64, 128, device="cuda")
    with torch.no_grad(), config.scope(matmul_templates="off", compile_cache=False):
        compiled = torch.compile(model, backend="ember")
        compiled(x)
        launches, names = _template_launches(lambda: compiled(x))
    assert launches == 0, names


def _interpreter_bfloat16_dot() -> None:
    """Triton's interpreter (3.6 to 3.9) hands `tl.dot` bfloat16 blocks to numpy as
    their raw uint16 bits and multiplies those; a GPU multiplies the values. For this
    test process only, its dot widens bfloat16 blocks to float32 first (exact)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_dot

    def widened(handle: Any) -> Any:
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        bits = handle.data.astype(np.uint32) << np.uint32(16)
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def create_dot(self: Any, a: Any, b: Any, *rest: Any) -> Any:
        return original(self, widened(a), widened(b), *rest)

    interpreter.InterpreterBuilder.create_dot = create_dot  # type: ignore[method-assign]


if __name__ == "__main__":
    _interpreter_bfloat16_dot()
    report(run_case, sys.argv[1:])
