"""The fingerprint of ember's source (ember.runtime.fingerprint): the same in every
process and in every copy of the same files, whatever their modification times;
changed by an edit of any one file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from ember.runtime.artifact import versions
from ember.runtime.fingerprint import SOURCE_PACKAGES, _sources, source_fingerprint

_PRINT = (
    "import ember.ir, ember.runtime.fingerprint as f; "
    "print(ember.ir.__file__); print(f.source_fingerprint())"
)


def _fresh(pythonpath: str | None = None) -> tuple[str, str]:
    """(where ember.ir was imported from, the fingerprint) in a fresh process."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run(
        [sys.executable, "-c", _PRINT], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    where, fingerprint = done.stdout.split()[-2:]
    return where, fingerprint


def test_every_process_computes_the_same_fingerprint() -> None:
    here = source_fingerprint()
    assert len(here) == 24 and int(here, 16) >= 0
    assert versions()["ember-source"] == here
    assert _fresh()[1] == here
    assert _fresh()[1] == here


def test_every_package_is_covered() -> None:
    for package in SOURCE_PACKAGES:
        names = [name for name, _ in _sources(package)]
        assert "__init__.py" in names, package
    assert "fingerprint.py" in [name for name, _ in _sources("ember.runtime")]


def _copy_of_the_source(destination: Path) -> Path:
    """The six packages' files in one tree under `destination` (as a wheel install
    lays them out), with fresh modification times."""
    for package in SOURCE_PACKAGES:
        module = __import__(package, fromlist=["_"])
        (source,) = module.__path__
        target = destination.joinpath(*package.split("."))
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    return destination


def test_a_copy_agrees_whatever_its_times_and_an_edit_changes_it(tmp_path: Path) -> None:
    here = source_fingerprint()
    root = _copy_of_the_source(tmp_path / "site")
    runtime = root / "ember" / "runtime"
    for path in runtime.rglob("*.py"):
        os.utime(path, (1_000_000, 1_000_000))  # other modification times
    where, copied = _fresh(str(root))
    assert Path(where).is_relative_to(root)  # the copy was the source imported
    assert copied == here

    edited = runtime / "fingerprint.py"
    original = edited.read_bytes()
    edited.write_bytes(original + b"\n# one more line\n")
    assert _fresh(str(root))[1] != here
    edited.write_bytes(original)
    assert _fresh(str(root))[1] == here  # the bytes decide, not the times
    (runtime / "demo.py").rename(runtime / "demo_renamed.py")
    assert _fresh(str(root))[1] != here  # a file's name counts too
