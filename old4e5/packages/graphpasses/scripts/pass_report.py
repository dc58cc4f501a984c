"""Print the default pipeline's per-pass report and pattern fires on the test models.

Usage (from the repository root): uv run python packages/graphpasses/scripts/pass_report.py
The models are the end-to-end test models in packages/graphpasses/tests/graphpasses_helpers.py.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from graphpasses_helpers import MLP, SmallCNN, TransformerBlock, aot_capture

from ember.graphpasses import default_pipeline
from ember.graphpasses.patterns import DEFAULT_PATTERNS


class GPT2MLP(torch.nn.Module):
    """GPT-2's MLP: hand-written tanh GELU and `x @ W + b` linears on 2-D input."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(d, 4 * d) / d)
        self.b1 = torch.nn.Parameter(torch.zeros(4 * d))
        self.w2 = torch.nn.Parameter(torch.randn(4 * d, d) / d)
        self.b2 = torch.nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.w1 + self.b1
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3.0)))
        return h @ self.w2 + self.b2


def main() -> None:
    start = time.perf_counter()
    for pattern in DEFAULT_PATTERNS:
        _ = pattern.graph  # trace once, outside the timings
    print(f"tracing {len(DEFAULT_PATTERNS)} patterns: {time.perf_counter() - start:.2f} s\n")
    models = [
        ("transformer block", TransformerBlock(), (2, 16, 32)),
        ("mlp", MLP(), (8, 16)),
        ("cnn+batchnorm", SmallCNN(), (2, 3, 16, 16)),
        ("gpt2 mlp", GPT2MLP(), (8, 32)),
    ]
    for name, model, shape in models:
        for train in (False, True):
            captured = aot_capture(model.train(train), torch.randn(shape), train=train)
            for kind in captured.graphs:
                _gm, report = default_pipeline().run(captured.graph(kind))
                fired = {k: v for k, v in report.stats("pattern_rewrite").items() if v}
                print(f"== {name} / {kind}: fired {fired or 'nothing'}")
                print(report.format())


if __name__ == "__main__":
    main()
