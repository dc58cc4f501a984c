"""The Triton compile workers: jobs go out as JSON lines, one reply each, and a job a
worker cannot compile is compiled in this process instead.

On a machine without a GPU every job fails in a worker; the point here is that each
failure comes back as a message and the job is handed to the local compiler exactly
once, that the pool neither hangs nor loses a job, and that workers still starting
are not waited for.
"""

from __future__ import annotations

import threading
from pathlib import Path

from ember.runtime import compile_pool
from ember.runtime.config import config


def _job(path: Path, function: str) -> compile_pool.CompileJob:
    return compile_pool.CompileJob(
        path=str(path),
        function=function,
        dtypes=("float32",),
        ints=1,
        blocks=(("XBLOCK", 16),),
        num_warps=1,
        num_stages=1,
        device=0,
    )


def _jobs(tmp_path: Path) -> list[compile_pool.CompileJob]:
    source = tmp_path / "k.py"
    source.write_text("def not_a_kernel(*args, **kwargs):\n    raise ValueError('boom')\n")
    return [_job(source, "not_a_kernel"), _job(tmp_path / "missing.py", "k"), _job(source, "x")]


def test_failed_jobs_are_compiled_locally_once(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path)
    local: list[int] = []
    lock = threading.Lock()

    def compile_here(i: int) -> None:
        with lock:
            local.append(i)

    with config.scope(compile_workers=2):
        try:
            compile_pool.start()
            assert all(w.ready.wait(120) for w in compile_pool._workers)
            failures = [compile_pool._workers[0].run(job) for job in jobs]
            remote = compile_pool.compile_all(jobs, compile_here, threads=1)
        finally:
            compile_pool._close_all()
    assert all(f.startswith("error: ") for f in failures), failures
    assert "AttributeError" in failures[2]
    assert remote == []
    assert sorted(local) == [0, 1, 2]


def test_without_workers_everything_compiles_here(tmp_path: Path) -> None:
    local: list[int] = []
    with config.scope(compile_workers=0):
        assert compile_pool.start() == 0
        assert compile_pool.compile_all(_jobs(tmp_path), local.append, threads=1) == []
    assert sorted(local) == [0, 1, 2]


def test_workers_exit_when_closed() -> None:
    with config.scope(compile_workers=1):
        assert compile_pool.start() == 1
        processes = [w.process for w in compile_pool._workers]
        compile_pool._close_all()
    assert all(p.poll() is not None for p in processes)
