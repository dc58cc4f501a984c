"""ember.runtime: the Ember compiler backend for PyTorch.

`torch.compile(model, backend="ember")` after `import ember.runtime` (or with
ember-runtime installed, through its entry point). `compile_graph` compiles one ATen
graph; `config` holds the settings (EMBER_* variables). The top of ember's stack: it
drives graphpasses -> ir -> scheduler -> codegen and runs what they produce.

The compiler's names (`compile_graph`, `ember_backend`, ...) are imported when first
used, not by `import ember.runtime`: their modules import Dynamo (about 3 s on the
2-core CPU), which a process that only loads ahead-of-time packages
(ember.runtime.aot) does not need. The backend's registration is
ember.runtime.registration's.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ember.runtime.config import EmberConfig, EmberConfigError, config
from ember.runtime.registration import register_unless_entry_point

if TYPE_CHECKING:
    from ember.runtime.backend import ember_backend, register
    from ember.runtime.compiler import (
        CompiledGraph,
        CompileRecord,
        EmberCompileError,
        compile_graph,
        compile_records,
    )

# name -> the module that defines it, imported at the name's first use
_LAZY = {
    "ember_backend": "ember.runtime.backend",
    "register": "ember.runtime.backend",
    "CompiledGraph": "ember.runtime.compiler",
    "CompileRecord": "ember.runtime.compiler",
    "EmberCompileError": "ember.runtime.compiler",
    "compile_graph": "ember.runtime.compiler",
    "compile_records": "ember.runtime.compiler",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ember.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
