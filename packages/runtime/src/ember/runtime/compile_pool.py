"""Worker processes that compile Triton kernels into Triton's on-disk cache.

Why processes. On the H100 machine (16 cores, Triton 3.6), resnet50's 60 compile jobs
took 17.3 s one after another, 6.4 s in 16 threads and 1.2 s in 16 processes
(benchmarks/compile_jobs.py). A Python thread spinning beside the compiles keeps its
full speed, so they do not hold the interpreter lock; still, threads in one process
serialise somewhere inside Triton's compiler, and processes do not.

Why workers import Triton only (ember/runtime/compile_worker.py, run by file path).
Workers that imported torch and compiled through Triton's jit took 16 s to start (15
at once), longer than most graphs take to compile, so they were off by default. A
worker that imports Triton alone is ready in about 1.5 s, including its first
compile (Triton loading its compiler libraries), well inside the seconds Dynamo and
AOTAutograd trace before ember sees a graph. Such a worker cannot run Triton's jit
(the jit's driver imports torch), so this process *captures* each compile: it runs
the jit's warm-up with the kernel's compile step replaced by a recorder (`capture`),
which keeps the source specialisation (signature, constants, attributes), the target
and the options the jit would compile with. A worker compiles exactly that, which
writes the binary under the key this process computes; this process's own warm-up
then finds it in the cache and only loads it.

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
import dataclasses
import functools
import importlib
import logging
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from ember.runtime.config import config

log = logging.getLogger(__name__)
_WORKER_SCRIPT = Path(__file__).with_name("compile_worker.py")


@dataclass(frozen=True)
class CompileRequest:
    """What Triton's jit would hand `triton.compile` for one kernel specialisation,
    in values a worker can unpickle with Triton alone."""

    path: str  # the kernel module's file
    module: str  # the module name this process loaded it under
    function: str
    signature: dict[str, str]
    constants: dict[Any, Any]
    attrs: dict[Any, Any]
    target: tuple[str, Any, int]  # Triton's GPUTarget: backend, arch, warp size
    options: dict[str, Any]
    # whether the worker also builds the C launcher (the first request of its
    # argument signature in this process; see compile_worker.build_launcher); the
    # session loads the signature's other jobs after this one is answered
    launcher: bool = False

    @functools.cached_property
    def payload(self) -> bytes:
        """The request as a worker reads it: its fields, pickled (once)."""
        return pickle.dumps({f.name: getattr(self, f.name) for f in fields(self)})


class _Captured(Exception):
    def __init__(self, source: Any, target: Any, options: Any) -> None:
        super().__init__("compile captured")
        self.source, self.target, self.options = source, target, options


def capture(fn: Any, path: str, device: int, warm: Callable[[], object]) -> CompileRequest | None:
    """The compile request `warm()` (a warm-up of the jit function `fn`, defined in the
    file at `path`, on CUDA device `device`) would make, without compiling: None
    where it makes none (the kernel is already compiled in this process) or where
    this Triton's jit does not work the way this relies on (it then compiles here).

    Triton's jit compiles through its `compile` attribute, which it sets when it first
    binds arguments for a device; binding first and then replacing the attribute
    catches the call, and the original goes back afterwards."""
    caches = getattr(fn, "device_caches", None)
    if caches is None:
        return None
    with _capturing:
        return _capture(fn, caches, path, device, warm)


_capturing = threading.Lock()  # one capture at a time: each swaps a jit attribute


def _capture(
    fn: Any, caches: Any, path: str, device: int, warm: Callable[[], object]
) -> CompileRequest | None:
    try:
        on_device = torch.cuda.device(device) if torch.cuda.is_available() else None
        with on_device or contextlib.nullcontext():
            caches[device]  # binds (and sets fn.compile) without compiling
        original = fn.compile
    except Exception as exc:
        log.debug("no compile capture for %s: binding failed: %r", path, exc)
        return None

    def record(source: Any, target: Any = None, options: Any = None, **_: Any) -> Any:
        raise _Captured(source, target, options)

    fn.compile = record
    try:
        warm()
    except _Captured as captured:
        return _request(fn, path, captured)
    except Exception as exc:
        log.debug("no compile capture for %s: the warm-up failed: %r", path, exc)
        return None
    finally:
        fn.compile = original
    log.debug("no compile capture for %s: the warm-up compiled nothing", path)
    return None


def _request(fn: Any, path: str, captured: _Captured) -> CompileRequest | None:
    source, target, options = captured.source, captured.target, captured.options
    try:
        request = CompileRequest(
            path=path,
            module=fn.__module__,
            function=fn.__name__,
            signature=dict(source.signature),
            constants=dict(source.constants),
            attrs=dict(source.attrs),
            target=(target.backend, target.arch, target.warp_size),
            options=dict(options),
        )
        request.payload  # noqa: B018  # a value a worker cannot receive: compile here
    except Exception as exc:
        log.debug("no compile capture for %s: %r", path, exc)
        return None
    # only a request that will be sent may promise its signature's launcher
    if _builds_launchers() and _first_of_signature(request.signature):
        request = dataclasses.replace(request, launcher=True)
    return request


@functools.cache
def _builds_launchers() -> bool:
    """Whether this Triton builds a C launcher per argument signature (3.6 does;
    later ones launch through one generic launcher, and nothing needs to wait)."""
    try:
        import importlib

        return hasattr(importlib.import_module("triton.backends.nvidia.driver"), "make_launcher")
    except Exception:
        return False


# Per argument signature (a C launcher is built per signature): set once the request
# that asked a worker to build its launcher is answered. Other jobs of the signature
# load after that, or the parent would build the same launcher meanwhile.
_launchers: dict[tuple[str, ...], threading.Event] = {}
_launchers_lock = threading.Lock()
_LAUNCHER_WAIT_S = 10.0  # a safety net: a job that waited in vain builds it itself


def _signature_key(signature: Any) -> tuple[str, ...]:
    return tuple(str(t) for t in dict(signature).values())


def _first_of_signature(signature: Any) -> bool:
    """Whether no request of this process had this argument signature before."""
    key = _signature_key(signature)
    with _launchers_lock:
        if key in _launchers:
            return False
        _launchers[key] = threading.Event()
        return True


def _launcher_settled(request: CompileRequest) -> None:
    """The launcher-building `request` is answered (or dropped)."""
    if request.launcher:
        event = _launchers.get(_signature_key(request.signature))
        if event is not None:
            event.set()


def _wait_for_launcher(request: CompileRequest) -> None:
    event = _launchers.get(_signature_key(request.signature))
    if event is not None and not request.launcher:
        event.wait(_LAUNCHER_WAIT_S)


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

    def _read(self) -> str:
        assert self.process.stdout is not None
        return str(pickle.load(self.process.stdout))

    def run(self, payload: bytes) -> str:
        """Compile a request (its `payload`): 'ok', or what went wrong."""
        stdin = self.process.stdin
        assert stdin is not None
        try:
            with self._lock:
                stdin.write(payload)
                stdin.flush()
                return self._read()
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
# Thread-seconds spent waiting on workers and loading what they compiled, summed over
# graphs, for compile-time profiles (benchmarks/compile_profile.py).
busy_seconds = {"in workers": 0.0, "loading": 0.0}
_busy_lock = threading.Lock()


def _add(key: str, seconds: float) -> None:
    with _busy_lock:
        busy_seconds[key] += seconds


_spawning: list[threading.Thread] = []


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
    if not _spawning and config.compile_workers > 0:
        count = config.compile_workers
        thread = threading.Thread(
            target=_spawn, args=(target, count), name="ember-compile-spawn", daemon=True
        )
        _spawning.append(thread)
        atexit.register(_close_all)
        thread.start()
        return count
    return len(workers())


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
_driver_ready = threading.Event()
_key_ready = threading.Event()


def prepare_here() -> None:
    """Start (once) two threads doing the one-time Triton work of this process that
    would otherwise fall on the first compile, while Dynamo and AOTAutograd trace:

    - Triton's CUDA driver object, which builds (or loads) Triton's C utilities with
      the host C compiler, 0.4 s; a capture needs it (`wait_prepared("driver")`);
    - Triton's cache key of itself (`triton_key`: a hash of its compiler's files and
      its 100+ MB shared library), 1.0-2.0 s on the H100 machine; a compile or a load
      needs it, a capture does not. It is computed once per process, but not under
      a lock: in a fresh process every thread that loaded a kernel at once computed
      it again (resnet50: 12.5 thread-s), so jobs wait for this one (`wait_prepared()`).

    Both mostly wait on a subprocess or hash outside the interpreter lock, so they
    run side by side. Both are cached by Triton, so this changes no result; a failure
    here is left to the compile that needs the same thing, which reports it.

    A third thread imports what the first CUDA compile imports lazily
    (`_prepare_imports`); the import system's module locks make the compile's own
    import wait for it instead of repeating it."""
    if _preparing:
        return
    for work, done in (
        (_prepare_driver, _driver_ready),
        (_prepare_key, _key_ready),
        (_prepare_imports, threading.Event()),
    ):
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


def _prepare_driver() -> None:
    from triton.runtime import driver

    driver.active.get_current_target()
    # Triton 3.6 imports its gluon layer at a kernel's first capture (0.16 s under
    # `-X importtime`); here, before captures may start, it cannot race theirs
    with contextlib.suppress(ImportError):
        importlib.import_module("triton.experimental.gluon.nvidia.hopper")


def _prepare_imports() -> None:
    """Modules a fresh process's first CUDA compile imports on its critical path
    (`python -X importtime` of attention's first training step, H100 machine): sympy's
    `sympy.tensor.tensor` (0.19 s with `sympy.combinatorics`), which sympy imports at
    its first sum of expressions, in the lowering; and ember's Triton codegen
    (0.07 s), imported when the compiler asks which ops it renders. Mostly file reads
    (that machine's file system is slow to stat), so they overlap the tracing."""
    for name in ("sympy.tensor.tensor", "ember.codegen.triton"):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def _prepare_key() -> None:
    from triton.runtime.cache import triton_key

    triton_key()


def wait_prepared(part: str = "all") -> float:
    """Wait for `prepare_here`'s work, all of it or only the `"driver"` part (nothing
    to wait for where it was not started); the seconds waited."""
    if not _preparing:
        return 0.0
    start = time.perf_counter()
    _driver_ready.wait()
    if part != "driver":
        _key_ready.wait()
    return time.perf_counter() - start


def cuda_target(device: torch.device) -> tuple[str, int, int] | None:
    """Triton's target for a CUDA device, or None off NVIDIA's CUDA (ROCm)."""
    if torch.version.cuda is None:
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return ("cuda", major * 10 + minor, 32)


class CompileSession:
    """Compiles jobs while they are still being added, so the caller can render and
    capture the next kernels meanwhile:

        session = CompileSession(threads=8)
        session.add(request, here)  # request: a CompileRequest, or None
        ...
        session.close()  # waits for every job

    or `session.seal()` when the last job is added, and `session.close()` later: the
    jobs keep compiling while the caller does other work (the next graph's lowering)
    and only the wait is deferred.

    A job is a request for a worker (None: it can only be compiled here) and `here`, a
    callable that compiles the job in this process or, after a worker compiled it,
    loads the binary from Triton's cache (the same warm-up does both). The workers
    take requests from a shared queue; a job a worker failed on runs `here` instead,
    where its error (if any) is reported. Without live workers, `threads` threads
    here take the jobs. With workers there are no such threads: compiles in this
    process scale poorly (see above), and they would hold up the loading.

    Workers still starting join the session when they are ready: a small graph's jobs
    often come while few or none are up. Compiling here instead cost more (cnn_block's
    first graph, H100 machine: 9 jobs, 1.0 s on the 6 of 15 workers then ready, 1.6 s
    in threads here when none was). A job no worker takes, because the workers died or
    none got ready within `_READY_WAIT_S` of the session's close, is compiled here."""

    def __init__(self, threads: int) -> None:
        self._pending: queue.Queue[tuple[CompileRequest | None, Callable[[], None]] | None]
        self._pending = queue.Queue()
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

    def add(self, request: CompileRequest | None, here: Callable[[], None]) -> None:
        with self._lock:
            self._unstarted += 1
        self._pending.put((request if self.workers else None, here))

    def _take(self) -> tuple[CompileRequest | None, Callable[[], None]] | None:
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
        """Take every queued job; settle its launcher claim, and compile it here if
        `run`."""
        with contextlib.suppress(queue.Empty):
            while True:
                job = self._pending.get_nowait()
                if job is None:
                    continue
                with self._lock:
                    self._unstarted -= 1
                if job[0] is not None:
                    _launcher_settled(job[0])
                if run:
                    job[1]()

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
            request, here = job
            if request is None:
                here()
                continue
            sent = time.perf_counter()
            try:
                reply = worker.run(request.payload)
            finally:
                _launcher_settled(request)
            _wait_for_launcher(request)
            replied = time.perf_counter()
            _add("in workers", replied - sent)
            here()
            if reply == "ok":
                _add("loading", time.perf_counter() - replied)
                with self._lock:
                    self.by_workers += 1

    def _work_here(self) -> None:
        while (job := self._take()) is not None:
            job[1]()


_READY_WAIT_S = 20.0  # a safety net: workers are ready about a second after their start


def _close_all() -> None:
    for worker in workers():
        worker.close()
    _workers.clear()
    _spawning.clear()


def warm_up(
    fn: Any,
    dtypes: Sequence[torch.dtype],
    ints: int,
    blocks: Sequence[tuple[str, int]],
    num_warps: int,
    num_stages: int,
    device: int,
    options: dict[str, Any] | None = None,
) -> Any:
    """Compile (or load) the jit function `fn` for one launch config the way a real
    launch specialises it: 16-byte-aligned pointers of `dtypes`, then `ints` sizes of
    an int32 value (sizes are never specialised by value), on CUDA device `device`,
    with the kernel's own Triton `options` (`TritonKernel.launch_options`: a kernel
    with index checks compiles with `debug`; a worker compiles the options captured
    here). Returns Triton's compiled kernel.

    The pointers are Triton's stand-ins (`MockTensor`: a dtype and an aligned address),
    not tensors: this runs while AOTAutograd traces, where a tensor made in the
    tracing thread is a fake one without an address."""
    from triton.runtime.jit import MockTensor

    with torch.cuda.device(torch.device("cuda", device)):
        args: list[object] = [MockTensor(d) for d in dtypes]
        args += [64] * ints
        return fn.warmup(
            *args,
            grid=(1,),
            **dict(blocks),
            num_warps=num_warps,
            num_stages=num_stages,
            **(options or {}),
        )
