"""The device records (ember.runtime.devices): a CUDA graph's properties are read off
the device when there is one (no GPU needed: torch's device queries are replaced
here), the codegen's documented defaults where there is none, and the scheduling
choices (the split-reduction heuristic) follow the multiprocessor count."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ember.codegen.triton import (
    GPU_DEFAULTS,
    TRITON_CHOICES,
    UNSUPPORTED,
    UNVERIFIED,
    triton_choices,
)
from ember.runtime import devices, kernels
from ember.runtime.config import config
from ember.scheduler import DeviceProperties


@pytest.fixture
def fresh_records() -> Iterator[None]:
    """Records and properties read anew in the test, and forgotten after it (the
    replaced queries must not leak into later tests' records)."""
    devices._record.cache_clear()
    devices._read_cuda_properties.cache_clear()
    yield
    devices._record.cache_clear()
    devices._read_cuda_properties.cache_clear()


def _two_gpus_of(monkeypatch: pytest.MonkeyPatch, sms: int) -> list[Any]:
    """Pretend this process has two CUDA devices of `sms` multiprocessors each; the
    device indices asked about, in order."""
    asked: list[Any] = []

    def properties(index: Any) -> SimpleNamespace:
        asked.append(index)
        return SimpleNamespace(
            multi_processor_count=sms, shared_memory_per_block=49152, warp_size=32,
            major=8, minor=0,
        )  # fmt: skip

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    return asked


@pytest.mark.usefixtures("fresh_records")
def test_the_sm_count_comes_from_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _two_gpus_of(monkeypatch, sms=66)
    record = devices.device_record(torch.device("cuda", 1))
    again = devices.device_record(torch.device("cuda", 1))
    assert asked == [1]  # read once per device
    assert record is again and record.available
    assert record.properties == DeviceProperties(
        multiprocessors=66, shared_memory_per_block=49152, warp_size=32, capability=(8, 0),
        measured=True,
    )  # fmt: skip
    assert record.properties.multiprocessors != GPU_DEFAULTS.multiprocessors
    assert record.codegen == "ember.codegen.triton"
    # rendered but not yet matching eager on the GPU: declined too
    assert record.unsupported_ops == frozenset(UNSUPPORTED) | frozenset(UNVERIFIED)
    # the special functions match eager on the GPU (test_triton_special_functions.py)
    special = {"special_zeta", "special_airy_ai", "special_legendre_polynomial_p"}
    special |= {"igamma", "igammac"}  # float32/float64; bfloat16 is eager's error
    assert special.isdisjoint(record.unsupported_ops)
    assert not record.lowers_depthwise  # until its Triton kernels have run on a GPU
    assert "polygamma" not in record.unsupported_ops  # its bfloat16 bound passed on a GPU
    assert record.sort_limit == 0  # CUDA sorts stay ATen calls (see devices._cuda_record)


@pytest.mark.usefixtures("fresh_records")
def test_split_reductions_aim_at_the_devices_multiprocessors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _two_gpus_of(monkeypatch, sms=66)
    records = devices.device_records({torch.device("cuda", 1)})
    choices = kernels.scheduling_choices(records)
    assert choices == triton_choices(records[torch.device("cuda", 1)].properties)
    assert choices.split_workers == 66 * 16 != TRITON_CHOICES.split_workers
    # a column sum of [32768, 4096]: 64 column tiles, cut until about 16 programs run
    # per multiprocessor: 16 chunks on 66 SMs, 32 on the default's 132
    assert choices.reduction_chunks(4096, 32768, 32768, column=True) == 16
    assert TRITON_CHOICES.reduction_chunks(4096, 32768, 32768, column=True) == 32


@pytest.mark.usefixtures("fresh_records")
def test_without_the_device_the_codegens_defaults_stand_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_query(index: Any) -> None:
        raise AssertionError("asked a device that is not there")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_properties", no_query)
    record = devices.device_record(torch.device("cuda", 0))
    assert not record.available and record.properties == GPU_DEFAULTS
    assert not record.properties.measured
    assert record.choices == TRITON_CHOICES


@pytest.mark.usefixtures("fresh_records")
def test_the_records_decide_what_lowering_keeps_as_aten_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _two_gpus_of(monkeypatch, sms=132)
    cpu = devices.device_records({torch.device("cpu")})
    both = devices.device_records({torch.device("cpu"), torch.device("cuda", 0)})
    assert kernels.sort_limits(cpu, "auto") == ()
    assert kernels.sort_limits(both, "auto") == (("cuda", 0),)
    assert kernels.sort_limits(both, "reference") == ()
    assert kernels.unsupported_ops(both, "auto") == cpu[torch.device("cpu")].unsupported_ops | (
        both[torch.device("cuda", 0)].unsupported_ops
    )
    assert kernels.unsupported_ops(both, "extern") == frozenset()
    assert kernels.scheduling_choices(both) == kernels.DEFAULT_CHOICES  # two device types


def test_auto_settings_follow_the_device_types_defaults() -> None:
    from ember.runtime.backend import min_cut_partition, partition_fn

    assert devices.defaults_for("cuda").mincut and not devices.defaults_for("cpu").mincut
    assert devices.defaults_for("mps") == devices.defaults_for("cpu")
    with config.scope(partitioner="auto", layout="auto"):
        assert partition_fn("cuda").partition is min_cut_partition
        assert partition_fn("cpu").partition is not min_cut_partition
        assert config.layout_devices == ("cuda",)
        assert config.layout_by_convolution == ("cpu",)  # each convolution by its shapes
    with config.scope(layout="channels-last"):
        assert config.layout_devices == ("cuda", "cpu") and config.layout_by_convolution == ()
    with config.scope(layout="keep"):
        assert config.layout_devices == () and config.layout_by_convolution == ()
