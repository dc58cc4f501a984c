"""ember.scheduler: from an IR Program to an ordered Schedule with a memory plan.

Fuses loop nodes into `FusedKernel`s (the contract with the codegens), orders the
steps, and plans memory. Sits on ember.ir; the codegens render its kernels and the
runtime executes it.
"""

from ember.scheduler.choices import DEFAULT_CHOICES, DeviceChoices, DeviceProperties
from ember.scheduler.epilogue import (
    MATMUL_OPS,
    MatmulRoles,
    matmul_operands,
    matmul_roles,
    template_matmuls,
)
from ember.scheduler.interpret import run_kernel, run_schedule
from ember.scheduler.kernel import (
    POINTWISE,
    REDUCTION,
    SCAN,
    SCATTER,
    SORT,
    FusedKernel,
    KernelMember,
    MatmulSpec,
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
from ember.scheduler.traffic import (
    buffer_layouts,
    computed_bytes,
    is_static,
    kernel_bytes,
    unfused_bytes,
)

__all__ = [
    "DEFAULT_CHOICES",
    "MATMUL_OPS",
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
    "MatmulRoles",
    "MatmulSpec",
    "MemoryPlan",
    "Schedule",
    "SelectOutput",
    "SortSpec",
    "Step",
    "buffer_layouts",
    "computed_bytes",
    "is_static",
    "kernel_bytes",
    "matmul_operands",
    "matmul_roles",
    "plan_memory",
    "run_kernel",
    "run_schedule",
    "schedule_program",
    "template_matmuls",
    "unfused_bytes",
]
