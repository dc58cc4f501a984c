"""Scheduling choices for the CPU kernels this codegen renders (ember.scheduler's
`DeviceChoices`), which the runtime passes to the scheduler for CPU graphs."""

from __future__ import annotations

import torch

from ember.codegen.cpp.reduction_loops import LANES, SPLIT_MIN
from ember.scheduler import DeviceChoices

# Scheduling choices for CPU kernels: recomputing an inlined producer costs a full
# extra pass per reduction stage here (and a transcendental op, vectorised, still costs
# tens of vector operations per element), so only cheap producers are inlined; longer
# chains are stored once instead.
# A reduction is split (ember.scheduler.split) when it has fewer work items than
# threads (one per output, or per LANES outputs in a column reduction), into chunks
# of at least SPLIT_MIN elements: the same rule as the kernels' per-thread partials.
# Matmul templates (float32 products, blocked over threads with their epilogues:
# ember.codegen.cpp.matmul_loops) are rendered; the runtime asks for them.
CPP_CHOICES = DeviceChoices(
    max_inline_ops=8,
    split_workers=torch.get_num_threads(),
    split_column_width=LANES,
    split_min_chunk=SPLIT_MIN,
    split_max_chunks=256,
    matmul_templates=True,
    matmul_dtypes=frozenset({torch.float32}),
)
