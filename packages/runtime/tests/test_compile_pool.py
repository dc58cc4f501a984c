"""The Triton compile workers' protocol: jobs go out as JSON lines, one reply each.

On a machine without a GPU every job fails in the worker; the point here is that the
failure comes back as a message (the main process then compiles lazily and reports
the real error) and that the pool neither hangs nor loses a job.
"""

from __future__ import annotations

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


def test_every_job_gets_a_reply(tmp_path: Path) -> None:
    source = tmp_path / "k.py"
    source.write_text("def not_a_kernel(*args, **kwargs):\n    raise ValueError('boom')\n")
    jobs = [_job(source, "not_a_kernel"), _job(tmp_path / "missing.py", "k"), _job(source, "nope")]
    with config.scope(compile_workers=2):
        try:
            outcomes = compile_pool.compile_all(jobs)
        finally:
            compile_pool._close_all()
    assert len(outcomes) == 3
    assert all(o.startswith("error: ") for o in outcomes), outcomes
    assert "nope" in outcomes[2] or "AttributeError" in outcomes[2]


def test_no_workers_when_turned_off() -> None:
    with config.scope(compile_workers=0):
        assert compile_pool.start() == 0
        assert compile_pool.compile_all([_job(Path("x.py"), "k")]) == []


def test_workers_exit_when_closed() -> None:
    with config.scope(compile_workers=1):
        assert compile_pool.start() == 1
        processes = [w.process for w in compile_pool._workers]
        compile_pool._close_all()
    assert all(p.poll() is not None for p in processes)
