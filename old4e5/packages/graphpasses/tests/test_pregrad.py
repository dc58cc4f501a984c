"""Attention -> SDPA on Torch-level graphs captured with Dynamo (before AOTAutograd)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from ember.graphpasses import rewrite_attention_pregrad

Tensor = torch.Tensor
SOFTMAXES = {"softmax", F.softmax, torch.softmax, torch.special.softmax}


def dynamo_graph(fn: Callable[..., Any], *inputs: Tensor) -> torch.fx.GraphModule:
    """The graph Dynamo hands a backend for `fn(*inputs)`."""
    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=record, fullgraph=True)(*inputs)
    assert len(graphs) == 1
    return graphs[0]


def run_graph(gm: torch.fx.GraphModule, named: dict[str, Tensor]) -> Any:
    """Run a Dynamo graph on real inputs; its placeholders are named `L_<arg>_`."""
    args = [named[str(n.target)[2:-1]] for n in gm.graph.nodes if n.op == "placeholder"]
    return gm(*args)


def count(gm: torch.fx.GraphModule, targets: object) -> int:
    wanted = targets if isinstance(targets, set) else {targets}
    return sum(1 for n in gm.graph.nodes if n.op != "placeholder" and n.target in wanted)


def inputs(
    shape_q: tuple[int, ...] = (2, 3, 5, 8),
    shape_kv: tuple[int, ...] = (2, 3, 6, 8),
    shape_v: tuple[int, ...] = (2, 3, 6, 7),
    shape_m: tuple[int, ...] = (2, 3, 5, 6),
) -> dict[str, Tensor]:
    return {
        "q": torch.randn(shape_q),
        "k": torch.randn(shape_kv),
        "v": torch.randn(shape_v),
        "m": torch.randn(shape_m),
    }


def check_rewrite(
    fn: Callable[..., Any], named: dict[str, Tensor], expected: int = 1
) -> torch.fx.GraphModule:
    """Rewrite fn's Dynamo graph; outputs and every input's gradient equal eager's."""
    gm = dynamo_graph(fn, *named.values())
    softmaxes = count(gm, SOFTMAXES)
    result = rewrite_attention_pregrad(gm)
    assert result.stats == {"attention_pregrad": expected}
    assert result.changed == (expected > 0)
    gm = result.graph_module
    assert count(gm, F.scaled_dot_product_attention) == expected
    assert count(gm, SOFTMAXES) == softmaxes - expected
    for node in gm.graph.nodes:
        if node.target is F.scaled_dot_product_attention:
            assert isinstance(node.meta["example_value"], torch.Tensor)

    def grads(run: Callable[[dict[str, Tensor]], Any]) -> tuple[Tensor, list[Tensor | None]]:
        leaves = {name: t.detach().clone().requires_grad_() for name, t in named.items()}
        out = run(leaves)
        out = out[0] if isinstance(out, tuple | list) else out
        out.square().sum().backward()
        return out.detach(), [leaves[name].grad for name in named]

    expected_out, expected_grads = grads(lambda leaves: fn(*leaves.values()))
    out, got_grads = grads(lambda leaves: run_graph(gm, leaves))
    torch.testing.assert_close(out, expected_out)
    for name, got, want in zip(named, got_grads, expected_grads, strict=True):
        if want is None:
            assert got is None, name
        else:
            torch.testing.assert_close(got, want, msg=f"grad of {name}")
    return gm


def _kt(k: Tensor) -> Tensor:
    return k.transpose(-2, -1)


POSITIVE: dict[str, Callable[..., Tensor]] = {
    "method_div": lambda q, k, v, m: (q @ k.transpose(-2, -1) / 8.0).softmax(dim=-1) @ v,
    "math_sqrt": lambda q, k, v, m: (q @ _kt(k) / math.sqrt(q.size(-1))).softmax(-1) @ v,
    "torch_functions": lambda q, k, v, m: torch.softmax(
        torch.div(torch.matmul(q, torch.transpose(k, 2, 3)), 8), -1
    ).matmul(v),
    "mT_mul_F_softmax": lambda q, k, v, m: F.softmax(q.matmul(k.mT) * 0.125, dim=-1) @ v,
    "swapaxes_rmul": lambda q, k, v, m: (0.125 * (q @ k.swapaxes(-1, -2))).softmax(-1) @ v,
    "permute_unscaled": lambda q, k, v, m: (q @ k.permute(0, 1, 3, 2)).softmax(-1) @ v,
    "transpose_positive_dims": lambda q, k, v, m: (q @ k.transpose(3, 2) * 0.2).softmax(3) @ v,
    "scaled_q": lambda q, k, v, m: ((q * 0.125) @ _kt(k)).softmax(-1) @ v,
    "scaled_q_and_k": lambda q, k, v, m: (
        ((q * 8**-0.25) @ (k / 8**0.25).transpose(-2, -1)).softmax(-1) @ v
    ),
    "mask": lambda q, k, v, m: (q @ _kt(k) / 8 + m).softmax(-1) @ v,
    "mask_first": lambda q, k, v, m: (m + q @ _kt(k) * 0.3).softmax(-1) @ v,
    "special_softmax_mask": lambda q, k, v, m: (
        torch.special.softmax(torch.add(q @ _kt(k), m), dim=-1) @ v
    ),
    "dropout_eval": lambda q, k, v, m: (
        F.dropout((q @ _kt(k) * 0.3).softmax(-1), 0.1, training=False) @ v
    ),
    "dropout_p0": lambda q, k, v, m: torch.dropout((q @ _kt(k)).softmax(-1), 0.0, True) @ v,
}


