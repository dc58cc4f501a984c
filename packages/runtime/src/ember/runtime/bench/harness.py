"""`ember bench`: run the measurements, one process each, and gather the records.

For each model and mode it runs eager once, then for each compiling backend (Inductor,
Inductor with CUDA graphs as "inductor-ro", ember) a cold process (fresh cache
directories) and, unless `--no-warm`, a warm process reusing the cold run's caches.
Progress goes to stderr; the tables go to stdout; `--json` writes the records and
`--plot` a chart. A time limit (`--time-limit`) bounds the whole run:
measurements not started by then are recorded as not run, so a run on a shared GPU
machine ends when promised.

Prefetch (on by default off the CPU): while one measurement runs, the next one's process
is already started and has imported torch, ember and the model's library, then waits
for its turn on stdin. On the GPU machine those imports took about a third of each
measurement's ten to twenty seconds. Nothing it measures starts before its turn: the
cold compile is still timed from the first call. On the CPU it stays off, since the
importing process would take the core beside a one-thread timing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ember.runtime.bench.registry import MODELS, ModelSpec, models_for

# "inductor-ro" is Inductor with mode="reduce-overhead": its kernels replayed from CUDA
# graphs, the bar for launch-bound models on the GPU. It is in the GPU default only:
# on the CPU it compiles what "inductor" compiles and replays nothing.
BACKENDS = ("eager", "inductor", "inductor-ro", "ember")
CPU_BACKENDS = ("eager", "inductor", "ember")
# Also accepted: "aot_eager", Dynamo + AOTAutograd running the graphs eagerly, the
# floor of every backend's cold compile (the issue asks for it beside both).
OPTIONAL_BACKENDS = ("aot_eager",)
MODES = ("inference", "train")


@dataclass
class BenchRecord:
    """One row of the results: a model, mode and backend on one device and dtype."""

    model: str
    mode: str
    device: str
    dtype: str
    backend: str
    compile_cold_s: float | None = None
    compile_warm_s: float | None = None
    ms: float | None = None
    speedup_vs_eager: float | None = None
    peak_mem_bytes: int | None = None
    max_abs_err: float | None = None
    matches_eager: bool | None = None
    kernels: int | None = None
    device_kernels: int | None = None
    graphs: int | None = None
    ran_eagerly: int | None = None
    cudagraphs: str | None = None  # per ember graph: whether its calls replay CUDA graphs
    error: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class BenchOptions:
    models: list[str]
    modes: list[str]
    backends: list[str]
    device: str = "cpu"
    dtype: str | None = None  # default: float32 on CPU, bfloat16 on GPU
    runs: int = 20
    # CPU threads per measurement (0: torch's default). One by default on the CPU: with
    # all cores, a core taken by any other process stalls every OpenMP region of the
    # measured one and medians jump 100x on a shared 2-core machine.
    threads: int | None = None
    warm: bool = True
    timeout_s: float = 900.0
    time_limit_s: float = float("inf")
    prefetch: bool | None = None  # None: on for devices other than the CPU
    # torch.compile's `mode` for ember (None: not passed); the other backends ignore it
    ember_mode: str | None = None

    @property
    def prefetching(self) -> bool:
        return self.device != "cpu" if self.prefetch is None else self.prefetch


class _Progress:
    """The measurements' progress on stderr, drawn by rich.progress: a live bar on a
    terminal. Anywhere else (a CI log, `2> file`) rich would print the bar only when it
    stops, and with FORCE_COLOR set it takes a log for a terminal and fills it with
    cursor movements; there it prints one plain line as each measurement starts."""

    def __init__(self, total: int) -> None:
        self.console = Console(stderr=True, highlight=False)
        self.live = self.console.is_interactive and sys.stderr.isatty()
        label = TextColumn("{task.description}")
        columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), label)
        self.bar = Progress(*columns, console=self.console, disable=not self.live)
        self.task = self.bar.add_task("", total=total)
        self.total, self.done, self.start = total, 0, time.perf_counter()

    def __enter__(self) -> _Progress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.update(self.task, description="done" if self.done == self.total else "")
        self.bar.stop()

    def show(self, label: str) -> None:
        """A measurement starts."""
        self.bar.update(self.task, description=label)
        if not self.live:
            elapsed = time.perf_counter() - self.start
            line = f"ember bench: [{self.done + 1}/{self.total}] {elapsed:.0f} s  {label}"
            print(line, file=sys.stderr, flush=True)

    def advance(self) -> None:
        """A measurement ended (or was not run)."""
        self.done += 1
        self.bar.update(self.task, completed=self.done)


@dataclass
class _Job:
    """One measurement process: started (perhaps ahead of its turn), then released."""

    record: BenchRecord
    spec: ModelSpec
    phase: str
    out: Path
    process: subprocess.Popen[str] | None = None


def _start(job: _Job, options: BenchOptions) -> None:
    """Start the measurement process; it imports, then waits for 'go' on stdin. Its
    cache directories sit beside its record (the warm phase reuses the cold one's)."""
    cache = job.out.parent
    cache.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        EMBER_CACHE_DIR=str(cache / "ember"),
        TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
        TRITON_CACHE_DIR=str(cache / "triton"),
    )
    record = job.record
    command = [sys.executable, "-m", "ember.runtime.bench.measure", "--model", job.spec.name]
    command += ["--mode", record.mode, "--backend", record.backend, "--device", options.device]
    command += ["--dtype", record.dtype, "--phase", job.phase, "--runs", str(options.runs)]
    threads = options.threads if options.threads is not None else int(options.device == "cpu")
    command += ["--threads", str(threads), "--out", str(job.out), "--wait"]
    if options.ember_mode is not None and record.backend == "ember":
        command += ["--ember-mode", options.ember_mode]
    job.process = subprocess.Popen(
        command,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a timeout kills its children too
    )


