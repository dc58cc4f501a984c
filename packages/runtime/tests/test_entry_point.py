"""`backend="ember"` in a fresh process, the three ways Dynamo can come to know it: the
installed `torch_dynamo_backends` entry point alone, the entry point with an
`import ember.runtime` first, and the packages only on PYTHONPATH (no entry point; the
import registers the backend). Each compiles under EMBER_STRICT=1, so a graph that
fell back to eager fails the run, and compares with eager."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

PACKAGES = Path(__file__).resolve().parents[2]

SCRIPT = """
import importlib.metadata, sys, torch
{prelude}
visible = any(
    ep.name == "ember" for ep in importlib.metadata.entry_points(group="torch_dynamo_backends")
)
def f(x):
    return torch.sin(x) * 2 + 1
x = torch.randn(64)
out = torch.compile(f, backend="ember")(x)
from ember.runtime import compile_records
assert [r.ran_eagerly for r in compile_records] == [None], compile_records
print(visible, float((out - f(x)).abs().max()))
"""


def _installed() -> bool:
    try:
        importlib.metadata.distribution("ember-runtime")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _run(
    tmp_path: Path, prelude: str, *, flags: tuple[str, ...] = (), pythonpath: str | None = None
) -> tuple[bool, float]:
    env = dict(os.environ, EMBER_STRICT="1", EMBER_CACHE_DIR=str(tmp_path / "cache"))
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run(
        [sys.executable, *flags, "-c", SCRIPT.format(prelude=prelude)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    visible, error = done.stdout.split()[-2:]
    return visible == "True", float(error)


@pytest.mark.skipif(not _installed(), reason="ember-runtime is only on PYTHONPATH here")
def test_entry_point_alone_compiles(tmp_path: Path) -> None:
    """Dynamo's load of the entry point imports `ember.runtime`; that import used to
    register the name first, and Dynamo's own registration then failed
    ('duplicate name: ember')."""
    visible, error = _run(tmp_path, "")
    assert visible and error < 1e-5


@pytest.mark.skipif(not _installed(), reason="ember-runtime is only on PYTHONPATH here")
def test_entry_point_after_import_compiles(tmp_path: Path) -> None:
    visible, error = _run(tmp_path, "import ember.runtime")
    assert visible and error < 1e-5


def test_packages_only_on_pythonpath_compile_after_import(tmp_path: Path) -> None:
    """As on the GPU machine: no installed distribution, so no entry point, and the
    import registers the backend. Where ember is installed here, a copy of the
    installed packages' directory as links, less ember's metadata and the `.pth` files
    that put ember's sources on the path, stands in for that machine's
    site-packages (`-S`: Python does not add its own)."""
    if not _installed():  # this process is already that case
        visible, error = _run(tmp_path, "import ember.runtime")
        assert not visible and error < 1e-5
        return
    site = Path(torch.__file__).resolve().parents[1]
    links = tmp_path / "site"
    links.mkdir()
    for entry in site.iterdir():
        hidden = entry.name.startswith("ember_") or entry.suffix == ".pth"
        if not hidden:
            (links / entry.name).symlink_to(entry)
    sources = [str(p) for p in sorted(PACKAGES.glob("*/src"))]
    pythonpath = os.pathsep.join([*sources, str(links)])
    visible, error = _run(tmp_path, "import ember.runtime", flags=("-S",), pythonpath=pythonpath)
    assert not visible and error < 1e-5
