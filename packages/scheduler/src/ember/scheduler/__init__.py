"""ember.scheduler: from an IR Program to an ordered Schedule with a memory plan.

Fuses loop nodes into `FusedKernel`s (the contract with the codegens), orders the
steps, and plans memory. Sits on ember.ir; the codegens render its kernels and the
runtime executes it.
"""

from ember.scheduler.choices import DEFAULT_CHOICES, DeviceChoices, DeviceProperties
from ember.scheduler.interpret import run_kernel, run_schedule
from ember.scheduler.kernel import (
    POINTWISE,
    REDUCTION,
    SCAN,
    SCATTER,
    SORT,
    FusedKernel,
    KernelMember,
    SortSpec,
)
from ember.scheduler.memory import plan_memory
from ember.scheduler.schedule import (
    Allocation,
    ExternCall,
    FusionNote,
    KernelStep,
    MemoryPlan,
    Schedule,
    SelectOutput,
    Step,
)
from ember.scheduler.scheduler import schedule_program
from ember.scheduler.traffic import computed_bytes, is_static, kernel_bytes, unfused_bytes

__all__ = [
    "DEFAULT_CHOICES",
    "POINTWISE",
    "REDUCTION",
    "SCAN",
    "SCATTER",
    "SORT",
    "Allocation",
    "DeviceChoices",
    "DeviceProperties",
    "ExternCall",
    "FusedKernel",
    "FusionNote",
    "KernelMember",
    "KernelStep",
    "MemoryPlan",
    "Schedule",
    "SelectOutput",
    "SortSpec",
    "Step",
    "computed_bytes",
    "is_static",
    "kernel_bytes",
    "plan_memory",
    "run_kernel",
    "run_schedule",
    "schedule_program",
    "unfused_bytes",
]
