from __future__ import annotations

import torch

from ember.codegen.cpp import cpp_target


def test_serves_cpu_devices_only() -> None:
    target = cpp_target()
    assert target.serves(torch.device("cpu"))
    assert not target.serves(torch.device("cuda"))
    assert target.language_standard == "c++17"
