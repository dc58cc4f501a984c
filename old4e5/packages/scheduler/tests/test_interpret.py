"""Fused schedules compute what the unfused program computes (run by the oracle)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from ember.ir import Program, run_program
from ember.scheduler import run_schedule, schedule_program


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b)


def attention_scores(q: torch.Tensor, k: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return torch.softmax((q @ k.transpose(-1, -2)) * 0.125 + m, -1)


def residual_rms(
    x: torch.Tensor, r: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    h = x + r
    return h, h * torch.rsqrt(h.square().mean(-1, keepdim=True) + 1e-6) * w


def mixed(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = torch.tanh(x @ w)
    return y.sum(0), y.amax(1), torch.var_mean(y, -1), y.t().contiguous() * 2, y.argmax(-1)


CASES: dict[str, tuple[Callable[..., Any], list[torch.Tensor]]] = {
    "softmax": (lambda x: torch.softmax(x, -1), [torch.randn(6, 33)]),
    "layer_norm": (layer_norm, [torch.randn(4, 5, 16), torch.randn(16), torch.randn(16)]),
    "attention_scores": (
        attention_scores,
        [torch.randn(2, 8, 16), torch.randn(2, 8, 16), torch.randn(8, 8)],
    ),
    "residual_rms": (residual_rms, [torch.randn(7, 24), torch.randn(7, 24), torch.randn(24)]),
    "mixed": (mixed, [torch.randn(9, 12), torch.randn(12, 10)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_schedule_matches_unfused_program_and_eager(
    case: str, lower: Callable[..., Program]
) -> None:
    fn, args = CASES[case]
    program = lower(fn, *args)
    expected = run_program(program, [a.clone() for a in args])
    actual = run_schedule(schedule_program(program), [a.clone() for a in args])
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(flatten(actual), flatten(fn(*args)), rtol=1e-4, atol=1e-5)


def flatten(value: Any) -> list[torch.Tensor]:
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in flatten(item)]
    return [value]
