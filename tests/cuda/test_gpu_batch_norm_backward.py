"""Batch norm's backward (`native_batch_norm_backward`, lowered whole by ember.ir.norms)
on a CUDA GPU with the Triton codegen, against eager's CUDA kernels: the cases of
tests/stack/test_batch_norm_backward.py, at sizes whose per-channel sums the scheduler
splits into partial and final kernels. Run with `python3 -m pytest -m cuda`."""

from __future__ import annotations

import pytest
import torch
from helpers import check_batch_norm_backward, check_batch_norm_gradients

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
DEVICE = "cuda"
SHAPES = [(4096, 24), (16, 8, 600), (32, 16, 28, 28), (4, 8, 6, 20, 20)]


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{len(s)}d")
def test_float32_against_eager_on_gpu(shape: tuple[int, ...], train: bool) -> None:
    check_batch_norm_backward(DEVICE, shape, torch.float32, train=train)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("shape", [(32, 16, 28, 28), (4, 8, 6, 20, 20)], ids=["4d", "5d"])
def test_channels_last_on_gpu(shape: tuple[int, ...], train: bool) -> None:
    check_batch_norm_backward(DEVICE, shape, torch.float32, train=train, channels_last=True)


@pytest.mark.parametrize("params", [torch.bfloat16, torch.float32], ids=["bf16", "mixed"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_bfloat16_rounds_once_on_gpu(train: bool, params: torch.dtype) -> None:
    check_batch_norm_backward(
        DEVICE, (32, 16, 28, 28), torch.bfloat16, train=train, param_dtype=params,
        channels_last=True,
    )  # fmt: skip


@pytest.mark.parametrize(
    "mask", [(True, False, False), (False, True, True), (False, False, True), (True, True, False)]
)
def test_output_mask_on_gpu(mask: tuple[bool, bool, bool]) -> None:
    check_batch_norm_backward(DEVICE, (16, 8, 600), torch.float32, train=True, mask=mask)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_without_weight_on_gpu(train: bool) -> None:
    # eager's CUDA kernel computes no weight or bias gradient without a weight (it
    # raises if asked): the input's gradient alone, as a graph without an affine asks
    check_batch_norm_backward(
        DEVICE, (32, 16, 28, 28), torch.float32, train=train, weight=False,
        mask=(True, False, False),
    )  # fmt: skip


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize(
    "shape", [(256, 32), (32, 16, 28, 28), (4, 8, 6, 20, 20)], ids=["2d", "4d", "5d"]
)
def test_gradients_through_batch_norm_on_gpu(shape: tuple[int, ...], train: bool) -> None:
    check_batch_norm_gradients(DEVICE, shape, train=train)
