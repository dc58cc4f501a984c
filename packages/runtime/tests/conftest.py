from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import ember.runtime  # noqa: F401  # registers backend="ember"
from ember.runtime import config
from ember.runtime.logs import setup_logging


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path) -> Iterator[None]:
    """Fresh Dynamo state and a private cache dir for each test. Whole graphs compile
    every time (the compile cache is off): tests that patch a compiler stage must see
    it run; test_compile_cache.py turns the cache on."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    with config.scope(cache_dir=tmp_path / "cache", compile_cache=False):
        yield
    torch._dynamo.reset()


@pytest.fixture
def warnings_seen(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> Iterator[pytest.LogCaptureFixture]:
    """The warnings of the "ember.runtime" logger (ember's own handler stops them at
    "ember" once a compile has set it up)."""
    setup_logging()
    monkeypatch.setattr(logging.getLogger("ember"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="ember.runtime"):
        yield caplog
