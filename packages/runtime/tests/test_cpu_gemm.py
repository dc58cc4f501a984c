"""CPU matmuls as oneDNN linears (EMBER_CPU_GEMM): what runs, and that training and
inference still match eager under the accuracy rule."""

from __future__ import annotations

import copy

import pytest
import torch

from ember.graphpasses import LinearCase, linear_op
from ember.runtime import config, cpu_gemm
from ember.runtime.accuracy import compare_outputs
from ember.runtime.compiler import compile_records
from ember.runtime.models import MLP, TransformerBlock

pytestmark = pytest.mark.skipif(linear_op() is None, reason="torch built without oneDNN")


def _wrapper_text(first: int) -> str:
    paths = [r.wrapper_path for r in compile_records[first:] if r.wrapper_path is not None]
    assert paths
    return "\n".join(p.read_text() for p in paths)


@pytest.mark.parametrize("setting", ["onednn", "aten"])
def test_mlp_inference_matches_eager(setting: str) -> None:
    model = MLP(64, 96, 24).eval()
    x = torch.randn(16, 64)
    first = len(compile_records)
    with config.scope(cpu_gemm=setting), torch.no_grad():
        actual = torch.compile(model, backend="ember")(x)
        expected = model(x)
        reference = model.double()(x.double())
    assert compare_outputs(actual, expected, reference=reference) is None
    text = _wrapper_text(first)
    if setting == "onednn":
        assert "mkldnn._linear_pointwise" in text and "'swish'" in text
        assert "aten.addmm" not in text
    else:
        assert "mkldnn" not in text and "aten.addmm" in text


def test_training_step_matches_eager() -> None:
    eager = TransformerBlock(32, 4, 64)
    model = copy.deepcopy(eager)
    x = torch.randn(2, 8, 32)
    first = len(compile_records)
    with config.scope(cpu_gemm="onednn"):
        compiled = torch.compile(model, backend="ember")
        out = compiled(x)
        out.square().mean().backward()
    ref = eager(x)
    ref.square().mean().backward()
    assert compare_outputs(out, ref) is None
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        assert compare_outputs(p.grad, q.grad) is None
    assert "mkldnn._linear_pointwise" in _wrapper_text(first)


def test_measured_choice_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    case = LinearCase(32, 48, 40, (48, 1), (1, 48), True, "gelu_tanh")
    monkeypatch.setattr(cpu_gemm, "_verdicts", {})
    assert isinstance(cpu_gemm.measured_prefer(case), bool)
    calls: list[LinearCase] = []
    monkeypatch.setattr(cpu_gemm, "_measure", lambda c: calls.append(c) or True)
    cpu_gemm.measured_prefer(case)  # the kept verdict: no second measurement
    assert calls == []
    other = LinearCase(32, 48, 40, (1, 32), (48, 1), False)
    assert cpu_gemm.measured_prefer(other) and calls == [other]


def test_unmeasurable_cases_stay_aten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_gemm, "_verdicts", {})
    huge = LinearCase(1 << 12, 1 << 10, 1 << 10, (1 << 10, 1), (1 << 10, 1), True)
    assert not cpu_gemm.measured_prefer(huge)  # too large to time: ATen, untimed

    def broken(case: LinearCase) -> bool:
        raise RuntimeError("no primitive")

    monkeypatch.setattr(cpu_gemm, "_measure", broken)
    assert not cpu_gemm.measured_prefer(LinearCase(2, 3, 4, (3, 1), (3, 1), False))


def test_settings_pick_prefer() -> None:
    assert cpu_gemm.prefer_for("aten") is None
    always = cpu_gemm.prefer_for("onednn")
    assert always is not None and always(LinearCase(1, 1, 1, (1, 1), (1, 1), False))
    assert cpu_gemm.prefer_for("auto") is cpu_gemm.measured_prefer
