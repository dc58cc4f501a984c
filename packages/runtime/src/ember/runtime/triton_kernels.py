"""Compiling, tuning and launching the Triton kernels of a schedule.

`compile_triton_kernels(kernels, cache_dir=...)` renders each `FusedKernel` (through
ember.codegen.triton), keeps its source as a checked entry of the cache under
`cache_dir` (ember.runtime.loader: the compile workers load the same file), executes
it as a module, and returns one launcher per kernel name. Kernels with identical
source share one module and so one set of binaries (the same layer repeated twelve
times compiles once).

Ember compiles each candidate config itself: it knows every argument's type (its
buffers' dtypes, sizes as 32-bit ints, 64-bit ones where a call needs them, block
sizes as constants), so it builds the specialisation `triton.compile` takes
(`specialisation`) and keeps the binary (`KernelBinary`), compiled by the workers
of ember.runtime.compile_pool or threads here while the rest of the graph is still
being lowered. A launch goes to the binary through the CUDA driver
(ember.runtime.cuda_driver): no Triton jit binding, no Triton launcher, one path for
every launch.

A launcher takes the kernel's buffers as tensors (in `buffer_arguments()` order) and
its sizes as ints (in `size_arguments()` order). It passes each buffer (random seeds
included: one-element buffers) as the address of its storage's start (index
expressions are storage offsets) and launches on the current CUDA stream. The first
call for a set of sizes times each candidate config briefly and keeps the fastest for
the rest of the process (kernels that read what they write, or whose tensors alias,
are timed on copies), then binds the launch: grid, sizes and block sizes fixed, so a
later call writes the tensors' addresses into the argument block and launches.

A look-back scan (`TritonKernel.workspace`) gets a workspace from its launcher: zeroed
int64 words, allocated at the first launch of a bound config on each stream and kept
for the later ones there (the kernel leaves them fit for its next launch of the same
grid, so no launch pays for zeroing them). Launches on another stream get their own,
so the same kernel may run on two streams at once; a launch being captured into a
CUDA graph uses one kept for graphs, allocated when the launch was bound (the capture
of ember.runtime.cudagraphs follows a call outside it).

Binaries assume 16-byte-aligned buffers (Triton vectorises on that). A call with a
buffer that is not aligned so launches a variant compiled without that assumption
(compiled on first need); such launches are counted in `unaligned_launches`.

Under `TRITON_INTERPRET=1` (CPU tensors) the kernels run in Triton's interpreter
through its jit, with libdevice calls served by torch (the interpreter has no
libdevice) and no tuning.

Kernels with index checks compile with their `launch_options` (Triton's `debug`,
which compiles `tl.device_assert` in): on a GPU a bad index stops the kernel with
CUDA's device-side assert, as eager's indexing kernels do. Triton's interpreter takes
no per-launch options, so such launches run with its debug option switched on for
their duration, and a failed check becomes `IndexOutOfBounds` naming the op, the
graph node and the dimension (the device gives no index value back).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ember.codegen.triton import LaunchConfig, TritonKernel, render_kernel
from ember.codegen.triton.plan import GridSpec
from ember.ir import IndexOutOfBounds, index_error_message
from ember.runtime import compile_pool, cuda_driver
from ember.runtime.bounded import LRUCache
from ember.runtime.loader import load_module, write_source
from ember.scheduler import FusedKernel

log = logging.getLogger("ember.runtime")

# source hash -> loaded module, while a launcher uses it
_modules: weakref.WeakValueDictionary[str, ModuleType] = weakref.WeakValueDictionary()
# (source hash, sizes, dtypes) -> the config tuning chose: one entry per kernel and
# set of sizes, so a dynamic-shape graph adds one per new size. The most recent 4096
# are kept; a forgotten one is tuned again (a few timed launches) if its sizes return.
CHOSEN_LIMIT = 4096
_chosen: LRUCache[tuple[Any, ...], LaunchConfig] = LRUCache(CHOSEN_LIMIT)
# Seconds spent in first launches (choosing a config, loading binaries, binding), for
# compile-time profiles: tuning happens at the first call, so this part of a cold
# start is not in any CompileRecord.
first_launch_seconds = [0.0]
# What `Precompiler`s did, summed over graphs, for compile-time profiles.
# "compile s" runs from the first kernel's rendering to the end of the wait for the
# compiles; "waiting s" is that wait (at the graph's first launch: the compiles run on
# meanwhile).
precompile_stats = dict.fromkeys(("waiting s", "compile s", "jobs", "by workers", "workers"), 0.0)
# Launches with a buffer not 16-byte aligned (kernel name -> how many): they run a
# variant compiled without the alignment assumption, slower on the device.
unaligned_launches: dict[str, int] = {}

# Triton's type names of torch dtypes, for a kernel's signature
_TRITON_TYPES = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
    torch.float64: "fp64", torch.int8: "i8", torch.int16: "i16", torch.int32: "i32",
    torch.int64: "i64", torch.uint8: "u8", torch.bool: "i1",
    torch.uint16: "u16", torch.uint32: "u32", torch.uint64: "u64",
    torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5",
}  # fmt: skip
_INT32_MAX = 2**31 - 1


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def compile_triton_kernels(
    kernels: Sequence[FusedKernel | TritonKernel], *, cache_dir: Path, debug: bool = False
) -> dict[str, Callable[..., None]]:
    """A launcher per kernel name. Rendering errors (`UnsupportedKernelError`)
    propagate, so the caller can fall back for the graph. On a GPU, each kernel's
    configs start compiling as soon as it is rendered (`Precompiler`), and this
    returns without waiting for them: the first launch of any of the graph's kernels
    does."""
    launchers: dict[str, TritonLauncher] = {}
    precompiler = Precompiler() if not interpreting() and torch.cuda.is_available() else None
    try:
        for kernel in kernels:
            rendered = (
                kernel if isinstance(kernel, TritonKernel) else render_kernel(kernel, debug=debug)
            )
            module = load_kernel_module(rendered.source, Path(cache_dir))
            launcher = launchers[rendered.name] = TritonLauncher(rendered, module)
            if precompiler is not None and isinstance(kernel, FusedKernel):
                precompiler.add(launcher, kernel.device)
    except BaseException:
        if precompiler is not None:
            precompiler.finish(cancel=True)
        raise
    if precompiler is not None:
        # the compiles go on while the caller lowers its next graph (a training
        # step's backward, compiled right after the forward); the graph's first
        # launch waits for them
        precompiler.seal()
        for launcher in launchers.values():
            launcher.pending = precompiler
    return dict(launchers)


@dataclass(frozen=True)
class Variant:
    """Which binary of a kernel and config: sizes as 64-bit ints (`wide`, for calls
    with a size past 2**31 - 1) and whether buffers are assumed 16-byte aligned."""

    config: LaunchConfig
    wide: bool = False
    aligned: bool = True


@dataclass(frozen=True)
class KernelBinary:
    """A compiled kernel as the CUDA driver loads it: the binary `image`, its entry
    `symbol`, the kind of each parameter ('p' pointer, 'i32', 'i64'; Triton's own
    scratch pointers last), threads per block, dynamic shared memory, and the global
    scratch each program needs (bytes, alignment)."""

    symbol: str
    image: bytes
    kinds: tuple[str, ...]
    threads: int
    shared: int
    scratch: int = 0
    scratch_align: int = 1

    @staticmethod
    def from_reply(reply: dict[str, Any], kinds: Sequence[str]) -> KernelBinary:
        """The binary a compile returned (`compile_worker.compile_binary`), for a
        kernel whose signature has the parameter `kinds`; an error naming what
        this launcher cannot do where the binary needs more."""
        for key, what in (
            ("profile_scratch", "profiling scratch memory"),
            ("cooperative", "a cooperative launch"),
            ("pdl", "programmatic dependent launch"),
        ):
            if reply.get(key):
                raise UnsupportedBinary(f"kernel {reply['symbol']} needs {what}")
        if reply.get("num_ctas", 1) != 1 or list(reply.get("cluster", [1, 1, 1])) != [1, 1, 1]:
            raise UnsupportedBinary(f"kernel {reply['symbol']} needs thread block clusters")
        hidden = reply["params"] - len(kinds)
        if reply["params"] < 0 or not 0 <= hidden <= 2:
            raise UnsupportedBinary(
                f"kernel {reply['symbol']} declares {reply['params']} parameters for a "
                f"signature of {len(kinds)} (Triton {reply.get('triton')})"
            )
        return KernelBinary(
            symbol=reply["symbol"],
            image=reply["image"],
            kinds=(*kinds, *("p",) * hidden),
            threads=reply["threads"],
            shared=reply["shared"],
            scratch=reply["scratch"],
            scratch_align=reply["scratch_align"],
        )


class UnsupportedBinary(RuntimeError):
    """A compiled kernel needs a launch feature ember's launcher does not provide."""


