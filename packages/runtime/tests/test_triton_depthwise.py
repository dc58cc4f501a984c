"""Triton kernels of depthwise convolutions (forward, and the backward under every
`output_mask`; cases: depthwise_cases) against the IR interpreter and eager.

On the CPU they run in Triton's interpreter, in subprocesses (`TRITON_INTERPRET=1`
must be set before Triton is imported and must not leak into other tests), which
print one JSON line per case; `cuda` tests run every case on a GPU.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from depthwise_cases import CASES, tolerance
from test_triton_kernels import _same_layout
from triton_harness import interpret, lower_for_triton, report, run_with_triton

from ember.ir import run_program


def _leaves(tree: Any) -> list[Any]:
    if isinstance(tree, (list, tuple)):
        return [leaf for item in tree for leaf in _leaves(item)]
    return [tree]


def run_case(name: str, device: str) -> dict[str, Any]:
    fn, make_args = CASES[name]
    args = make_args(device)
    program, schedule = lower_for_triton(fn, [a.cpu() for a in args], False)
    calls = [str(n.op) for n in program.extern_kernels() if "convolution" in str(n.op)]
    assert calls == [], calls
    with tempfile.TemporaryDirectory() as cache:
        actual, kinds = run_with_triton(
            program, schedule, [_same_layout(a) for a in args], seed=0, cache_dir=Path(cache)
        )
    actual = _leaves(actual)
    reference = _leaves(run_program(program, [_same_layout(a.cpu()) for a in args], seed=0))
    expected = _leaves(fn(*[_same_layout(a).cpu() for a in args]))
    for a, r, e in zip(actual, reference, expected, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape, (a.dtype, e.dtype, a.shape, e.shape)
        rtol, atol = tolerance(e)
        # the same float32 sums; bfloat16 results may round apart (Triton's
        # interpreter emulates bfloat16 through numpy)
        close = (rtol, atol) if e.dtype == torch.bfloat16 else (1e-5, 1e-5)
        torch.testing.assert_close(a.cpu(), r, rtol=close[0], atol=close[1])
        torch.testing.assert_close(a.cpu(), e, rtol=rtol, atol=atol)
    return {"case": name, "ok": True, "kinds": kinds}


@pytest.fixture(scope="module")
def interpreted() -> dict[str, dict[str, Any]]:
    return interpret(__file__, list(CASES), workers=2, timeout=900)


@pytest.mark.parametrize("case", list(CASES))
def test_depthwise_kernel_in_interpreter(case: str, interpreted: dict[str, dict[str, Any]]) -> None:
    record = interpreted.get(case)
    assert record is not None, f"case {case} did not report"
    assert record["ok"], record.get("error")


@pytest.mark.cuda
@pytest.mark.parametrize("case", list(CASES))
def test_depthwise_kernel_on_gpu(case: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    assert run_case(case, "cuda")["ok"]


if __name__ == "__main__":
    report(run_case, sys.argv[1:])
