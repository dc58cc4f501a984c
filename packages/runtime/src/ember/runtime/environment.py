"""What a measurement or a report ran on: package versions, commit, device, CPU.

`ember --version` prints `package_versions()`; `ember bench` writes `environment()`
beside its records, so a number read later says which torch, Triton and ember made
it, from which commit, on which GPU and CPU.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess
from pathlib import Path
from typing import Any

# Ember's six packages, in processing order, then what they run on.
EMBER_PACKAGES = (
    "ember-graphpasses",
    "ember-ir",
    "ember-scheduler",
    "ember-codegen-triton",
    "ember-codegen-cpp",
    "ember-runtime",
)
OTHER_PACKAGES = ("torch", "triton")


@functools.cache
def package_versions() -> dict[str, str]:
    """Each ember package's version, then torch's and Triton's (package metadata;
    'absent' for one not installed)."""
    import torch

    found = {}
    for name in (*EMBER_PACKAGES, *OTHER_PACKAGES):
        if name == "torch":  # with its local tag (+cu132, +cpu), which metadata drops
            found[name] = str(torch.__version__)
            continue
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


def version_text() -> str:
    """`ember --version`: a line per package."""
    versions = package_versions()
    width = max(map(len, versions))
    return "\n".join(f"{name:<{width}}  {version}" for name, version in versions.items())


@functools.cache
def git_commit() -> str | None:
    """The commit of the source tree ember runs from, with '-dirty' when it has
    uncommitted changes; None outside a git checkout (an installed wheel)."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            result = subprocess.run(
                ["git", *args], cwd=here, capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return result.stdout.strip() if result.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    # only ember's own checkout: an installed ember inside someone's repository is not it
    if not top or not (Path(top) / "packages" / "runtime" / "src" / "ember").is_dir():
        return None
    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return f"{commit}-dirty" if dirty else commit


def device_name(device: str) -> str:
    """The GPU's name for a CUDA device, the CPU's model for 'cpu'."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return str(torch.cuda.get_device_name(dev))
    if dev.type == "cpu":
        return cpu_model()
    return str(dev)


def cpu_model() -> str:
    from ember.runtime.cpp_kernels import cpu_model as model

    return model()


def environment(device: str) -> dict[str, Any]:
    """Everything above, for a run on `device`, as one JSON-ready dict."""
    return {
        "versions": package_versions(),
        "python": platform.python_version(),
        "commit": git_commit(),
        "device": device,
        "device_name": device_name(device),
        "cpu": cpu_model(),
        "platform": platform.platform(),
    }
