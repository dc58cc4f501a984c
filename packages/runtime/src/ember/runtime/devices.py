"""One record per device type: what compiling a graph for a device needs to know.

`device_record(device)` gathers in one frozen `DeviceRecord`, for one device of this
process:

- whether the device is present here;
- its properties (`ember.scheduler.DeviceProperties`: multiprocessors, shared memory
  per block, warp size, capability), read off the device, or where it is absent the
  codegen's documented defaults (`ember.codegen.triton.GPU_DEFAULTS`);
- which codegen renders its kernels and which runtime module compiles them;
- what that codegen cannot do: the IR ops it cannot render and the longest row it
  sorts (lowering keeps ops that need more as ATen calls); and whether its depthwise
  convolutions beat the library's;
- the scheduling choices its codegen makes for it;
- the defaults of the settings whose 'auto' depends on the device type
  (`DeviceDefaults`).

The compile driver builds the records of a graph's devices once, when the compile
starts, and hands them down (ember.runtime.kernels); nothing else on the compile path
asks the device or branches on a device type's name for these. Records are kept per
device, a handful per process at most.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import torch

from ember.scheduler import DEFAULT_CHOICES, DeviceChoices, DeviceProperties


@dataclass(frozen=True)
class DeviceDefaults:
    """What the settings whose 'auto' depends on the device type choose for it.

    `recompute_shared`: recompute shared values wider than their inputs
    (`EMBER_RECOMPUTE=cuda`, the default). `mincut`: split training graphs with the
    min-cut partitioner (`EMBER_PARTITIONER=auto`). `eager_backward`: compile a
    training graph's backward with its forward (`EMBER_BACKWARD=auto`).
    `channels_last`: run convolution graphs channels-last (`EMBER_LAYOUT=auto`);
    `channels_last_by_convolution`: instead, each convolution in the layout its shapes
    favour (ember.graphpasses.favours_channels_last). `decompose_batch_norm`: trace a
    training batch norm as mean/var and pointwise ops rather than whole
    (`_native_batch_norm_legit_functional`, which ember.ir lowers too).
    The reasons, with the measurements, are at each setting's use
    (ember.runtime.backend, ember.runtime.compiler)."""

    recompute_shared: bool = False
    mincut: bool = False
    eager_backward: bool = False
    channels_last: bool = False
    channels_last_by_convolution: bool = False
    decompose_batch_norm: bool = True


# On GPUs the fused kernels are bound by memory: recomputing cheap values and saving
# fewer bytes wins; on CPUs the recomputed math costs more than the bytes it saves.
# Other device types (no generated kernels) take the CPU's.
DEFAULTS: dict[str, DeviceDefaults] = {
    "cuda": DeviceDefaults(
        recompute_shared=True, mincut=True, eager_backward=True, channels_last=True
    ),
    "cpu": DeviceDefaults(channels_last_by_convolution=True, decompose_batch_norm=False),
}


@dataclass(frozen=True)
class DeviceRecord:
    """Everything the compile path knows about one device (see the module docstring).

    `codegen`: the module that renders its kernels; `compiler`: (module, function)
    of the runtime's compiler for them; both None where ember generates no kernels
    for the device type. `sort_limit`: the longest row its generated kernels sort
    (None: any length; 0: none, sorts stay ATen calls). `lowers_depthwise`: its 2-d
    depthwise convolutions are loop nodes (ember.ir.depthwise), not library calls."""

    device: torch.device
    available: bool
    properties: DeviceProperties
    codegen: str | None
    compiler: tuple[str, str] | None
    unsupported_ops: frozenset[str]
    sort_limit: int | None
    lowers_depthwise: bool
    choices: DeviceChoices
    defaults: DeviceDefaults

    @property
    def type(self) -> str:
        return self.device.type


def device_record(device: torch.device) -> DeviceRecord:
    """The record of `device` (read off it once per process)."""
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return _record(device)


@functools.lru_cache(maxsize=64)  # keyed by device: a handful per process
def _record(device: torch.device) -> DeviceRecord:
    if device.type == "cuda":
        return _cuda_record(device)
    if device.type == "cpu":
        return _cpu_record(device)
    return DeviceRecord(
        device=device,
        available=True,
        properties=DeviceProperties(multiprocessors=1),
        codegen=None,
        compiler=None,
        unsupported_ops=frozenset(),
        sort_limit=None,
        lowers_depthwise=False,
        choices=DEFAULT_CHOICES,
        defaults=DEFAULTS["cpu"],
    )


def _cuda_record(device: torch.device) -> DeviceRecord:
    from ember.codegen.triton import GPU_DEFAULTS, UNSUPPORTED, UNVERIFIED, triton_choices

    properties = cuda_properties(device)
    available = properties is not None
    properties = properties or GPU_DEFAULTS
    return DeviceRecord(
        device=device,
        available=available,
        properties=properties,
        codegen="ember.codegen.triton",
        compiler=("ember.runtime.triton_kernels", "compile_triton_kernels"),
        unsupported_ops=frozenset(UNSUPPORTED) | frozenset(UNVERIFIED),
        # None, for now: ember's Triton sort kernels order every NaN as the largest
        # value, as eager's CPU sort does, but eager's CUDA sort put NaNs with the
        # sign bit set elsewhere (H100, torch 2.11, 2026-11-24: a row of -NaN among
        # ties sorted differently in 300 of 1800 elements, while the kernel matched
        # the CPU order bit for bit). Until the kernels follow the CUDA order, CUDA
        # sorts stay ATen calls (the codegen's own limit is `MAX_SORT_LENGTH`).
        sort_limit=0,
        # cuDNN compiles its channels-last depthwise kernels at run time on first use
        # (cuDNN 9.10 and later: 9-17 s of eager MobileNetV3's first training step on
        # an H100), and as ATen calls they split the batch norms and activations
        # around them into kernels of their own; memory-bound, they are loops ember
        # can generate. Off by default until the Triton kernels have run on a GPU
        # (benchmarks/depthwise_conv.py, test_triton_depthwise.py's `cuda` cases):
        # checked so far in Triton's interpreter only; EMBER_DEPTHWISE=loops turns
        # them on.
        lowers_depthwise=False,
        choices=triton_choices(properties),
        defaults=DEFAULTS["cuda"],
    )


def cuda_properties(device: torch.device) -> DeviceProperties | None:
    """The properties of a CUDA device, asked of the driver (through torch) once per
    process; None where there is no such device here. The one place that asks:
    the records, the compile cache's key and Triton's target read them from here.
    (Cheap to import: no codegen is loaded, for processes that only load kernels.)"""
    index = device.index
    if not torch.cuda.is_available():
        return None
    if index is None:
        index = torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        return None
    return _read_cuda_properties(index)


@functools.lru_cache(maxsize=64)  # keyed by device index
def _read_cuda_properties(index: int) -> DeviceProperties:
    found: Any = torch.cuda.get_device_properties(index)
    major, minor = getattr(found, "major", None), getattr(found, "minor", None)
    return DeviceProperties(
        multiprocessors=int(found.multi_processor_count),
        shared_memory_per_block=int(getattr(found, "shared_memory_per_block", 0)),
        warp_size=int(getattr(found, "warp_size", 32)),  # older torch: NVIDIA's 32
        capability=(int(major), int(minor)) if major is not None and minor is not None else None,
        measured=True,
    )


def _cpu_record(device: torch.device) -> DeviceRecord:
    from ember.codegen.cpp import CPP_CHOICES, UNSUPPORTED_OPS

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return DeviceRecord(
        device=device,
        available=True,
        properties=DeviceProperties(multiprocessors=cores or 1, measured=True),
        codegen="ember.codegen.cpp",
        compiler=("ember.runtime.cpp_kernels", "compile_cpp_kernels"),
        unsupported_ops=frozenset(UNSUPPORTED_OPS),
        sort_limit=None,  # C++ sorts rows of any length
        # oneDNN's channels-last depthwise kernels win: one thread, 2-core AMD EPYC,
        # float32 inference, eager channels-last against ember's C++ kernel (which
        # ember's layout pass runs channels-last too): [32, 96, 56, 56] 3x3 stride 1
        # 19.7 ms against 26.0, stride 2 2.1 against 7.6, [32, 480, 14, 14] 5x5 3.7
        # against 18.1 (eager NCHW: 57.0, 29.1, 19.3 ms)
        lowers_depthwise=False,
        choices=CPP_CHOICES,
        defaults=DEFAULTS["cpu"],
    )


def device_records(devices: set[torch.device]) -> dict[torch.device, DeviceRecord]:
    """The records of a graph's devices, by device."""
    return {d: device_record(d) for d in sorted(devices, key=str)}


def defaults_for(device_type: str) -> DeviceDefaults:
    """The 'auto' defaults of a device type (the CPU's for types without their own)."""
    return DEFAULTS.get(device_type, DEFAULTS["cpu"])
