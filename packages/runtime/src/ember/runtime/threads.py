"""How ember's C++ kernels share the CPU with ATen: one thread count, one OpenMP pool.

The policy, for the demo, `ember bench` and users alike:

- A kernel runs on `torch.get_num_threads()` threads, read before each call
  (`CompiledUnit.sync_threads`): whatever sets torch's count (`torch.set_num_threads`,
  `OMP_NUM_THREADS`, `ember bench --threads`, `ember demo --threads`) sets ember's.
- Ember's kernels and ATen's ops must share one OpenMP runtime, so that one pool of
  threads serves both. The kernels are built with the system compiler's `-fopenmp`
  and so name `libgomp.so.1`; torch's Linux wheels carry their own `libgomp.so.1`
  (torch/lib), loaded when torch is imported. The dynamic linker satisfies a library's
  dependency with an already loaded object of the same soname, so the kernels bind to
  torch's copy, not the system's: one runtime, one pool. A torch whose runtime has
  another soname (Intel's libiomp5, LLVM's libomp, or a wheel's renamed
  `libgomp-<hash>.so.1`) would leave two runtimes in the process, each with a pool of
  spinning threads: on two cores that oversubscribes them, the known cause of 10-30x
  slowdowns. `check_openmp_runtimes` looks, once, after the first kernel library is
  loaded, and logs a warning naming both where it finds more than one.
- Idle threads wait as the runtime's settings say (`OMP_WAIT_POLICY`,
  `GOMP_SPINCOUNT`), read by libgomp when torch loads it, before ember can set
  anything: ember leaves them to the user. Measured on the shared 2-core VM (an MLP
  training step, eager and ember alike, benchmarks/results/cpu-threads-2core-*):
  the default (spin, then sleep) is fastest while the machine is quiet and collapses
  while a neighbour holds a core (mean 4.7 ms for a 1.1 ms step); `passive` never
  collapses (mean 1.7-1.8 ms) but every region then pays a wake-up (fastest 1.4-1.6 ms);
  `GOMP_SPINCOUNT=1000` sits between. On a machine shared with steady load, set
  `OMP_WAIT_POLICY=passive` (or use fewer threads than cores) before starting Python.
- A reduction kernel's loop over outer points is `schedule(runtime)`; the library
  sets its schedule per loop from the region's thread count (the prelude's
  `ember::reduction_schedule`): `static` on one thread, `guided` on more. The
  `EMBER_REDUCTION_SCHEDULE` setting fixes one instead (`static`, `dynamic`, `guided`,
  each with an optional `,chunk`), applied to each library as it is loaded
  (`CompiledUnit.set_reduction_schedule`): no kernel is rebuilt for it. Results do not
  depend on the schedule (ember.codegen.cpp.reduction_loops says why).
"""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)

# file names of OpenMP runtimes: GNU (also renamed copies in wheels), Intel, LLVM
_RUNTIME_NAME = re.compile(r"^(libgomp|libiomp5|libomp)([-.].*)?\.(so|dylib)(\.[0-9.]+)?$")


def is_openmp_runtime(path: str) -> bool:
    """Whether `path` names an OpenMP runtime library (by its file name)."""
    return _RUNTIME_NAME.match(Path(path).name) is not None


def openmp_runtimes(maps: str | None = None) -> list[str]:
    """The OpenMP runtime libraries mapped into this process (from /proc/self/maps, or
    the text `maps`), by resolved path, sorted; empty where that cannot be read."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return []
    found = set()
    # every runtime's name holds "omp": the few lines that do are the only ones split
    # and matched (a process with torch maps about 550; all of them took 2.4 ms of a
    # warm compile on the 2-core CPU)
    for line in maps.splitlines():
        if "omp" not in line:
            continue
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/") and is_openmp_runtime(fields[5]):
            path = Path(fields[5])
            found.add(str(path.resolve()) if path.exists() else str(path))
    return sorted(found)


@functools.cache
def check_openmp_runtimes() -> list[str]:
    """Log a warning (once per process) where more than one OpenMP runtime is loaded;
    the runtimes found."""
    runtimes = openmp_runtimes()
    if len(runtimes) > 1:
        log.warning(
            "ember's C++ kernels and ATen may use different OpenMP runtimes (%s): each "
            "keeps a pool of torch.get_num_threads() threads, which can oversubscribe the "
            "cores and slow both by many times; set OMP_WAIT_POLICY=passive, or use fewer "
            "threads (torch.set_num_threads)",
            ", ".join(runtimes),
        )
    return runtimes


# omp_sched_t's kinds, as the prelude's `ember_set_reduction_schedule` takes them
SCHEDULE_KINDS = {"static": 1, "dynamic": 2, "guided": 3}
AUTO_SCHEDULE = "auto"


def parse_reduction_schedule(text: str) -> str:
    """An `EMBER_REDUCTION_SCHEDULE` value, spelt one way ("auto", "static",
    "dynamic,16"); ValueError naming what it accepts otherwise."""
    value = "".join(text.split()).lower() or AUTO_SCHEDULE
    kind, comma, chunk = value.partition(",")
    if value == AUTO_SCHEDULE or (kind in SCHEDULE_KINDS and not comma):
        return value
    if kind in SCHEDULE_KINDS and chunk.isdigit() and int(chunk) > 0:
        return f"{kind},{int(chunk)}"
    raise ValueError(
        "'auto' (by thread count), or 'static', 'dynamic' or 'guided', each optionally "
        "with ',<chunk>' (a whole number, 1 or more)"
    )


def schedule_code(setting: str) -> tuple[int, int]:
    """(omp_sched_t kind, chunk) of a parsed schedule setting; (0, 0) for "auto", and
    chunk 0 where the setting names none (the kind's default)."""
    if setting == AUTO_SCHEDULE:
        return 0, 0
    kind, _, chunk = setting.partition(",")
    return SCHEDULE_KINDS[kind], int(chunk or 0)


def schedule_name(kind: int, chunk: int) -> str:
    """The setting's spelling of an (omp_sched_t kind, chunk) pair."""
    names = {code: name for name, code in SCHEDULE_KINDS.items()}
    name = names.get(kind, f"kind {kind}")
    return f"{name},{chunk}" if chunk > 0 else name
