"""The Triton compile workers: a worker (Triton only, no torch) compiles the request
ember built and replies with the binary, and a job a worker cannot compile is
compiled here instead.

Triton compiles for a CUDA target without a GPU (ptxas ships with it), so workers
compile real requests here on the CPU.
"""

from __future__ import annotations

import functools
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ember.runtime import compile_pool
from ember.runtime.config import config
from ember.runtime.loader import write_source

HOPPER = ("cuda", 90, 32)
KERNEL = """
import triton
import triton.language as tl

@triton.jit
def double(x, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tl.load(x + i, mask=i < n) * 2, mask=i < n)
"""


def _request(path: Path, function: str = "double", block: int = 64) -> compile_pool.CompileRequest:
    return compile_pool.CompileRequest(
        path=str(path),
        module="ember_test_kernel",
        function=function,
        signature={"x": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"},
        constexprs={(3,): block},
        attrs={(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]},
        target=HOPPER,
        options={"num_warps": 4, "num_stages": 1},
    )


def _run(requests: list[Any], threads: int = 1) -> tuple[int, list[Any]]:
    """(jobs compiled by workers, each job's result in order) for one session."""
    results: dict[int, Any] = {}
    lock = threading.Lock()

    def done(i: int, result: Any) -> None:
        with lock:
            assert i not in results, f"job {i} finished twice"
            results[i] = result

    session = compile_pool.CompileSession(threads=threads)
    for i, request in enumerate(requests):
        session.add(request, functools.partial(done, i))
    session.close()
    return session.by_workers, [results[i] for i in sorted(results)]


@pytest.fixture
def workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Two started workers, warmed up for sm_90, with a Triton cache of their own."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    with config.scope(compile_workers=2):
        try:
            assert compile_pool.start(HOPPER) == 2
            assert all(w.ready.wait(120) for w in compile_pool.workers())
            yield compile_pool.workers()
        finally:
            compile_pool._close_all()


def test_a_worker_compiles_a_request_into_a_binary(tmp_path: Path, workers: Any) -> None:
    source = write_source(tmp_path / "sources", KERNEL, prefix="k")
    by_workers, results = _run([_request(source, block=64), _request(source, block=128)])
    assert by_workers == 2
    for result in results:
        assert isinstance(result, dict), result
        assert result["image"].startswith(b"\x7fELF") and result["symbol"] == "double"
        assert result["params"] >= 3  # x, out, n, then any scratch pointers of Triton's
        assert result["threads"] == 4 * 32
    assert results[0]["image"] != results[1]["image"]  # one binary per block size


def test_failed_requests_are_compiled_here_once(tmp_path: Path, workers: Any) -> None:
    not_a_kernel = "def not_a_kernel(*args, **kwargs):\n    raise ValueError('boom')\n"
    source = write_source(tmp_path / "sources", not_a_kernel, prefix="k")
    # a kernel file changed after it was written, and one written outside the cache:
    # neither is loaded, whatever it holds
    altered = write_source(tmp_path / "sources", KERNEL, prefix="k")
    altered.write_text(KERNEL.replace("* 2", "* 3"))
    outside = tmp_path / "outside.py"
    outside.write_text(KERNEL)
    requests = [
        _request(source, "not_a_kernel"),
        _request(tmp_path / "missing.py"),
        _request(source, "absent"),
        _request(altered),
        _request(outside),
    ]
    failures = [workers[0].run(r.payload) for r in requests]
    assert all(isinstance(f, str) and f.startswith("error: ") for f in failures), failures
    assert "AttributeError" in str(failures[2])
    assert "fails its check" in str(failures[3]) and "fails its check" in str(failures[4])
    by_workers, results = _run(requests)  # each compiled here once more, and failing
    assert by_workers == 0 and all(isinstance(r, Exception) for r in results)


def test_without_workers_everything_compiles_here(tmp_path: Path) -> None:
    source = write_source(tmp_path / "sources", KERNEL, prefix="k")
    with config.scope(compile_workers=0):
        assert compile_pool.start() == 0
        requests = [_request(source, block=32 << i) for i in range(3)]
        by_workers, results = _run(requests, threads=2)
    assert by_workers == 0 and all(r["symbol"] == "double" for r in results)


def test_a_cancelled_session_runs_no_queued_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing with cancel (a kernel failed to render) drops the queued jobs and waits
    only for the running one."""
    started, release = threading.Event(), threading.Event()
    ran: list[int] = []

    def compile_here(request: compile_pool.CompileRequest) -> dict[str, Any]:
        if request.constexprs == {(3,): 16}:
            started.set()
            release.wait(30)
        return {}

    monkeypatch.setattr(compile_pool, "compile_here", compile_here)
    with config.scope(compile_workers=0):
        session = compile_pool.CompileSession(threads=1)
        session.add(_request(tmp_path / "k.py", block=16), lambda result: ran.append(0))
        assert started.wait(30)
        for i in range(1, 4):
            session.add(_request(tmp_path / "k.py", block=32), lambda result, i=i: ran.append(i))
        closer = threading.Thread(target=session.close, kwargs={"cancel": True})
        closer.start()
        deadline = time.monotonic() + 30
        while session._pending.qsize() != 1 and time.monotonic() < deadline:  # the stop mark
            time.sleep(0.01)
        release.set()
        closer.join(30)
    assert not closer.is_alive()
    assert ran == [0]


def test_workers_exit_when_closed() -> None:
    with config.scope(compile_workers=1):
        assert compile_pool.start() == 1
        processes = [w.process for w in compile_pool.workers()]
        compile_pool._close_all()
    assert all(p.poll() is not None for p in processes)


_ECHO = """
import pickle, sys, time
while True:
    try:
        request = pickle.load(sys.stdin.buffer)
    except EOFError:
        break
    time.sleep(0.002)
    pickle.dump(request, sys.stdout.buffer)
    sys.stdout.buffer.flush()
"""


def test_threads_sharing_a_worker_each_get_their_own_answer() -> None:
    """Two sessions' feeders can use one worker at once (a sealed session still
    running while the next graph's opens): each request gets its own reply."""
    worker = compile_pool._Worker.__new__(compile_pool._Worker)
    worker.process = subprocess.Popen(
        [sys.executable, "-c", _ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    worker._lock = threading.Lock()
    wrong: list[tuple[str, str]] = []

    def ask(tag: str) -> None:
        for i in range(40):
            expected = f"{tag}{i}"
            answer = worker.run(pickle.dumps(expected))
            if answer != expected:
                wrong.append((expected, answer))

    try:
        threads = [threading.Thread(target=ask, args=(t,)) for t in "abc"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        worker.close()
    assert not wrong, wrong[:3]


class _StubWorker:
    """Stands in for a worker: answers a binary's description after
    `delays[payload]` seconds (or `delay`), and counts the requests it served."""

    def __init__(self, delays: dict[bytes, float], ready: bool = True, delay: float = 0.0) -> None:
        self.ready = threading.Event()
        if ready:
            self.ready.set()
        self.process = type("P", (), {"poll": staticmethod(lambda: None)})()
        self.delays, self.delay = delays, delay
        self.served = 0

    def run(self, payload: bytes) -> dict[str, Any]:
        time.sleep(self.delays.get(payload, self.delay))
        self.served += 1
        return {"symbol": "stub"}


def test_a_worker_that_becomes_ready_joins_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs queue behind the one ready worker; a worker still starting when the
    session opened takes its share once it is ready."""
    up, starting = _StubWorker({}, delay=0.3), _StubWorker({}, ready=False, delay=0.3)
    monkeypatch.setattr(compile_pool, "_workers", [up, starting])
    session = compile_pool.CompileSession(threads=1)
    assert session.workers == 2
    ran: list[int] = []
    for i in range(6):
        session.add(_request(tmp_path / "k.py", block=16 << i), lambda result, i=i: ran.append(i))
    time.sleep(0.1)
    starting.ready.set()
    session.close()
    assert sorted(ran) == list(range(6)) and session.by_workers == 6
    assert starting.served >= 2 and up.served >= 2, (up.served, starting.served)


def test_with_no_worker_ready_yet_the_jobs_wait_for_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    starting = _StubWorker({}, ready=False)
    monkeypatch.setattr(compile_pool, "_workers", [starting])
    session = compile_pool.CompileSession(threads=4)
    ran: list[int] = []
    for i in range(3):
        session.add(_request(tmp_path / "k.py", block=16 << i), lambda result, i=i: ran.append(i))
    threading.Timer(0.2, starting.ready.set).start()
    session.close()
    assert sorted(ran) == [0, 1, 2] and session.by_workers == 3 and starting.served == 3


def test_a_sealed_session_compiles_its_jobs_before_anyone_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`seal` ends the adding without waiting: the workers take every job, and the
    deferred `close` (a graph's first launch) then only collects them, as often as
    it is called."""
    up = _StubWorker({}, delay=0.05)
    monkeypatch.setattr(compile_pool, "_workers", [up])
    session = compile_pool.CompileSession(threads=1)
    done = threading.Semaphore(0)
    for i in range(4):
        session.add(_request(tmp_path / "k.py", block=16 << i), lambda result: done.release())
    session.seal()
    session.seal()
    assert all(done.acquire(timeout=30) for _ in range(4))  # nobody waited on the session
    assert up.served == 4
    session.close()
    session.close()
    assert session.by_workers == 4


def test_cancelling_a_sealed_session_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel drops the queued jobs, the stop marks of the earlier seal among them:
    the threads still get theirs."""
    ran: list[int] = []

    def compile_here(request: compile_pool.CompileRequest) -> dict[str, Any]:
        time.sleep(0.05)
        return {}

    monkeypatch.setattr(compile_pool, "compile_here", compile_here)
    with config.scope(compile_workers=0):
        session = compile_pool.CompileSession(threads=2)
        for i in range(6):
            session.add(_request(tmp_path / "k.py"), lambda result, i=i: ran.append(i))
        session.seal()
        closer = threading.Thread(target=session.close, kwargs={"cancel": True})
        closer.start()
        closer.join(30)
    assert not closer.is_alive()
    assert len(ran) < 6  # the queued ones were dropped


def test_a_worker_that_cannot_start_leaves_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []

    class Flaky:
        def __init__(self, target: Any) -> None:
            made.append(len(made))
            if len(made) == 2:
                raise OSError("no more processes")

    monkeypatch.setattr(compile_pool, "_Worker", Flaky)
    monkeypatch.setattr(compile_pool, "_workers", [])
    compile_pool._spawn(None, 4)
    assert len(made) == 4 and len(compile_pool._workers) == 3


def test_jobs_no_worker_took_are_compiled_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The only worker dies while starting: its jobs run here when the session closes."""
    dying = _StubWorker({}, ready=False)
    exit_code: list[int] = []
    dying.process = type(
        "P", (), {"poll": staticmethod(lambda: exit_code[0] if exit_code else None)}
    )()
    monkeypatch.setattr(compile_pool, "_workers", [dying])
    session = compile_pool.CompileSession(threads=4)
    ran: list[int] = []
    for i in range(3):
        session.add(_request(tmp_path / "k.py", block=16 << i), lambda result, i=i: ran.append(i))
    exit_code.append(1)
    session.close()
    assert sorted(ran) == [0, 1, 2] and session.by_workers == 0 and dying.served == 0


def test_a_worker_that_never_gets_ready_does_not_hold_up_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    up, stuck = _StubWorker({}), _StubWorker({}, ready=False)
    monkeypatch.setattr(compile_pool, "_workers", [up, stuck])
    session = compile_pool.CompileSession(threads=1)
    for i in range(3):
        session.add(_request(tmp_path / "k.py", block=16 << i), lambda result: None)
    start = time.perf_counter()
    session.close()
    assert time.perf_counter() - start < 5
    assert up.served == 3 and stuck.served == 0


def test_starting_from_many_threads_at_once_starts_one_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lazily compiled backward (autograd's thread) and another graph's compile can
    start the pool at the same moment: one spawning thread and one Triton set-up, and
    every caller is told the same number of workers."""
    made: list[object] = []
    prepared: list[str] = []

    class Quick:
        def __init__(self, target: Any) -> None:
            time.sleep(0.001)
            made.append(target)

    def slow_key() -> None:
        time.sleep(0.05)
        prepared.append("key")

    monkeypatch.setattr(compile_pool, "_Worker", Quick)
    monkeypatch.setattr(compile_pool, "_workers", [])
    monkeypatch.setattr(compile_pool, "_spawning", [])
    monkeypatch.setattr(compile_pool, "_preparing", [])
    monkeypatch.setattr(compile_pool, "_key_ready", threading.Event())
    monkeypatch.setattr(compile_pool, "_prepare_key", slow_key)
    monkeypatch.setattr(compile_pool, "_prepare_imports", lambda: None)
    monkeypatch.setattr(compile_pool, "_close_all", lambda: None)
    barrier = threading.Barrier(8)
    told: list[int] = []

    def caller() -> None:
        barrier.wait()
        told.append(compile_pool.start(("cuda", 90, 32)))

    plain = threading.Thread

    class Slow(plain):  # widens the gap between checking and starting
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            time.sleep(0.01)
            super().__init__(*args, **kwargs)

    with config.scope(compile_workers=3):
        threads = [plain(target=caller) for _ in range(8)]
        monkeypatch.setattr(threading, "Thread", Slow)
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(compile_pool._spawning) == 1 and len(compile_pool._preparing) == 2
        assert len(compile_pool.workers()) == 3 and set(told) == {3}
    compile_pool.wait_prepared()
    assert prepared == ["key"]
