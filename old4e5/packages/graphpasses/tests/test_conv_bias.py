"""convolution_bias_epilogue: a convolution's bias becomes a graph add (which ember
fuses into the convolution's consumer), with the same values and strides.

The pass acts on CUDA graphs by default; here it is pointed at the CPU so that the
rewritten graphs can be run and compared with the originals."""

from __future__ import annotations

import torch
from graphpasses_helpers import aot_capture, count  # type: ignore[import-not-found]  # tests/ on sys.path
from torch import nn

from ember.graphpasses import channels_last_convolutions, convolution_bias_epilogue

aten = torch.ops.aten
ON_CPU = convolution_bias_epilogue(devices=("cpu",))


def _run(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    out = gm(*[x.clone() for x in inputs])
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _biased(gm: torch.fx.GraphModule) -> int:
    return sum(
        1
        for node in gm.graph.nodes
        if node.target is aten.convolution.default and node.args[2] is not None
    )


def test_biases_move_into_adds_with_the_same_results() -> None:
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, groups=8),
        nn.Conv2d(8, 4, 1, bias=False),
    ).eval()
    captured = aot_capture(model, torch.randn(2, 3, 10, 10))
    gm = captured.graph("inference")
    before = _run(gm, captured.inputs["inference"])
    assert _biased(gm) == 2
    result = ON_CPU(gm)
    assert result.changed and result.stats == {"moved": 2}
    assert _biased(gm) == 0 and count(gm, aten.add.Tensor) == 2
    after = _run(gm, captured.inputs["inference"])
    torch.testing.assert_close(after[0], before[0], rtol=1e-5, atol=1e-6)
    assert after[0].stride() == before[0].stride()


def test_channels_last_layout_and_cuda_default_are_kept() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.GELU()).eval()
    captured = aot_capture(model, torch.randn(2, 3, 9, 9))
    gm = captured.graph("inference")
    before = _run(gm, captured.inputs["inference"])
    assert not convolution_bias_epilogue()(gm).changed  # CUDA only by default
    assert channels_last_convolutions(devices=("cpu",))(gm).changed
    assert ON_CPU(gm).changed
    (add,) = [n for n in gm.graph.nodes if n.target is aten.add.Tensor]
    assert add.meta["val"].is_contiguous(memory_format=torch.channels_last)
    after = _run(gm, captured.inputs["inference"])
    torch.testing.assert_close(after[0], before[0], rtol=1e-5, atol=1e-6)
    assert after[0].stride() == before[0].stride()
