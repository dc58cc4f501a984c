from __future__ import annotations

import os
from pathlib import Path

import pytest

from ember.runtime.config import EmberConfig


def test_environment_is_read_at_each_access(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = EmberConfig()
    monkeypatch.setenv("EMBER_FALLBACK", "0")
    assert cfg.fallback is False
    monkeypatch.setenv("EMBER_FALLBACK", "yes")
    assert cfg.fallback is True
    monkeypatch.setenv("EMBER_DEBUG_DIR", "/tmp/x")
    assert cfg.debug_dir == Path("/tmp/x")


def test_scope_overrides_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = EmberConfig()
    monkeypatch.delenv("EMBER_STRICT", raising=False)
    with cfg.scope(strict=True):
        assert cfg.strict is True
        with cfg.scope(strict=False):
            assert cfg.strict is False
        assert cfg.strict is True
    assert cfg.strict is False


def test_bad_values_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_STRICT", "maybe")
    with pytest.raises(ValueError, match="EMBER_STRICT='maybe'"):
        _ = EmberConfig().strict


def test_unknown_setting_is_an_error() -> None:
    with pytest.raises(KeyError, match="unknown ember settings"), EmberConfig().scope(nope=1):
        pass


@pytest.mark.parametrize(
    ("cores", "ranks", "workers"),
    [(16, None, 15), (16, "8", 1), (64, None, 16), (2, None, 1), (1, None, 0), (16, "x", 15)],
)
def test_compile_workers_default_to_the_cores_left_per_local_rank(
    monkeypatch: pytest.MonkeyPatch, cores: int, ranks: str | None, workers: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(cores)), raising=False)
    if ranks is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", ranks)
    monkeypatch.delenv("EMBER_COMPILE_WORKERS", raising=False)
    assert EmberConfig().compile_workers == workers
