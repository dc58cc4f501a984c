"""Shared fixtures for the cross-layer tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import ember.runtime  # noqa: F401  # registers backend="ember" without the entry point


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """Each test compiles from scratch and starts from the same random state."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()