class Precompiler:
    """Compiles every candidate config of every distinct kernel source before the
    first call, so the first call only loads binaries and times them.

    Compiling lazily at the first call, one config after another, spent 30 s on a
    graph of forty kernels with four configs each (GPT-2, H100). Here the compiles
    start while the graph's later kernels are still being rendered: in the worker
    processes of ember.runtime.compile_pool where they are ready, otherwise in
    threads here. Sizes are 32-bit ints (a call needing 64-bit sizes compiles its own
    variant when it comes). Failures are kept per config: the first call skips a
    config that failed, and raises only if none compiled.

    Once every kernel is added the session is sealed, not waited for: the wait
    (`finish`) comes at the graph's first launch. Meanwhile the caller goes on; in a
    training step it lowers the backward, whose compiles then overlap the forward's.
    """

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self._session: compile_pool.CompileSession | None = None  # at the first job
        self._lock = threading.Lock()
        self._finished = False
        self._jobs = 0
        self._seen: set[tuple[str, Variant]] = set()
        self._earlier: set[Precompiler] = set()  # unfinished ones compiling shared sources

    def add(self, launcher: TritonLauncher, device: torch.device) -> None:
        if device.type != "cuda":
            return
        target = compile_pool.cuda_target(device)
        if target is None:
            return
        with _owners_lock:
            owner = _owners.setdefault(launcher.digest, self)
        if owner is not self:
            # an earlier graph's session compiles this source: its binaries (shared
            # through the module) serve this graph too, once that session is done
            self._earlier.add(owner)
            return
        for candidate in launcher.kernel.configs:
            variant = Variant(candidate)
            if launcher.has(variant) or (launcher.digest, variant) in self._seen:
                continue  # compiled, or queued for an earlier kernel of the same source
            self._seen.add((launcher.digest, variant))
            self._jobs += 1
            self._open(target).add(
                launcher.request(variant, target), functools.partial(launcher.store, variant)
            )

    def _open(self, target: tuple[str, int, int]) -> compile_pool.CompileSession:
        """The session, started at the first job. The workers are started here too,
        where the backend left them for a graph it expected in the cache
        (`compile_cache.warm_hint`); starting them is done once per process."""
        if self._session is None:
            compile_pool.start(target)
            self._session = compile_pool.CompileSession(threads=8)
        return self._session

    def seal(self) -> None:
        """Every kernel is added; the compiles go on without a caller waiting."""
        if self._session is not None:
            self._session.seal()

    def finish(self, cancel: bool = False) -> None:
        """Wait for every compile (once: later calls, from any thread, return when
        the first is done)."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
            waited = time.perf_counter()
            if self._session is not None:
                self._session.close(cancel)
            for earlier in self._earlier:  # never the other way round: no cycle
                earlier.finish()
            with _owners_lock:
                for digest, owner in list(_owners.items()):
                    if owner is self:
                        del _owners[digest]
            stats = precompile_stats
            stats["waiting s"] += time.perf_counter() - waited
            stats["compile s"] += time.perf_counter() - self._start
        stats["jobs"] += self._jobs
        if self._session is not None:
            stats["by workers"] += self._session.by_workers
            stats["workers"] = max(stats["workers"], self._session.workers)


# kernel source digest -> the unfinished Precompiler compiling it
_owners: dict[str, Precompiler] = {}
_owners_lock = threading.Lock()


class _Binaries(dict[Variant, "KernelBinary | BaseException"]):
    """A source's binaries by variant (a dict that can be weakly referenced)."""


