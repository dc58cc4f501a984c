"""Compiling, caching, loading and calling the C++ kernels of ember.codegen.cpp.

`compile_cpp_kernels(kernels, cache_dir=...)` renders a graph's fused kernels into
one translation unit, compiles it with the system C++ compiler into a shared object,
loads it with ctypes and returns one callable per kernel. A callable takes torch
tensors in `kernel.buffer_arguments()` order, then Python ints in
`kernel.size_arguments()` order, and passes each tensor's *storage* base pointer (the
kernels index storage offsets). Before each call the OpenMP thread count follows
`torch.get_num_threads()`, in the OpenMP runtime ATen uses, and reduction loops take
the schedule of the `EMBER_REDUCTION_SCHEDULE` setting in force when the library was
loaded (ember.runtime.threads). A kernel that can find errors (an index outside its
dimension, an integer division by zero: `KernelInfo.checks`) gets an error record too;
when the kernel has set it, the call raises what eager would have raised
(`IndexOutOfBounds`, or a RuntimeError saying ZeroDivisionError), naming the op, the
graph node and the bad index: the kernel itself never reads or writes outside a
buffer, nor traps.

The shared object is cached as one entry of an `ember.runtime.store.EntryStore`
(`<cache_dir>/cpp/k<key>/`: the library, its source and the flags it was built with),
so processes can share it. The key hashes the source, the compiler's identity, the
flags and the CPU target that `-march=native` resolves to on this machine
(`native_target`), never the literal `-march=native`: machines whose CPUs differ in
features never share a library (one built for AVX-512 would die of SIGILL on a CPU
without it). The library's bytes are checked against their recorded SHA-256 before it
is dlopen'ed: a truncated library (SIGBUS when mapped) or one copied over another
entry (other values) is rebuilt, never loaded. The check reads the file and dlopen
then opens it again by path; no one else can swap it in between, because the cache
directory is this user's own and no one else can write to it or to any directory
above it (`store.secure_directory`).

A unit the compiler rejects (with every choice of flags below) is remembered under its
key in `<cache_dir>/cpp-failed/k<key>/` (the compiler's error and the source's
SHA-256), so a later process neither runs the compiler on it again nor waits for it:
it raises the same `CppCompileError`, with the original error and a note that it was
remembered, and the graph's ops run as ATen kernels as after a fresh failure.
`ember cache clear --failed` forgets these records (after fixing a toolchain, say: the
key holds the compiler's version, not its headers). A failure that looks like the
machine's rather than the unit's (a full disk, no memory, a killed compiler, a
compiler that could not be started) is not remembered.

The compiler is `$CXX`, else the first of c++, g++, clang++ on PATH. Flags:
`-O3 -fopenmp -shared -fPIC -std=c++17 -ffp-contract=fast -fno-math-errno` and
`-march=native -mprefer-vector-width=512`, retried with `-march=native` alone, then
with neither, where the compiler rejects them. `-ffp-contract=fast` lets polynomials
use fused multiply-adds (ISO C++ mode turns contraction off); `-fno-math-errno` lets
`sqrt` and friends vectorise (errno is never read); neither changes NaN or infinity
semantics, unlike `-ffast-math`. Wide vectors: GCC prefers 256-bit ones on AVX-512
machines, which halves the throughput of the prelude's vectorised exp and erf.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ember.codegen.cpp import CppSource, KernelInfo
from ember.ir import IndexOutOfBounds, index_error_message
from ember.runtime.blas import sgemm_pointer
from ember.runtime.cache import FAILED_CPP_STORE, entry_store
from ember.runtime.config import config
from ember.runtime.store import Entry, EntryStore
from ember.runtime.threads import (
    check_openmp_runtimes,
    parse_reduction_schedule,
    schedule_code,
    schedule_name,
)
from ember.scheduler import FusedKernel

BASE_FLAGS: tuple[str, ...] = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
BASE_FLAGS += ("-ffp-contract=fast", "-fno-math-errno")
WIDE_VECTORS = "-mprefer-vector-width=512"
NATIVE_FLAGS = ("-march=native", WIDE_VECTORS)
# tried in order until the compiler accepts one (non-x86 compilers reject the width)
FLAG_CHOICES = ((*BASE_FLAGS, *NATIVE_FLAGS), (*BASE_FLAGS, "-march=native"), BASE_FLAGS)
COMPILERS = ("c++", "g++", "clang++")
BUILD_RECORD = "build.json"  # in a library's cache entry: the flags it was built with
FAILURE_RECORD = "failure.json"  # in a failed compile's entry: why it failed
# compiler errors that say the machine failed, not the unit: never remembered
MACHINE_ERRORS = (
    "No space left on device",
    "Disk quota exceeded",
    "Read-only file system",
    "Permission denied",
    "Input/output error",
    "Cannot allocate memory",
    "out of memory",
    "virtual memory exhausted",
    "Too many open files",
    "Resource temporarily unavailable",
    "Killed",
    "terminated signal",
    "cannot open output file",
)


class CppCompileError(RuntimeError):
    """No C++ compiler, or the compiler rejected a generated translation unit."""


class CppCompileRejected(CppCompileError):
    """The compiler ran and rejected the unit: remembered under the unit's key."""


