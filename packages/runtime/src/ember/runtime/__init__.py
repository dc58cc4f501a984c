"""ember.runtime: the Ember compiler backend for PyTorch.

`torch.compile(model, backend="ember")` after `import ember.runtime` (or with
ember-runtime installed, through its entry point). `compile_graph` compiles one ATen
graph; `config` holds the settings (EMBER_* variables). The top of ember's stack: it
drives graphpasses -> ir -> scheduler -> codegen and runs what they produce.
"""

from ember.runtime.backend import ember_backend, register, register_unless_entry_point
from ember.runtime.compiler import (
    CompiledGraph,
    CompileRecord,
    EmberCompileError,
    compile_graph,
    compile_records,
)
from ember.runtime.config import EmberConfig, EmberConfigError, config

register_unless_entry_point()

__all__ = [
    "CompileRecord",
    "CompiledGraph",
    "EmberCompileError",
    "EmberConfig",
    "EmberConfigError",
    "compile_graph",
    "compile_records",
    "config",
    "ember_backend",
    "register",
]
