"""Ember's test sessions.

- `tests(<layer>)`: one per package, each in its own venv holding only that package
  and its declared dependencies (plus pytest), installed from uv.lock. This is the
  proof that a user can depend on just that layer.
- `stack`: end-to-end tests across all layers on the CPU (tests/).
- `lint`: ruff check and ruff format --check.
- `typecheck`: mypy --strict over every package.
- `cuda`: tests marked `cuda`; needs a GPU, so it is not a default session. On a GPU
  machine without uv or nox, the same tests run with:
      PYTHONPATH=$(printf '%s:' $PWD/packages/*/src) python3 -m pytest -m cuda -q packages tests
"""

from __future__ import annotations

import os

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "uv"
nox.options.reuse_venv = "yes"

LAYERS = ["graphpasses", "ir", "scheduler", "codegen-triton", "codegen-cpp", "runtime"]
UV = os.environ.get("UV", "uv")
NOT_GPU = "not cuda and not slow"


def uv_sync(session: nox.Session, *args: str) -> None:
    """Install exactly what uv.lock says for the selection into the session's venv."""
    env = {"UV_PROJECT_ENVIRONMENT": session.virtualenv.location}
    session.run_install(UV, "sync", "--frozen", "--exact", *args, env=env, external=True)


@nox.session
@nox.parametrize("layer", LAYERS, ids=LAYERS)
def tests(session: nox.Session, layer: str) -> None:
    """One layer's tests with only that layer and what it declares installed."""
    uv_sync(session, "--package", f"ember-{layer}", "--group", "test")
    session.run("pytest", f"packages/{layer}/tests", "-q", "-m", NOT_GPU, *session.posargs)


@nox.session
def stack(session: nox.Session) -> None:
    """End-to-end tests across all layers (CPU) and the layering rules."""
    uv_sync(session)
    session.run("pytest", "tests", "-q", "-m", NOT_GPU, *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    uv_sync(session, "--only-group", "tools")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    uv_sync(session)
    session.run("mypy", *(f"packages/{layer}/src" for layer in LAYERS))


@nox.session(default=False)
def cuda(session: nox.Session) -> None:
    """GPU tests: every test marked `cuda`, across all layers."""
    uv_sync(session)
    has_cuda = session.run(
        "python", "-c", "import torch; print(torch.cuda.is_available())", silent=True
    )
    if not has_cuda or "True" not in has_cuda:
        session.error("the cuda session needs a CUDA GPU visible to torch")
    session.run("pytest", "packages", "tests", "-q", "-m", "cuda", *session.posargs)
