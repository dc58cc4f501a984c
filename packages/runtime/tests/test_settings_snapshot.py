"""What runs after a compile (a compiled graph's first call, each call under
EMBER_CHECK) uses the settings of that compile, not those in force when it runs: a
backend call's settings are one frozen snapshot (ember.runtime.backend)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.runtime import check, compile_graph
from ember.runtime.check import EmberCheckWarning
from ember.runtime.config import config


def _graph() -> torch.fx.GraphModule:
    return make_fx(lambda x: torch.cos(x) * 3 - 1, tracing_mode="fake")(torch.randn(8))


def _entries(cache: Path) -> list[str]:
    graphs = cache / "graphs"
    return (
        [p.name for p in graphs.iterdir() if not p.name.startswith(".")] if graphs.exists() else []
    )


def test_the_first_call_stores_the_graph_in_its_compiles_cache(tmp_path: Path) -> None:
    compiled_in, called_in = tmp_path / "compiled", tmp_path / "called"
    with config.scope(cache_dir=compiled_in, compile_cache=True, strict=True):
        compiled = compile_graph(_graph(), [torch.randn(8)], name="snapshot_store")
    x = torch.randn(8)
    with config.scope(cache_dir=called_in, compile_cache=True):
        (out,) = compiled([x.clone()])
    torch.testing.assert_close(out, torch.cos(x) * 3 - 1)
    assert len(_entries(compiled_in)) == 1
    assert _entries(called_in) == []


def test_check_mode_is_the_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    def planted(*args: Any, **kwargs: Any) -> tuple[int, str, None]:
        return 0, "planted divergence", None

    monkeypatch.setattr(check, "first_divergence", planted)
    with config.scope(check="warn", strict=True):
        compiled = compile_graph(_graph(), [torch.randn(8)], name="snapshot_check")
    with config.scope(check="raise"), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compiled([torch.randn(8)])  # warns, as its compile said, rather than raising
    assert any(issubclass(w.category, EmberCheckWarning) for w in seen)
