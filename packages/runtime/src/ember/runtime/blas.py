"""The BLAS `sgemm_` that CPU matmul kernels call for their blocks' products.

ember.codegen.cpp renders a float32 matmul with its epilogue as one kernel that cuts
the output into blocks over the threads and computes each block's product with a
Fortran-interface `sgemm_` (ember.codegen.cpp.gemm_prelude), which the runtime hands
to each kernel library as it loads it (`ember_set_sgemm`). The function is torch's
own: the MKL (or OpenBLAS) that ATen's `addmm` calls, found in the libraries torch has
already loaded, so ember's products accumulate like eager's and nothing new is
installed. Where torch exports none (a build without a BLAS, or one that hides its
symbols), `sgemm_pointer()` is None and CPU matmuls stay ATen calls: the kernels'
portable loop is there for odd strides, not to be the product of every matmul.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SYMBOL = "sgemm_"
LIBRARIES = ("libtorch_cpu.so", "libtorch_cpu.dylib")


@functools.cache
def sgemm_pointer() -> int | None:
    """The address of torch's `sgemm_`, or None where torch exports none."""
    directory = Path(torch.__file__).parent / "lib"
    for name in LIBRARIES:
        path = directory / name
        if not path.exists():
            continue
        try:
            library = ctypes.CDLL(str(path))  # already loaded by torch: its handle
            address = ctypes.cast(getattr(library, SYMBOL), ctypes.c_void_p).value
        except (OSError, AttributeError):
            continue
        if address:
            return int(address)
    log.info("torch exports no %s: CPU matmuls stay ATen calls", SYMBOL)
    return None


__all__ = ["sgemm_pointer"]
