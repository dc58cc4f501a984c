"""CPU matmul kernels (ember.codegen.cpp.matmul_loops) against eager: products blocked
over the threads with their epilogues, in every operand layout a training graph holds,
batched, with dynamic sizes, and through the portable loop where no BLAS is given;
the kernels' wrappers call no ATen matmul."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from ember.runtime import config, cpp_kernels
from ember.runtime.blas import sgemm_pointer
from ember.runtime.compiler import CompileRecord
from ember.runtime.models import MLP
from ember.runtime.testing import no_eager_fallback

pytestmark = pytest.mark.skipif(sgemm_pointer() is None, reason="torch exports no sgemm_")


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def matmul_kernels(records: list[CompileRecord]) -> list[str]:
    names: list[str] = []
    for record in records:
        assert record.wrapper_path is not None
        source = record.wrapper_path.read_text()
        assert "aten_addmm" not in source and "aten_bmm" not in source
        names += re.findall(r"^(k\d+_mm\w*) = None", source, re.MULTILINE)
    return names


def check(fn: Callable[..., torch.Tensor], *args: torch.Tensor, **options: Any) -> list[str]:
    with torch.no_grad(), no_eager_fallback() as records:
        out = torch.compile(fn, backend="ember", **options)(*args)
        torch.testing.assert_close(out, fn(*args), rtol=1e-4, atol=1e-5)
    return matmul_kernels(records)


def test_linear_bias_and_silu_run_in_one_kernel() -> None:
    x, w, b = torch.randn(64, 256), torch.randn(512, 256) / 16, torch.randn(512)
    assert len(check(lambda x, w, b: F.silu(F.linear(x, w, b)), x, w, b)) == 1


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_every_operand_layout(layout: str) -> None:
    a = torch.randn(48, 40) if layout[0] == "n" else torch.randn(40, 48).t()
    b = torch.randn(40, 72) if layout[1] == "n" else torch.randn(72, 40).t()
    r = torch.randn(48, 72)
    assert len(check(lambda a, b, r: torch.relu(a @ b) + r, a, b, r)) == 1


def test_strides_no_blas_takes_run_the_portable_loop() -> None:
    a = torch.randn(40, 96)[:, ::2]  # no unit stride in either dimension
    b = torch.randn(48, 160)[:, ::2]
    assert len(check(lambda a, b: torch.tanh(a @ b), a, b)) == 1


def test_a_batched_product_and_its_epilogue() -> None:
    q, k = torch.randn(6, 32, 16), torch.randn(6, 16, 32)
    assert len(check(lambda q, k: (q @ k) / 4.0, q, k)) == 1


def test_dynamic_sizes() -> None:
    fn = torch.compile(lambda x, w, b: F.gelu(F.linear(x, w, b)), backend="ember", dynamic=True)
    w, b = torch.randn(96, 64), torch.randn(96)
    with torch.no_grad():
        for rows in (33, 70, 129):
            x = torch.randn(rows, 64)
            torch.testing.assert_close(fn(x, w, b), F.gelu(F.linear(x, w, b)), rtol=1e-4, atol=1e-5)


def test_without_blas_the_kernels_compute_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpp_kernels, "sgemm_pointer", lambda: None)
    x, w, b = torch.randn(64, 80), torch.randn(96, 80), torch.randn(96)
    try:
        assert len(check(lambda x, w, b: F.silu(F.linear(x, w, b)) * 2, x, w, b)) == 1
    finally:
        monkeypatch.undo()
        check(lambda x, w, b: F.silu(F.linear(x, w, b)) * 2, x, w, b)  # the pointer back


@pytest.mark.parametrize("setting", ["on", "auto"])
def test_mlp_training_matches_eager(setting: str) -> None:
    """Kernels in the training graphs under 'on'; under 'auto' the CPU keeps ATen's
    matmuls in training graphs (measured slower there: ember.runtime.kernels)."""
    torch.manual_seed(0)
    model, twin = MLP(64, 128, 16), MLP(64, 128, 16)
    twin.load_state_dict(model.state_dict())
    x = torch.randn(32, 64)
    with config.scope(matmul_templates=setting), no_eager_fallback() as records:
        torch.compile(twin, backend="ember")(x).square().mean().backward()
    model(x).square().mean().backward()
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)
    if setting == "on":
        assert len(matmul_kernels(records)) >= 3
    else:
        sources = [r.wrapper_path.read_text() for r in records if r.wrapper_path is not None]
        assert len(sources) == 2 and all("aten_addmm" in s or "aten_mm" in s for s in sources)