@functools.cache
def find_compiler() -> str:
    """The C++ compiler to use: $CXX, else c++, g++ or clang++ from PATH."""
    # The one environment read outside ember.runtime.config: CXX is the toolchain's own
    # convention, not an EMBER_* setting.
    explicit = os.environ.get("CXX")
    if explicit:
        found = shutil.which(explicit)
        if found is None:
            raise CppCompileError(f"CXX={explicit!r} is not an executable on PATH")
        return found
    for name in COMPILERS:
        found = shutil.which(name)
        if found is not None:
            return found
    raise CppCompileError(
        "no C++ compiler found (tried $CXX, c++, g++, clang++): install one, e.g. "
        "`apt-get install g++` (Debian/Ubuntu) or `dnf install gcc-c++`, or set CXX; "
        "ember runs graphs eagerly on the CPU until then"
    )


@functools.cache
def compiler_identity(compiler: str) -> str:
    """The compiler's version banner (part of the cache key)."""
    result = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False)
    return result.stdout.strip()


@dataclass
class CompiledUnit:
    """A loaded shared object and how it was obtained."""

    path: Path
    library: ctypes.CDLL
    source: CppSource
    compile_seconds: float  # 0.0 when loaded from the cache
    flags: tuple[str, ...]
    # the count last set, per Python thread: OpenMP keeps a thread count per calling
    # thread, so one set from the main thread says nothing about another thread's
    _set: threading.local = field(default_factory=threading.local)

    def __post_init__(self) -> None:
        self.set_reduction_schedule(config.reduction_schedule)

    @property
    def threads(self) -> int:
        """The OpenMP thread count this Python thread last set for the library (-1:
        none yet)."""
        return int(getattr(self._set, "count", -1))

    def sync_threads(self) -> None:
        wanted = torch.get_num_threads()
        if wanted != self.threads:
            self.library.ember_set_num_threads(ctypes.c_int(wanted))
            self._set.count = wanted

    def set_reduction_schedule(self, setting: str) -> None:
        """Fix the schedule of the library's reduction loops (an
        `EMBER_REDUCTION_SCHEDULE` value), or with "auto" let each loop choose by its
        thread count. A library built before the choice existed keeps its own."""
        kind, chunk = schedule_code(parse_reduction_schedule(setting))
        setter = _symbol(self.library, "ember_set_reduction_schedule")
        if setter is not None:
            setter(ctypes.c_int(kind), ctypes.c_int(chunk))

    def reduction_schedule(self, threads: int) -> str | None:
        """The schedule the library's reduction loops take when run by `threads`
        threads ("static", "dynamic,16", ...); None for a library built before the
        choice existed."""
        query = _symbol(self.library, "ember_reduction_schedule")
        if query is None:
            return None
        chunk = ctypes.c_int(0)
        kind = query(ctypes.c_int(threads), ctypes.byref(chunk))
        return schedule_name(int(kind), chunk.value)


