"""Keep generated Python source in the verified cache and load it as a module.

`write_source(directory, source)` stores `source` as an entry of an
`ember.runtime.store.EntryStore` in `directory`, keyed by the source's hash
(`<directory>/<prefix><hash>/<prefix><hash><suffix>`, beside the entry's
checksums), and returns the file's path. An entry already there is reused only when it
passes its check and holds this very source; else it is written anew. In the cache
directory, the write keeps the cache under its size cap (`ember.runtime.cache`).

`load_module(path, injected)` reads the file back, checked with its entry
(`store.read_file`), and executes exactly the text it checked: compiled with
`compile()` into a fresh module, not imported, so no `__pycache__` `.pyc` is ever
written or read and nothing else in the cache directory runs. A file that is missing
or fails its check is an ImportError naming it (the compile driver then runs the graph
eagerly); a text that does not parse is the SyntaxError `compile()` raises. The text
is also put into `linecache` under the file's path, with no modification time so it is
never re-read from disk: that is where `inspect.getsource` finds it, and so where
Triton's `@triton.jit` reads each kernel's source (in its interpreter too), and where
tracebacks take their lines. The file stays on disk for debuggers and for the Triton
compile workers, which load it the same way (ember/runtime/compile_worker.py).
`execute_source(path, data, injected)` is that execution for source already checked
in memory (a loaded artifact's wrapper, against its manifest's hash).
"""

from __future__ import annotations

import hashlib
import linecache
from pathlib import Path
from types import ModuleType
from typing import Any

from ember.runtime.cache import entry_store
from ember.runtime.store import read_file


def write_source(directory: Path, source: str, suffix: str = ".py", prefix: str = "w") -> Path:
    """Store `source` under `directory` by its hash; return the path of its file."""
    data = source.encode()
    key = f"{prefix}{hashlib.sha256(data).hexdigest()[:24]}"
    name = f"{key}{suffix}"
    store = entry_store(directory)
    entry = store.get(key)
    if entry is not None and entry.files.get(name) != data:
        reason = f"it does not hold the source {name} it is named after"
        store.discard(key, reason, entry=entry)
        entry = None
    if entry is None:
        entry = store.put(key, {name: data})
        if entry.files.get(name) != data:  # another writer's entry under this key
            raise ImportError(f"the cache entry {entry.directory} holds another source")
    return entry.path(name)


def load_module(path: Path, injected: dict[str, Any]) -> ModuleType:
    """Execute the source file at `path` (one that `write_source` wrote, checked again
    here) as a fresh module whose globals start with `injected`."""
    path = Path(path)
    data = read_file(path)
    if data is None:
        raise ImportError(
            f"generated module {path} is missing from the cache or fails its check "
            "(see the warning above); it is not loaded"
        )
    return execute_source(path, data, injected)


def execute_source(path: Path, data: bytes, injected: dict[str, Any]) -> ModuleType:
    """Execute `data`, source its caller has checked (`load_module` against its cache
    entry, a loaded artifact against its manifest's hash), as a fresh module whose
    globals start with `injected`, under the file name `path` (where a copy lies for
    debuggers; the text run is `data` itself, never re-read)."""
    filename = str(path)
    text = data.decode()
    code = compile(text, filename, "exec", dont_inherit=True)
    module = ModuleType(f"ember_generated_{Path(path).stem}")
    module.__file__ = filename
    module.__dict__.update(injected)
    # (size, mtime None: never checked against the file, lines, name): inspect.getsource
    # and so Triton's jit read exactly the text that runs
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    exec(code, module.__dict__)
    return module
