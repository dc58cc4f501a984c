"""ember.codegen.triton: Triton kernel source for Ember's fused kernels (GPUs).

Renders the scheduler's `FusedKernel`s into Triton source plus launch metadata
(`render_kernel` -> `TritonKernel`): argument order, grid, candidate configs. It
renders text only; the runtime (ember.runtime.triton_kernels) compiles, tunes and
launches. Modules in processing order: plan (tiling, configs, grid), skeleton
(signature, block axes), body (DAG -> lines), optable (op -> Triton), helpers
(@triton.jit helpers: RNG, combines, the pair sort), pointwise, reduction, scan, sort,
kernel (entry).
"""

from ember.codegen.triton.kernel import TritonKernel, render_kernel
from ember.codegen.triton.optable import TRITON_OPS, UNSUPPORTED
from ember.codegen.triton.plan import (
    COLUMN_XBLOCK,
    MAX_SORT_LENGTH,
    GridSpec,
    KernelPlan,
    LaunchConfig,
    plan_kernel,
)
from ember.codegen.triton.printer import UnsupportedKernelError
from ember.scheduler import DeviceChoices

__all__ = [
    "COLUMN_XBLOCK",
    "GPU_SMS",
    "MAX_SORT_LENGTH",
    "TRITON_CHOICES",
    "TRITON_OPS",
    "UNSUPPORTED",
    "GridSpec",
    "KernelPlan",
    "LaunchConfig",
    "TritonKernel",
    "UnsupportedKernelError",
    "plan_kernel",
    "render_kernel",
    "triton_choices",
]


# Scheduling choices for GPU kernels: persistent reductions keep a row in registers,
# so recomputing an inlined producer per stage is cheap next to another memory pass.
# Reductions are split (ember.scheduler.split) until an H100/H200-class GPU (132 SMs)
# gets about 16 programs per SM, a few thousand in all, counting one program per
# COLUMN_XBLOCK outputs for a column reduction (plan.py's first column tile) and per
# output for a row one; each chunk reduces at least 256 elements. A column sum of
# [32768, 4096] becomes 32 chunks of 1024 rows: 2048 programs instead of 64.
GPU_SMS = 132  # the default where no device is at hand to ask


def triton_choices(sms: int = GPU_SMS) -> DeviceChoices:
    """The scheduling choices for a GPU of `sms` multiprocessors (the runtime reads the
    count off the device)."""
    return DeviceChoices(
        max_inline_ops=24,
        split_workers=max(1, sms) * 16,
        split_column_width=COLUMN_XBLOCK,
        split_min_chunk=256,
        split_max_chunks=1024,
    )


TRITON_CHOICES = triton_choices()
