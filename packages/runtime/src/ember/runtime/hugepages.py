"""Transparent huge pages for large CPU buffers that a compiled graph allocates.

glibc serves an allocation of 32 MiB or more (its largest mmap threshold) with a fresh
mapping and unmaps it at free, so every call that allocates such an output faults it
in again, one 4 KiB page at a time: on the 2-core development VM a 33.5 MB float32
output cost about 20 ms of faults against a 1.8 ms GELU kernel that fills it (eager
and Inductor pay the same). Smaller buffers come back from glibc's heap already
mapped. Where the kernel's transparent-huge-page mode is `madvise` (a common default),
`madvise(MADV_HUGEPAGE)` on the untouched range before the kernel writes it makes the
faults 2 MiB at a time: 20 -> 2.4 ms for that output
(benchmarks/results/cpu-kernels-2core-2026-11-24-7109a11.md). torch does the same
for all its allocations of 2 MiB or more when `THP_MEM_ALLOC_ENABLE=1` is set before
it loads; this does it for ember's own large outputs without that setting. Where madvise is
missing (not Linux) or refuses, nothing happens.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable

import torch

HUGE_MIN = 32 << 20  # bytes: glibc's largest mmap threshold, below which memory is reused
_PAGE = 4096
_MADV_HUGEPAGE = 14  # Linux's value on every architecture


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    advise: Callable[[int, int, int], int] = function
    return advise


def advise_huge_pages(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`, whose storage, if it is a CPU buffer of at least HUGE_MIN bytes, is
    marked for huge pages (the whole pages inside it; the storage must not have been
    written yet for this to save faults)."""
    storage = tensor.untyped_storage()
    nbytes = storage.nbytes()
    if nbytes < HUGE_MIN or tensor.device.type != "cpu":
        return tensor
    madvise = _madvise()
    if madvise is not None:
        start = storage.data_ptr()
        first = (start + _PAGE - 1) // _PAGE * _PAGE
        last = (start + nbytes) // _PAGE * _PAGE
        madvise(first, last - first, _MADV_HUGEPAGE)  # a refusal only costs the faults
    return tensor