def _symbol(library: ctypes.CDLL, name: str) -> Any:
    """A function of `library`, or None where it has none of that name."""
    try:
        return getattr(library, name)
    except AttributeError:
        return None


class CppKernel:
    """A callable for one kernel of a compiled unit."""

    def __init__(self, unit: CompiledUnit, info: KernelInfo) -> None:
        self.unit = unit
        self.info = info
        self.name = info.name
        self.buffers = sum(1 for a in info.arguments if a.kind == "buffer")
        self.arity = len(info.arguments)
        function = getattr(unit.library, info.name)
        function.restype = None
        function.argtypes = [
            ctypes.c_void_p if a.kind == "buffer" else ctypes.c_int64 for a in info.arguments
        ]
        # (check number + 1, value, size), zero until the kernel finds an error; one per
        # launcher, reset when raised (concurrent calls of one kernel from several
        # threads could mix up their reports, never miss one)
        self.record = (ctypes.c_int64 * 3)() if info.checks else None
        if self.record is not None:
            function.argtypes.append(ctypes.c_void_p)
        self.function = function

    def __call__(self, *args: Any) -> None:
        if len(args) != self.arity:
            names = ", ".join(a.name for a in self.info.arguments)
            raise TypeError(
                f"kernel {self.name} takes {self.arity} arguments ({names}), got {len(args)}"
            )
        self.unit.sync_threads()
        pointers = [t.untyped_storage().data_ptr() for t in args[: self.buffers]]
        if self.record is None:
            self.function(*pointers, *(int(s) for s in args[self.buffers :]))
            return
        self.function(*pointers, *(int(s) for s in args[self.buffers :]), self.record)
        if self.record[0]:
            self._raise()

    def _raise(self) -> None:
        assert self.record is not None
        number, value, size = self.record[0] - 1, self.record[1], self.record[2]
        self.record[0] = self.record[1] = self.record[2] = 0
        check = self.info.checks[number]
        if check.kind == "division":
            raise RuntimeError(f"ZeroDivisionError: integer division by zero in {check.what}")
        message = index_error_message(f"{check.what}, kernel {self.name}", check.dim, value, size)
        raise IndexOutOfBounds(message, index=value, size=size)

    def __repr__(self) -> str:
        return f"CppKernel({self.name}, {self.unit.path.name})"


def compile_cpp_source(source: CppSource, *, cache_dir: Path) -> CompiledUnit:
    """Compile (or find in the cache, checked) and load one translation unit."""
    compiler = find_compiler()
    key = f"k{unit_key(source.source, compiler)}"
    store = entry_store(Path(cache_dir) / "cpp")
    entry = store.get(key)
    if entry is not None and not _holds(entry, key, source.source):
        reason = "it does not hold this translation unit's library, source and flags"
        store.discard(key, reason, entry=entry)
        entry = None
    seconds = 0.0
    if entry is None:
        failures = entry_store(Path(cache_dir) / FAILED_CPP_STORE)
        _raise_remembered_failure(failures, key, source.source)
        start = time.perf_counter()
        try:
            entry = _build(compiler, source.source, store, key)
        except CppCompileRejected as exc:
            _remember_failure(failures, key, source.source, compiler, str(exc))
            raise
        seconds = time.perf_counter() - start
        if not _holds(entry, key, source.source):  # another writer's, under this key
            raise CppCompileError(f"the cache entry {entry.directory} holds another unit")
    flags = tuple(json.loads(entry.files[BUILD_RECORD])["flags"])
    library = entry.path(f"{key}.so")
    loaded = load_library(library)  # checked above; see the module docstring
    return CompiledUnit(library, loaded, source, seconds, flags)


