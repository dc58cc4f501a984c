"""A fingerprint of ember's own source: what a compiled artifact depends on beyond
the version numbers.

In a development install (the workspace's editable packages) the versions stay the
same while the code changes, so a compile cache keyed on versions alone would go on
replaying artifacts compiled by older code: stale kernels, possibly wrong numbers.
`source_fingerprint()` is a SHA-256 over every `.py` file of the six ember packages
(`SOURCE_PACKAGES`), each named by its package and its path there, and hashed by
its bytes, not its modification time: two installs of the same source (a wheel on
another machine, a copy of the workspace) agree, and any edit, added, removed or
renamed file changes it. It is computed once per process, at first use (about 170
files, 1.5 MB: about 3 ms of CPU time once the files are in the page cache).

It joins the versions an artifact records (`ember.runtime.artifact.versions`), so
the compile cache's key covers it and a saved artifact or package built by other
ember source is refused at load, as one built by another ember version is.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os

# Every ember package whose code shapes a compiled artifact (the whole stack).
SOURCE_PACKAGES = (
    "ember.graphpasses",
    "ember.ir",
    "ember.scheduler",
    "ember.codegen.triton",
    "ember.codegen.cpp",
    "ember.runtime",
)


def source_fingerprint() -> str:
    """The SHA-256 (hex, 24 digits) of the source of `SOURCE_PACKAGES` as installed
    in this process; computed once."""
    return _fingerprint(SOURCE_PACKAGES)


@functools.cache
def _fingerprint(packages: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for package in packages:
        digest.update(f"package {package}\0".encode())
        for relative, data in _sources(package):
            digest.update(f"{len(relative)}:{relative}{len(data)}:".encode())
            digest.update(data)
    return digest.hexdigest()[:24]


def _sources(package: str) -> list[tuple[str, bytes]]:
    """(path under the package, bytes) of each `.py` file of `package`, in path order;
    none where the package is not installed (the fingerprint then says so, by the
    package's name alone)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    found: list[tuple[str, bytes]] = []
    for root in spec.submodule_search_locations:
        for directory, subdirectories, files in os.walk(root):
            subdirectories[:] = [d for d in subdirectories if d != "__pycache__"]
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(directory, name)
                    relative = os.path.relpath(path, root).replace(os.sep, "/")
                    with open(path, "rb") as file:
                        found.append((relative, file.read()))
    found.sort()
    return found
