"""ember.codegen.triton: Triton kernel source for Ember's fused kernels (GPUs).

Renders the scheduler's `FusedKernel`s into Triton source plus launch metadata
(`render_kernel` -> `TritonKernel`): argument order, grid, candidate configs. It
renders text only; the runtime (ember.runtime.triton_kernels) compiles, tunes and
launches. Modules in processing order: plan (tiling, configs, grid), skeleton
(signature, block axes), body (DAG -> lines), optable (op -> Triton), helpers
(@triton.jit helpers: RNG, combines, the pair sort, the scatters' compare-and-swap
loops), pointwise (and scatter), reduction, scan, sort, gemm (the matmul template, its
pointwise consumers fused as an epilogue), kernel (entry).
"""

from ember.codegen.triton.kernel import TritonKernel, render_kernel
from ember.codegen.triton.optable import TRITON_OPS, UNSUPPORTED, UNVERIFIED
from ember.codegen.triton.plan import (
    COLUMN_XBLOCK,
    MAX_SORT_LENGTH,
    GridSpec,
    KernelPlan,
    LaunchConfig,
    plan_kernel,
)
from ember.codegen.triton.printer import UnsupportedKernelError
from ember.scheduler import DeviceChoices, DeviceProperties

__all__ = [
    "COLUMN_XBLOCK",
    "GPU_DEFAULTS",
    "MAX_SORT_LENGTH",
    "TRITON_CHOICES",
    "TRITON_OPS",
    "UNSUPPORTED",
    "UNVERIFIED",
    "GridSpec",
    "KernelPlan",
    "LaunchConfig",
    "TritonKernel",
    "UnsupportedKernelError",
    "plan_kernel",
    "render_kernel",
    "triton_choices",
]


# The GPU assumed where none is at hand to ask (rendering on a machine without one,
# tests, benchmarks that plan kernels): an H100, the GPU ember is measured on
# (132 SMs; 48 KiB of shared memory per block without opting in; sm_90). On a GPU
# the runtime reads the real values (ember.runtime.devices).
GPU_DEFAULTS = DeviceProperties(
    multiprocessors=132, shared_memory_per_block=48 * 1024, warp_size=32, capability=(9, 0)
)


# Scheduling choices for GPU kernels: persistent reductions keep a row in registers,
# so recomputing an inlined producer per stage is cheap next to another memory pass.
# Reductions are split (ember.scheduler.split) until the GPU gets about 16 programs
# per multiprocessor (2112 on an H100's 132), counting one program per COLUMN_XBLOCK
# outputs for a column reduction (plan.py's first column tile) and per output for a
# row one; each chunk reduces at least 256 elements. A column sum of [32768, 4096]
# becomes 32 chunks of 1024 rows: 2048 programs instead of 64. Measured and rejected
# (H100, 2026-11-24, MobileNetV3 training step): counting a column reduction's programs
# by (chunk, output) pairs with chunks of 32+ rows sped its batch-norm statistics by 8%
# (548 -> 505 us) but slowed the backward's fused column sums 2.3x (231 -> 542 us):
# 5.14 ms of kernels per step against 4.78.
def triton_choices(properties: DeviceProperties = GPU_DEFAULTS) -> DeviceChoices:
    """The scheduling choices for the GPU of `properties`."""
    return DeviceChoices(
        max_inline_ops=24,
        matmul_templates=True,  # ember.codegen.triton.gemm
        split_workers=max(1, properties.multiprocessors) * 16,
        split_column_width=COLUMN_XBLOCK,
        split_min_chunk=256,
        split_max_chunks=1024,
        # T5-small's RMSNorm (2048 rows of 512) and llama_small's (512 of 512) ran as
        # a partial, a final and a pointwise kernel where one does (H100, 2026-11-25)
        split_min_work=8192,
    )


TRITON_CHOICES = triton_choices()