def load_library(path: Path) -> ctypes.CDLL:
    """dlopen a (checked) kernel library; the first one loaded in a process also checks
    that its OpenMP runtime is ATen's (ember.runtime.threads)."""
    loaded = ctypes.CDLL(str(path))
    loaded.ember_set_num_threads.argtypes = [ctypes.c_int]
    loaded.ember_set_num_threads.restype = None
    setter = _symbol(loaded, "ember_set_reduction_schedule")
    if setter is not None:
        setter.argtypes = [ctypes.c_int, ctypes.c_int]
        setter.restype = None
    query = _symbol(loaded, "ember_reduction_schedule")
    if query is not None:
        query.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        query.restype = ctypes.c_int
    set_sgemm = _symbol(loaded, "ember_set_sgemm")  # a library with matmul kernels
    if set_sgemm is not None:
        set_sgemm.argtypes = [ctypes.c_void_p]
        set_sgemm.restype = None
        set_sgemm(sgemm_pointer())
    check_openmp_runtimes()
    return loaded


def _raise_remembered_failure(failures: EntryStore, key: str, text: str) -> None:
    """Raise the `CppCompileError` of an earlier failed compile of `text` under `key`,
    where one is remembered."""
    entry = failures.get(key)
    if entry is None:
        return
    try:
        record = json.loads(entry.files[FAILURE_RECORD])
        message = record["message"]
        ours = record["source_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    except (KeyError, ValueError, TypeError):
        message, ours = None, False
    if not ours or not isinstance(message, str):
        reason = "it does not record a failed compile of this translation unit"
        failures.discard(key, reason, entry=entry)
        return
    raise CppCompileError(
        f"{message}\n(remembered from an earlier compile of this unit, {entry.directory}: "
        "the compiler is not run on it again; `ember cache clear --failed` forgets it)"
    )


def _remember_failure(
    failures: EntryStore, key: str, text: str, compiler: str, message: str
) -> None:
    record = {
        "message": message[-16000:],
        "source_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "compiler": compiler,
        "compiler_version": compiler_identity(compiler).split("\n", 1)[0],
        "time": time.time(),
    }
    with contextlib.suppress(OSError):  # not remembered: the next process compiles it again
        failures.put(key, {FAILURE_RECORD: json.dumps(record, indent=1).encode()})


def _holds(entry: Entry, key: str, text: str) -> bool:
    """Whether a (checked) entry holds a library built from `text`, and its flags."""
    if entry.files.get(f"{key}.cpp") != text.encode() or f"{key}.so" not in entry.files:
        return False
    try:
        flags = json.loads(entry.files[BUILD_RECORD])["flags"]
    except (KeyError, ValueError, TypeError):
        return False
    return isinstance(flags, list) and all(isinstance(f, str) for f in flags)


def unit_key(text: str, compiler: str) -> str:
    """The cache key of a translation unit: its source, the compiler's identity, the
    flags, and the target `-march=native` resolves to on this machine."""
    # `-march=native` itself would say nothing: each machine reads it differently
    target = native_target(compiler)
    parts = [text, compiler_identity(compiler), *BASE_FLAGS, WIDE_VECTORS, target]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


@functools.cache
def native_target(compiler: str) -> str:
    """What `-march=native` stands for with `compiler` on this CPU, as text for the
    cache key (once per process): the architecture and every feature flag the
    compiler's driver resolves it to (GCC passes them to cc1 as `-march=<cpu>` and
    `-m<feature>`/`-mno-<feature>`, Clang as `-target-cpu` and `-target-feature`),
    shown by `-###`. Where the compiler cannot say, the CPU's flags from
    /proc/cpuinfo."""
    command = [compiler, "-###", "-x", "c++", "-E", "-", "-march=native"]
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        result = None
    if result is not None and result.returncode == 0:
        resolved = resolved_target_flags(result.stderr)
        if resolved:
            return "compiler: " + " ".join(resolved)
    return "cpuinfo: " + cpuinfo_features()


_TARGET_OPTIONS = ("-target-cpu", "-target-feature", "-tune-cpu", "--param")


def resolved_target_flags(driver_output: str) -> list[str]:
    """The target flags of the first command in a compiler driver's `-###` output
    (`driver_output`) that names a resolved CPU: `-march=<cpu>` other than native
    (GCC) or `-target-cpu <cpu>` (Clang). Empty where no command does."""
    for line in driver_output.splitlines():
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        resolved = any(w.startswith("-march=") and w != "-march=native" for w in words)
        if not resolved and "-target-cpu" not in words:
            continue
        flags = []
        for index, word in enumerate(words):
            if word in _TARGET_OPTIONS and index + 1 < len(words):
                flags.append(f"{word} {words[index + 1]}")
            elif word.startswith("-m") and word != "-march=native":
                flags.append(word)
        return flags
    return []


def cpuinfo_features() -> str:
    """The machine and its CPU's feature flags (x86 `flags`, Arm `Features`) from
    /proc/cpuinfo, sorted; the processor name where there is no such file."""
    flags = cpu_flags()
    if flags:
        return f"{platform.machine()} {' '.join(sorted(flags))}"
    return f"{platform.machine()} {platform.processor()}"


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first value of each field of /proc/cpuinfo (the first CPU's), read once;
    empty where it cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, colon, value = line.partition(":")
        if colon:
            fields.setdefault(name.strip(), value.strip())
    return fields


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (x86 `flags`, Arm `Features`) from /proc/cpuinfo;
    empty where it cannot be read."""
    info = _cpuinfo()
    return frozenset((info.get("flags") or info.get("Features") or "").split())


def cpu_model() -> str:
    """This CPU's name (x86 `model name`, else Arm's implementer and part numbers),
    or the platform's processor string where /proc/cpuinfo has none."""
    info = _cpuinfo()
    if info.get("model name"):
        return info["model name"]
    if info.get("CPU implementer"):
        return f"implementer {info['CPU implementer']} part {info.get('CPU part', '?')}"
    return platform.processor() or platform.machine()


def _build(compiler: str, text: str, store: EntryStore, key: str) -> Entry:
    with store.scratch(".build-") as scratch:
        cpp = scratch / "kernels.cpp"
        cpp.write_text(text)
        output = scratch / "kernels.so"
        errors = []
        rejected = True  # by the compiler, for reasons of the unit's own
        for flags in FLAG_CHOICES:
            command = [compiler, *flags, str(cpp), "-o", str(output)]
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            if result.returncode == 0:
                files = {
                    f"{key}.so": output.read_bytes(),
                    f"{key}.cpp": text.encode(),  # kept beside the library, for debugging
                    BUILD_RECORD: json.dumps({"flags": list(flags)}).encode(),
                }
                return store.put(key, files)  # one step: readers see all of it or nothing
            machine = result.returncode < 0 or any(m in result.stderr for m in MACHINE_ERRORS)
            rejected = rejected and not machine and cpp.exists()
            errors.append(f"$ {' '.join(command)}\n{result.stderr[-4000:]}")
        message = "the C++ compiler failed on generated kernels:\n" + "\n".join(errors)
        raise (CppCompileRejected if rejected else CppCompileError)(message)


def compile_cpp_kernels(
    kernels: Sequence[FusedKernel], *, cache_dir: Path
) -> dict[str, Callable[..., None]]:
    """One callable per kernel (by name), all from one compiled translation unit."""
    from ember.codegen.cpp import render_kernels  # the renderer: not for loading kernels

    unit = compile_cpp_source(render_kernels(kernels), cache_dir=cache_dir)
    return {info.name: CppKernel(unit, info) for info in unit.source.kernels}
