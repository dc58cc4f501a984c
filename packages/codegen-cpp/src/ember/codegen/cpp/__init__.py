"""ember.codegen.cpp: C++/OpenMP kernel source for Ember's fused kernels (CPUs).

Renders the scheduler's fused kernels (ember.scheduler.FusedKernel) into one C++17
translation unit per graph: standard headers only, OpenMP-parallel outer loops,
`omp simd` inner loops, reductions with per-lane and per-thread partials. It renders
text and call metadata only; the runtime (ember.runtime.cpp_kernels) compiles with
the system compiler, loads and calls.

Files in processing order: render.py (entry point, signatures), loops.py (pointwise
and scatter loop nests), reduction_loops.py (reduction passes), reductions.py
(accumulator rules), emitter.py (body DAG -> C++ statements), ops_table.py (one line
of C++ per op), indexing.py (sympy index -> C++), dtypes.py, prelude.py, errors.py.
"""

import torch

from ember.codegen.cpp.errors import CppRenderError
from ember.codegen.cpp.ops_table import OP_FORMATS, UNSUPPORTED_OPS
from ember.codegen.cpp.prelude import PRELUDE
from ember.codegen.cpp.reduction_loops import LANES, SPLIT_MIN
from ember.codegen.cpp.render import (
    CppSource,
    KernelArgument,
    KernelInfo,
    kernel_arguments,
    render_kernel,
    render_kernels,
)
from ember.codegen.cpp.target import CppTarget, cpp_target
from ember.scheduler import DeviceChoices

__all__ = [
    "CPP_CHOICES",
    "OP_FORMATS",
    "PRELUDE",
    "UNSUPPORTED_OPS",
    "CppRenderError",
    "CppSource",
    "CppTarget",
    "KernelArgument",
    "KernelInfo",
    "cpp_target",
    "kernel_arguments",
    "render_kernel",
    "render_kernels",
]


# Scheduling choices for CPU kernels: recomputing an inlined producer costs a full
# extra pass per reduction stage here (and a transcendental op, vectorised, still costs
# tens of vector operations per element), so only cheap producers are inlined; longer
# chains are stored once instead.
# A reduction is split (ember.scheduler.split) when it has fewer work items than
# threads (one per output, or per LANES outputs in a column reduction), into chunks
# of at least SPLIT_MIN elements: the same rule as the kernels' per-thread partials.
CPP_CHOICES = DeviceChoices(
    max_inline_ops=8,
    split_workers=torch.get_num_threads(),
    split_column_width=LANES,
    split_min_chunk=SPLIT_MIN,
    split_max_chunks=256,
)