# kernel source digest -> its binaries by variant (or why a variant failed), shared by
# every launcher of the source while one lives
_binaries: weakref.WeakValueDictionary[str, _Binaries] = weakref.WeakValueDictionary()


def load_kernel_module(source: str, cache_dir: Path) -> ModuleType:
    digest = hashlib.sha256(source.encode()).hexdigest()[:32]
    module = _modules.get(digest)
    if module is not None:
        return module
    module = load_module(write_source(cache_dir / "triton", source, prefix="k"), {})
    if interpreting() and hasattr(module, "libdevice"):
        module.libdevice = InterpreterLibdevice()  # type: ignore[attr-defined]  # generated module
    _modules[digest] = module
    return module


def storage_view(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`'s whole storage as a flat tensor starting at the storage's start."""
    if tensor.storage_offset() == 0 and not interpreting():
        return tensor  # the same data_ptr; Triton reads nothing else
    count = tensor.untyped_storage().nbytes() // tensor.element_size()
    return tensor.as_strided((count,), (1,), 0)


class TritonLauncher:
    """Launches one rendered kernel: `launcher(*tensors, *sizes)`.

    The first call for a set of sizes chooses a config (timing the compiled ones) and
    binds a `_Bound` launch for those sizes; later calls with them go straight to it.
    """

    def __init__(self, kernel: TritonKernel, module: ModuleType | None, grid: str = "") -> None:
        """`module` holds the kernel's jit function, None for a launcher restored from
        an artifact (`restore`), which loads it only if it must compile a variant the
        artifact lacks. `grid` is the grid's Python text where `kernel.grid` is not
        the real one (restored kernels)."""
        self.kernel = kernel
        self._module = module
        self.digest = hashlib.sha256(kernel.source.encode()).hexdigest()[:32]
        self._grid_text = grid or kernel.grid.python()
        self._grid = _grid_function(self._grid_text)
        self._buffers = len(kernel.buffer_arguments)
        self._bounds = [kernel.buffer_arguments.index(b) for b in kernel.bounds_arguments]
        self._written = {i for i, b in enumerate(kernel.buffer_arguments) if b in kernel.written}
        self._bound: dict[tuple[Any, ...], _Bound | _NoPrograms] = {}
        self._loose: dict[tuple[Any, ...], _Bound] = {}  # unaligned variants, by sizes
        self._functions: dict[tuple[Variant, int], cuda_driver.Function] = {}
        self._unaligned_logged = False
        binaries = _binaries.get(self.digest)
        if binaries is None:
            binaries = _binaries[self.digest] = _Binaries()
        self.binaries: _Binaries = binaries
        # the graph's compiles, still running when compile_triton_kernels returned
        self.pending: Precompiler | None = None
        self._binaries_lock = threading.Lock()
        # where a launcher without its module (restored) writes its source to load it
        self._sources = _restored_sources() if module is None else None

    # -- compiling -----------------------------------------------------------------

    def module(self) -> ModuleType:
        """The module of the kernel's jit function (loaded now for a restored
        launcher: only compiling and Triton's interpreter need it)."""
        if self._module is None:
            assert self._sources is not None  # made with its module otherwise
            self._module = load_kernel_module(self.kernel.source, self._sources())
        return self._module

    @property
    def fn(self) -> Any:
        return getattr(self.module(), self.kernel.function_name)

    def has(self, variant: Variant) -> bool:
        return variant in self.binaries

    def signature(self, variant: Variant) -> tuple[dict[str, str], list[str]]:
        """Triton's signature of the kernel's function for `variant` (a type per
        parameter name, "constexpr" for block sizes) and the driver's kinds of the
        non-constant parameters, in order."""
        kernel = self.kernel
        names = list(self.fn.arg_names)
        types: list[str] = []
        for dtype in kernel.buffer_dtypes:
            if dtype not in _TRITON_TYPES:
                raise UnsupportedBinary(f"kernel {kernel.name}: no Triton type for {dtype}")
            types.append("*" + _TRITON_TYPES[dtype])
        size_type = "i64" if variant.wide else "i32"
        types += [size_type] * len(kernel.size_arguments)
        types += ["i64"] * len(kernel.bounds_arguments)
        if kernel.workspace:
            types.append("*i64")
        blocks = dict(variant.config.blocks)
        constant = [n for n in names[len(types) :]]
        if sorted(constant) != sorted(blocks):
            raise UnsupportedBinary(
                f"kernel {kernel.name}: parameters {constant} are not its block sizes "
                f"{sorted(blocks)}"
            )
        signature = dict(zip(names, [*types, *["constexpr"] * len(constant)], strict=True))
        kinds = ["p" if t.startswith("*") else t for t in types]
        return signature, kinds

    def request(
        self, variant: Variant, target: tuple[str, int, int]
    ) -> compile_pool.CompileRequest:
        signature, _ = self.signature(variant)
        names = list(signature)
        blocks = dict(variant.config.blocks)
        constexprs: dict[tuple[int, ...], Any] = {
            (i,): blocks[n] for i, n in enumerate(names) if signature[n] == "constexpr"
        }
        attrs: dict[tuple[int, ...], Any] = {}
        if variant.aligned:
            attrs = {(i,): [["tt.divisibility", 16]] for i in range(self._buffers)}
        options: dict[str, Any] = {
            "num_warps": variant.config.num_warps,
            "num_stages": variant.config.num_stages,
            **dict(self.kernel.launch_options),
        }
        module = self.module()
        return compile_pool.CompileRequest(
            path=str(module.__file__),
            module=module.__name__,
            function=self.kernel.function_name,
            signature=signature,
            constexprs=constexprs,
            attrs=attrs,
            target=target,
            options=options,
        )

    def store(self, variant: Variant, reply: dict[str, Any] | BaseException) -> None:
        """Keep a compile's result (a session's `done`)."""
        result: KernelBinary | BaseException
        if isinstance(reply, BaseException):
            result = reply
        else:
            try:
                result = KernelBinary.from_reply(reply, self.signature(variant)[1])
            except UnsupportedBinary as exc:
                result = exc
        with self._binaries_lock:
            self.binaries[variant] = result

    def binary(self, variant: Variant, device: torch.device) -> KernelBinary:
        """The binary of `variant`, compiled here now if no session compiled it; the
        compile's error if it failed."""
        pending = self.pending
        if pending is not None:
            pending.finish()
            self.pending = None
        found = self.binaries.get(variant)
        if found is None:
            target = compile_pool.cuda_target(device)
            if target is None:
                raise UnsupportedBinary(f"no Triton target for {device}")
            request = self.request(variant, target)
            try:
                self.store(variant, compile_pool.compile_here(request))
            except Exception as exc:
                self.store(variant, exc)
            found = self.binaries[variant]
        if isinstance(found, BaseException):
            raise found
        return found

    def function(
        self, variant: Variant, device: torch.device
    ) -> tuple[cuda_driver.Function, KernelBinary]:
        binary = self.binary(variant, device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        function = self._functions.get((variant, index))
        if function is None:
            function = cuda_driver.Function(binary.image, binary.symbol, index, binary.shared)
            self._functions[(variant, index)] = function
        return function, binary

    # -- launching -----------------------------------------------------------------

    def __call__(self, *args: Any) -> None:
        bound = self._bound.get(args[self._buffers :])
        if bound is None or not bound(args[: self._buffers]):
            self._slow_call(args, bound)

    def _slow_call(self, args: tuple[Any, ...], bound: _Bound | _NoPrograms | None) -> None:
        """A first call for these sizes, a call the bound launch refused (a buffer not
        aligned), or any call under Triton's interpreter."""
        kernel = self.kernel
        if len(args) != self._buffers + len(kernel.size_arguments):
            raise TypeError(
                f"kernel {kernel.name} takes {self._buffers} tensors "
                f"({', '.join(kernel.buffer_arguments)}) and {len(kernel.size_arguments)} "
                f"sizes ({', '.join(kernel.size_arguments)}); got {len(args)} arguments"
            )
        tensors = args[: self._buffers]
        sizes = [int(s) for s in args[self._buffers :]]
        if interpreting() or not tensors or tensors[0].device.type != "cuda":
            config = self.kernel.configs[0]
            operands = self._operands(tensors, sizes)
            if self.kernel.workspace:  # a fresh one: nothing to keep between these launches
                programs = self.grid(config, sizes)[0]
                operands.append(new_workspace(self.kernel, programs, tensors[0].device))
            self._launch_jit(config, operands, sizes)
            return
        if self.grid(self.kernel.configs[0], sizes)[0] <= 0:
            # Nothing to compute (a size is 0): the driver refuses a grid of no
            # programs, and there is nothing to tune; eager returns the empty result.
            self._bound[args[self._buffers :]] = _NO_PROGRAMS
            return
        if isinstance(bound, _Bound):  # refused: a buffer is not 16-byte aligned
            self._count_unaligned(tensors)
            loose = self._loose.get(args[self._buffers :])
            if loose is None:
                variant = Variant(bound.variant.config, bound.variant.wide, aligned=False)
                loose = self._loose[args[self._buffers :]] = self._bind(variant, tensors, sizes)
            loose(tensors)
            return
        start = time.perf_counter()
        key = (self.digest, tuple(sizes), tuple(t.dtype for t in tensors))
        wide = any(abs(s) > _INT32_MAX for s in sizes)
        config = _chosen.get(key) or self._tune(tensors, sizes, wide)
        _chosen[key] = config
        launch = self._bind(Variant(config, wide), tensors, sizes)
        self._bound[args[self._buffers :]] = launch
        first_launch_seconds[0] += time.perf_counter() - start
        if not launch(tensors):
            self._slow_call(args, launch)

    def benchmark(self, tensors: Sequence[torch.Tensor], sizes: list[int]) -> float:
        """Milliseconds of one launch on `tensors` (which it writes) with the config
        tuning chooses for these sizes: tuned now, as a first call would, and kept,
        so the first call with these sizes and dtypes does not tune again."""
        key = (self.digest, tuple(sizes), tuple(t.dtype for t in tensors))
        wide = any(abs(s) > _INT32_MAX for s in sizes)
        config = _chosen.get(key) or self._tune(tensors, sizes, wide)
        _chosen[key] = config
        launch = self._bind(Variant(config, wide), tensors, sizes)
        if not launch(tensors):  # a buffer not 16-byte aligned
            launch = self._bind(Variant(config, wide, aligned=False), tensors, sizes)
        return launch_ms(functools.partial(launch, tensors))

    def _bind(self, variant: Variant, tensors: Sequence[torch.Tensor], sizes: list[int]) -> _Bound:
        device = tensors[0].device
        function, binary = self.function(variant, device)
        grid = self.grid(variant.config, sizes)
        return _Bound(self, variant, function, binary, grid, sizes)

    def _count_unaligned(self, tensors: Sequence[torch.Tensor]) -> None:
        name = self.kernel.name
        unaligned_launches[name] = unaligned_launches.get(name, 0) + 1
        if not self._unaligned_logged:
            self._unaligned_logged = True
            which = [
                b for b, t in zip(self.kernel.buffer_arguments, tensors, strict=True)
                if storage_view(t).data_ptr() % 16
            ]  # fmt: skip
            log.info(
                "kernel %s: buffers %s are not 16-byte aligned; launching a variant "
                "compiled without that assumption",
                name,
                ", ".join(which),
            )

    def _operands(self, tensors: Sequence[torch.Tensor], sizes: list[int]) -> list[Any]:
        operands: list[Any] = [storage_view(t) for t in tensors]
        operands += sizes
        operands += [
            tensors[i].untyped_storage().nbytes() // tensors[i].element_size() for i in self._bounds
        ]
        return operands

    def grid(self, config: LaunchConfig, sizes: list[int]) -> tuple[int, int, int]:
        by_name = dict(zip(self.kernel.size_arguments, sizes, strict=True))
        return (self._grid(by_name, dict(config.blocks)), 1, 1)

    # -- artifacts -----------------------------------------------------------------

    def export(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        """The launcher as data: its kernel's description, its binaries (files) and
        the configs chosen so far, from which `restore` builds it again."""
        kernel = self.kernel
        pending = self.pending
        if pending is not None:  # every candidate's binary, not the ones done so far
            pending.finish()
            self.pending = None
        files: dict[str, bytes] = {}
        variants: list[dict[str, Any]] = []
        for variant, binary in sorted(self.binaries.items(), key=lambda item: repr(item[0])):
            if not isinstance(binary, KernelBinary):
                continue  # a config that failed: the restored launcher skips it too
            name = f"{kernel.name}.{len(variants)}.cubin"
            files[name] = binary.image
            variants.append(
                {
                    "config": _config_json(variant.config),
                    "wide": variant.wide,
                    "aligned": variant.aligned,
                    "file": name,
                    "symbol": binary.symbol,
                    "kinds": list(binary.kinds),
                    "threads": binary.threads,
                    "shared": binary.shared,
                    "scratch": binary.scratch,
                    "scratch_align": binary.scratch_align,
                }
            )
        chosen = [
            {"sizes": list(sizes), "dtypes": [str(d) for d in dtypes], "config": _config_json(c)}
            for (digest, sizes, dtypes), c in _chosen.items()
            if digest == self.digest
        ]
        spec = {
            "type": "triton",
            "name": kernel.name,
            "function": kernel.function_name,
            "source": kernel.source,
            "kind": kernel.kind,
            "buffers": list(kernel.buffer_arguments),
            "dtypes": [str(d).removeprefix("torch.") for d in kernel.buffer_dtypes],
            "sizes": list(kernel.size_arguments),
            "bounds": list(kernel.bounds_arguments),
            "reads": list(kernel.reads),
            "written": list(kernel.written),
            "grid": self._grid_text,
            "configs": [_config_json(c) for c in kernel.configs],
            "index_type": kernel.index_type,
            "index_checks": [list(c) for c in kernel.index_checks],
            "launch_options": [list(o) for o in kernel.launch_options],
            "workspace": kernel.workspace,
            "variants": variants,
            "chosen": chosen,
        }
        return spec, files

    @staticmethod
    def restore(spec: dict[str, Any], files: dict[str, bytes]) -> TritonLauncher:
        """A launcher from `export`'s data: its binaries launch without Triton's
        compiler; only a variant the artifact lacks (64-bit sizes, an unaligned
        buffer) would be compiled, from the kernel's source."""
        kernel = TritonKernel(
            name=spec["name"],
            function_name=spec["function"],
            source=spec["source"],
            kind=spec["kind"],
            buffer_arguments=tuple(spec["buffers"]),
            buffer_dtypes=tuple(getattr(torch, d) for d in spec["dtypes"]),
            size_arguments=tuple(spec["sizes"]),
            bounds_arguments=tuple(spec["bounds"]),
            reads=tuple(spec["reads"]),
            written=tuple(spec["written"]),
            grid=GridSpec(()),  # the grid is `spec["grid"]`'s text
            configs=tuple(_config_from(c) for c in spec["configs"]),
            index_type=spec["index_type"],
            index_checks=tuple((str(w), int(d)) for w, d in spec["index_checks"]),
            launch_options=tuple((str(k), bool(v)) for k, v in spec["launch_options"]),
            workspace=int(spec.get("workspace", 0)),
        )
        launcher = TritonLauncher(kernel, None, grid=spec["grid"])
        for entry in spec["variants"]:
            variant = Variant(_config_from(entry["config"]), entry["wide"], entry["aligned"])
            launcher.binaries.setdefault(
                variant,
                KernelBinary(
                    symbol=entry["symbol"],
                    image=files[entry["file"]],
                    kinds=tuple(entry["kinds"]),
                    threads=entry["threads"],
                    shared=entry["shared"],
                    scratch=entry["scratch"],
                    scratch_align=entry["scratch_align"],
                ),
            )
        for entry in spec["chosen"]:
            dtypes = tuple(getattr(torch, d.removeprefix("torch.")) for d in entry["dtypes"])
            key = (launcher.digest, tuple(entry["sizes"]), dtypes)
            _chosen.setdefault(key, _config_from(entry["config"]))
        return launcher

    def _launch_jit(self, config: LaunchConfig, operands: list[Any], sizes: list[int]) -> Any:
        """A launch through Triton's jit: only for its interpreter (or tensors that
        are not on a GPU, which only the interpreter can run)."""
        options = dict(self.kernel.launch_options)
        if options.get("debug") and interpreting():
            return self._interpret(config, operands, sizes)
        return self.fn[self.grid(config, sizes)](
            *operands,
            **dict(config.blocks),
            num_warps=config.num_warps,
            num_stages=config.num_stages,
            **options,
        )

    def _interpret(self, config: LaunchConfig, operands: list[Any], sizes: list[int]) -> Any:
        """Run a kernel with index checks in Triton's interpreter, its asserts on."""
        with _interpreter_debug():
            try:
                return self.fn[self.grid(config, sizes)](
                    *operands,
                    **dict(config.blocks),
                    num_warps=config.num_warps,
                    num_stages=config.num_stages,
                )
            except Exception as exc:
                raise self._index_error(exc) from exc

    def _index_error(self, exc: Exception) -> Exception:
        """`IndexOutOfBounds` for a failed index check (its message begins with the
        check's number), `exc` itself for anything else."""
        marker = "ember index check "
        text = str(exc)
        if marker not in text:
            return exc
        number = int(text.split(marker, 1)[1].split(":", 1)[0])
        what, dim = self.kernel.index_checks[number]
        message = index_error_message(f"{what}, kernel {self.kernel.name}", dim, None, None)
        return IndexOutOfBounds(message)

    def _tune(self, tensors: Sequence[torch.Tensor], sizes: list[int], wide: bool) -> LaunchConfig:
        """The fastest config that compiled (for 64-bit sizes where `wide`), timed on
        these tensors (copies of the written ones where the kernel is not idempotent
        or its tensors alias)."""
        configs = self.kernel.configs
        device = tensors[0].device
        if len(configs) == 1:
            self.function(Variant(configs[0], wide), device)  # raises if it did not compile
            return configs[0]
        tensors = list(tensors)
        if not self.kernel.idempotent or _aliased(tensors):
            for i in self._written:  # time on copies: the real outputs stay untouched
                tensors[i] = storage_view(tensors[i]).clone()
        best, best_ms = None, float("inf")
        first_error: BaseException | None = None
        for candidate in configs:
            try:
                launch = self._bind(Variant(candidate, wide), tensors, sizes)
            except Exception as exc:  # a config that does not compile (resources)
                first_error = first_error or exc
                continue
            if not launch(tensors):  # not aligned: time the unaligned variant
                launch = self._bind(Variant(candidate, wide, aligned=False), tensors, sizes)
            ms = launch_ms(functools.partial(launch, tensors))
            if ms < best_ms:
                best, best_ms = candidate, ms
        if best is None:
            assert first_error is not None
            raise first_error
        return best


@functools.lru_cache(maxsize=4096)  # one per distinct grid text; a dropped one is evaluated again
def _grid_function(text: str) -> Callable[[dict[str, int], dict[str, int]], int]:
    """The grid's block count as a function of (sizes by name, blocks by name), from
    its Python text (`GridSpec.python`: ember's own, from the kernel it rendered or the
    artifact's checked spec)."""
    function: Callable[[dict[str, int], dict[str, int]], int] = eval(
        f"lambda sizes, blocks: {text}"
    )
    return function


def _config_json(config: LaunchConfig) -> dict[str, Any]:
    return {
        "blocks": [list(b) for b in config.blocks],
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
    }


def _config_from(data: dict[str, Any]) -> LaunchConfig:
    blocks = tuple((str(name), int(value)) for name, value in data["blocks"])
    return LaunchConfig(blocks, int(data["num_warps"]), int(data["num_stages"]))


def _restored_sources() -> Callable[[], Path]:
    """Where a launcher restored now writes its kernel's source if it must load it
    (Triton reads a jit function's source from its file), maybe calls later: the
    cache of the settings in force now (the restoring compile's), not of the
    settings in force at that call."""
    from ember.runtime.config import cache_directory, config

    cache, directory = config.cache, config.get("cache_dir")
    return lambda: cache_directory(cache, directory) / "kernels"


def new_workspace(kernel: TritonKernel, programs: int, device: torch.device) -> torch.Tensor:
    """A zeroed workspace for `programs` programs of `kernel` (see TritonKernel)."""
    return torch.zeros(1 + kernel.workspace * programs, dtype=torch.int64, device=device)


class _Bound:
    """A kernel's binary bound to one set of sizes: grid, sizes, block sizes and
    scratch fixed, so a launch writes the buffers' addresses (and, with index checks,
    their storage sizes) into the argument block and calls the driver. A look-back
    scan's workspaces are kept here, one per stream (see the module docstring).

    Calling it returns False, launching nothing, where a buffer is not 16-byte aligned
    and the binary assumes it is. The thread that bound it (the one that runs the
    graph: the caller's, or autograd's for a backward) finds its argument block
    without a lookup; see `cuda_driver.Launch` for the others."""

    __slots__ = (
        "address", "aligned", "bounds", "device", "launch", "owner", "scratch", "slots",
        "variant", "workspace", "workspaces",
    )  # fmt: skip

    def __init__(
        self,
        launcher: TritonLauncher,
        variant: Variant,
        function: cuda_driver.Function,
        binary: KernelBinary,
        grid: tuple[int, int, int],
        sizes: list[int],
    ) -> None:
        self.variant = variant
        self.aligned = variant.aligned
        buffers = launcher._buffers
        self.bounds = [(buffers + len(sizes) + n, i) for n, i in enumerate(launcher._bounds)]
        fixed = {buffers + n: s for n, s in enumerate(sizes)}
        user = buffers + len(sizes) + len(self.bounds)
        programs = grid[0] * grid[1] * grid[2]
        # a look-back scan's workspace: (its slot, words); one for graph captures now
        self.workspace: tuple[int, torch.device] | None = None
        self.workspaces: dict[int | str, torch.Tensor] = {}
        if launcher.kernel.workspace:
            self.workspace = (user, torch.device("cuda", function.device))
            self.workspaces["graph"] = new_workspace(launcher.kernel, programs, self.workspace[1])
            user += 1
        for index in range(user, len(binary.kinds)):
            fixed[index] = 0  # Triton's scratch pointers: none needed ...
        # ... unless the binary asks for global scratch: (bytes for the grid, its slot)
        self.scratch = (binary.scratch * programs, user) if binary.scratch else None
        self.device = function.device
        self.launch = cuda_driver.Launch(
            function, grid, binary.threads, binary.shared, binary.kinds, fixed
        )
        self.owner = threading.get_ident()
        self.slots, self.address = self.launch.block()

    def __call__(self, tensors: Sequence[torch.Tensor]) -> bool:
        if threading.get_ident() == self.owner:
            slots, address = self.slots, self.address
        else:
            slots, address = self.launch.block()
        for slot, t in zip(slots, tensors, strict=False):  # the slots go on: sizes
            pointer = t.data_ptr()
            offset: int = t.storage_offset()  # type: ignore[assignment]  # an int at run time
            if offset:
                pointer -= offset * t.element_size()
            if pointer & 15 and self.aligned:
                return False
            slot.value = pointer
        if self.bounds:
            for slot_index, i in self.bounds:
                t = tensors[i]
                slots[slot_index].value = t.untyped_storage().nbytes() // t.element_size()
        stream = _raw_stream(self.device)
        if self.workspace is not None:
            slots[self.workspace[0]].value = self._workspace(stream).data_ptr()
        if self.scratch is None:
            self.launch.launch(stream, address)
            return True
        nbytes, slot_index = self.scratch
        scratch = torch.empty(nbytes, dtype=torch.uint8, device=tensors[0].device)
        slots[slot_index].value = scratch.data_ptr()
        self.launch.launch(stream, address)
        del scratch  # the caching allocator orders its reuse after this stream's work
        return True

    def _workspace(self, stream: int) -> torch.Tensor:
        """The look-back workspace of launches on `stream`."""
        if torch.cuda.is_current_stream_capturing():
            return self.workspaces["graph"]
        found = self.workspaces.get(stream)
        if found is None:
            zeroed = self.workspaces["graph"]  # the same size; zero where it was made
            found = self.workspaces[stream] = torch.zeros_like(zeroed)
        return found


class _NoPrograms:
    """The bound launch of sizes that leave a kernel no programs to run: it launches
    nothing (CUDA refuses an empty grid with 'invalid argument')."""

    __slots__ = ()

    def __call__(self, tensors: Sequence[torch.Tensor]) -> bool:
        return True


_NO_PROGRAMS = _NoPrograms()

_raw_stream = torch._C._cuda_getCurrentRawStream  # the current stream's handle, per device


@contextlib.contextmanager
def _interpreter_debug() -> Any:
    """Triton's interpreter with its `debug` option on (so `tl.device_assert` checks)
    and overflow sanitizing off, as `CHECKED_OPTIONS` ask of a compiled kernel. The
    interpreter reads one module-level options object and no launch keywords (Triton
    3.6 and 3.9); where that object is missing, asserts stay off, as before."""
    import dataclasses

    from triton.runtime import interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if builder is None or not dataclasses.is_dataclass(options):
        yield
        return
    with _interpreter_lock:
        builder.options = dataclasses.replace(options, debug=True, sanitize_overflow=False)  # type: ignore[type-var]  # Triton's dataclass
        try:
            yield
        finally:
            builder.options = options


_interpreter_lock = threading.Lock()


def _aliased(tensors: Sequence[torch.Tensor]) -> bool:
    pointers = [t.untyped_storage().data_ptr() for t in tensors]
    return len(set(pointers)) != len(pointers)


# Device clock cycles to keep the GPU waiting per timed launch while the host queues
# them: at least 100k (about 50 us at an H100's clocks, more than a lean launch's host
# time), more where the host is slower (see `launch_ms`).
_QUEUE_AHEAD_CYCLES = 100_000
# Clock rate assumed to turn host seconds into device sleep cycles: about an H100's
# boost clock. A slower clock only makes the wait longer.
_CYCLES_PER_SECOND = 2.0e9


def launch_ms(run: Callable[[], object], repeats: int = 10) -> float:
    """Median milliseconds of `run` on the current stream (after a compile + warm-up):
    its launches queued back to back between events behind a device-side wait, so the
    host's launch time stays out of the device's even where the host is the slower (a
    few-microsecond kernel launched through torch's dispatcher: timed without the wait,
    a 10 us copy measured 49 us on the H100, which made the matmul-template choice
    overrate a separate epilogue kernel's cost 2-5x).

    The wait is sized from the host time of a warm-up call, and checked: where the
    device had finished waiting before the host had queued the last launch (a host
    slowed by other threads inside a compile: a 4 us cuBLAS call measured 170 us),
    the round is timed again with a four times longer wait."""
    run()
    begin = time.perf_counter()
    run()
    host_s = time.perf_counter() - begin
    sleep = getattr(torch.cuda, "_sleep", None)
    per_launch = max(_QUEUE_AHEAD_CYCLES, int(2 * host_s * _CYCLES_PER_SECOND))
    for _ in range(4):
        start = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]  # type: ignore[no-untyped-call]  # torch stub
        end = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]  # type: ignore[no-untyped-call]  # torch stub
        awake = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch stub
        if sleep is not None:
            sleep(per_launch * repeats)  # the device waits while the host queues
        awake.record()
        for s, e in zip(start, end, strict=True):
            s.record()
            run()
            e.record()
        queued_in_time = sleep is None or not awake.query()  # type: ignore[no-untyped-call]  # torch stub
        torch.cuda.synchronize()
        if queued_in_time:
            break
        per_launch *= 4
    times = sorted(float(s.elapsed_time(e)) for s, e in zip(start, end, strict=True))
    return times[len(times) // 2]


# -- libdevice under the interpreter ---------------------------------------------------


def _special(name: str) -> Callable[..., torch.Tensor]:
    return getattr(torch.special, name)  # type: ignore[no-any-return]  # torch.special functions


_LIBDEVICE_AS_TORCH: dict[str, Callable[..., torch.Tensor]] = {
    "trunc": torch.trunc, "rint": torch.round, "expm1": torch.expm1, "log10": torch.log10,
    "log1p": torch.log1p, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin,
    "cos": torch.cos, "tan": torch.tan, "asin": torch.asin, "acos": torch.acos,
    "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh,
    "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh, "erf": torch.erf,
    "erfc": torch.erfc, "erfinv": torch.erfinv, "lgamma": torch.lgamma,
    "cyl_bessel_i0": torch.i0, "cyl_bessel_i1": _special("i1"), "normcdfinv": _special("ndtri"),
    "erfcx": _special("erfcx"), "j0": _special("bessel_j0"), "j1": _special("bessel_j1"),
    "y0": _special("bessel_y0"), "y1": _special("bessel_y1"), "fmod": torch.fmod,
    "pow": torch.pow, "atan2": torch.atan2, "fmax": torch.fmax, "fmin": torch.fmin,
    "copysign": torch.copysign, "hypot": torch.hypot, "nextafter": torch.nextafter,
    "exp": torch.exp, "log": torch.log,
}  # fmt: skip


# stand-ins whose float32 result must be computed in float32 (the rest of a float32
# call is computed in float64 and rounded)
_FLOAT32_STAND_INS = frozenset({"nextafter"})


class InterpreterLibdevice:
    """Stands in for `libdevice` in kernel modules run by Triton's interpreter.

    Float32 calls are computed in float64 and rounded (nextafter aside): torch's
    float32 kernels return values that depend on where an element falls in its
    vector (SLEEF's routine for whole vectors, libm's for the tail), so the same
    argument could round differently from call to call, and a test could not write
    down what the kernel computes."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        try:
            fn = _LIBDEVICE_AS_TORCH[name]
        except KeyError:
            raise AttributeError(f"libdevice.{name} has no interpreter stand-in") from None
        widen = name not in _FLOAT32_STAND_INS
        return lambda *args: _apply(fn, args, widen)


def _apply(fn: Callable[..., torch.Tensor], args: tuple[Any, ...], widen: bool) -> Any:
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    arrays = [np.asarray(a.handle.data) for a in args]
    tensors = [torch.from_numpy(np.ascontiguousarray(x)) for x in arrays]
    if widen and all(t.dtype == torch.float32 for t in tensors):
        tensors = [t.double() for t in tensors]
    result = fn(*tensors).numpy()
    first = args[0]
    result = result.astype(arrays[0].dtype)
    blocks = [list(a.type.shape) for a in args if a.type.is_block()]
    if not blocks:
        return tl.core.tensor(TensorHandle(result, first.dtype), first.dtype)
    shape = list(np.broadcast_shapes(*(tuple(b) for b in blocks)))
    result = np.broadcast_to(
        result.reshape(result.shape[-len(shape) :] if result.ndim > len(shape) else result.shape),
        shape,
    ).copy()
    return tl.core.tensor(TensorHandle(result, first.dtype), tl.block_type(first.dtype, shape))
