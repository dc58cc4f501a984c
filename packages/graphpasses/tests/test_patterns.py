"""The pattern matcher and ember's patterns, on graphs traced from real modules."""

from __future__ import annotations

import math

import pytest
import torch
from graphpasses_helpers import Attention, aot_capture, count, export_aten

from ember.graphpasses import (
    DEFAULT_PATTERNS,
    PassManager,
    Pattern,
    normalise_views,
    remove_noops,
    rewrite_patterns,
)

aten = torch.ops.aten
SDPA = aten.scaled_dot_product_attention.default


def rewrite(gm: torch.fx.GraphModule, inputs: list[object] | None) -> dict[str, int]:
    """Canonicalise and rewrite with the default patterns, checking values if given inputs."""
    manager = PassManager(
        [normalise_views, remove_noops, rewrite_patterns(DEFAULT_PATTERNS)],
        sample_inputs=inputs,
        check=True,
    )
    gm, report = manager.run(gm)
    return {k: v for k, v in report.stats("pattern_rewrite").items() if v}


@pytest.mark.parametrize(
    ("spelling", "mask", "pattern"),
    [
        ("div", "none", "attention_div"),
        ("mul", "none", "attention_mul"),
        ("scaled_q", "none", "attention_scaled_q"),
        ("none", "none", "attention_unscaled"),
        ("div", "causal_add", "attention_div_mask"),
        ("mul", "mask_first", "attention_mul_mask"),
        ("none", "causal_add", "attention_mask"),
    ],
)
def test_attention_spellings_become_sdpa(spelling: str, mask: str, pattern: str) -> None:
    model = Attention(spelling=spelling, mask=mask).eval()
    x = torch.randn(2, 5, 32)
    captured = aot_capture(model, x)
    gm = captured.graph("inference")
    assert count(gm, aten.bmm.default) == 2
    fired = rewrite(gm, captured.inputs["inference"])  # checking mode compares values
    assert fired == {pattern: 1}
    assert count(gm, SDPA) == 1
    assert count(gm, aten.bmm.default) == 0
    assert count(gm, aten._softmax.default) == 0
    sdpa = next(n for n in gm.graph.nodes if n.target is SDPA)
    assert sdpa.meta["val"].shape == (2, 4, 5, 8)
    with torch.no_grad():
        torch.testing.assert_close(gm(*captured.inputs["inference"])[0], model(x))


def test_attention_scale_is_bound_from_the_graph() -> None:
    captured = aot_capture(Attention(spelling="div").eval(), torch.randn(2, 5, 32))
    gm = captured.graph("inference")
    rewrite(gm, None)
    sdpa = next(n for n in gm.graph.nodes if n.target is SDPA)
    assert sdpa.kwargs["scale"] == pytest.approx(1 / math.sqrt(8))


@pytest.mark.parametrize("mask", ["bool", "dropout"])
def test_attention_not_rewritten_when_it_would_change_meaning(mask: str) -> None:
    # masked_fill with a bool mask is not an additive mask; dropout draws random numbers.
    captured = aot_capture(Attention(mask=mask).eval(), torch.randn(2, 5, 32))
    gm = captured.graph("inference")
    inputs = captured.inputs["inference"] if mask == "bool" else None
    assert rewrite(gm, inputs) == {}
    assert count(gm, SDPA) == 0


def test_attention_not_rewritten_in_training_forward() -> None:
    # The forward graph saves the softmax output for backward: the scores are used
    # outside the pattern, so replacing them would not remove anything.
    captured = aot_capture(Attention().train(), torch.randn(2, 5, 32), train=True)
    gm = captured.graph("forward")
    assert rewrite(gm, captured.inputs["forward"]) == {}
    assert count(gm, SDPA) == 0


def test_attention_with_dynamic_shapes() -> None:
    captured = aot_capture(Attention().eval(), torch.randn(2, 5, 32), dynamic=True)
    gm = captured.graph("inference")
    assert rewrite(gm, captured.inputs["inference"]) == {"attention_div": 1}
    sdpa = next(n for n in gm.graph.nodes if n.target is SDPA)
    assert any(isinstance(s, torch.SymInt) for s in sdpa.meta["val"].shape)


def test_attention_in_exported_program() -> None:
    model = Attention(mask="causal_add").eval()
    x = torch.randn(2, 5, 32)
    ep = export_aten(model, x)
    gm = ep.graph_module
    assert rewrite(gm, None) == {"attention_div_mask": 1}
    params = [*ep.state_dict.values()]
    torch.testing.assert_close(gm(*params, x)[0], model(x))


