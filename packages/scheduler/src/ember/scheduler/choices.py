"""Device-specific scheduling choices, behind one small interface.

The scheduler is device-neutral; how much to fuse and when to split a reduction
depend on the device. Each codegen provides a `DeviceChoices` (ember.codegen.triton's
`TRITON_CHOICES`, ember.codegen.cpp's `CPP_CHOICES`); the runtime passes the right one
to `schedule_program`. The defaults here never split a reduction.

A codegen derives its choices from the `DeviceProperties` of the device a graph runs
on (a GPU's multiprocessor count sets how many programs a split reduction aims at);
the runtime reads them off the device (ember.runtime.devices).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeviceProperties:
    """What ember reads off one device, or assumes where there is none to ask.

    `multiprocessors`: a GPU's streaming multiprocessors (a CPU's usable cores).
    `shared_memory_per_block`: bytes of shared memory a GPU block may use without
    opting in to more (0 on a CPU). `warp_size`: threads that run in lockstep (1 on a
    CPU). `capability`: a CUDA device's (major, minor) compute capability, None
    elsewhere. `measured`: read off a device of this process (False: a codegen's
    documented defaults, for rendering where no such device is present).
    """

    multiprocessors: int
    shared_memory_per_block: int = 0
    warp_size: int = 1
    capability: tuple[int, int] | None = None
    measured: bool = False


@dataclass(frozen=True)
class DeviceChoices:
    """Knobs the scheduler consults.

    `max_members`: most IR nodes in one kernel (compile time and register pressure).
    `max_inline_ops`: a pointwise member is inlined into other members of its kernel
    (recomputed) only when its body has at most this many ops, and only while inlining
    adds at most this many ops to the reader; heavier producers stay in their own
    kernel rather than being computed again at every stage of a long chain.
    `horizontal`: fuse siblings that share inputs but not data.

    Split reductions (ember.scheduler.split): a reduction runs one worker (a GPU
    program, a CPU thread's work item) per output, or per `split_column_width`
    outputs when its loads are contiguous across outputs (a column sum: the codegen
    tiles neighbouring outputs together). When that gives fewer than `split_workers`
    workers, the reduction is cut into chunks so that about `split_workers` run, if
    that at least doubles the workers (2048 rows on a GPU that wants 2112 programs
    stay whole) and each unsplit worker has at least `split_min_work` elements to
    reduce (less takes a GPU program a microsecond or two, and splitting costs the
    final reduction's kernel and often a consumer's that no longer fuses with it);
    `split_workers=0` never splits. Each chunk reduces at least `split_min_chunk`
    elements (a partial result costs a store and a load) and there are at most
    `split_max_chunks` chunks per output (the final reduction's row).

    Matmul templates (ember.scheduler.epilogue): `matmul_templates` says the codegen
    renders matrix products as kernels of their own, with pointwise consumers fused
    as an epilogue (Triton's does; the C++ one does not). `matmul_epilogues` asks the
    scheduler to use them (the runtime sets it from EMBER_MATMUL_TEMPLATES, and only
    where `matmul_templates` holds); `matmul_tf32` lets float32 products round their
    operands to TF32 (torch's `allow_tf32` at compile time); `matmul_dtypes` names the
    operand dtypes the codegen's templates multiply (the C++ one: float32 alone).
    """

    max_members: int = 48
    max_inline_ops: int = 24
    horizontal: bool = True
    split_workers: int = 0
    split_column_width: int = 1
    split_min_chunk: int = 1024
    split_min_work: int = 0
    split_max_chunks: int = 1024
    matmul_templates: bool = False
    matmul_epilogues: bool = False
    matmul_tf32: bool = False
    matmul_dtypes: frozenset[torch.dtype] = frozenset(
        {torch.float16, torch.bfloat16, torch.float32}
    )

    def reduction_chunks(self, outputs: int, length: int, extent: int, column: bool) -> int:
        """How many chunks to cut each row of a static reduction into (1: leave it whole).

        `outputs` values, each over `length` elements; `extent` is the size of the
        reduction dimension that is cut, so the count must divide it (every chunk the
        same contiguous length, no masks); `column` says the loads are contiguous
        across outputs rather than along the row.
        """
        if self.split_workers <= 0 or outputs <= 0 or length <= 0:
            return 1
        width = max(self.split_column_width, 1) if column else 1
        workers = -(-outputs // width)
        if workers >= self.split_workers:
            return 1
        wanted = min(
            self.split_workers // workers,  # below 2: splitting would not double them
            self.split_max_chunks,
            length // max(self.split_min_chunk, 1),
        )
        for chunks in range(wanted, 1, -1):
            if extent % chunks == 0:
                return chunks
        return 1


DEFAULT_CHOICES = DeviceChoices()
