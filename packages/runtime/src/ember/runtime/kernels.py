"""Compiling fused kernels: pick the compiler for each kernel's device.

`EMBER_KERNELS` chooses: `auto` (the C++ codegen on CPUs, Triton on CUDA GPUs, when
their toolchains are present), `extern` (no generated kernels: every op runs as its
ATen kernel), or `reference` (run fused kernels with the scheduler's torch-op
interpreter: slow, for debugging and tests of the pipeline itself).

A compiler takes the kernels of one graph and returns a launcher per kernel name,
called with the kernel's buffer arguments then its size arguments.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import sympy
import torch

from ember.runtime.devices import DeviceRecord, device_record
from ember.scheduler import DEFAULT_CHOICES, DeviceChoices, FusedKernel, run_kernel

Launcher = Callable[..., None]
KernelCompiler = Callable[..., dict[str, Launcher]]  # (kernels, *, cache_dir)
Records = Mapping[torch.device, DeviceRecord]  # a graph's devices (ember.runtime.devices)


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


def compiler_for(record: DeviceRecord, mode: str) -> KernelCompiler:
    """The kernel compiler to use for `record`'s device under EMBER_KERNELS=`mode`."""
    if mode == "reference":
        return lambda kernels, *, cache_dir: {k.name: reference_launcher(k) for k in kernels}
    if mode != "auto":
        raise KernelsUnavailable(f"EMBER_KERNELS={mode}: generated kernels are off")
    if record.compiler is None:
        raise KernelsUnavailable(f"ember generates no kernels for {record.type} devices")
    module_name, function = record.compiler
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise KernelsUnavailable(f"{module_name} is not available: {exc}") from exc
    compiler: KernelCompiler = getattr(module, function)
    return compiler


def compile_kernels(
    kernels: Sequence[FusedKernel], mode: str, cache_dir: Path, records: Records
) -> dict[str, Launcher]:
    """Launchers for all `kernels`, each compiled for its own device."""
    launchers: dict[str, Launcher] = {}
    by_device: dict[str, list[FusedKernel]] = {}
    for kernel in kernels:
        by_device.setdefault(str(kernel.device), []).append(kernel)
    for device, group in by_device.items():
        record = records.get(torch.device(device)) or device_record(torch.device(device))
        launchers.update(compiler_for(record, mode)(group, cache_dir=cache_dir))
    return launchers


def unsupported_ops(records: Records, mode: str) -> frozenset[str]:
    """IR op names the codegens of the graph's devices cannot render (lowering keeps
    ATen ops that need them as ATen calls)."""
    if mode != "auto":
        return frozenset()
    return frozenset().union(*(r.unsupported_ops for r in records.values()))


def sort_limits(records: Records, mode: str) -> tuple[tuple[str, int], ...]:
    """The longest row each device type's codegen sorts, where there is a limit
    (lowering keeps longer sorts and topks ATen calls): `DeviceRecord.sort_limit`."""
    if mode != "auto":
        return ()
    limits = {r.type: r.sort_limit for r in records.values() if r.sort_limit is not None}
    return tuple(sorted(limits.items()))


def extern_depthwise(records: Records, setting: str = "auto") -> tuple[str, ...]:
    """The device types whose 2-d depthwise convolutions stay ATen calls under
    EMBER_DEPTHWISE=`setting`: 'auto', those whose record does not lower them
    (`DeviceRecord.lowers_depthwise`); 'aten', every one; 'loops', none."""
    if setting == "loops":
        return ()
    aten = setting == "aten"
    return tuple(sorted({r.type for r in records.values() if aten or not r.lowers_depthwise}))


def scheduling_choices(
    records: Records, matmul_templates: str = "off", training: bool = False
) -> DeviceChoices:
    """The scheduler's device-specific choices: the codegen's own for a graph on one
    device type (the first device's, with several GPUs), the defaults otherwise.

    `matmul_templates` (EMBER_MATMUL_TEMPLATES) 'on' turns matmul templates with fused
    epilogues on where the codegen renders them (`template_choices`). 'auto' leaves
    them off here: the compiler measures each matmul and asks for the templates that
    win (ember.runtime.matmul_choice). On the CPU, 'auto' turns them on for inference
    graphs (`training`: a training forward or backward) wherever torch's BLAS can
    compute the products (`cpu_templates`), and 'on' for every graph. In training
    steps they measured slower: GPT-2 0.92-0.94x and BERT 0.94-1.01x against ATen's
    matmuls, where inference was at 0.98-1.02x (2-core VM, 1 and 2 threads, one
    process, alternating rounds), and the demo's MLP 1.24x faster."""
    if len({r.type for r in records.values()}) != 1:
        return DEFAULT_CHOICES
    wanted = matmul_templates == "on" or (
        matmul_templates == "auto" and not training and cpu_templates(records)
    )
    if wanted:
        templates = template_choices(records)
        if templates is not None:
            return templates
    return min(records.values(), key=lambda r: str(r.device)).choices


def cpu_templates(records: Records) -> bool:
    """Whether a CPU graph's float32 matmuls become matmul kernels with their
    epilogues (ember.codegen.cpp.matmul_loops): wherever torch exports the BLAS
    `sgemm_` those kernels call for their blocks (ember.runtime.blas). No measuring and
    no rule by shape: a bound by shape lost to every product a kernel in whole models
    (benchmarks/results/cpu-demo-mlp-cpu-2core-2026-11-25-a61cf1a.md)."""
    if not records or any(r.type != "cpu" for r in records.values()):
        return False
    from ember.runtime.blas import sgemm_pointer

    return sgemm_pointer() is not None


def template_choices(records: Records) -> DeviceChoices | None:
    """The choices with matmul templates on (float32 products exact unless torch
    allows TF32 now), or None where the graph's codegen renders none."""
    if len({r.type for r in records.values()}) != 1:
        return None
    choices = min(records.values(), key=lambda r: str(r.device)).choices
    if not choices.matmul_templates:
        return None
    tf32 = bool(torch.backends.cuda.matmul.allow_tf32)
    return replace(choices, matmul_epilogues=True, matmul_tf32=tf32)


def measures_matmuls(records: Records, mode: str, matmul_templates: str) -> bool:
    """Whether EMBER_MATMUL_TEMPLATES=auto measures this graph's matmuls: generated
    kernels on CUDA GPUs whose codegen renders templates, compiled (not run by
    Triton's interpreter, whose times say nothing)."""
    if matmul_templates != "auto" or mode != "auto" or not records:
        return False
    if any(r.type != "cuda" for r in records.values()) or template_choices(records) is None:
        return False
    from ember.runtime.triton_kernels import interpreting

    return torch.cuda.is_available() and not interpreting()


def wants_loops(records: Records, mode: str) -> bool:
    """Whether to lower to loop nodes: only when every device can run generated kernels."""
    if mode == "extern" or not records:
        return False
    if mode == "reference":
        return True
    for record in records.values():
        try:
            compiler_for(record, mode)
        except KernelsUnavailable:
            return False
    return True
