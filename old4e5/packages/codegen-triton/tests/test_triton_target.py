from __future__ import annotations

import torch

from ember.codegen.triton import triton_target


def test_serves_cuda_devices_only() -> None:
    target = triton_target()
    assert target.serves(torch.device("cuda", 0))
    assert not target.serves(torch.device("cpu"))


def test_reports_the_toolchain() -> None:
    target = triton_target()
    assert target.triton_version is not None  # triton is a declared dependency
    assert target.usable == torch.cuda.is_available()
