"""`ember bench`: run the measurements, one process each, and gather the records.

For each model and mode it runs eager once, then for each compiling backend a cold
process (fresh cache directories) and, unless `--no-warm`, a warm process reusing the
cold run's caches. Progress goes to stderr; the table goes to stdout; `--json` writes
the records and `--plot` a chart. A time limit (`--time-limit`) bounds the whole run:
measurements not started by then are recorded as not run, so a run on a shared GPU
machine ends when promised.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ember.runtime.bench.registry import MODELS, ModelSpec, models_for

BACKENDS = ("eager", "inductor", "ember")
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


class Progress:
    """A one-line progress bar on stderr (a line per step when stderr is not a terminal)."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.start = total, 0, time.perf_counter()
        self.tty = sys.stderr.isatty()

    def show(self, label: str) -> None:
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        elapsed = time.perf_counter() - self.start
        bar = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
        line = f"{bar}{elapsed:5.0f}s  {label}"
        if self.tty:
            print(f"\r{line:<110}", end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def finish(self) -> None:
        if self.tty:
            print(file=sys.stderr)


def _run_worker(
    spec: ModelSpec,
    mode: str,
    backend: str,
    options: BenchOptions,
    phase: str,
    cache: Path,
    timeout_s: float,
) -> dict[str, Any]:
    out = cache / f"{backend}-{phase}.json"
    env = dict(os.environ)
    env.update(
        EMBER_CACHE_DIR=str(cache / "ember"),
        TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
        TRITON_CACHE_DIR=str(cache / "triton"),
    )
    command = [sys.executable, "-m", "ember.runtime.bench.measure", "--model", spec.name]
    command += ["--mode", mode, "--backend", backend, "--device", options.device]
    command += ["--dtype", dtype_for(options), "--phase", phase, "--runs", str(options.runs)]
    threads = options.threads if options.threads is not None else int(options.device == "cpu")
    command += ["--threads", str(threads), "--out", str(out)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"{phase} measurement timed out after {timeout_s:.0f} s"}
    if done.returncode != 0 or not out.exists():
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return {"error": f"{phase}: " + (lines[-1] if lines else f"exit {done.returncode}")[:300]}
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def dtype_for(options: BenchOptions) -> str:
    return options.dtype or ("float32" if options.device == "cpu" else "bfloat16")


def run_bench(options: BenchOptions) -> list[BenchRecord]:
    """Measure every selected (model, mode, backend); skipped models get a record too."""
    specs = [MODELS[name] for name in options.models]
    dtype = dtype_for(options)
    records: list[BenchRecord] = []
    for spec in specs:
        if not spec.available():
            print(f"ember bench: skipping {spec.name}: needs {spec.requires}", file=sys.stderr)
    runnable = [s for s in specs if s.available()]
    per_case = sum(1 if b == "eager" else 1 + options.warm for b in options.backends)
    progress = Progress(len(runnable) * len(options.modes) * per_case)
    start = time.perf_counter()
    for spec in specs:
        for mode in options.modes:
            for backend in options.backends:
                record = BenchRecord(spec.name, mode, options.device, dtype, backend)
                records.append(record)
                if not spec.available():
                    record.error = f"skipped: needs {spec.requires}"
                    continue
                phases = ["cold"] + (["warm"] if options.warm and backend != "eager" else [])
                with tempfile.TemporaryDirectory(prefix="ember-bench-") as tmp:
                    for phase in phases:
                        left = options.time_limit_s - (time.perf_counter() - start)
                        if left < 5:
                            record.error = record.error or "not run: --time-limit reached"
                            progress.done += 1
                            continue
                        progress.show(f"{spec.name} {mode} {backend} ({phase})")
                        timeout = min(options.timeout_s, left)  # the limit bounds the run
                        result = _run_worker(
                            spec, mode, backend, options, phase, Path(tmp), timeout
                        )
                        progress.done += 1
                        _merge(record, phase, result)
    progress.finish()
    _fill_speedups(records)
    return records


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
    for key in ("device_kernels", "graphs", "ran_eagerly"):
        setattr(record, key, result.get(key))
    if record.backend == "eager":
        record.max_abs_err = 0.0
    if "mismatch" in result:
        record.notes.append(result["mismatch"].splitlines()[0])
    if result.get("ran_eagerly"):
        record.notes.append(f"{result['ran_eagerly']} graph(s) ran eagerly after a compile failure")


def _fill_speedups(records: list[BenchRecord]) -> None:
    eager = {(r.model, r.mode): r.ms for r in records if r.backend == "eager" and r.ms}
    for r in records:
        base = eager.get((r.model, r.mode))
        if base and r.ms:
            r.speedup_vs_eager = base / r.ms


def default_models(device: str) -> list[str]:
    return [spec.name for spec in models_for(device)]


def write_json(records: list[BenchRecord], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(r) for r in records], indent=1))
