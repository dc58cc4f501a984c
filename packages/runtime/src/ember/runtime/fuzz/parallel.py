"""Fuzzing in worker processes: every core busy, and a crash is a finding.

`fuzz_in_workers` starts `workers` processes (`python -m ember.runtime.fuzz --worker`)
and hands them seeds one at a time, so a slow program holds one worker, not a share
of the seeds. A worker prints `start <seed>` before a seed and one JSON line with its
outcome after it (`serve`). A worker that ends in the middle of a seed (killed by a
signal, say) leaves a 'crash' failure for that seed, with the program written out as
a reproducer, and a new worker takes its place: one bad program cannot stop a
campaign, as it would in a single process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path

from ember.runtime.fuzz.campaign import CampaignResult, Failure, record, run_seed
from ember.runtime.fuzz.generate import generate, hazards_for
from ember.runtime.fuzz.program import Program
from ember.runtime.fuzz.run import Finding
from ember.runtime.fuzz.shrink import write_reproducer


def serve(out_dir: Path | None, device: str, max_steps: int) -> int:
    """A worker's loop: a seed per line of stdin, its outcome as a JSON line."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for line in sys.stdin:
            seed = int(line)
            print(f"start {seed}", flush=True)
            outcome, dynamic, failure = run_seed(seed, out_dir, device, max_steps)
            reply = {"seed": seed, "outcome": outcome, "dynamic": dynamic}
            reply["failure"] = asdict(failure) if failure is not None else None
            print(json.dumps(reply), flush=True)
    return 0


def fuzz_in_workers(
    seeds: Iterable[int],
    *,
    workers: int,
    out_dir: Path | None = None,
    time_budget_s: float = float("inf"),
    device: str = "cpu",
    max_steps: int = 10,
    worker_command: Sequence[str] | None = None,
) -> CampaignResult:
    """`fuzz(seeds, ...)` over `workers` processes (`worker_command`: another program
    that speaks `serve`'s protocol, for tests)."""
    result = CampaignResult()
    pending = iter(seeds)
    lock = threading.Lock()
    start = time.perf_counter()
    command = [sys.executable, "-m", "ember.runtime.fuzz", "--worker", "--device", device]
    command += ["--max-steps", str(max_steps)]
    if out_dir is not None:
        command += ["--out", str(out_dir)]
    if worker_command is not None:
        command = list(worker_command)
    # one thread each: the workers share the cores instead of fighting over them
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EMBER_COMPILE_WORKERS": "0"}

    def next_seed() -> int | None:
        with lock:
            if time.perf_counter() - start > time_budget_s:
                return None
            return next(pending, None)

    def drive() -> None:
        process: subprocess.Popen[str] | None = None
        while (seed := next_seed()) is not None:
            if process is None:
                process = subprocess.Popen(
                    command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
                )
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(f"{seed}\n")
            process.stdin.flush()
            reply = None
            for line in process.stdout:
                if line.startswith("{"):
                    reply = json.loads(line)
                    break
            with lock:
                if reply is not None:
                    failure = reply["failure"]
                    record(
                        result,
                        reply["outcome"],
                        reply["dynamic"],
                        Failure(**failure) if failure is not None else None,
                    )
                    continue
            code = process.wait()
            process = None
            program = generate(seed, max_steps, hazards_for(device))
            crash = _crash(program, code, out_dir, device)
            with lock:
                record(result, "failure", program.dynamic, crash)
        if process is not None and process.stdin is not None:
            process.stdin.close()
            process.wait()

    threads = [threading.Thread(target=drive) for _ in range(max(1, workers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result.failures.sort(key=lambda f: f.seed)
    result.seconds = time.perf_counter() - start
    return result


def _crash(program: Program, code: int, out_dir: Path | None, device: str) -> Failure:
    """The failure of a program whose worker ended with exit status `code` (negative:
    the signal that killed it); it is written out unshrunk (shrinking would crash this
    process)."""
    how = f"signal {-code}" if code < 0 else f"exit status {code}"
    finding = Finding("crash", f"the process ended with {how}")
    path = write_reproducer(program, finding, out_dir, device) if out_dir else None
    steps = len(program.steps)
    return Failure(
        program.seed, finding.kind, finding.detail, steps, steps, str(path) if path else None
    )
