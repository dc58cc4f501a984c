"""Write generated wrapper source to disk and load it as a module.

Files are content-addressed (`<cache_dir>/wrappers/<hash>.py`) and written
atomically (temp file + rename), so processes sharing a cache never see half a file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any


def write_source(directory: Path, source: str, suffix: str = ".py", prefix: str = "w") -> Path:
    """Write `source` under `directory` by its hash; return the path."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{prefix}{digest}{suffix}"
    if not path.exists():
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            handle.write(source)
        os.replace(tmp, path)
    return path


def load_module(path: Path, injected: dict[str, Any]) -> ModuleType:
    """Import the file at `path` as a fresh module and add `injected` to its globals."""
    spec = importlib.util.spec_from_file_location(f"ember_generated_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load generated module {path}")
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(injected)
    spec.loader.exec_module(module)
    return module
