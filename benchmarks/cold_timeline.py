"""Where the wall time of one cold first call goes, in a fresh process.

    python benchmarks/cold_timeline.py --model mlp [--mode inference] [--backend ember]

Like `ember bench`'s cold phase (fresh cache directories, a fresh process, the model
built and CUDA initialised before the clock starts), it times the first call. Meanwhile
a sampler thread records every thread's Python stack each few milliseconds (a wall-time
profile: waits count, unlike cProfile's, and all threads are seen), and the external
programs started (the C compiler building Triton's launchers, ptxas) are timed. It
prints, per thread group, the functions that were on the stack for the most wall time
(inclusive), and the subprocesses by program. A profile, not the benchmark. Under
`python -X importtime` the imports the first call makes follow a marker line on stderr.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gc
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_ROOT = tempfile.mkdtemp(prefix="ember-cold-timeline-")
for _var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "EMBER_CACHE_DIR"):
    os.environ[_var] = os.path.join(_ROOT, _var.lower())
for _src in sorted((Path(__file__).resolve().parent.parent / "packages").glob("*/src")):
    if str(_src) not in sys.path:
        sys.path.insert(0, str(_src))

import torch  # noqa: E402

import ember.runtime  # noqa: E402,F401  (registers the backend)
from ember.runtime.bench.measure import prepare, step_fn  # noqa: E402

_programs: list[tuple[str, float, float]] = []  # (program, start, seconds)


def _timed(original: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        command = args[0] if args else kwargs.get("args")
        program = command[0] if isinstance(command, (list, tuple)) else str(command).split()[0]
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            _programs.append((os.path.basename(str(program)), start, time.perf_counter() - start))

    return run


class Sampler(threading.Thread):
    """Every `interval` seconds, the Python stack of every other thread."""

    def __init__(self, interval: float) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.samples: list[tuple[float, dict[int, list[str]]]] = []
        self.stop = threading.Event()
        # sampling gaps: (start, seconds, CPU seconds per OS thread during the gap)
        self.gaps: list[tuple[float, float, list[tuple[float, str]]]] = []

    def run(self) -> None:
        me = threading.get_ident()
        last, cpu = time.perf_counter(), _thread_cpu()
        while not self.stop.is_set():
            now = time.perf_counter()
            if now - last > _GAP_S:  # nothing let this thread run: who did?
                after = _thread_cpu()
                used = sorted(
                    ((after[t][0] - cpu.get(t, (0.0, ""))[0], after[t][1]) for t in after),
                    reverse=True,
                )
                self.gaps.append((last, now - last, used[:4]))
                cpu = after
            elif len(self.samples) % 20 == 0:
                cpu = _thread_cpu()
            last = now
            stacks: dict[int, list[str]] = {}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                names = []
                f: Any = frame
                while f is not None:
                    code = f.f_code
                    names.append(f"{_short(code.co_filename)}:{code.co_name}")
                    f = f.f_back
                stacks[ident] = names
            self.samples.append((now, stacks))
            time.sleep(self.interval)


_GAP_S = 0.2


def _thread_cpu() -> dict[int, tuple[float, str]]:
    """CPU seconds so far and a name, per OS thread of this process (Linux /proc)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, tuple[float, str]] = {}
    for task in Path("/proc/self/task").glob("*"):
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        tid = int(task.name)
        found[tid] = ((int(fields[11]) + int(fields[12])) / tick, names.get(tid, comm))
    return found


def gaps(sampler: Sampler, start: float) -> None:
    """The intervals in which the sampler itself could not run (the GIL held by C
    code, or the process stopped), with the OS threads that used CPU meanwhile (the
    CPU counts are read every 20 samples, so a thread's figure may include up to 20
    intervals before the gap)."""
    if not sampler.gaps:
        return
    print(
        f"\n== sampling gaps over {_GAP_S} s: {len(sampler.gaps)}, "
        f"{sum(g for _, g, _ in sampler.gaps):.2f} s in all"
    )
    main = threading.main_thread().ident or 0
    times = [t for t, _ in sampler.samples]
    for begin, seconds, used in sorted(sampler.gaps, key=lambda g: -g[1])[:10]:
        busy = ", ".join(f"{name} {cpu:.2f}" for cpu, name in used)
        print(f"  {begin - start:6.2f} s  +{seconds:5.2f} s   CPU s: {busy}")
        at = bisect.bisect_right(times, begin + seconds / 2)  # the first sample after
        for label, index in (("before", at - 1), ("after", at)):
            if 0 <= index < len(times):
                stack = sampler.samples[index][1].get(main, [])
                print(f"      main {label}: " + " < ".join(stack[:5]))


