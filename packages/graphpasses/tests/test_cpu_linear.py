"""cpu_linear: CPU matmuls become oneDNN linears, with the bias and an activation that
only the matmul reads applied in the output pass; values stay within float32 rounding
of eager's (the accuracy rule's float32 tolerance: rtol 1e-4, atol 1e-5)."""

from __future__ import annotations

import pytest
import torch
from graphpasses_helpers import aot_capture, count  # type: ignore[import-not-found]  # tests/ on sys.path
from torch import nn

from ember.graphpasses import LinearCase, cpu_linear, default_pipeline, linear_op

aten = torch.ops.aten
pytestmark = pytest.mark.skipif(linear_op() is None, reason="torch built without oneDNN")
ALWAYS = cpu_linear(lambda case: True)


def _linears(gm: torch.fx.GraphModule) -> list[tuple[str, str]]:
    """(post-op, algorithm) of each oneDNN linear in the graph."""
    op = linear_op()
    return [(n.args[3], n.args[5]) for n in gm.graph.nodes if n.target is op]


def _run(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    out = gm(*[x.clone() for x in inputs])
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _close(after: list[torch.Tensor], before: list[torch.Tensor]) -> None:
    assert len(after) == len(before)
    for a, b in zip(after, before, strict=True):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
            assert a.stride() == b.stride()


class Block(nn.Module):
    def __init__(self, activation: nn.Module) -> None:
        super().__init__()
        self.up, self.act, self.down = nn.Linear(48, 96), activation, nn.Linear(96, 40)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(self.act(self.up(x)))
        return out


@pytest.mark.parametrize(
    ("activation", "post_op"),
    [
        (nn.SiLU(), ("swish", "")),
        (nn.ReLU(), ("relu", "")),
        (nn.GELU(), ("gelu", "none")),
        (nn.GELU(approximate="tanh"), ("gelu", "tanh")),
        (nn.Tanh(), ("tanh", "")),
        (nn.Sigmoid(), ("sigmoid", "")),
    ],
)
def test_inference_fuses_bias_and_activation(
    activation: nn.Module, post_op: tuple[str, str]
) -> None:
    torch.manual_seed(0)
    captured = aot_capture(Block(activation).eval(), torch.randn(3, 5, 48) * 2)
    gm = captured.graph("inference")
    before = _run(gm, captured.inputs["inference"])
    assert count(gm, aten.addmm.default) == 2
    result = ALWAYS(gm)
    assert result.changed and result.stats == {"linears": 2, "post_ops": 1}
    gm = default_pipeline(patterns=False).run(gm)[0]  # sweeps the replaced nodes
    assert count(gm, aten.addmm.default) == 0
    assert sorted(_linears(gm)) == sorted([post_op, ("none", "")])
    _close(_run(gm, captured.inputs["inference"]), before)


def test_training_keeps_the_saved_matmul_output_and_fuses_the_bias() -> None:
    torch.manual_seed(0)
    captured = aot_capture(Block(nn.SiLU()), torch.randn(16, 48), train=True)
    for kind in ("forward", "backward"):
        gm = captured.graph(kind)
        before = _run(gm, captured.inputs[kind])
        matmuls = count(gm, aten.addmm.default) + count(gm, aten.mm.default)
        result = ALWAYS(gm)
        # the forward saves the first matmul's output for SiLU's backward: no post-op
        assert result.stats == {"linears": matmuls, "post_ops": 0}
        assert count(gm, aten.addmm.default) + count(gm, aten.mm.default) == 0
        _close(_run(gm, captured.inputs[kind]), before)


def test_prefer_sees_each_case_and_can_refuse() -> None:
    torch.manual_seed(0)
    captured = aot_capture(Block(nn.SiLU()).eval(), torch.randn(8, 48))
    seen: list[LinearCase] = []

    def refuse_post_ops(case: LinearCase) -> bool:
        seen.append(case)
        return case.post_op == "none"

    gm = captured.graph("inference")
    assert cpu_linear(refuse_post_ops)(gm).stats == {"linears": 2, "post_ops": 0}
    assert LinearCase(8, 48, 96, (48, 1), (48, 1), True, "swish") in seen
    assert LinearCase(8, 96, 40, (96, 1), (96, 1), True, "none") in seen
    gm = captured.graph("inference")
    assert not cpu_linear(lambda case: False)(gm).changed
    assert count(gm, aten.addmm.default) == 2


def test_other_dtypes_and_scaled_addmm_stay() -> None:
    def scaled(b: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.addmm(b, x, w, beta=0.5)

    args = (torch.randn(7), torch.randn(5, 6), torch.randn(6, 7))
    gm = aot_capture(scaled, *args).graph("inference")
    assert not ALWAYS(gm).changed
    double = Block(nn.ReLU()).double().eval()
    gm = aot_capture(double, torch.randn(4, 48, dtype=torch.float64)).graph("inference")
    assert not ALWAYS(gm).changed


def test_mm_of_any_operand_layout() -> None:
    def products(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return a @ b, a.t() @ c, (a @ b).relu() * 2

    args = [torch.randn(12, 20), torch.randn(20, 9), torch.randn(12, 5)]
    gm = aot_capture(products, *args).graph("inference")
    before = _run(gm, args)
    assert ALWAYS(gm).stats == {"linears": 3, "post_ops": 1}
    gm.graph.eliminate_dead_code()  # the replaced mm, read by nothing now
    assert count(gm, aten.mm.default) == 0
    _close(_run(gm, args), before)
