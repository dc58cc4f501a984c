"""The Triton compile workers: this process captures what Triton's jit would compile,
a worker (Triton only, no torch) compiles it into Triton's disk cache, and a job a
worker cannot compile is compiled here instead.

Triton compiles for a CUDA target without a GPU (ptxas ships with it), so a worker
compiles real requests here on the CPU; the capture step runs against a stand-in for
the jit function (the real one needs a GPU: tests/cuda covers it).
"""

from __future__ import annotations

import dataclasses
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
        constants={(3,): block},
        attrs={(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]},
        target=HOPPER,
        options={"num_warps": 4, "num_stages": 1},
    )


class _Recorder:
    """The `here` callables of a session's jobs: which ran, in which thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ran: list[int] = []

    def job(self, i: int) -> Any:
        def here() -> None:
            with self.lock:
                self.ran.append(i)

        return here


def _run(requests: list[Any], threads: int = 1) -> tuple[int, list[int]]:
    """(jobs compiled by workers, jobs whose `here` ran) for one session."""
    seen = _Recorder()
    session = compile_pool.CompileSession(threads=threads)
    for i, request in enumerate(requests):
        session.add(request, seen.job(i))
    session.close()
    return session.by_workers, sorted(seen.ran)


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


def test_a_worker_compiles_a_request_into_the_cache(tmp_path: Path, workers: Any) -> None:
    source = write_source(tmp_path / "sources", KERNEL, prefix="k")
    requests = [_request(source, block=64), _request(source, block=128), None]
    # every job's `here` runs: after a worker compiled it (a load), or instead of one
    assert _run(requests) == (2, [0, 1, 2])
    cubins = list((tmp_path / "triton-cache").rglob("double.cubin"))
    assert len(cubins) == 2  # one binary per block size


def test_a_worker_builds_the_launcher_where_this_triton_needs_one(
    tmp_path: Path, workers: Any
) -> None:
    """A request with `launcher` set also builds the kernel's C launcher into the cache,
    on Tritons that build one per signature (3.6: `make_launcher`); later Tritons
    launch through one generic launcher, and the worker builds nothing."""
    import importlib

    source = write_source(tmp_path / "sources", KERNEL, prefix="k")
    request = dataclasses.replace(_request(source), launcher=True)
    assert workers[0].run(request.payload) == "ok"
    built = list((tmp_path / "triton-cache").rglob("__triton_launcher*"))
    driver = importlib.import_module("triton.backends.nvidia.driver")
    assert bool(built) == hasattr(driver, "make_launcher")


def test_only_a_signatures_first_request_asks_for_its_launcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compile_pool, "_launchers", {})
    first = {"x": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    assert compile_pool._first_of_signature(first)
    assert not compile_pool._first_of_signature(dict(first))
    assert compile_pool._first_of_signature({"x": "*bf16", "n": "i32", "BLOCK": "constexpr"})


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
    assert all(f.startswith("error: ") for f in failures), failures
    assert "AttributeError" in failures[2]
    assert "fails its check" in failures[3] and "fails its check" in failures[4]
    assert _run(requests) == (0, [0, 1, 2, 3, 4])


def test_without_workers_everything_compiles_here(tmp_path: Path) -> None:
    with config.scope(compile_workers=0):
        assert compile_pool.start() == 0
        assert _run([_request(tmp_path / "k.py"), None] * 3, threads=2) == (0, list(range(6)))


def test_a_cancelled_session_runs_no_queued_job() -> None:
    """Closing with cancel (a kernel failed to render) drops the queued jobs and waits
    only for the running one."""
    started, release = threading.Event(), threading.Event()
    ran: list[int] = []

    def blocking() -> None:
        started.set()
        release.wait(30)
        ran.append(0)

    with config.scope(compile_workers=0):
        session = compile_pool.CompileSession(threads=1)
        session.add(None, blocking)
        assert started.wait(30)
        for i in range(1, 4):
            session.add(None, functools.partial(ran.append, i))
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


class _Source:
    def __init__(self) -> None:
        self.signature = {"x": "*fp32", "n": "i32"}
        self.constants = {(2,): 32}
        self.attrs = {(0,): [["tt.divisibility", 16]]}


class _Target:
    backend, arch, warp_size = HOPPER


class _Jit:
    """Stands in for a Triton JITFunction: binding a device sets `compile`, and a
    warm-up compiles unless it has the kernel already."""

    __module__ = "ember_generated_kabc"
    __name__ = "kernel"

    def __init__(self) -> None:
        self.compiled: list[Any] = []
        self.compile: Any = None  # set when a device is first bound
        self.device_caches = _Caches(self)

    def real_compile(self, source: Any, target: Any = None, options: Any = None) -> str:
        self.compiled.append(source)
        return "binary"

    def warmup(self) -> Any:
        self.device_caches[0]
        return self.compile(_Source(), target=_Target(), options={"num_warps": 8})


class _Caches(dict[int, str]):
    def __init__(self, jit: _Jit) -> None:
        super().__init__()
        self.jit = jit

    def __missing__(self, device: int) -> str:
        self.jit.compile = self.jit.real_compile  # what Triton's create_binder does
        self[device] = "binder"
        return "binder"


def test_capture_records_the_compile_without_compiling() -> None:
    jit = _Jit()
    request = compile_pool.capture(jit, "/k.py", 0, jit.warmup)
    assert request is not None
    assert jit.compiled == []  # nothing compiled here
    assert request.module == "ember_generated_kabc" and request.function == "kernel"
    assert request.signature == _Source().signature and request.constants == {(2,): 32}
    assert request.target == HOPPER and request.options == {"num_warps": 8}
    assert jit.compile == jit.real_compile  # the jit's own compile is back
    assert jit.warmup() == "binary" and len(jit.compiled) == 1


def test_capture_gives_nothing_where_the_warm_up_compiles_nothing() -> None:
    jit = _Jit()
    assert compile_pool.capture(jit, "/k.py", 0, lambda: None) is None
    assert compile_pool.capture(object(), "/k.py", 0, lambda: None) is None  # not a jit
    assert jit.compile == jit.real_compile


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
    """Stands in for a worker: answers 'ok' after `delays[payload]` seconds (or
    `delay`), and counts the requests it served."""

    def __init__(self, delays: dict[bytes, float], ready: bool = True, delay: float = 0.0) -> None:
        self.ready = threading.Event()
        if ready:
            self.ready.set()
        self.process = type("P", (), {"poll": staticmethod(lambda: None)})()
        self.delays, self.delay = delays, delay
        self.served = 0

    def run(self, payload: bytes) -> str:
        time.sleep(self.delays.get(payload, self.delay))
        self.served += 1
        return "ok"


def test_a_worker_that_becomes_ready_joins_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs queue behind the one ready worker; a worker still starting when the
    session opened takes its share once it is ready."""
    monkeypatch.setattr(compile_pool, "_launchers", {})
    up, starting = _StubWorker({}, delay=0.3), _StubWorker({}, ready=False, delay=0.3)
    monkeypatch.setattr(compile_pool, "_workers", [up, starting])
    session = compile_pool.CompileSession(threads=1)
    assert session.workers == 2
    ran: list[int] = []
    for i in range(6):
        session.add(_request(tmp_path / "k.py", block=16 << i), functools.partial(ran.append, i))
    time.sleep(0.1)
    starting.ready.set()
    session.close()
    assert sorted(ran) == list(range(6)) and session.by_workers == 6
    assert starting.served >= 2 and up.served >= 2, (up.served, starting.served)


