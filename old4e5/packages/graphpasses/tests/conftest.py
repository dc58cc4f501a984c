"""pytest setup for ember.graphpasses' tests: every test starts from the same seed."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
