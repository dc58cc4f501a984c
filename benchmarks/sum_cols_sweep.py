"""Split column sums (`x.sum(0)`, 32768 x 4096 bf16) over tile, split and warp choices.

    python benchmarks/sum_cols_sweep.py [--grid wide|tall|more|policies|order|few]

The kernels have the shape of ember's sum_cols schedule (benchmarks/triton_kernels.py):
a partial sum of each column over each of SPLITS row chunks ([XBLOCK columns x RBLOCK
rows] tiles, float32 accumulators), then a final kernel summing the partials. Each
config is timed with `do_bench` (which zeroes 256 MB between runs to flush L2) and the
time is shown as a share of the copy bandwidth measured the same way: the question is
how close to 90% of the copy any such schedule gets on this GPU. The H100 run
(2026-11-22, ff8bcb9) covered the grids `tall` (64-256 columns x 8-64 rows), `wide`
(512-4096 columns), `more` (many short chunks) and `policies` (eviction policy, split
order); see
benchmarks/results/gpu-h100-2026-11-22-ff8bcb9.md.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections.abc import Callable, Iterable

import torch
import triton
import triton.language as tl

M, N = 32768, 4096


@triton.jit  # type: ignore[untyped-decorator]  # Triton is untyped
def partial_sum(  # type: ignore[no-untyped-def]  # jit kernel
    x_ptr,
    out_ptr,
    M,
    N: tl.constexpr,
    CHUNK: tl.constexpr,
    XBLOCK: tl.constexpr,
    RBLOCK: tl.constexpr,
    POLICY: tl.constexpr,
    SPLITS: tl.constexpr,
    SPLIT_FAST: tl.constexpr,
    INTERLEAVE: tl.constexpr,
):
    tiles: tl.constexpr = N // XBLOCK
    pid = tl.program_id(0)
    if SPLIT_FAST:  # neighbouring programs take the same columns' other chunks
        split = pid % SPLITS
        tile = pid // SPLITS
    else:  # neighbouring programs take the same rows' other columns
        split = pid // tiles
        tile = pid % tiles
    cols = tile * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    base = split * CHUNK
    acc = tl.full([XBLOCK, RBLOCK], 0, tl.float32)
    for r in range(0, CHUNK, RBLOCK):
        if INTERLEAVE:  # chunk s takes rows s, s + SPLITS, s + 2 * SPLITS, ...
            rows = (r + tl.arange(0, RBLOCK)[None, :]) * SPLITS + split
        else:  # chunk s takes the rows [s * CHUNK, (s + 1) * CHUNK)
            rows = base + r + tl.arange(0, RBLOCK)[None, :]
        mask = (rows < M) & (cols < N)
        v = tl.load(x_ptr + rows * N + cols, mask, other=0.0, eviction_policy=POLICY)
        acc = acc + tl.where(mask, v.to(tl.float32), 0)
    tl.store(out_ptr + split * N + cols, tl.sum(acc, 1)[:, None], cols < N)


@triton.jit  # type: ignore[untyped-decorator]
def final_sum(p_ptr, out_ptr, N: tl.constexpr, S: tl.constexpr, XBLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    cols = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    s = tl.arange(0, S)[None, :]
    v = tl.load(p_ptr + s * N + cols, cols < N, other=0.0)
    tl.store(out_ptr + cols, tl.sum(v, 1)[:, None].to(tl.bfloat16), cols < N)


def column_sum(
    x: torch.Tensor,
    xb: int,
    rb: int,
    warps: int,
    splits: int,
    policy: str = "",
    fast: bool = False,
    interleave: bool = False,
    final: bool = True,
) -> Callable[[], torch.Tensor]:
    """A two-kernel column sum of `x` with this config, as a callable (only its first
    kernel, the partial sums, when not `final`)."""
    part = torch.empty(splits, N, device=x.device, dtype=torch.float32)
    out = torch.empty(N, device=x.device, dtype=torch.bfloat16)
    final_block = max(1, min(64, 8192 // splits))
    grid = ((N // xb) * splits,)

    def step() -> torch.Tensor:
        partial_sum[grid](
            x,
            part,
            M,
            N,
            M // splits,
            xb,
            rb,
            policy,
            splits,
            fast,
            interleave,
            num_warps=warps,
            num_stages=1,
        )
        if not final:
            return part
        final_sum[(N // final_block,)](part, out, N, splits, final_block, num_warps=4)
        return out

    return step


# (XBLOCK, RBLOCK, warps, splits) per grid
GRIDS: dict[str, Iterable[tuple[int, int, int, int]]] = {
    "tall": [
        c
        for c in itertools.product((64, 128, 256), (8, 16, 32, 64), (4, 8), (16, 32, 64))
        if 4 <= c[0] * c[1] // (c[2] * 32) <= 64
    ],
    "wide": [
        c
        for c in itertools.product(
            (512, 1024, 2048, 4096), (1, 2, 4, 8), (4, 8, 16), (32, 128, 512)
        )
        if 4 <= c[0] * c[1] // (c[2] * 32) <= 64 and (N // c[0]) * c[3] >= 128
    ],
    "more": [
        (64, 32, 4, 128),
        (64, 32, 4, 256),
        (64, 64, 4, 128),
        (128, 32, 4, 256),
        (64, 16, 2, 256),
    ],
    "policies": [(64, 64, 4, 16), (64, 32, 2, 32), (1024, 8, 4, 128), (4096, 4, 16, 256)],
    # `--grid order`: chunked against interleaved rows, with and without the final kernel
    "order": [
        (64, 32, 4, 32),
        (64, 64, 4, 16),
        (64, 32, 4, 64),
        (128, 32, 4, 32),
        (128, 16, 4, 64),
        (256, 16, 4, 32),
    ],
    # `--grid few`: one to four chunks of narrow columns, about one wave of programs;
    # the partial kernel alone is the time a one-kernel column sum would take
    "few": [
        (16, 128, 4, 1),
        (16, 256, 4, 1),
        (32, 64, 4, 1),
        (32, 128, 4, 1),
        (32, 256, 8, 1),
        (32, 128, 4, 2),
        (64, 64, 4, 2),
        (64, 128, 8, 2),
        (64, 64, 4, 4),
        (128, 32, 4, 4),
    ],
}


def order_table(x: torch.Tensor, ref: torch.Tensor, copy_us: dict[str, float], grid: str) -> None:
    """Each config of `grid` chunked and interleaved, whole and its partial kernel alone,
    under both flushes: where the time above the copy's floor goes."""
    flushes = _flushes()
    for xb, rb, warps, splits in GRIDS[grid]:
        for interleave in (False, True) if splits > 1 else (False,):
            whole = column_sum(x, xb, rb, warps, splits, interleave=interleave)
            partial = column_sum(x, xb, rb, warps, splits, interleave=interleave, final=False)
            error = (whole().float() - ref).abs().max().item()
            cells = []
            for name, flush in flushes.items():
                for fn in (whole, partial):
                    us = median_us(fn, flush)
                    cells.append(f"{name} {us:6.1f} us {copy_us[name] / 2 / us * 100:5.1f}%")
            order = "interleaved" if interleave else "chunked"
            print(
                f"{xb:4d} x {rb:3d} w{warps} S{splits:3d} {order:11s} err {error:.2g}: "
                + " | ".join(cells),
                flush=True,
            )