@pytest.mark.parametrize("spelling", POSITIVE)
def test_attention_spellings_become_sdpa(spelling: str) -> None:
    check_rewrite(POSITIVE[spelling], inputs())


def test_bmm_on_3d_inputs() -> None:
    def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) / 2, dim=-1), v)

    named = {"q": torch.randn(6, 5, 8), "k": torch.randn(6, 7, 8), "v": torch.randn(6, 7, 3)}
    check_rewrite(attention, named)


@pytest.mark.parametrize("mask_shape", [(5, 6), (2, 1, 1, 6), (1, 3, 5, 6)])
def test_broadcast_masks(mask_shape: tuple[int, ...]) -> None:
    check_rewrite(POSITIVE["mask"], inputs(shape_m=mask_shape))


def test_causal_mask_with_minus_infinity() -> None:
    causal = torch.full((5, 6), float("-inf")).triu(1)
    check_rewrite(POSITIVE["mask"], {**inputs(), "m": causal})


class Heads(nn.Module):
    """Softmax and dropout as modules (Dynamo inlines them into F.softmax / F.dropout)."""

    def __init__(self) -> None:
        super().__init__()
        self.softmax = nn.Softmax(dim=-1)
        self.dropout = nn.Dropout(0.1)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        scores = q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])
        out: Tensor = self.dropout(self.softmax(scores)) @ v
        return out


def test_modules_in_eval_mode() -> None:
    named = inputs()
    del named["m"]
    check_rewrite(Heads().eval(), named)


def test_modules_in_training_mode_keep_dropout() -> None:
    named = inputs()
    del named["m"]
    gm = dynamo_graph(Heads().train(), *named.values())
    assert rewrite_attention_pregrad(gm).stats == {"attention_pregrad": 0}


def test_two_attention_blocks_and_a_shared_scaled_input() -> None:
    def two(q: Tensor, k: Tensor, v: Tensor, m: Tensor) -> Tensor:
        qs = q * 0.5
        first = (qs @ _kt(k)).softmax(-1) @ v
        second = (qs @ _kt(k) + m).softmax(-1) @ v
        return first + second + qs.sum()

    check_rewrite(two, inputs(shape_q=(2, 3, 6, 8), shape_v=(2, 3, 6, 8), shape_m=(6, 6)), 2)


def test_dynamic_shapes() -> None:
    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(POSITIVE["mask"], backend=record, dynamic=True, fullgraph=True)
    compiled(*inputs().values())
    assert rewrite_attention_pregrad(graphs[0]).stats == {"attention_pregrad": 1}


def test_log_line(caplog: pytest.LogCaptureFixture) -> None:
    gm = dynamo_graph(POSITIVE["mask"], *inputs().values())
    with caplog.at_level(logging.INFO, logger="ember.graphpasses"):
        rewrite_attention_pregrad(gm)
    assert "rewrote 1 hand-written attention block(s)" in caplog.text


NEGATIVE: dict[str, Callable[..., Any]] = {
    "probs_used_twice": lambda q, k, v, m: (
        (p := (q @ _kt(k) / 8).softmax(-1)) @ v,
        p,
    ),
    "scores_used_twice": lambda q, k, v, m: (
        ((s := q @ _kt(k)) / 8).softmax(-1) @ v,
        s.sum(),
    ),
    "softmax_over_other_dim": lambda q, k, v, m: (q @ _kt(k) / 8).softmax(-2) @ v,
    "dropout_in_training": lambda q, k, v, m: (
        F.dropout((q @ _kt(k) / 8).softmax(-1), 0.1, training=True) @ v
    ),
    "tensor_scale": lambda q, k, v, m: (q @ _kt(k) / m[0, 0, 0, 0]).softmax(-1) @ v,
    "softmax_with_dtype": lambda q, k, v, m: (
        (q @ _kt(k)).softmax(-1, dtype=torch.float64).float() @ v
    ),
    "mask_after_scale_is_scaled": lambda q, k, v, m: ((q @ _kt(k) + m) / 8).softmax(-1) @ v,
    "k_not_transposed": lambda q, k, v, m: (q @ k).softmax(-1) @ v,
    "bool_mask": lambda q, k, v, m: (q @ _kt(k) + (m > 0)).softmax(-1) @ v,
}


def _mutated_q(q: Tensor, k: Tensor, v: Tensor, m: Tensor) -> Tensor:
    q = q + 0
    scores = q @ _kt(k)
    q.add_(1)  # SDPA would read q later than the scores' matmul did
    return scores.softmax(-1) @ v + q


NEGATIVE["q_mutated_in_between"] = _mutated_q


@pytest.mark.parametrize("case", NEGATIVE)
def test_not_rewritten(case: str) -> None:
    square = (2, 3, 6, 6)
    named = inputs(shape_q=square, shape_kv=square, shape_v=square, shape_m=square)
    gm = dynamo_graph(NEGATIVE[case], *named.values())
    assert rewrite_attention_pregrad(gm).stats == {"attention_pregrad": 0}


def test_broadcasting_matmul_not_rewritten() -> None:
    def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return (q @ k.transpose(-2, -1)).softmax(-1) @ v

    named = {"q": torch.randn(2, 3, 5, 8), "k": torch.randn(3, 6, 8), "v": torch.randn(3, 6, 7)}
    gm = dynamo_graph(attention, *named.values())
    assert rewrite_attention_pregrad(gm).stats == {"attention_pregrad": 0}
