"""The tanh approximation of GELU written out by hand -> `aten.gelu(approximate="tanh")`.

GPT-2-style models spell GELU as `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 *
x^3)))`: eight pointwise ops in the graph where ATen has one op with the same formula.
One op is simpler for the IR to lower and for its autograd (the decomposed form saves
several intermediates for backward).
"""

from __future__ import annotations

import math

import torch

from ember.graphpasses.matcher import Match
from ember.graphpasses.pattern import Pattern

aten = torch.ops.aten


def _gelu_tanh_search(x: torch.Tensor) -> torch.Tensor:
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
    return 0.5 * x * (1.0 + torch.tanh(inner))


def _check(match: Match) -> bool:
    return match.value("x").is_floating_point()


GELU_PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        name="gelu_tanh",
        search=_gelu_tanh_search,
        replace=lambda x: aten.gelu.default(x, approximate="tanh"),
        inputs=("x",),
        example_inputs=lambda: [torch.randn(3, 4)],
        check=_check,
        description="hand-written tanh GELU -> aten.gelu(approximate='tanh')",
        requires=frozenset({aten.tanh.default}),
    ),
)
