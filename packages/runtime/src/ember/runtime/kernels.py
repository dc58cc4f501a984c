"""Compiling fused kernels: pick the compiler for each kernel's device.

`EMBER_KERNELS` chooses: `auto` (the C++ codegen on CPUs, Triton on CUDA GPUs, when
their toolchains are present), `extern` (no generated kernels: every op runs as its
ATen kernel), or `reference` (run fused kernels with the scheduler's torch-op
interpreter: slow, for debugging and tests of the pipeline itself).

A compiler takes the kernels of one graph and returns a launcher per kernel name,
called with the kernel's buffer arguments then its size arguments.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import sympy
import torch

from ember.scheduler import DEFAULT_CHOICES, DeviceChoices, FusedKernel, run_kernel

Launcher = Callable[..., None]
KernelCompiler = Callable[..., dict[str, Launcher]]  # (kernels, *, cache_dir)

# device type -> (module, function) of the compiler for kernels on that device.
_COMPILERS = {
    "cpu": ("ember.runtime.cpp_kernels", "compile_cpp_kernels"),
    "cuda": ("ember.runtime.triton_kernels", "compile_triton_kernels"),
}


class KernelsUnavailable(RuntimeError):
    """No compiler for generated kernels on this device here."""


def reference_launcher(kernel: FusedKernel) -> Launcher:
    """A launcher that runs `kernel` with the scheduler's interpreter (torch ops)."""
    names = kernel.buffer_arguments()
    symbols = kernel.size_arguments()

    def launch(*args: Any) -> None:
        tensors, sizes = args[: len(names)], args[len(names) :]
        env: dict[str, Any] = dict(zip(names, tensors, strict=True))
        bindings: dict[sympy.Symbol, int] = {s: int(v) for s, v in zip(symbols, sizes, strict=True)}
        run_kernel(kernel, env, bindings)

    return launch


def compiler_for(device: torch.device, mode: str) -> KernelCompiler:
    """The kernel compiler to use for `device` under EMBER_KERNELS=`mode`."""
    if mode == "reference":
        return lambda kernels, *, cache_dir: {k.name: reference_launcher(k) for k in kernels}
    if mode != "auto":
        raise KernelsUnavailable(f"EMBER_KERNELS={mode}: generated kernels are off")
    if device.type not in _COMPILERS:
        raise KernelsUnavailable(f"ember generates no kernels for {device.type} devices")
    module_name, function = _COMPILERS[device.type]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise KernelsUnavailable(f"{module_name} is not available: {exc}") from exc
    compiler: KernelCompiler = getattr(module, function)
    return compiler


def compile_kernels(
    kernels: Sequence[FusedKernel], mode: str, cache_dir: Path
) -> dict[str, Launcher]:
    """Launchers for all `kernels`, each compiled for its own device."""
    launchers: dict[str, Launcher] = {}
    by_device: dict[str, list[FusedKernel]] = {}
    for kernel in kernels:
        by_device.setdefault(str(kernel.device), []).append(kernel)
    for device, group in by_device.items():
        launchers.update(compiler_for(torch.device(device), mode)(group, cache_dir=cache_dir))
    return launchers


def unsupported_ops(devices: set[torch.device], mode: str) -> frozenset[str]:
    """IR op names the codegens of `devices` cannot render (lowering keeps ATen ops
    that need them as ATen calls)."""
    if mode != "auto":
        return frozenset()
    names: set[str] = set()
    for device in devices:
        if device.type == "cpu":
            from ember.codegen.cpp import UNSUPPORTED_OPS

            names |= set(UNSUPPORTED_OPS)
        elif device.type == "cuda":
            from ember.codegen.triton import UNSUPPORTED

            names |= set(UNSUPPORTED)
    return frozenset(names)


def sort_limits(devices: set[torch.device], mode: str) -> tuple[tuple[str, int], ...]:
    """The longest row each device's codegen sorts (lowering keeps longer sorts and
    topks ATen calls); C++ sorts rows of any length.

    On CUDA none, for now: ember's Triton sort kernels order every NaN as the largest
    value, as eager's CPU sort does, but eager's CUDA sort put NaNs with the sign bit
    set elsewhere (H100, torch 2.11, 2026-11-24: a row of -NaN among ties sorted
    differently in 300 of 1800 elements, while the kernel matched the CPU order bit
    for bit). Until the kernels follow the CUDA order, CUDA sorts stay ATen calls
    (the codegen's own limit is `MAX_SORT_LENGTH`)."""
    if mode != "auto" or not any(d.type == "cuda" for d in devices):
        return ()
    return (("cuda", 0),)


def scheduling_choices(devices: set[torch.device]) -> DeviceChoices:
    """The scheduler's device-specific choices: the codegen's own for a single-device
    graph, the defaults otherwise."""
    types = {d.type for d in devices}
    if types == {"cpu"}:
        from ember.codegen.cpp import CPP_CHOICES

        return CPP_CHOICES
    if types == {"cuda"}:
        from ember.codegen.triton import triton_choices

        return triton_choices(multiprocessors(min(devices, key=str)))
    return DEFAULT_CHOICES


@functools.cache
def multiprocessors(device: torch.device) -> int:
    """The GPU's multiprocessor count, read off the device once (split reductions aim
    at a number of programs per multiprocessor)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def wants_loops(devices: set[torch.device], mode: str) -> bool:
    """Whether to lower to loop nodes: only when every device can run generated kernels."""
    if mode == "extern" or not devices:
        return False
    if mode == "reference":
        return True
    for device in devices:
        try:
            compiler_for(device, mode)
        except KernelsUnavailable:
            return False
    return True
