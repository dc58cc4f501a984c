"""How `backend="ember"` becomes known to Dynamo, without importing Dynamo to find out.

Where ember-runtime is installed, its `torch_dynamo_backends` entry point names the
backend and Dynamo imports it when a program first asks for "ember": nothing needs to
happen at `import ember.runtime`, and a process that only loads ahead-of-time
packages (ember.runtime.aot) never imports Dynamo (about 3 s on the 2-core CPU).
Where it is not installed (the packages only on PYTHONPATH), the import of
`ember.runtime` registers the backend itself, which imports Dynamo.

Only the standard library is imported here; ember.runtime.backend is imported only to
register.
"""

from __future__ import annotations

import importlib.metadata


def entry_point_visible() -> bool:
    """Whether Dynamo's search of the `torch_dynamo_backends` entry points (the
    installed distributions on sys.path) finds ember's. Only ember-runtime's own
    metadata is read, not every distribution's: this runs at import time."""
    try:
        entry_points = importlib.metadata.distribution("ember-runtime").entry_points
    except importlib.metadata.PackageNotFoundError:
        return False
    return any(ep.group == "torch_dynamo_backends" and ep.name == "ember" for ep in entry_points)


def register_unless_entry_point() -> None:
    """The import of `ember.runtime`'s registration: where the entry point is visible,
    Dynamo registers the backend itself (when a program first names it), and that
    lookup may be what is importing this module, so registering here as well would make
    Dynamo's own registration fail as a duplicate. Where it is not, nothing else
    registers it."""
    if not entry_point_visible():
        from ember.runtime.backend import register

        register()