class MatmulBias(torch.nn.Module):
    def __init__(self, bias_shape: tuple[int, ...], batched: bool = False) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(*((3,) if batched else ()), 8, 6))
        self.b = torch.nn.Parameter(torch.randn(bias_shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.w + self.b).relu()


@pytest.mark.parametrize(
    ("batched", "bias_shape", "expected"),
    [
        (False, (6,), {"mm_bias_to_addmm": 1}),
        (False, (4, 6), {"mm_bias_to_addmm": 1}),
        (False, (2, 4, 6), {}),  # the add broadcasts to 3-D: addmm cannot
        (True, (6,), {"bmm_bias_to_baddbmm": 1}),
    ],
)
def test_matmul_bias(batched: bool, bias_shape: tuple[int, ...], expected: dict[str, int]) -> None:
    x = torch.randn(*((3,) if batched else ()), 4, 8)
    captured = aot_capture(MatmulBias(bias_shape, batched).eval(), x)
    gm = captured.graph("inference")
    assert rewrite(gm, captured.inputs["inference"]) == expected
    if expected:
        assert count(gm, aten.add.Tensor) == 0


def test_matmul_bias_keeps_mm_used_elsewhere() -> None:
    def f(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p = a @ b
        return p + c, p * 2

    captured = aot_capture(f, torch.randn(4, 8), torch.randn(8, 6), torch.randn(6))
    gm = captured.graph("inference")
    assert rewrite(gm, captured.inputs["inference"]) == {}


class NewGELU(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
        return 0.5 * x * (1.0 + torch.tanh(inner))


def test_hand_written_tanh_gelu() -> None:
    captured = aot_capture(NewGELU(), torch.randn(4, 16))
    gm = captured.graph("inference")
    assert rewrite(gm, captured.inputs["inference"]) == {"gelu_tanh": 1}
    (gelu,) = [n for n in gm.graph.nodes if n.target is aten.gelu.default]
    assert gelu.kwargs["approximate"] == "tanh"
    assert count(gm, aten.tanh.default) == 0


def test_other_gelu_constant_does_not_match() -> None:
    class Almost(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            inner = math.sqrt(2.0 / math.pi) * (x + 0.05 * torch.pow(x, 3.0))
            return 0.5 * x * (1.0 + torch.tanh(inner))

    captured = aot_capture(Almost(), torch.randn(4, 16))
    gm = captured.graph("inference")
    assert rewrite(gm, None) == {}


def test_user_pattern_binds_scalar_and_checks() -> None:
    def search(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return torch.relu(x * alpha)

    seen: list[float] = []

    def check(match: object) -> bool:
        seen.append(match.scalars["alpha"])  # type: ignore[attr-defined]
        return match.scalars["alpha"] > 0  # type: ignore[attr-defined]

    pattern = Pattern(
        name="relu_of_positive_scale",
        search=search,
        replace=lambda x, alpha: aten.mul.Tensor(aten.relu.default(x), alpha),
        inputs=("x",),
        example_inputs=lambda: [torch.randn(3)],
        scalars=("alpha",),
        check=check,
    )

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(x * 3.0), torch.relu(x * -2.0)

    captured = aot_capture(f, torch.randn(5))
    gm = captured.graph("inference")
    manager = PassManager([rewrite_patterns([pattern])], sample_inputs=captured.inputs["inference"])
    gm, report = manager.run(gm)
    assert report.stats("pattern_rewrite") == {"relu_of_positive_scale": 1}
    assert sorted(seen) == [-2.0, 3.0]


def test_pattern_scalar_must_appear_in_graph() -> None:
    pattern = Pattern(
        name="bad",
        search=lambda x, s: x * (s * 2.0),
        replace=lambda x, s: x,
        inputs=("x",),
        example_inputs=lambda: [torch.randn(3)],
        scalars=("s",),
    )
    with pytest.raises(ValueError, match=r"do not appear as literals"):
        _ = pattern.graph


def test_a_pattern_is_traced_only_where_its_required_ops_are() -> None:
    """`requires` keeps a pattern from being traced (or matched) in a graph without
    those ops, and a declaration its search graph contradicts is an error."""
    traced: list[str] = []

    def search(x: torch.Tensor) -> torch.Tensor:
        traced.append("search")
        return torch.tanh(x) * 2

    pattern = Pattern(
        name="tanh_times_two",
        search=search,
        replace=lambda x: aten.mul.Tensor(aten.tanh.default(x), 2),
        inputs=("x",),
        example_inputs=lambda: [torch.randn(3)],
        requires=frozenset({aten.tanh.default}),
    )
    rewriter = rewrite_patterns([pattern])
    without = aot_capture(lambda x: torch.sigmoid(x) * 2, torch.randn(4)).graph("inference")
    assert rewriter(without).stats == {"tanh_times_two": 0}
    assert traced == []
    with_tanh = aot_capture(lambda x: torch.tanh(x) * 2, torch.randn(4)).graph("inference")
    assert rewriter(with_tanh).stats == {"tanh_times_two": 1}
    assert traced  # traced (and retraced at the match's sizes, see sizes_agree)

    wrong = Pattern(
        name="declares_sin",
        search=lambda x: torch.tanh(x) * 2,
        replace=lambda x: x,
        inputs=("x",),
        example_inputs=lambda: [torch.randn(3)],
        requires=frozenset({aten.sin.default}),
    )
    with pytest.raises(ValueError, match=r"declares_sin.*requires"):
        _ = wrong.graph


def test_every_shipped_pattern_traces_to_what_it_requires() -> None:
    """A `requires` its search graph contradicts raises only when traced, and a
    pattern is traced only in graphs holding what it requires: trace them all here."""
    for pattern in DEFAULT_PATTERNS:
        targets = {n.target for n in pattern.graph.graph.nodes}
        assert pattern.requires and pattern.requires <= targets, pattern.name
