"""`ember explain DIR --plot PATH`: the chart of each graph's kernels and ATen calls
(needs the bench group's matplotlib, as `ember bench --plot`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from ember.runtime import config
from ember.runtime.cli import main
from ember.runtime.explain import explain, plot_explanations
from ember.runtime.profiling import write_profiles

pytest.importorskip("matplotlib", reason="--plot needs matplotlib (the bench group)")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def aten_matmuls() -> Iterator[None]:
    """One known schedule (an ATen addmm between two kernels), not a per-machine
    choice of oneDNN's linear."""
    with config.scope(cpu_gemm="aten"):
        yield


class NormLinearGelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.linear = nn.Linear(32, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.linear(self.norm(x))).sum(-1)


def _debug_dir(tmp_path: Path, *, profile: bool) -> Path:
    debug = tmp_path / ("profiled" if profile else "plain")
    model, x = NormLinearGelu().eval(), torch.randn(16, 32)
    with config.scope(debug_dir=debug, profile=profile), torch.no_grad():
        compiled = torch.compile(model, backend="ember")
        for _ in range(4 if profile else 1):
            compiled(x)
    write_profiles()
    return debug


def test_explain_plot_writes_a_png_of_the_floor_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    debug, chart = _debug_dir(tmp_path, profile=False), tmp_path / "charts" / "explain.png"
    assert main(["explain", str(debug), "--plot", str(chart)]) == 0
    assert f"chart: {chart}" in capsys.readouterr().out
    data = chart.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 1000


def test_explain_plot_of_a_profiled_graph_shows_times_and_roofs(tmp_path: Path) -> None:
    explanations = explain(_debug_dir(tmp_path, profile=True))
    (graph,) = explanations
    assert any(r.roof is not None for r in graph.rows)  # something to annotate
    chart = plot_explanations(explanations, tmp_path / "profiled.png")
    assert chart.read_bytes().startswith(PNG_SIGNATURE)
