"""Activations through the whole stack on the CPU: torch.compile(backend="ember") of
GELU (erf and tanh forms), SiLU, sigmoid, tanh, erf, exp, softmax and log_softmax
against eager, under ember's accuracy rule (ember.runtime.accuracy) with a float64
reference, forward and backward. Strict settings, and `no_eager_fallback`: a graph
that ran eagerly, or whose kernels ran as ATen ops, fails the test instead of passing
with eager's own numbers. The inputs hold the values the prelude's float math treats
apart: NaN, infinities, signed zeros, subnormals, overflow and underflow of exp, the
branch points of erf and tanh; sizes leave a remainder after whole vectors."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from ember.runtime import config
from ember.runtime.accuracy import compare
from ember.runtime.testing import no_eager_fallback

Activation = Callable[[torch.Tensor], torch.Tensor]
POINTWISE: dict[str, Activation] = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "erf": torch.erf,
    "exp": torch.exp,
}
ROWS: dict[str, Activation] = {
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
}
SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-39, -1e-39, 88.72, 88.73]
SPECIAL += [-87.3, -103.9, -104.0, 200.0, -200.0, 0.96875, -0.96875, 0.625, -0.625, 4.0, 9.5]
SPECIAL += [0.6875, -0.6875, 1.3693064, 0.78, 17.3, -17.3, 1e30, -1e30]


def pointwise_input() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(37, 129, generator=g) * 4
    x.view(-1)[: len(SPECIAL)] = torch.tensor(SPECIAL)
    x.view(-1)[len(SPECIAL) : 2 * len(SPECIAL)] = -torch.tensor(SPECIAL)
    return x


def row_input() -> torch.Tensor:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(23, 300, generator=g) * 5
    x[0, :7] = -math.inf  # masked positions, as attention's
    x[1, 3] = 95.0  # exp would overflow without the max subtracted
    x[2] = -1e30  # a constant row
    x[3, ::2] = 1e-45
    return x


def check(fn: Activation, x: torch.Tensor, *, train: bool) -> None:
    compiled = torch.compile(fn, backend="ember")
    with config.scope(strict=True, fallback=False), no_eager_fallback() as graphs:
        if train:
            mine = x.clone().requires_grad_()
            out = compiled(mine)
            weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
            (out * weight).sum().backward()
        else:
            with torch.no_grad():
                out = compiled(x)
    expected = fn(x)
    reference = fn(x.double()).float()
    # eager's float32 GELU is NaN at +inf (float64's, and ember's, is inf): there, the
    # float64 result is the one to match
    quirk = expected.isnan() & ~reference.isnan()
    assert not quirk.any() or (fn is F.gelu and bool((x[quirk] == math.inf).all())), x[quirk]
    expected = torch.where(quirk, reference.to(expected.dtype), expected)
    verdict = compare(out.detach(), expected, reference=reference)
    assert verdict.ok, verdict.describe()
    if train:
        theirs = x.clone().requires_grad_()
        (fn(theirs) * weight).sum().backward()
        ours_ref = x.double().requires_grad_()
        (fn(ours_ref) * weight.double()).sum().backward()
        assert mine.grad is not None and theirs.grad is not None and ours_ref.grad is not None
        verdict = compare(mine.grad, theirs.grad, reference=ours_ref.grad.float())
        assert verdict.ok, f"gradient: {verdict.describe()}"
        assert any(g.graph.startswith("backward") for g in graphs)


@pytest.mark.parametrize("name", list(POINTWISE))
def test_pointwise_inference_with_special_values(name: str) -> None:
    check(POINTWISE[name], pointwise_input(), train=False)


@pytest.mark.parametrize("name", list(ROWS))
def test_row_inference(name: str) -> None:
    check(ROWS[name], row_input(), train=False)


@pytest.mark.parametrize("name", [*POINTWISE, *ROWS])
def test_training(name: str) -> None:
    fn = {**POINTWISE, **ROWS}[name]
    g = torch.Generator().manual_seed(4)
    x = torch.randn(19, 133, generator=g) * 3
    x[0, :8] = torch.tensor([30.0, -30.0, 0.0, -0.0, 1e-40, -87.5, 12.0, -12.0])
    check(fn, x, train=True)


@pytest.mark.parametrize("name", ["gelu", "silu", "softmax"])
def test_bfloat16_inference(name: str) -> None:
    """Half types compute in float: the same functions, then rounded to bfloat16."""
    fn = {**POINTWISE, **ROWS}[name]
    x = (pointwise_input() if name in POINTWISE else row_input()).to(torch.bfloat16)
    check(fn, x, train=False)
