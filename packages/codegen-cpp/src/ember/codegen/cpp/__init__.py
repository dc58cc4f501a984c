"""ember.codegen.cpp: C++/OpenMP kernel source for Ember's fused kernels (CPUs).

Renders the scheduler's fused kernels into one C++17 translation unit per graph. It
renders text only; the runtime compiles (with the system compiler) and loads. Until
the scheduler forms fused kernels every step is an extern call, so this layer
currently describes the device family it serves.
"""

from ember.codegen.cpp.target import CppTarget, cpp_target

__all__ = ["CppTarget", "cpp_target"]
