"""The scheduling choices of a CUDA graph follow the device's multiprocessor count,
read off the device (no GPU needed: torch's device query is replaced here)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ember.codegen.triton import TRITON_CHOICES, triton_choices
from ember.runtime import kernels


def test_split_reductions_aim_at_the_devices_multiprocessors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[Any] = []

    def properties(index: Any) -> SimpleNamespace:
        asked.append(index)
        return SimpleNamespace(multi_processor_count=66)

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    kernels.multiprocessors.cache_clear()
    try:
        choices = kernels.scheduling_choices({torch.device("cuda", 1)})
        again = kernels.scheduling_choices({torch.device("cuda", 1)})
    finally:
        kernels.multiprocessors.cache_clear()
    assert choices == triton_choices(66) == again
    assert choices.split_workers == 66 * 16 != TRITON_CHOICES.split_workers
    assert asked == [1]  # read once per device
