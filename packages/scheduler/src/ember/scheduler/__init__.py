"""ember.scheduler: from an IR Program to an ordered Schedule with a memory plan.

Sits on ember.ir; the codegens render its kernels and the runtime executes it.
"""

from ember.scheduler.memory import plan_memory
from ember.scheduler.schedule import ExternCall, MemoryPlan, Schedule, SelectOutput, Step
from ember.scheduler.scheduler import schedule_program

__all__ = [
    "ExternCall",
    "MemoryPlan",
    "Schedule",
    "SelectOutput",
    "Step",
    "plan_memory",
    "schedule_program",
]
