"""The prelude's vectorised float math (ember::exp, erf, tanh, and sigmoid through
exp) against torch, in ulps of the float32 result, over wide ranges: every exponent
from subnormals to overflow, the branch boundaries, NaN, infinities, signed zeros."""

from __future__ import annotations

import pytest
import sympy
import torch

from ember.ir import Layout, Load, Op
from ember.ir.symbolic import index_var
from ember.runtime.cpp_kernels import compile_cpp_kernels
from ember.scheduler import POINTWISE, FusedKernel, KernelMember

OPS = ("exp", "erf", "tanh", "sigmoid")
# ulps from the float64 result; torch's own float32 kernels are within 1
MAX_ULPS = {"exp": 1.5, "erf": 2.0, "tanh": 2.0, "sigmoid": 2.5}
SPECIAL = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, -1e-45, 1e-40]
SPECIAL += [1.17e-38, 88.72, 88.73, 89.0, -87.3, -103.0, -103.9, -104.0, -150.0, 3.92, 4.0]
SPECIAL += [0.921875, 0.92187494, -0.921875, 0.625, 0.62499994, 9.5, 10.0, 1e30, -1e30]


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
    torch.testing.assert_close(got, getattr(torch, op)(x), equal_nan=True, rtol=2e-6, atol=1e-6)
