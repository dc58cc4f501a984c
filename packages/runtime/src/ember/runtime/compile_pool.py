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
are still tracing. `EMBER_COMPILE_WORKERS=0` turns it off.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from ember.runtime.config import config


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
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()


_workers: list[_Worker] = []


def start() -> int:
    """Start the workers (once); how many there are."""
    if not _workers and config.compile_workers > 0:
        _workers.extend(_Worker() for _ in range(config.compile_workers))
        atexit.register(_close_all)
    return len(_workers)


def compile_all(jobs: Sequence[CompileJob]) -> list[str]:
    """Run `jobs` on the workers; an outcome per job ('ok' or an error message)."""
    if not jobs or start() == 0:
        return []
    pending: queue.Queue[int] = queue.Queue()
    for i in range(len(jobs)):
        pending.put(i)
    outcomes = [""] * len(jobs)

    def feed(worker: _Worker) -> None:
        while True:
            try:
                i = pending.get_nowait()
            except queue.Empty:
                return
            outcomes[i] = worker.run(jobs[i])

    threads = [threading.Thread(target=feed, args=(w,)) for w in _workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def _close_all() -> None:
    for worker in _workers:
        worker.close()
    _workers.clear()


def compile_job(job: dict[str, Any]) -> None:
    """In a worker: compile one job into Triton's cache (the binary is discarded)."""
    import torch

    path = Path(job["path"])  # imported under the name ember.runtime.loader gives it
    spec = importlib.util.spec_from_file_location(f"ember_generated_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, job["function"])
    device = torch.device("cuda", job["device"])
    with torch.cuda.device(device):
        args: list[object] = [
            torch.empty(16, dtype=getattr(torch, name), device=device) for name in job["dtypes"]
        ]
        args += [64] * job["ints"]
        blocks = {name: value for name, value in job["blocks"]}
        fn.warmup(
            *args,
            grid=(1,),
            **blocks,
            num_warps=job["num_warps"],
            num_stages=job["num_stages"],
        )


def _serve(requests: IO[str], replies: IO[str]) -> None:
    import torch  # noqa: F401  (imported up front, while the parent is still tracing)

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
