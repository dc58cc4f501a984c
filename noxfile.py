"""Ember's test sessions.

- `tests(<layer>)`: one per package, each in its own venv holding only that package
  and its declared dependencies (plus pytest), installed from uv.lock. This is the
  proof that a user can depend on just that layer.
- `stack`: end-to-end tests across all layers on the CPU (tests/).
- `lint`: ruff check and ruff format --check.
- `typecheck`: mypy --strict over every package.
- `opinfo`, `fuzz`, `bench` (not default; too slow for CI): the full OpInfo sweep with
  fallbacks on and off, a long fuzzing campaign, and `ember bench` on the CPU set. Their
  fast subsets (every 12th OpInfo op, 30 fixed fuzzer seeds, one tiny bench) run in
  `stack`. Outputs go to bench_out/.
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


@nox.session(default=False)
def opinfo(session: nox.Session) -> None:
    """The full OpInfo sweep, float32 and bfloat16: fallbacks on (must show no mismatch)
    and off (lowering coverage); then the dtypes each op does not support, where eager's
    error must be ember's too. Summary lines on stdout, JSON under bench_out/."""
    uv_sync(session)
    sweep = ["python", "-m", "ember.runtime.opinfo", "--dtypes", "float32,bfloat16"]
    session.run(*sweep, "--json", "bench_out/opinfo_fallback_on.json", *session.posargs)
    session.run(
        *sweep, "--no-fallback", "--show", "", "--json", "bench_out/opinfo_fallback_off.json"
    )
    # the dtypes each op does not support: where eager raises, ember must raise too
    every = "float32,bfloat16,float16,int64,int32,uint8,bool"
    session.run(
        "python", "-m", "ember.runtime.opinfo", "--eager-errors", "--dtypes", every,
        "--json", "bench_out/opinfo_eager_errors.json",
    )  # fmt: skip


@nox.session(default=False)
def fuzz(session: nox.Session) -> None:
    """A long differential-fuzzing campaign (2000 seeds or 20 minutes); reproducers of
    failures are written to bench_out/fuzz/. Pass e.g. `-- --seeds 5000:6000` to vary."""
    uv_sync(session)
    session.run(
        "python", "-m", "ember.runtime.fuzz", "--seeds", "0:2000", "--time-budget", "1200",
        "--out", "bench_out/fuzz", "--json", "bench_out/fuzz.json", *session.posargs,
    )  # fmt: skip


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """`ember bench` on the CPU set (eager, inductor, ember; inference and train)."""
    uv_sync(session)
    args = session.posargs or ["--json", "bench_out/cpu.json", "--plot", "bench_out/cpu.png"]
    session.run("ember", "bench", *args)
