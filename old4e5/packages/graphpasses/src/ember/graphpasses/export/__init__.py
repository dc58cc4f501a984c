"""Passes for torch.export programs: guards, custom-op profiles, module-call signatures,
runtime assertion removal. They work on `ExportedProgram.graph_module` (ATen level)."""

from ember.graphpasses.export.guards import insert_custom_op_guards
from ember.graphpasses.export.module_calls import (
    Constant,
    ModuleCallRecord,
    ModuleCallSignatures,
    collect_module_call_signatures,
)
from ember.graphpasses.export.profiles import (
    CustomOpProfile,
    TensorProfile,
    collect_custom_op_profiles,
)
from ember.graphpasses.export.runtime_asserts import remove_runtime_assertions

__all__ = [
    "Constant",
    "CustomOpProfile",
    "ModuleCallRecord",
    "ModuleCallSignatures",
    "TensorProfile",
    "collect_custom_op_profiles",
    "collect_module_call_signatures",
    "insert_custom_op_guards",
    "remove_runtime_assertions",
]
