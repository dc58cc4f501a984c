"""Worker processes that compile Triton kernels into Triton's on-disk cache.

Triton compiles a kernel the first time it is launched, in the launching thread, and
most of a compile holds Python's interpreter lock: compiling a graph's kernels in
threads only halved GPT-2's cold start on an H100. Worker processes compile in
parallel for real. A worker does what the main process would (imports the kernel's
module file and calls the jit function's `warmup` with arguments of the same dtypes
and alignment), so the binary lands in the shared cache under the key the main
process computes; the main process's own warm-up then only loads it.

Workers are plain subprocesses (`python -m ember.runtime.compile_pool`) speaking one
JSON line per job over their stdin/stdout, not multiprocessing children: a spawned
child re-imports the user's main script, which would re-run an unguarded training
script. The pool starts when ember first compiles a graph with CUDA inputs (the
backend calls `start()`), so the workers import torch while Dynamo and AOTAutograd
are still tracing. It is off by default (`EMBER_COMPILE_WORKERS=0`): a worker takes
seconds to import torch, so it rarely helps the first graph, and each holds a CUDA
context of its own. Measured on an H200 with GPT-2 inference (before repeated layers
shared one source): 22.0 s cold with threads only, 19.6 s with twelve workers.
It stays off now that most kernels compile one to three configs (GPT-2 inference 29
jobs, resnet50 57, both under four seconds of compiling): on a 2-core CPU machine
(benchmarks/compile_jobs.py, Triton 3.9 compiling for sm_90) a Python thread spinning
beside serial compiles kept 83% of its speed, so compiles leave the interpreter lock
free most of the time and threads already scale (20 compiles: 2.5-3.0 s serial,
1.6-2.2 s in two threads, 1.4-2.7 s in two processes), while starting two workers
took 9-17 s, longer than the compiles they would share.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import torch

from ember.runtime.config import config
from ember.runtime.loader import load_module


@dataclass(frozen=True)
class CompileJob:
    """One kernel source and one launch config, described with plain values."""

    path: str  # the kernel module's file
    function: str
    dtypes: tuple[str, ...]  # torch dtype names of the pointer arguments
    ints: int  # how many int arguments follow them
    blocks: tuple[tuple[str, int], ...]
    num_warps: int
    num_stages: int
    device: int


class _Worker:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ember.runtime.compile_pool"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        self.ready = threading.Event()  # set once the worker has imported torch
        threading.Thread(target=self._wait_ready, daemon=True).start()

    def _wait_ready(self) -> None:
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() == "ready":
            self.ready.set()

    def run(self, job: CompileJob) -> str:
        """'ok', or what went wrong."""
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(json.dumps(asdict(job)) + "\n")
            stdin.flush()
            return stdout.readline().strip() or "worker exited"
        except OSError as exc:
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


def start() -> int:
    """Start the workers (once); how many there are."""
    if not _workers and config.compile_workers > 0:
        _workers.extend(_Worker() for _ in range(config.compile_workers))
        atexit.register(_close_all)
    return len(_workers)


def compile_all(
    jobs: Sequence[CompileJob], local: Callable[[int], None], threads: int
) -> list[int]:
    """Run `jobs`: workers that are ready take them from a shared queue, and so do
    `threads` threads here that call `local(i)` (compiling in this process). Returns
    the indices of the jobs a worker compiled without error (their binaries are in
    Triton's disk cache; the caller still loads them).

    Workers still importing torch take no part: waiting for them would cost a small
    graph more than compiling it here (twelve workers starting at once took ~10 s on
    the GPU machine), and they are ready for the next graph (the backward, say).
    """
    start()
    pending: queue.Queue[int] = queue.Queue()
    for i in range(len(jobs)):
        pending.put(i)
    remote: list[int] = []

    def next_job() -> int | None:
        try:
            return pending.get_nowait()
        except queue.Empty:
            return None

    def feed(worker: _Worker) -> None:
        while (i := next_job()) is not None:
            if worker.run(jobs[i]) == "ok":
                remote.append(i)
            else:
                local(i)  # compiled here instead, where its error (if any) is reported

    def work_here() -> None:
        while (i := next_job()) is not None:
            local(i)

    pool = [threading.Thread(target=feed, args=(w,)) for w in _workers if w.ready.is_set()]
    pool += [threading.Thread(target=work_here) for _ in range(max(1, threads))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sorted(remote)


def _close_all() -> None:
    for worker in _workers:
        worker.close()
    _workers.clear()


def warm_up(
    fn: Any,
    dtypes: Sequence[torch.dtype],
    ints: int,
    blocks: Sequence[tuple[str, int]],
    num_warps: int,
    num_stages: int,
    device: int,
) -> None:
    """Compile the jit function `fn` for one launch config the way a real launch
    specialises it: 16-byte-aligned pointers of `dtypes`, then `ints` sizes of an
    int32 value (sizes are never specialised by value), on CUDA device `device`. Both
    this process and the workers call this, so their cache keys agree."""
    cuda = torch.device("cuda", device)
    with torch.cuda.device(cuda):
        args: list[object] = [torch.empty(16, dtype=d, device=cuda) for d in dtypes]
        args += [64] * ints
        fn.warmup(*args, grid=(1,), **dict(blocks), num_warps=num_warps, num_stages=num_stages)


def compile_job(job: dict[str, Any]) -> None:
    """In a worker: compile one job into Triton's cache (the binary is discarded)."""
    module = load_module(Path(job["path"]), {})  # the module name this process gives it
    warm_up(
        getattr(module, job["function"]),
        [getattr(torch, name) for name in job["dtypes"]],
        job["ints"],
        [(name, value) for name, value in job["blocks"]],
        job["num_warps"],
        job["num_stages"],
        job["device"],
    )


def _serve(requests: IO[str], replies: IO[str]) -> None:
    import triton  # noqa: F401  (imported, like torch, before the parent sends work)

    replies.write("ready\n")
    replies.flush()
    for line in requests:
        try:
            compile_job(json.loads(line))
            reply = "ok"
        except Exception as exc:  # reported to the parent, which compiles lazily instead
            reply = f"error: {type(exc).__name__}: {exc}".replace("\n", " ")
        replies.write(reply + "\n")
        replies.flush()


if __name__ == "__main__":
    # Replies use a private copy of stdout; anything else written to fd 1 (by torch,
    # Triton or the compilers they run) goes to stderr and cannot corrupt a reply.
    _replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    _serve(sys.stdin, _replies)
