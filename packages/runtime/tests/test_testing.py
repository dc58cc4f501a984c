"""ember.runtime.testing: `no_eager_fallback()` fails when ember did not really run."""

from __future__ import annotations

import pytest
import torch

import ember.runtime.compiler as compiler
from ember.runtime.testing import no_eager_fallback


def _plant(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"planted {name} failure")

    monkeypatch.setattr(compiler, name, broken)


def test_a_compiled_graph_passes_and_its_record_is_yielded() -> None:
    with no_eager_fallback() as graphs:
        out = torch.compile(lambda x: x.sin() * 2, backend="ember")(torch.ones(3))
    torch.testing.assert_close(out, torch.ones(3).sin() * 2)
    (record,) = graphs
    assert record.graph.startswith("inference") and record.wrapper_path is not None


def test_a_block_that_compiles_nothing_fails() -> None:
    with pytest.raises(AssertionError, match="compiled no graph"), no_eager_fallback():
        torch.ones(3).sin()


def test_a_graph_run_eagerly_fails_naming_it_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    _plant(monkeypatch, "lower_graph")
    f = torch.compile(lambda x: x.cos() + 1, backend="ember")
    with pytest.raises(AssertionError) as info, no_eager_fallback():
        torch.testing.assert_close(f(torch.ones(3)), torch.ones(3).cos() + 1)  # eager's numbers
    message = str(info.value)
    assert "1 of 1 graphs fell back" in message
    assert "inference_" in message and "ran eagerly" in message
    assert "planted lower_graph failure" in message


def test_generated_kernels_run_as_aten_ops_fail_unless_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _plant(monkeypatch, "compile_kernels")
    aten_kernels = "ran its kernels as ATen ops: RuntimeError: planted"
    with pytest.raises(AssertionError, match=aten_kernels), no_eager_fallback():
        torch.compile(lambda x: x.exp() - 1, backend="ember")(torch.ones(3))
    torch._dynamo.reset()
    with no_eager_fallback(kernels=False) as graphs:
        torch.compile(lambda x: x.exp() - 2, backend="ember")(torch.ones(3))
    (record,) = graphs
    assert record.kernel_fallback is not None and record.ran_eagerly is None


def test_an_exception_inside_the_block_passes_through() -> None:
    with pytest.raises(ValueError, match="inside"), no_eager_fallback():
        raise ValueError("inside")
