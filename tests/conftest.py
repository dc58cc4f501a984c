"""Shared fixtures for the cross-layer tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import ember.runtime  # noqa: F401  # registers backend="ember" without the entry point
from ember.runtime.config import config


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """Each test compiles from scratch (the whole-graph compile cache is off; the
    kernel caches are shared) and starts from the same random state."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    with config.scope(compile_cache=False):
        yield
    torch._dynamo.reset()
