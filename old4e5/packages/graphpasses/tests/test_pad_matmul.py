"""pad_matmul: unaligned low-precision products are padded to multiples of 8 and the
results sliced back, with the same values and the same output layout.

The pass acts on CUDA graphs by default; here it is pointed at the CPU (and its size
threshold lowered) so the rewritten graphs can be run and compared with the originals.
"""

from __future__ import annotations

import torch
from graphpasses_helpers import aot_capture, count  # type: ignore[import-not-found]  # tests/ on sys.path
from torch import nn

from ember.graphpasses import pad_matmul

aten = torch.ops.aten
ON_CPU = pad_matmul(devices=("cpu",), min_flops=0)


def _unaligned_products(gm: torch.fx.GraphModule) -> int:
    found = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (aten.mm.default, aten.addmm.default):
            a, b = node.args[-2].meta["val"], node.args[-1].meta["val"]
            found += any(s % 8 for s in (*a.shape, b.shape[-1]))
    return found


def _run(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    out = gm(*[x.clone() for x in inputs])
    return list(out) if isinstance(out, (tuple, list)) else [out]


def test_lm_head_is_padded_and_equal() -> None:
    head = nn.Linear(72, 1001, bias=True).to(torch.bfloat16)  # GPT-2-like odd vocabulary
    x = torch.randn(4, 30, 72, dtype=torch.bfloat16)  # M = 120 (aligned), N = 1001
    captured = aot_capture(head, x)
    gm = captured.graph("inference")
    before = _run(gm, captured.inputs["inference"])
    assert _unaligned_products(gm) == 1
    result = ON_CPU(gm)
    assert result.changed and result.stats == {"padded": 1}
    assert _unaligned_products(gm) == 0
    assert count(gm, aten.constant_pad_nd.default) >= 1
    after = _run(gm, captured.inputs["inference"])
    for a, b in zip(after, before, strict=True):
        assert a.stride() == b.stride()
        torch.testing.assert_close(a, b, rtol=1.6e-2, atol=1e-2)


def test_backward_products_with_odd_m_and_k_are_padded() -> None:
    head = nn.Linear(72, 1001, bias=False).to(torch.bfloat16)
    x = torch.randn(2, 57, 72, dtype=torch.bfloat16, requires_grad=True)  # M = 114
    captured = aot_capture(head, x, train=True)
    gm = captured.graph("backward")
    before = _run(gm, captured.inputs["backward"])
    assert _unaligned_products(gm) >= 1
    assert ON_CPU(gm).changed
    assert _unaligned_products(gm) == 0
    after = _run(gm, captured.inputs["backward"])
    for a, b in zip(after, before, strict=True):
        if isinstance(b, torch.Tensor):
            assert a.shape == b.shape and a.stride() == b.stride()
            torch.testing.assert_close(a, b, rtol=1.6e-2, atol=2e-2)


def test_leaves_cpu_float32_and_small_products_alone() -> None:
    head = nn.Linear(72, 1001).to(torch.bfloat16)
    captured = aot_capture(head, torch.randn(4, 30, 72, dtype=torch.bfloat16))
    assert not pad_matmul()(captured.graph("inference")).changed  # CUDA only by default
    small = pad_matmul(devices=("cpu",))(captured.graph("inference"))
    assert not small.changed  # 17 MFLOP is far below the default threshold
    fp32 = aot_capture(nn.Linear(72, 1001), torch.randn(4, 30, 72))
    assert not ON_CPU(fp32.graph("inference")).changed  # float32 products are not padded