def _flushes() -> dict[str, Callable[[], object]]:
    buffer = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    return {"zero": lambda: buffer.zero_(), "read": lambda: buffer.view(torch.int32).sum()}


def median_us(fn: Callable[[], object], flush: Callable[[], object], n: int = 40) -> float:
    """Median of `n` runs of `fn`, each after `flush()`, in microseconds (CUDA events)."""
    times = []
    for _ in range(3):
        flush()
        fn()
    for _ in range(n):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grid", default="tall", choices=sorted(GRIDS))
    args = parser.parse_args()
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    ref = x.float().sum(0)
    flush_buffer = torch.empty(256 << 20, dtype=torch.int8, device="cuda")

    def flush() -> None:  # what do_bench does between runs
        flush_buffer.zero_()

    copy = median_us(lambda: y.copy_(x), flush)
    if args.grid in ("order", "few"):
        copies = {name: median_us(lambda: y.copy_(x), f) for name, f in _flushes().items()}
        print("copy " + ", ".join(f"{k} flush {v:.1f} us" for k, v in copies.items()))
        order_table(x, ref, copies, args.grid)
        return
    print(f"copy {copy:.1f} us; 90% of the copy's bandwidth for the sum: {copy / 2 / 0.9:.1f} us")
    policies = ("", "evict_first", "evict_last") if args.grid == "policies" else ("",)
    rows = []
    for (xb, rb, warps, splits), policy, fast in itertools.product(
        GRIDS[args.grid], policies, (False, True)
    ):
        step = column_sum(x, xb, rb, warps, splits, policy, fast)
        error = (step().float() - ref).abs().max().item()
        us = median_us(step, flush)
        rows.append((us, xb, rb, warps, splits, policy or "none", fast, error))
        print(
            f"{xb:5d} x {rb:3d} w{warps:2d} splits {splits:4d} {policy or 'none':11s} "
            f"split-fast {fast:d}: {us:6.1f} us, {copy / 2 / us * 100:5.1f}% (max err {error:.3g})",
            flush=True,
        )
    print("== fastest")
    for us, xb, rb, warps, splits, policy, fast, _ in sorted(rows)[:8]:
        print(
            f"{xb:5d} x {rb:3d} w{warps:2d} splits {splits:4d} {policy:11s} split-fast {fast:d}: "
            f"{us:6.1f} us, {copy / 2 / us * 100:5.1f}%"
        )


if __name__ == "__main__":
    main()
