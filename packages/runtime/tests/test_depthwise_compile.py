"""A training step through torch.compile(backend="ember") with depthwise convolutions,
under EMBER_STRICT with fallbacks off: the loss and every gradient match eager's, and
EMBER_DEPTHWISE decides whether the depthwise convolution and its backward run as
generated kernels ('loops': no ATen call left for them) or as ATen calls ('aten'),
while the 1x1 convolution beside it stays an ATen call either way."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest
import torch
import torch._dynamo
from torch import nn

from ember.runtime import config

aten = torch.ops.aten


def _convolutions(fn: Any) -> Counter[str]:
    """How many times `fn()` runs each ATen convolution op (by the profiler: a
    dispatch mode would make Dynamo trace the mode instead of running the compiled
    graph)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    names = ("aten::convolution", "aten::convolution_backward")
    return Counter(e.name for e in prof.events() if e.name in names)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8, bias=True),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 4, 1),
    )


def _step(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    loss = model(x).square().mean()
    loss.backward()
    return loss.detach()


@pytest.mark.parametrize("setting", ["loops", "aten"])
def test_training_step_matches_eager(setting: str) -> None:
    torch._dynamo.reset()
    x = torch.randn(2, 8, 11, 13)
    eager = _model()
    compiled_model = copy.deepcopy(eager)
    want = _step(eager, x)
    with config.scope(strict=True, fallback=False, depthwise=setting):
        compiled = torch.compile(compiled_model, backend="ember")
        _step(compiled, x)  # compiles
        compiled_model.zero_grad()
        got = torch.zeros(())

        def step() -> None:
            got.copy_(_step(compiled, x))

        calls = _convolutions(step)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(compiled_model.named_parameters(), eager.parameters(), strict=True):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    # the 1x1 convolution is an ATen call either way; the depthwise one only under 'aten'
    each = 1 if setting == "loops" else 2
    assert calls == {"aten::convolution": each, "aten::convolution_backward": each}, calls
