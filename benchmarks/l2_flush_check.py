"""Does the L2 flush between timed runs penalise read-only kernels?

    python benchmarks/l2_flush_check.py

`triton.testing.do_bench` zeroes a 256 MB buffer before each run, which leaves L2 full
of dirty lines that the timed kernel's traffic must write back. A copy writes anyway;
a kernel that only reads (a reduction) pays for writes it does not make. This times a
copy, row and column sums (eager, Inductor, and the split column sum of
sum_cols_sweep.py) after three flushes: zeroing (do_bench's), reading 256 MB (L2 left
clean), none. Run on the H100 machine (2026-11-22, ff8bcb9); the table is in
benchmarks/results/gpu-h100-2026-11-22-ff8bcb9.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sum_cols_sweep import M, N, column_sum, median_us


def main() -> None:
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    buffer = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    flushes = {
        "zeroing (do_bench)": lambda: buffer.zero_(),
        "reading": lambda: buffer.view(torch.int32).sum(),
        "none": lambda: None,
    }
    rows = torch.compile(lambda t: t.sum(1))
    cols = torch.compile(lambda t: t.sum(0))
    kernels = {
        "copy": (lambda: y.copy_(x), 2 * x.numel() * 2),
        "sum_rows eager": (lambda: x.sum(1), x.numel() * 2),
        "sum_rows inductor": (lambda: rows(x), x.numel() * 2),
        "sum_cols inductor": (lambda: cols(x), x.numel() * 2),
        "sum_cols 64x64, 16 splits": (column_sum(x, 64, 64, 4, 16), x.numel() * 2),
        "x.sum() eager": (lambda: x.sum(), x.numel() * 2),
    }
    print(f"{'kernel':26s}" + "".join(f"{name:>24s}" for name in flushes) + "   (us, TB/s)")
    for name, (fn, nbytes) in kernels.items():
        fn()
        cells = []
        for flush in flushes.values():
            us = median_us(fn, flush, n=60)
            cells.append(f"{us:8.1f} {nbytes / us / 1e6:5.2f}")
        print(f"{name:26s}" + "".join(f"{c:>24s}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
