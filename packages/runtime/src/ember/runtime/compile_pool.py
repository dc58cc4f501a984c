"""Worker processes that compile Triton kernels and reply with their binaries.

Why processes. On the H100 machine (16 cores, Triton 3.6), resnet50's 60 compile jobs
took 17.3 s one after another, 6.4 s in 16 threads and 1.2 s in 16 processes
(benchmarks/compile_jobs.py). A Python thread spinning beside the compiles keeps its
full speed, so they do not hold the interpreter lock; still, threads in one process
serialise somewhere inside Triton's compiler, and processes do not.

Why workers import Triton only (ember/runtime/compile_worker.py, run by file path).
Workers that imported torch took 16 s to start (15 at once), longer than most graphs
take to compile. A worker that imports Triton alone is ready in about 1.5 s,
including its first compile (Triton loading its compiler libraries), well inside
the seconds Dynamo and AOTAutograd trace before ember sees a graph. A request is
everything `triton.compile` takes, built by ember from the kernel it rendered
(`CompileRequest`); the reply is the binary itself (ember.runtime.triton_kernels
loads and launches it through the CUDA driver), so nothing is shared through
Triton's caches or its jit.

Workers are plain subprocesses speaking pickled messages over stdin/stdout, not
multiprocessing children: a spawned child re-imports the user's main script, which
would re-run an unguarded training script. The pool starts when ember first sees a
graph with CUDA inputs (the backend calls `start()`), and lives for the process (the
backward graph comes later). `EMBER_COMPILE_WORKERS` sets their number; by default one
per core but one, at most 16; 0 compiles in threads here.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import logging
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from ember.runtime.config import config

log = logging.getLogger(__name__)
_WORKER_SCRIPT = Path(__file__).with_name("compile_worker.py")


@dataclass(frozen=True)
class CompileRequest:
    """One kernel specialisation for `triton.compile`, in values a worker can
    unpickle with Triton alone (see `compile_worker.compile_binary`)."""

    path: str  # the kernel module's file
    module: str  # the module name this process loaded it under
    function: str
    signature: dict[str, str]
    constexprs: dict[tuple[int, ...], Any]
    attrs: dict[tuple[int, ...], Any]
    target: tuple[str, int, int]  # Triton's GPUTarget: backend, arch, warp size
    options: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @functools.cached_property
    def payload(self) -> bytes:
        """The request as a worker reads it: its fields, pickled (once)."""
        return pickle.dumps(self.as_dict())


def compile_here(request: CompileRequest) -> dict[str, Any]:
    """Compile `request` in this process (the worker's own function)."""
    wait_prepared()
    from ember.runtime.compile_worker import compile_binary

    return compile_binary(request.as_dict())


class _Worker:
    def __init__(self, target: tuple[str, int, int] | None) -> None:
        arguments = [str(part) for part in target] if target is not None else []
        self.process = subprocess.Popen(
            [sys.executable, str(_WORKER_SCRIPT), *arguments],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.ready = threading.Event()  # set once the worker has done its first compile
        # one request at a time: two sessions' feeders can share a worker (a sealed
        # session's jobs still run while the next graph's session opens)
        self._lock = threading.Lock()
        threading.Thread(target=self._wait_ready, daemon=True).start()

    def _wait_ready(self) -> None:
        with contextlib.suppress(Exception):
            if self._read() == "ready":
                self.ready.set()

    def _read(self) -> Any:
        assert self.process.stdout is not None
        return pickle.load(self.process.stdout)

    def run(self, payload: bytes) -> dict[str, Any] | str:
        """Compile a request (its `payload`): the binary's description, or what went
        wrong."""
        stdin = self.process.stdin
        assert stdin is not None
        try:
            with self._lock:
                stdin.write(payload)
                stdin.flush()
                reply = self._read()
            return reply if isinstance(reply, (dict, str)) else f"unexpected reply {reply!r}"
        except EOFError:
            return "worker exited"
        except (OSError, pickle.UnpicklingError) as exc:
            return f"worker unreachable: {exc}"

    def close(self) -> None:
        """End the worker: end of input stops an idle one; one still starting (or
        busy) is terminated rather than waited for, so exiting stays quick."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            self.process.wait()


_workers: list[_Worker] = []
# Thread-seconds spent waiting on workers and compiling here, summed over graphs, for
# compile-time profiles (benchmarks/compile_profile.py).
busy_seconds = {"in workers": 0.0, "here": 0.0}
_busy_lock = threading.Lock()


def _add(key: str, seconds: float) -> None:
    with _busy_lock:
        busy_seconds[key] += seconds


_spawning: list[threading.Thread] = []
# `start` and `prepare_here` check, then start threads: a lazily compiled backward runs
# in autograd's thread while another graph may be compiling, so both hold this lock
_start_lock = threading.Lock()


def start(target: tuple[str, int, int] | None = None) -> int:
    """Start the workers (once) and, for a GPU `target` (Triton's backend, arch, warp
    size), this process's own Triton set-up in the background (`prepare_here`); how
    many workers there are (or are being started). Each worker warms up by compiling
    for `target` before it says it is ready.

    The processes are started by a thread of their own: fifteen of them took 0.24 s
    of the caller's thread on the H100 machine (cold timeline of attention's first
    training step), while Dynamo and AOTAutograd could have been tracing. Sessions
    (and `workers()`) wait for that thread first."""
    if target is not None:
        prepare_here()
    with _start_lock:
        count = config.compile_workers if not _spawning else 0
        if count > 0:
            thread = threading.Thread(
                target=_spawn, args=(target, count), name="ember-compile-spawn", daemon=True
            )
            _spawning.append(thread)
            atexit.register(_close_all)
            thread.start()
    return count if count > 0 else len(workers())


def _spawn(target: tuple[str, int, int] | None, count: int) -> None:
    for _ in range(count):
        with contextlib.suppress(OSError):  # a worker that cannot start is one fewer
            _workers.append(_Worker(target))


def workers() -> list[_Worker]:
    """The workers, once every one has been started."""
    for thread in _spawning:
        thread.join()
    return _workers


_preparing: list[threading.Thread] = []
_key_ready = threading.Event()


def prepare_here() -> None:
    """Start (once) two threads doing one-time work of this process that would
    otherwise fall on the first compile, while Dynamo and AOTAutograd trace:

    - Triton's cache key of itself (`triton_key`: a hash of its compiler's files and
      its 100+ MB shared library), 1.0-2.0 s on the H100 machine; a compile here
      needs it. It is computed once per process, but not under a lock: in a fresh
      process every thread that compiled at once computed it again (resnet50: 12.5
      thread-s), so compiles here wait for this one (`wait_prepared()`);
    - imports the first CUDA compile makes lazily (`_prepare_imports`); the import
      system's module locks make the compile's own import wait for it instead of
      repeating it.

    Both are cached, so this changes no result; a failure here is left to the
    compile that needs the same thing, which reports it."""
    with _start_lock:
        if _preparing:
            return
        for work, done in ((_prepare_key, _key_ready), (_prepare_imports, threading.Event())):
            thread = threading.Thread(
                target=_then_set, args=(work, done), name="ember-triton-prepare", daemon=True
            )
            _preparing.append(thread)
            thread.start()


def _then_set(work: Callable[[], object], done: threading.Event) -> None:
    try:
        work()
    except Exception:
        pass
    finally:
        done.set()


def _prepare_imports() -> None:
    """Modules a fresh process's first CUDA compile imports on its critical path
    (`python -X importtime` of attention's first training step, H100 machine): sympy's
    `sympy.tensor.tensor` (0.19 s with `sympy.combinatorics`), which sympy imports at
    its first sum of expressions, in the lowering; ember's Triton codegen (0.07 s),
    imported when the compiler asks which ops it renders; Triton's compiler."""
    for name in ("sympy.tensor.tensor", "ember.codegen.triton", "triton.compiler"):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def _prepare_key() -> None:
    from triton.runtime.cache import triton_key

    triton_key()


def wait_prepared() -> float:
    """Wait for `prepare_here`'s Triton key (nothing to wait for where it was not
    started); the seconds waited."""
    if not _preparing:
        return 0.0
    start = time.perf_counter()
    _key_ready.wait()
    return time.perf_counter() - start


def cuda_target(device: torch.device) -> tuple[str, int, int] | None:
    """Triton's target for a CUDA device (its capability and warp size, from
    ember.runtime.devices), or None off NVIDIA's CUDA (ROCm) or without the device."""
    from ember.runtime.devices import cuda_properties

    if torch.version.cuda is None:
        return None
    properties = cuda_properties(device)
    if properties is None or properties.capability is None:
        return None
    major, minor = properties.capability
    return ("cuda", major * 10 + minor, properties.warp_size)


Done = Callable[[dict[str, Any] | BaseException], None]


class CompileSession:
    """Compiles jobs while they are still being added, so the caller can render the
    next kernels meanwhile:

        session = CompileSession(threads=8)
        session.add(request, done)  # done(binary description or the exception)
        ...
        session.close()  # waits for every job

    or `session.seal()` when the last job is added, and `session.close()` later: the
    jobs keep compiling while the caller does other work (the next graph's lowering)
    and only the wait is deferred.

    The workers take requests from a shared queue; a job a worker failed on is
    compiled here instead, where its error (if any) is what `done` receives. Without
    live workers, `threads` threads here take the jobs. With workers there are no such
    threads: compiles in this process scale poorly (see above).

    Workers still starting join the session when they are ready: a small graph's jobs
    often come while few or none are up. Compiling here instead cost more (cnn_block's
    first graph, H100 machine: 9 jobs, 1.0 s on the 6 of 15 workers then ready, 1.6 s
    in threads here when none was). A job no worker takes, because the workers died or
    none got ready within `_READY_WAIT_S` of the session's close, is compiled here."""

    def __init__(self, threads: int) -> None:
        self._pending: queue.Queue[tuple[CompileRequest, Done] | None] = queue.Queue()
        self.by_workers = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._sealed = False
        self._unstarted = 0  # jobs added and not yet taken
        alive = [w for w in workers() if w.process.poll() is None]
        self.workers = len(alive)
        if alive:
            self._threads = [threading.Thread(target=self._feed, args=(w,)) for w in alive]
        else:
            self._threads = [threading.Thread(target=self._work_here) for _ in range(threads)]
        for t in self._threads:
            t.start()

    def add(self, request: CompileRequest, done: Done) -> None:
        with self._lock:
            self._unstarted += 1
        self._pending.put((request, done))

    def _take(self) -> tuple[CompileRequest, Done] | None:
        job = self._pending.get()
        if job is not None:
            with self._lock:
                self._unstarted -= 1
        return job

    def seal(self) -> None:
        """No more jobs: the threads end once the queued ones are taken."""
        with self._lock:
            if self._sealed:
                return
            self._sealed = True
        self._closing.set()
        for _ in self._threads:
            self._pending.put(None)

    def close(self, cancel: bool = False) -> None:
        """Seal, then wait for every job (with `cancel`, for the running ones only)."""
        if cancel:
            self._closing.set()
            self._drain(run=False)
            with self._lock:
                self._sealed = False  # an earlier seal's stop marks were drained too
        self.seal()
        for t in self._threads:
            t.join()
        self._drain(run=True)  # jobs no worker took: they died, or none got ready in time

    def _drain(self, run: bool) -> None:
        """Take every queued job, and compile it here if `run`."""
        with contextlib.suppress(queue.Empty):
            while True:
                job = self._pending.get_nowait()
                if job is None:
                    continue
                with self._lock:
                    self._unstarted -= 1
                if run:
                    _run_here(*job)

    def _feed(self, worker: _Worker) -> None:
        # a worker still starting joins once ready; it gives up if it dies, or once
        # the session is closing and every job has been taken or the wait is too long
        deadline = None
        while not worker.ready.wait(0.01):
            if worker.process.poll() is not None:
                return
            if self._closing.is_set():
                deadline = deadline or time.perf_counter() + _READY_WAIT_S
                if self._unstarted == 0 or time.perf_counter() > deadline:
                    return
        while (job := self._take()) is not None:
            request, done = job
            sent = time.perf_counter()
            reply = worker.run(request.payload)
            _add("in workers", time.perf_counter() - sent)
            if isinstance(reply, dict):
                with self._lock:
                    self.by_workers += 1
                done(reply)
            else:
                log.debug("a compile worker failed on %s: %s", request.function, reply)
                _run_here(request, done)

    def _work_here(self) -> None:
        while (job := self._take()) is not None:
            _run_here(*job)


def _run_here(request: CompileRequest, done: Done) -> None:
    start = time.perf_counter()
    result: dict[str, Any] | BaseException
    try:
        result = compile_here(request)
    except Exception as exc:
        result = exc
    _add("here", time.perf_counter() - start)
    done(result)


_READY_WAIT_S = 20.0  # a safety net: workers are ready about a second after their start


def _close_all() -> None:
    for worker in workers():
        worker.close()
    _workers.clear()
    _spawning.clear()