def test_with_no_worker_ready_yet_the_jobs_wait_for_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compile_pool, "_launchers", {})
    starting = _StubWorker({}, ready=False)
    monkeypatch.setattr(compile_pool, "_workers", [starting])
    session = compile_pool.CompileSession(threads=4)
    ran: list[int] = []
    for i in range(3):
        session.add(_request(tmp_path / "k.py", block=16 << i), functools.partial(ran.append, i))
    threading.Timer(0.2, starting.ready.set).start()
    session.close()
    assert sorted(ran) == [0, 1, 2] and session.by_workers == 3 and starting.served == 3


def test_a_sealed_session_compiles_its_jobs_before_anyone_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`seal` ends the adding without waiting: the workers take every job, and the
    deferred `close` (a graph's first launch) then only collects them, as often as
    it is called."""
    monkeypatch.setattr(compile_pool, "_launchers", {})
    up = _StubWorker({}, delay=0.05)
    monkeypatch.setattr(compile_pool, "_workers", [up])
    session = compile_pool.CompileSession(threads=1)
    done = threading.Semaphore(0)
    for i in range(4):
        session.add(_request(tmp_path / "k.py", block=16 << i), done.release)
    session.seal()
    session.seal()
    assert all(done.acquire(timeout=30) for _ in range(4))  # nobody waited on the session
    assert up.served == 4
    session.close()
    session.close()
    assert session.by_workers == 4


def test_cancelling_a_sealed_session_returns() -> None:
    """A cancel drops the queued jobs, the stop marks of the earlier seal among them:
    the threads still get theirs."""
    ran: list[int] = []
    with config.scope(compile_workers=0):
        session = compile_pool.CompileSession(threads=2)
        for i in range(6):
            session.add(None, functools.partial(lambda i: (time.sleep(0.05), ran.append(i)), i))
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
    monkeypatch.setattr(compile_pool, "_launchers", {})
    dying = _StubWorker({}, ready=False)
    exit_code: list[int] = []
    dying.process = type(
        "P", (), {"poll": staticmethod(lambda: exit_code[0] if exit_code else None)}
    )()
    monkeypatch.setattr(compile_pool, "_workers", [dying])
    session = compile_pool.CompileSession(threads=4)
    ran: list[int] = []
    for i in range(3):
        session.add(_request(tmp_path / "k.py", block=16 << i), functools.partial(ran.append, i))
    exit_code.append(1)
    session.close()
    assert sorted(ran) == [0, 1, 2] and session.by_workers == 0 and dying.served == 0


def test_a_worker_that_never_gets_ready_does_not_hold_up_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compile_pool, "_launchers", {})
    up, stuck = _StubWorker({}), _StubWorker({}, ready=False)
    monkeypatch.setattr(compile_pool, "_workers", [up, stuck])
    session = compile_pool.CompileSession(threads=1)
    for i in range(3):
        session.add(_request(tmp_path / "k.py", block=16 << i), lambda: None)
    start = time.perf_counter()
    session.close()
    assert time.perf_counter() - start < 5
    assert up.served == 3 and stuck.served == 0


def test_jobs_of_a_signature_load_after_its_launcher_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first request of a signature asks its worker for the C launcher; the other
    jobs of that signature load (`here`) only once that request is answered, else the
    parent would build the same launcher meanwhile."""
    monkeypatch.setattr(compile_pool, "_launchers", {})
    builds = _request(tmp_path / "k.py", block=64)
    builds = dataclasses.replace(
        builds, launcher=compile_pool._first_of_signature(builds.signature)
    )
    waits = _request(tmp_path / "k.py", block=128)
    waits = dataclasses.replace(waits, launcher=compile_pool._first_of_signature(waits.signature))
    assert builds.launcher and not waits.launcher
    delays = {builds.payload: 0.5}  # whichever worker takes it
    monkeypatch.setattr(compile_pool, "_workers", [_StubWorker(delays), _StubWorker(delays)])
    loaded: dict[str, float] = {}
    session = compile_pool.CompileSession(threads=1)
    assert session.workers == 2
    start = time.perf_counter()
    session.add(builds, lambda: loaded.setdefault("builds", time.perf_counter() - start))
    session.add(waits, lambda: loaded.setdefault("waits", time.perf_counter() - start))
    session.close()
    assert loaded["builds"] >= 0.5 and loaded["waits"] >= 0.5, loaded


def test_a_request_that_cannot_be_sent_promises_no_launcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A capture whose values do not pickle is compiled here; it must not claim its
    signature's launcher, or the signature's other jobs would wait for it in vain."""
    monkeypatch.setattr(compile_pool, "_launchers", {})
    monkeypatch.setattr(compile_pool, "_builds_launchers", lambda: True)  # as Triton 3.6
    source = type("Source", (), {})()
    source.signature = {"x": "*fp32", "n": "i32"}
    source.constants, source.attrs = {}, {}
    target = type("Target", (), {"backend": "cuda", "arch": 90, "warp_size": 32})()
    fn = type("Fn", (), {"__module__": "m", "__name__": "f"})()
    unpicklable = compile_pool._Captured(source, target, {"hook": lambda: None})
    assert compile_pool._request(fn, "k.py", unpicklable) is None
    assert compile_pool._launchers == {}
    sendable = compile_pool._Captured(source, target, {"num_warps": 4})
    first = compile_pool._request(fn, "k.py", sendable)
    second = compile_pool._request(fn, "k.py", sendable)
    assert first is not None and first.launcher
    assert second is not None and not second.launcher
    # a Triton without per-signature launchers: no request claims one, none waits
    monkeypatch.setattr(compile_pool, "_launchers", {})
    monkeypatch.setattr(compile_pool, "_builds_launchers", lambda: False)
    later = compile_pool._request(fn, "k.py", sendable)
    assert later is not None and not later.launcher and compile_pool._launchers == {}