def _release(job: _Job, go: bool) -> None:
    """Let a started process measure ('go'), or tell it to exit unmeasured."""
    assert job.process is not None and job.process.stdin is not None
    try:
        job.process.stdin.write("go\n" if go else "stop\n")
        job.process.stdin.close()
    except BrokenPipeError:  # it died while importing; its stderr says why
        pass
    job.process.stdin = None  # closed: communicate() must not flush it


def _kill_group(process: subprocess.Popen[str]) -> None:
    """Kill a measurement and everything it started (compile workers, ptxas), whose
    inherited stderr would otherwise keep `communicate` waiting after the kill (the
    likely reason a GPU run went 10 s past its time limit and lost its table)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()
    # a child that left the group may still hold the pipe: give up on it after 10 s
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.communicate(timeout=10)


def _finish(job: _Job, timeout_s: float) -> dict[str, Any]:
    assert job.process is not None
    try:
        _, stderr = job.process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(job.process)
        return {"error": f"{job.phase} measurement timed out after {timeout_s:.0f} s"}
    if job.process.returncode != 0 or not job.out.exists():
        lines = [line for line in stderr.splitlines() if line.strip()]
        code = job.process.returncode
        return {"error": f"{job.phase}: " + (lines[-1] if lines else f"exit {code}")[:300]}
    result: dict[str, Any] = json.loads(job.out.read_text())
    return result


def dtype_for(options: BenchOptions) -> str:
    return options.dtype or ("float32" if options.device == "cpu" else "bfloat16")


def run_bench(
    options: BenchOptions, on_record: Callable[[list[BenchRecord]], None] | None = None
) -> list[BenchRecord]:
    """Measure every selected (model, mode, backend); skipped models get a record too.
    `on_record` sees all the records after each measurement (the finished ones
    filled in), so a run stopped from outside (a time limit on the whole run) keeps
    what it measured: `--json` writes them each time."""
    specs = [MODELS[name] for name in options.models]
    dtype = dtype_for(options)
    records: list[BenchRecord] = []
    jobs: list[_Job] = []
    with tempfile.TemporaryDirectory(prefix="ember-bench-") as tmp:
        for spec in specs:
            if not spec.available():
                print(f"ember bench: skipping {spec.name}: needs {spec.requires}", file=sys.stderr)
            for mode in options.modes:
                for backend in options.backends:
                    record = BenchRecord(spec.name, mode, options.device, dtype, backend)
                    records.append(record)
                    if backend == "ember" and options.ember_mode is not None:
                        record.notes.append(f"mode={options.ember_mode}")
                    if not spec.available():
                        record.error = f"skipped: needs {spec.requires}"
                        continue
                    # the warm phase reuses the cold phase's cache directories
                    cache = Path(tmp) / f"{spec.name}-{mode}-{backend}"
                    warm = options.warm and backend != "eager"
                    for phase in ["cold"] + (["warm"] if warm else []):
                        jobs.append(_Job(record, spec, phase, cache / f"{phase}.json"))
        _run_jobs(jobs, options, lambda: on_record(_with_speedups(records)) if on_record else None)
    return _with_speedups(records)


def _run_jobs(jobs: list[_Job], options: BenchOptions, measured: Callable[[], None]) -> None:
    start = time.perf_counter()
    with _Progress(len(jobs)) as progress:
        for number, job in enumerate(jobs):
            left = options.time_limit_s - (time.perf_counter() - start)
            if left < 5:
                job.record.error = job.record.error or "not run: --time-limit reached"
                if job.process is not None:  # prefetched: let it exit unmeasured
                    _release(job, go=False)
                    job.process.communicate()
                progress.advance()
                continue
            if job.process is None:
                _start(job, options)
            record = job.record
            progress.show(f"{record.model} {record.mode} {record.backend} ({job.phase})")
            _release(job, go=True)
            following = jobs[number + 1] if number + 1 < len(jobs) else None
            if options.prefetching and following is not None:
                _start(following, options)
            result = _finish(job, min(options.timeout_s, left))  # the limit bounds the run
            progress.advance()
            _merge(record, job.phase, result)
            measured()


def _merge(record: BenchRecord, phase: str, result: dict[str, Any]) -> None:
    if "error" in result:
        record.error = record.error or result["error"]
        return
    if phase == "warm":
        record.compile_warm_s = result.get("compile_s")
        return
    record.compile_cold_s = result.get("compile_s")
    for key in ("ms", "peak_mem_bytes", "max_abs_err", "matches_eager", "kernels"):
        setattr(record, key, result.get(key))
    for key in ("device_kernels", "graphs", "ran_eagerly", "cudagraphs"):
        setattr(record, key, result.get(key))
    if record.backend == "eager":
        record.max_abs_err = 0.0
    if "mismatch" in result:
        record.notes.append(result["mismatch"].splitlines()[0])
    if result.get("ran_eagerly"):
        record.notes.append(
            f"{result['ran_eagerly']} graph(s) ran eagerly "
            "(a compile failure, or a dtype eager has no kernel for)"
        )


def _with_speedups(records: list[BenchRecord]) -> list[BenchRecord]:
    eager = {(r.model, r.mode): r.ms for r in records if r.backend == "eager" and r.ms}
    for r in records:
        base = eager.get((r.model, r.mode))
        if base and r.ms:
            r.speedup_vs_eager = base / r.ms
    return records


def default_models(device: str) -> list[str]:
    return [spec.name for spec in models_for(device)]


def default_backends(device: str) -> list[str]:
    return list(CPU_BACKENDS if device == "cpu" else BACKENDS)


def unmeasured(records: list[BenchRecord]) -> list[BenchRecord]:
    """The records of measurements that were asked for and did not give a trustworthy
    time: failed, timed out, skipped (a missing library), not run (the time limit),
    or compiled to something that does not match eager."""
    return [r for r in records if r.error is not None or r.ms is None or r.matches_eager is False]


def write_json(
    records: list[BenchRecord], path: Path, environment: dict[str, Any] | None = None
) -> None:
    """`{"environment": ..., "records": [...]}`: the records with what they ran on
    (ember.runtime.environment: versions, commit, device and CPU)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"environment": environment or {}, "records": [asdict(r) for r in records]}
    path.write_text(json.dumps(document, indent=1))
