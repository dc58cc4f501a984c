"""Check mode: compiled graphs re-run eagerly and compared (ember.runtime.check)."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

import ember.runtime.check as check_module
import ember.runtime.compiler as compiler_module
from ember.runtime import config
from ember.runtime.check import EmberCheckError, EmberCheckWarning, checked, metadata_mismatch
from ember.runtime.testing import no_eager_fallback


class NormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(8)
        self.lin = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.bn(x).relu())


def _perturbing_loader(real: Any) -> Any:
    """A load_module that returns a wrapper whose first output is slightly wrong."""

    def load(path: Path, injected: dict[str, Any]) -> ModuleType:
        module = real(path, injected)
        inner = module.call

        def call(args: list[Any]) -> Any:
            outs = inner(args)
            return (outs[0] + 1e-2, *outs[1:])

        module.call = call
        return module

    return load


def _count_checked_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count, per graph, the calls that check mode ran eagerly and compared."""
    calls: dict[str, int] = {}
    real = check_module.checked

    def counting(call: Any, eager_gm: Any, graph: str, wrapper: Path | None = None) -> Any:
        run = real(call, eager_gm, graph, wrapper)

        def counted(args: list[Any]) -> Any:
            calls[graph] = calls.get(graph, 0) + 1
            return run(args)

        return counted

    monkeypatch.setattr(check_module, "checked", counting)
    return calls


def test_check_mode_passes_a_correct_training_step_with_mutated_buffers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both graphs of the step are compiled, checked against eager once each, and
    pass; the batch norm's running statistics are written once, with eager's values."""
    calls = _count_checked_calls(monkeypatch)
    model, reference = NormNet(), NormNet()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="ember")
    x = torch.randn(6, 8)
    with config.scope(check=True, cache_dir=tmp_path), no_eager_fallback() as graphs:
        compiled(x).square().mean().backward()
    reference(x).square().mean().backward()
    assert sorted(calls) == sorted(g.graph for g in graphs)
    assert sorted(name.split("_")[0] for name in calls) == ["backward", "forward"]
    assert set(calls.values()) == {1}
    assert model.lin.weight.grad is not None and reference.lin.weight.grad is not None
    torch.testing.assert_close(model.lin.weight.grad, reference.lin.weight.grad)
    assert int(model.bn.num_batches_tracked) == 1
    torch.testing.assert_close(model.bn.running_mean, reference.bn.running_mean)


def test_check_mode_raises_on_a_wrong_output_and_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        compiler_module, "load_module", _perturbing_loader(compiler_module.load_module)
    )
    compiled = torch.compile(lambda a, b: (a * b).sin(), backend="ember")
    with (
        config.scope(check=True, cache_dir=tmp_path),
        no_eager_fallback(),
        pytest.raises(EmberCheckError) as info,
    ):
        compiled(torch.randn(4, 5), torch.randn(4, 5))
    message = str(info.value)
    assert "output 0" in message and "max abs error 0.01" in message
    dump = Path(message.split("Debug dump: ")[1].split(". ")[0])
    assert (dump / "graph.py").read_text().count("aten.mul") == 1


def test_check_mode_warn_only_warns_and_returns_the_compiled_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        compiler_module, "load_module", _perturbing_loader(compiler_module.load_module)
    )
    monkeypatch.setenv("EMBER_CHECK", "warn")
    compiled = torch.compile(lambda a: a.cos(), backend="ember")
    a = torch.randn(3)
    with (
        config.scope(cache_dir=tmp_path),
        no_eager_fallback(),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        out = compiled(a)
        compiled(a)
    assert [w.category for w in caught] == [EmberCheckWarning]
    torch.testing.assert_close(out, a.cos() + 1e-2)


def test_checked_compares_strides_and_mutated_inputs() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x.t()

    gm = make_fx(f)(torch.randn(3, 4))

    def transposed_copy(args: list[Any]) -> Any:
        (x,) = args
        args.clear()
        x.add_(1)
        return (x.t().contiguous(),)  # right values, wrong strides

    def forgets_mutation(args: list[Any]) -> Any:
        (x,) = args
        args.clear()
        return ((x + 1).t(),)

    with config.scope(check="raise"):
        with pytest.raises(EmberCheckError, match=r"output 0: strides \[3, 1\], eager \[1, 4\]"):
            checked(transposed_copy, gm, "g")([torch.randn(3, 4)])
        with pytest.raises(EmberCheckError, match="input \\(mutated in place\\) 0"):
            checked(forgets_mutation, gm, "g")([torch.randn(3, 4)])


def test_metadata_mismatch_ignores_strides_of_size_one_dims() -> None:
    a = torch.empty_strided((1, 4), (1, 1))
    b = torch.empty_strided((1, 4), (4, 1))
    assert metadata_mismatch(a, b) is None
    assert metadata_mismatch(a.double(), b) is not None


def test_check_knob_parses_words_and_booleans(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CHECK", "1")
    assert config.check == "raise"
    monkeypatch.setenv("EMBER_CHECK", "warn")
    assert config.check == "warn"
    monkeypatch.setenv("EMBER_CHECK", "off")
    assert config.check == "off"
    with config.scope(check=True):
        assert config.check == "raise"