_collections: list[tuple[int, float, float]] = []  # (generation, start, seconds)
_collecting: list[float] = []


def _on_collection(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _collecting[:] = [time.perf_counter()]
    elif _collecting:
        begun = _collecting.pop()
        _collections.append((info["generation"], begun, time.perf_counter() - begun))


def collections_report(start: float) -> None:
    """CPython's cyclic garbage collections during the call, per generation."""
    print("\n== garbage collections (generation: count, seconds, longest; then the longest)")
    for generation in range(3):
        took = [s for g, b, s in _collections if g == generation and b >= start]
        if took:
            print(f"  gen{generation}: {len(took)}, {sum(took):.2f} s, longest {max(took):.3f} s")
    full = sorted((s, b) for g, b, s in _collections if g == 2 and b >= start)
    for seconds, begun in full[::-1][:6]:
        print(f"  full collection at {begun - start:6.2f} s took {seconds:.2f} s")
    print(f"  objects tracked at the end: {len(gc.get_objects())}")


_slow_c_calls: list[tuple[float, str, str]] = []  # (seconds, C function, its caller)


def _watch_c_calls(threshold: float) -> Callable[..., None]:
    """A profile hook (main thread) that notes every call into C code whose own time
    (less the Python code it calls back) is over `threshold` seconds: what a sampling
    gap cannot show, the call that held the GIL (or waited)."""
    stack: list[list[Any]] = []  # [is C, start, seconds spent in Python callbacks]

    def hook(frame: Any, event: str, arg: Any) -> None:
        now = time.perf_counter()
        if event in ("call", "c_call"):
            stack.append([event == "c_call", now, 0.0])
            return
        if not stack:
            return
        is_c, begun, inside = stack.pop()
        if stack and stack[-1][0] and not is_c:  # Python called back from C
            stack[-1][2] += now - begun
        if is_c and now - begun - inside > threshold:
            name = getattr(arg, "__qualname__", None) or repr(arg)
            module = getattr(arg, "__module__", None) or ""
            code = frame.f_code
            caller = f"{_short(code.co_filename)}:{code.co_name}:{frame.f_lineno}"
            _slow_c_calls.append((now - begun - inside, f"{module}.{name}", caller))

    return hook


def _short(path: str) -> str:
    for marker in ("site-packages/", "packages/", "lib/python"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def report(sampler: Sampler, main_ident: int, top: int, keep: str) -> None:
    """Inclusive wall seconds per function, and exclusive seconds per innermost
    function, for the main thread and for all others together; a sample stands for
    the time since the one before."""
    inclusive: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    leaves: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    totals: collections.Counter[str] = collections.Counter()
    previous = sampler.samples[0][0] if sampler.samples else 0.0
    for now, stacks in sampler.samples:
        weight, previous = now - previous, now
        for ident, stack in stacks.items():
            if any("tqdm" in frame for frame in stack):
                continue  # tqdm's monitor thread sleeps throughout
            group = "main" if ident == main_ident else "other threads"
            totals[group] += weight
            for frame in set(stack):
                inclusive[group][frame] += weight
            if stack:
                leaves[group][stack[0]] += weight
    for group, counter in inclusive.items():
        print(f"\n== {group}: {totals[group]:.2f} thread-s; inclusive")
        shown = [(n, s) for n, s in counter.most_common() if re.search(keep, n)]
        for name, seconds in shown[:top]:
            print(f"{seconds:7.2f} s  {name}")
        print(f"-- {group}: innermost")
        for name, seconds in leaves[group].most_common(top // 2):
            print(f"{seconds:7.2f} s  {name}")


# Main-thread phases, by the innermost frame of a sample that matches (first rule wins
# at that frame): what the first call was doing, in order (a critical-path view).
_PHASES: list[tuple[str, str]] = [
    ("wait: compile jobs", r"compile_pool.py:close$|triton_kernels.py:finish$"),
    ("wait: triton prepare", r"compile_pool.py:wait_prepared$"),
    ("capture", r"compile_pool.py:capture$"),
    ("tune+launch", r"triton_kernels.py:(__call__|_choose|_tune)"),
    ("triton", r"^triton/"),
    ("render", r"codegen/triton/"),
    ("schedule", r"ember/scheduler/"),
    ("lower", r"ember/ir/"),
    ("graphpasses", r"ember/graphpasses/"),
    ("ember other", r"ember/"),
    ("import", r"_find_and_load$"),
    ("aot", r"aot_autograd.py|partitioners.py|torch/_functorch/"),
    ("dynamo", r"torch/_dynamo/"),
]


def _time_worker_jobs() -> list[tuple[float, float]]:
    """(sent, answered) of every request ember sends a compile worker."""
    jobs: list[tuple[float, float]] = []
    try:
        from ember.runtime import compile_pool
    except ImportError:
        return jobs
    original = compile_pool._Worker.run

    def run(self: Any, payload: bytes) -> str:
        begin = time.perf_counter()
        try:
            return original(self, payload)
        finally:
            jobs.append((begin, time.perf_counter()))

    compile_pool._Worker.run = run  # type: ignore[method-assign]
    return jobs


def phases(sampler: Sampler, main_ident: int, start: float) -> None:
    """The main thread's phases as contiguous segments, then seconds per phase."""
    compiled = [(name, re.compile(rule)) for name, rule in _PHASES]

    def label(stack: list[str]) -> str:
        for frame in stack:  # innermost first
            for name, rule in compiled:
                if rule.search(frame):
                    return name
        return "other"

    segments: list[list[Any]] = []  # [label, begin, end]
    previous = start
    for now, stacks in sampler.samples:
        if now < start or main_ident not in stacks:
            continue
        name = label(stacks[main_ident])
        if segments and segments[-1][0] == name:
            segments[-1][2] = now
        else:
            segments.append([name, previous, now])
        previous = now
    totals: collections.Counter[str] = collections.Counter()
    print("\n== main thread phases (s from the call's start)")
    for name, begin, end in segments:
        totals[name] += end - begin
        if end - begin >= 0.02:
            print(f"  {begin - start:6.2f} - {end - start:6.2f}  {name}")
    print("-- per phase: " + ", ".join(f"{n} {s:.2f}" for n, s in totals.most_common()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--mode", default="inference")
    parser.add_argument("--backend", default="ember")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--interval", type=float, default=0.005)
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument(
        "--c-calls",
        type=float,
        default=0.0,
        help="list the main thread's calls into C longer than this many seconds "
        "(a profile hook: the call runs slower)",
    )
    parser.add_argument(
        "--keep",
        default=r"ember/|triton/|_find_and_load$|aot_autograd.py|partitioners.py|"
        r"convert_frame.py:_compile_inner|output_graph.py:call_user_compiler",
        help="inclusive rows: functions matching this regex",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model, inputs = prepare(args.model, device, dtype)
    if device.type == "cuda":
        torch.cuda.init()  # type: ignore[no-untyped-call]  # torch stub
    for name in ("run", "call"):  # check_output and check_call go through these
        setattr(subprocess, name, _timed(getattr(subprocess, name)))
    jobs = _time_worker_jobs()
    compiled = torch.compile(model, backend=args.backend)
    step = step_fn(compiled, inputs, args.mode)  # type: ignore[arg-type]
    gc.callbacks.append(_on_collection)
    sampler = Sampler(args.interval)
    sampler.start()
    # a marker for `python -X importtime`'s log: the imports after it are the first call's
    print("ember-cold-timeline: first call starts", file=sys.stderr, flush=True)
    if args.c_calls:
        sys.setprofile(_watch_c_calls(args.c_calls))
    start = time.perf_counter()
    step()
    sys.setprofile(None)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    sampler.stop.set()
    sampler.join()
    print(f"{args.model} {args.mode} {args.backend}: first call {seconds:.2f} s")
    by_program: dict[str, list[float]] = collections.defaultdict(list)
    for program, begun, took in _programs:
        if begun >= start:
            by_program[program].append(took)
    for program, took in sorted(by_program.items()):
        print(
            f"  subprocess {program}: {len(took)} runs, {sum(took):.2f} s summed, "
            f"longest {max(took):.2f} s"
        )
    if jobs:
        took = [end - begin for begin, end in jobs]
        print(
            f"  worker jobs: {len(jobs)}, first sent {min(b for b, _ in jobs) - start:.2f} s, "
            f"last answered {max(e for _, e in jobs) - start:.2f} s, "
            f"longest {max(took):.2f} s, summed {sum(took):.2f} s"
        )
    if args.backend == "ember":
        from ember.runtime import compile_pool, triton_kernels

        stats = {k: round(v, 2) for k, v in triton_kernels.precompile_stats.items()}
        print(f"  precompile: {stats}; busy: {compile_pool.busy_seconds}")
    phases(sampler, threading.main_thread().ident or 0, start)
    gaps(sampler, start)
    collections_report(start)
    if args.c_calls:
        print(f"\n== main thread's calls into C over {args.c_calls} s: {len(_slow_c_calls)}")
        for took, name, caller in sorted(_slow_c_calls, reverse=True)[: args.top]:
            print(f"  {took:6.2f} s  {name}  from {caller}")
    report(sampler, threading.main_thread().ident or 0, args.top, args.keep)


if __name__ == "__main__":
    main()
