"""ember.codegen.triton: Triton kernel source for Ember's fused kernels (GPUs).

Renders the scheduler's `FusedKernel`s into Triton source plus launch metadata
(`render_kernel` -> `TritonKernel`): argument order, grid, candidate configs. It
renders text only; the runtime (ember.runtime.triton_kernels) compiles, tunes and
launches. Modules in processing order: plan (tiling, configs, grid), skeleton
(signature, block axes), body (DAG -> lines), optable (op -> Triton), helpers
(@triton.jit helpers: RNG, combines), pointwise, reduction, kernel (entry).
"""

from ember.codegen.triton.kernel import TritonKernel, render_kernel
from ember.codegen.triton.optable import TRITON_OPS, UNSUPPORTED
from ember.codegen.triton.plan import GridSpec, KernelPlan, LaunchConfig, plan_kernel
from ember.codegen.triton.printer import UnsupportedKernelError
from ember.codegen.triton.target import TritonTarget, triton_target
from ember.scheduler import DeviceChoices

__all__ = [
    "TRITON_CHOICES",
    "TRITON_OPS",
    "UNSUPPORTED",
    "GridSpec",
    "KernelPlan",
    "LaunchConfig",
    "TritonKernel",
    "TritonTarget",
    "UnsupportedKernelError",
    "plan_kernel",
    "render_kernel",
    "triton_target",
]


# Scheduling choices for GPU kernels: persistent reductions keep a row in registers,
# so recomputing an inlined producer per stage is cheap next to another memory pass.
TRITON_CHOICES = DeviceChoices(max_inline_ops=24)
