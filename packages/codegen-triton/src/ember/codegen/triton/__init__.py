"""ember.codegen.triton: Triton kernel source for Ember's fused kernels (GPUs).

Renders the scheduler's fused kernels into Triton source plus launch metadata. It
renders text only; the runtime compiles and launches. Until the scheduler forms fused
kernels every step is an extern call, so this layer currently describes the device
family it serves and whether the Triton toolchain is usable here.
"""

from ember.codegen.triton.target import TritonTarget, triton_target

__all__ = ["TritonTarget", "triton_target"]
