"""ember.codegen.cpp: C++/OpenMP kernel source for Ember's fused kernels (CPUs).

Renders the scheduler's fused kernels (ember.scheduler.FusedKernel) into one C++17
translation unit per graph: standard headers only, OpenMP-parallel outer loops,
`omp simd` inner loops, reductions with per-lane and per-thread partials. It renders
text and call metadata only; the runtime (ember.runtime.cpp_kernels) compiles with
the system compiler, loads and calls.

Files in processing order: render.py (entry point, signatures), loops.py (pointwise
and scatter loop nests), reduction_loops.py (reduction passes), reductions.py
(accumulator rules), emitter.py (body DAG -> C++ statements), ops_table.py (one line
of C++ per op), indexing.py (sympy index -> C++), dtypes.py, prelude.py, errors.py;
info.py (what the runtime keeps of a unit) and choices.py (scheduling choices).

Only info.py's names are imported with the package; the others when first used
(`ember.codegen.cpp.render_kernels`, `from ember.codegen.cpp import CPP_CHOICES`):
a process that only loads compiled kernels then imports none of the renderer
(13 ms of a warm compile-cache hit on the 2-core CPU).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ember.codegen.cpp.info import CppSource, KernelArgument, KernelCheck, KernelInfo

if TYPE_CHECKING:
    from ember.codegen.cpp.choices import CPP_CHOICES
    from ember.codegen.cpp.errors import CppRenderError
    from ember.codegen.cpp.ops_table import OP_FORMATS, UNSUPPORTED_OPS
    from ember.codegen.cpp.prelude import PRELUDE
    from ember.codegen.cpp.render import kernel_arguments, render_kernel, render_kernels
    from ember.codegen.cpp.target import CppTarget, cpp_target

# name -> the module that defines it, imported at the name's first use
_LAZY = {
    "CPP_CHOICES": "choices",
    "CppRenderError": "errors",
    "OP_FORMATS": "ops_table",
    "UNSUPPORTED_OPS": "ops_table",
    "PRELUDE": "prelude",
    "kernel_arguments": "render",
    "render_kernel": "render",
    "render_kernels": "render",
    "CppTarget": "target",
    "cpp_target": "target",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ember.codegen.cpp' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ember.codegen.cpp.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "CPP_CHOICES",
    "OP_FORMATS",
    "PRELUDE",
    "UNSUPPORTED_OPS",
    "CppRenderError",
    "CppSource",
    "CppTarget",
    "KernelArgument",
    "KernelCheck",
    "KernelInfo",
    "cpp_target",
    "kernel_arguments",
    "render_kernel",
    "render_kernels",
]
