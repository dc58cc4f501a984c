"""Batch norm's backward (`native_batch_norm_backward`), which ember keeps whole and
lowers (ember.ir.norms), compiled with the C++ codegen against eager: training and
eval forms, asked-for outputs, no weight, ranks 2 to 5, channels-last, bfloat16."""

from __future__ import annotations

import pytest
import torch
from helpers import check_batch_norm_backward, check_batch_norm_gradients

SHAPES = [(16, 5), (4, 6, 9), (3, 4, 7, 5), (2, 3, 4, 5, 3)]


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{len(s)}d")
def test_float32_against_eager(shape: tuple[int, ...], train: bool) -> None:
    check_batch_norm_backward("cpu", shape, torch.float32, train=train)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("shape", [(4, 6, 5, 7), (2, 3, 4, 5, 3)], ids=["4d", "5d"])
def test_channels_last(shape: tuple[int, ...], train: bool) -> None:
    check_batch_norm_backward("cpu", shape, torch.float32, train=train, channels_last=True)


@pytest.mark.parametrize("params", [torch.bfloat16, torch.float32], ids=["bf16", "mixed"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_bfloat16_rounds_once(train: bool, params: torch.dtype) -> None:
    check_batch_norm_backward(
        "cpu", (8, 6, 5, 5), torch.bfloat16, train=train, param_dtype=params, channels_last=True
    )


@pytest.mark.parametrize(
    "mask", [(True, False, False), (False, True, True), (False, False, True), (True, True, False)]
)
def test_output_mask(mask: tuple[bool, bool, bool]) -> None:
    check_batch_norm_backward("cpu", (4, 3, 6), torch.float32, train=True, mask=mask)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_without_weight(train: bool) -> None:
    check_batch_norm_backward("cpu", (4, 3, 6, 2), torch.float32, train=train, weight=False)
    check_batch_norm_backward(
        "cpu", (4, 3, 6), torch.float32, train=train, weight=False, mask=(True, False, False)
    )


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("shape", [(8, 4), (4, 3, 6, 5), (2, 3, 4, 3, 5)], ids=["2d", "4d", "5d"])
def test_gradients_through_batch_norm(shape: tuple[int, ...], train: bool) -> None:
    check_batch_norm_gradients("cpu", shape, train=train)
