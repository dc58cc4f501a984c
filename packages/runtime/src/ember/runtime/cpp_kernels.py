"""Compiling, caching, loading and calling the C++ kernels of ember.codegen.cpp.

`compile_cpp_kernels(kernels, cache_dir=...)` renders a graph's fused kernels into
one translation unit, compiles it with the system C++ compiler into a shared object
(cached by the hash of source, compiler and flags, written atomically, so processes
can share the cache), loads it with ctypes and returns one callable per kernel. A
callable takes torch tensors in `kernel.buffer_arguments()` order, then Python ints in
`kernel.size_arguments()` order, and passes each tensor's *storage* base pointer (the
kernels index storage offsets). Before each call the OpenMP thread count follows
`torch.get_num_threads()`. A kernel that can find errors (an index outside its
dimension, an integer division by zero: `KernelInfo.checks`) gets an error record
too; when the kernel has set it, the call raises what eager would have raised
(`IndexOutOfBounds`, or a RuntimeError saying ZeroDivisionError), naming the op, the
graph node and the bad index: the kernel itself never reads or writes outside a
buffer, nor traps.

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

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ember.codegen.cpp import CppSource, KernelInfo, render_kernels
from ember.ir import IndexOutOfBounds, index_error_message
from ember.scheduler import FusedKernel

BASE_FLAGS: tuple[str, ...] = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
BASE_FLAGS += ("-ffp-contract=fast", "-fno-math-errno")
NATIVE_FLAGS = ("-march=native", "-mprefer-vector-width=512")
# tried in order until the compiler accepts one (non-x86 compilers reject the width)
FLAG_CHOICES = ((*BASE_FLAGS, *NATIVE_FLAGS), (*BASE_FLAGS, "-march=native"), BASE_FLAGS)
COMPILERS = ("c++", "g++", "clang++")


class CppCompileError(RuntimeError):
    """No C++ compiler, or the compiler rejected a generated translation unit."""


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
    threads: list[int] = field(default_factory=lambda: [-1])  # last count set, shared

    def sync_threads(self) -> None:
        wanted = torch.get_num_threads()
        if wanted != self.threads[0]:
            self.library.ember_set_num_threads(ctypes.c_int(wanted))
            self.threads[0] = wanted


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
    """Compile (or find in the cache) and load one translation unit."""
    compiler = find_compiler()
    identity = compiler_identity(compiler)
    key = hashlib.sha256(
        "\0".join([source.source, identity, *BASE_FLAGS, *NATIVE_FLAGS]).encode()
    ).hexdigest()[:32]
    directory = Path(cache_dir) / "cpp"
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / f"k{key}.so"
    seconds = 0.0
    flags: tuple[str, ...] = (*BASE_FLAGS, *NATIVE_FLAGS)
    if not library.exists():
        start = time.perf_counter()
        flags = _build(compiler, source.source, directory, library)
        seconds = time.perf_counter() - start
    loaded = ctypes.CDLL(str(library))
    loaded.ember_set_num_threads.argtypes = [ctypes.c_int]
    loaded.ember_set_num_threads.restype = None
    return CompiledUnit(library, loaded, source, seconds, flags)


def _build(compiler: str, text: str, directory: Path, library: Path) -> tuple[str, ...]:
    with tempfile.TemporaryDirectory(dir=directory, prefix="build-") as scratch:
        cpp = Path(scratch) / "kernels.cpp"
        cpp.write_text(text)
        output = Path(scratch) / "kernels.so"
        errors = []
        for flags in FLAG_CHOICES:
            command = [compiler, *flags, str(cpp), "-o", str(output)]
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            if result.returncode == 0:
                _publish(cpp, library.with_suffix(".cpp"))
                os.replace(output, library)  # atomic: readers see all of it or nothing
                return flags
            errors.append(f"$ {' '.join(command)}\n{result.stderr[-4000:]}")
        raise CppCompileError("the C++ compiler failed on generated kernels:\n" + "\n".join(errors))


def _publish(source: Path, target: Path) -> None:
    """Keep the source next to the library, for debugging (atomically too)."""
    temporary = target.with_suffix(f".{os.getpid()}.tmp")
    shutil.copyfile(source, temporary)
    os.replace(temporary, target)


def compile_cpp_kernels(
    kernels: Sequence[FusedKernel], *, cache_dir: Path
) -> dict[str, Callable[..., None]]:
    """One callable per kernel (by name), all from one compiled translation unit."""
    unit = compile_cpp_source(render_kernels(kernels), cache_dir=cache_dir)
    return {info.name: CppKernel(unit, info) for info in unit.source.kernels}
