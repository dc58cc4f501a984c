"""Loading, tuning and launching the Triton kernels of a schedule.

`compile_triton_kernels(kernels, cache_dir=...)` renders each `FusedKernel` (through
ember.codegen.triton), writes its source to a content-addressed file under
`cache_dir` (Triton's jit reads real source files), imports it, and returns one
launcher per kernel name. Kernels with identical source share one module and so one
set of compiled binaries (the same layer repeated twelve times compiles once).

A launcher takes the kernel's buffers as tensors (in `buffer_arguments()` order) and
its sizes as ints (in `size_arguments()` order). It passes each buffer (random seeds
included: one-element buffers) as its whole storage (index expressions are storage
offsets) and launches on the current CUDA stream. The first call for a given set of sizes times each
candidate config briefly and keeps the fastest for the rest of the process; kernels
that read what they write (or whose tensors alias) are timed on copies.

Under `TRITON_INTERPRET=1` (CPU tensors) the kernels run in Triton's interpreter, with
libdevice calls served by torch (the interpreter has no libdevice) and no tuning.

After a kernel's first call for a set of sizes, a launch goes straight to the compiled
binary (`_DirectLaunch`). Where that is unavailable or refused, the launch goes
through Triton's jit, which rebinds and re-specialises every argument: each such
launch is counted in `jit_launches` (per kernel name, the reason in
`jit_launch_reasons`), and each launcher logs the first one with its reason on the
"ember.runtime" logger, at INFO where the slow path is expected (Triton's
interpreter, debug bounds arguments, a profiler's launch hook) and WARNING otherwise.

Kernels with index checks launch and compile with their `launch_options` (Triton's
`debug`, which compiles `tl.device_assert` in): on a GPU a bad index stops the kernel
with CUDA's device-side assert, as eager's indexing kernels do. Triton's interpreter
takes no per-launch options, so such launches run with its debug option switched on
for their duration, and a failed check becomes `IndexOutOfBounds` naming the op, the
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
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import triton

from ember.codegen.triton import LaunchConfig, TritonKernel, render_kernel
from ember.ir import IndexOutOfBounds, index_error_message
from ember.runtime import compile_pool
from ember.runtime.loader import load_module, write_source
from ember.scheduler import FusedKernel

log = logging.getLogger("ember.runtime")

_modules: dict[str, ModuleType] = {}  # source hash -> loaded module
_chosen: dict[tuple[Any, ...], LaunchConfig] = {}  # (source hash, sizes, dtypes) -> config
# Seconds spent in first launches (choosing a config, Triton's compile, binding), for
# compile-time profiles: Triton compiles lazily, so this part of a cold start is not
# in any CompileRecord.
first_launch_seconds = [0.0]
# What `Precompiler`s did, summed over graphs, for compile-time profiles.
# "compile s" runs from the first kernel's rendering to the end of the wait for the
# compiles; "waiting s" is that wait (at the graph's first launch: the compiles run on
# meanwhile); "prepare wait s" is the wait for `compile_pool.prepare_here`'s Triton
# set-up.
precompile_stats = dict.fromkeys(
    (
        "prepare wait s",
        "capture s",
        "waiting s",
        "compile s",
        "jobs",
        "by workers",
        "workers",
    ),
    0.0,
)


# Launches through Triton's jit that were not a first call for their sizes: kernel name
# -> how many, and the latest reason (one of the texts below, or a more specific one).
jit_launches: dict[str, int] = {}
jit_launch_reasons: dict[str, str] = {}
INTERPRETER = "Triton's interpreter runs every launch (TRITON_INTERPRET=1)"
BOUNDS_ARGUMENTS = "debug bounds arguments (storage sizes) are computed at each call"
LAUNCH_HOOK = "a launch hook (a profiler's) is registered with Triton"
EXPECTED_JIT_REASONS = frozenset({INTERPRETER, BOUNDS_ARGUMENTS, LAUNCH_HOOK})


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


class Precompiler:
    """Compiles every candidate config of every distinct kernel source before the
    first call, so the first call finds the binaries in Triton's in-memory cache.

    Triton compiles lazily at a kernel's first launch, one config after another while
    the first call tunes: a graph of forty kernels with four configs each spent 30 s
    there on an H100 (GPT-2). Here the compiles run at once, and start while the
    graph's later kernels are still being rendered: in the worker processes of
    ember.runtime.compile_pool where they are ready (each compile is captured here,
    compiled there into Triton's disk cache, and loaded here), otherwise in threads
    here. A kernel's configs are all captured before any of them is queued: a capture
    swaps an attribute of the jit function that a thread loading the same function
    would otherwise see. Sizes are specialised by type only (do_not_specialize), so a
    sample value of each size symbol (64, an i32) matches real calls; a call needing
    64-bit sizes compiles its own variant lazily. Failures are ignored here: the lazy
    path reports them (or skips a config that does not fit) as before.

    Once every kernel is added the session is sealed, not waited for: the wait
    (`finish`) comes at the graph's first launch. Meanwhile the caller goes on; in a
    training step it lowers the backward, whose compiles then overlap the forward's
    (on the H100 machine, attention's first step waited for the backward's worker
    compiles only after its forward had run).
    """

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self._seen: set[tuple[str, LaunchConfig]] = set()
        self._session = compile_pool.CompileSession(threads=8)
        self._capturing = 0.0
        self._lock = threading.Lock()
        self._finished = False
        self._digests: set[str] = set()  # the kernel sources this one compiles
        self._earlier: set[Precompiler] = set()  # unfinished ones compiling others here

    def add(self, launcher: TritonLauncher, device: torch.device) -> None:
        if device.type != "cuda":
            return
        with _owners_lock:
            owner = _owners.setdefault(launcher.digest, self)
        if owner is not self:
            # An earlier graph's session, still compiling, has this source (the same
            # module, so the same jit function): capturing it here would swap the
            # function's compile while that session's threads load it. Its binaries
            # serve this graph too; this graph's first launch waits for them.
            self._earlier.add(owner)
            return
        self._digests.add(launcher.digest)
        # a capture needs Triton's driver (after the first kernel, this returns at once)
        precompile_stats["prepare wait s"] += compile_pool.wait_prepared("driver")
        start = time.perf_counter()
        jobs = []
        for candidate in launcher.kernel.configs:
            if (launcher.digest, candidate) in self._seen:
                continue
            self._seen.add((launcher.digest, candidate))
            here = functools.partial(_warm, launcher, candidate, device)
            request = None
            if self._session.workers:
                warm = functools.partial(_warm_up, launcher, candidate, device)
                request = compile_pool.capture(launcher.fn, launcher.path, device.index or 0, warm)
            jobs.append((request, here))
        self._capturing += time.perf_counter() - start
        for request, here in jobs:
            self._session.add(request, here)

    def seal(self) -> None:
        """Every kernel is added; the compiles go on without a caller waiting."""
        self._session.seal()

    def finish(self, cancel: bool = False) -> None:
        """Wait for every compile (once: later calls, from any thread, return when
        the first is done)."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
            waited = time.perf_counter()
            self._session.close(cancel)
            for earlier in self._earlier:  # never the other way round: no cycle
                earlier.finish()
            with _owners_lock:
                for digest in self._digests:
                    if _owners.get(digest) is self:
                        del _owners[digest]
            stats = precompile_stats
            stats["capture s"] += self._capturing
            stats["waiting s"] += time.perf_counter() - waited
            stats["compile s"] += time.perf_counter() - self._start
        stats["jobs"] += len(self._seen)
        stats["by workers"] += self._session.by_workers
        stats["workers"] = max(stats["workers"], self._session.workers)


# kernel source digest -> the unfinished Precompiler compiling it
_owners: dict[str, Precompiler] = {}
_owners_lock = threading.Lock()


def _warm(launcher: TritonLauncher, launch_config: LaunchConfig, device: torch.device) -> None:
    """Compile (or load from Triton's cache) one config and load it onto the device;
    errors are left to the lazy path, which reports them or skips a config that does
    not fit.

    Loading builds the binary's launcher, a C module per distinct argument signature
    that Triton compiles with the host C compiler the first time it sees one: five for
    resnet50, 0.37 s each, which ran one after another at the first call (H100
    machine, cProfile). Here they build in parallel with the kernels' compiles.

    It first waits for Triton's cache key (`compile_pool.prepare_here`), which every
    thread loading at once would otherwise compute again."""
    compile_pool.wait_prepared()
    with contextlib.suppress(Exception):
        compiled = _warm_up(launcher, launch_config, device)
        init_handles = getattr(compiled, "_init_handles", None)
        if init_handles is not None:
            with torch.cuda.device(device):
                init_handles()


def _warm_up(launcher: TritonLauncher, launch_config: LaunchConfig, device: torch.device) -> Any:
    """The compiled kernel (Triton's), compiled or loaded from its caches."""
    kernel = launcher.kernel
    return compile_pool.warm_up(
        launcher.fn,
        kernel.buffer_dtypes,
        len(kernel.size_arguments) + len(kernel.bounds_arguments),
        launch_config.blocks,
        launch_config.num_warps,
        launch_config.num_stages,
        device.index or 0,
        dict(kernel.launch_options),
    )


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

    The first call for a set of sizes goes through Triton's jit (which compiles and
    specialises) after choosing a config; it keeps the compiled kernel and its grid
    so later calls with those sizes launch it directly: Triton's own launch path
    rebinds and re-specialises every argument on every call, which costs more than
    many small kernels take to run.
    """

    def __init__(self, kernel: TritonKernel, module: ModuleType) -> None:
        self.kernel = kernel
        self.fn = getattr(module, kernel.function_name)
        self.digest = module.__name__
        self.path = str(module.__file__)
        self._buffers = len(kernel.buffer_arguments)
        self._bounds = [kernel.buffer_arguments.index(b) for b in kernel.bounds_arguments]
        self._written = {i for i, b in enumerate(kernel.buffer_arguments) if b in kernel.written}
        self._direct: dict[tuple[Any, ...], _DirectLaunch | None] = {}
        self._no_direct: dict[tuple[Any, ...], str] = {}  # sizes -> why _direct has None
        self._jit_logged = False
        # the graph's compiles, still running when compile_triton_kernels returned
        self.pending: Precompiler | None = None

    def __call__(self, *args: Any) -> None:
        sizes = args[self._buffers :]
        direct = self._direct.get(sizes)
        if direct is not None:
            if direct.launch(args[: self._buffers]):
                return
            self._count_jit_launch(direct.refusal(args[: self._buffers]))
        elif sizes in self._direct:
            self._count_jit_launch(self._no_direct[sizes])
        self._call_through_jit(args)

    def _count_jit_launch(self, reason: str) -> None:
        """Count a launch that takes Triton's jit path after its sizes' first call."""
        name = self.kernel.name
        jit_launches[name] = jit_launches.get(name, 0) + 1
        jit_launch_reasons[name] = reason
        if self._jit_logged:
            return
        self._jit_logged = True
        level = logging.INFO if reason in EXPECTED_JIT_REASONS else logging.WARNING
        log.log(
            level,
            "kernel %s launches through Triton's jit, not directly (slower per launch): %s",
            name,
            reason,
        )

    def _call_through_jit(self, args: tuple[Any, ...]) -> None:
        pending = self.pending
        if pending is not None:
            # else Triton's jit would compile here what a worker is compiling
            pending.finish()
            self.pending = None
        start = time.perf_counter()
        kernel = self.kernel
        if len(args) != self._buffers + len(kernel.size_arguments):
            raise TypeError(
                f"kernel {kernel.name} takes {self._buffers} tensors "
                f"({', '.join(kernel.buffer_arguments)}) and {len(kernel.size_arguments)} "
                f"sizes ({', '.join(kernel.size_arguments)}); got {len(args)} arguments"
            )
        tensors = args[: self._buffers]
        sizes = [int(s) for s in args[self._buffers :]]
        operands = self._operands(tensors, sizes)
        key = (self.digest, tuple(sizes), tuple(t.dtype for t in tensors))
        config = _chosen.get(key)
        if config is None:
            config = self._tune(tensors, sizes)
            _chosen[key] = config
        compiled = self._launch(config, operands, sizes)
        size_key = args[self._buffers :]
        if size_key not in self._direct:
            direct = _DirectLaunch.make(self, compiled, config, operands, sizes)
            if isinstance(direct, str):
                self._no_direct[size_key] = direct
                self._direct[size_key] = None
            else:
                self._direct[size_key] = direct
            first_launch_seconds[0] += time.perf_counter() - start

    def _operands(self, tensors: Sequence[torch.Tensor], sizes: list[int]) -> list[Any]:
        operands: list[Any] = [storage_view(t) for t in tensors]
        operands += sizes
        operands += [
            tensors[i].untyped_storage().nbytes() // tensors[i].element_size() for i in self._bounds
        ]
        return operands

    def grid(self, config: LaunchConfig, sizes: list[int]) -> tuple[int, int, int]:
        return self.kernel.launch_grid(
            config, dict(zip(self.kernel.size_arguments, sizes, strict=True))
        )

    def _launch(self, config: LaunchConfig, operands: list[Any], sizes: list[int]) -> Any:
        options = dict(self.kernel.launch_options)
        if options and interpreting():
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

    def _tune(self, tensors: Sequence[torch.Tensor], sizes: list[int]) -> LaunchConfig:
        configs = self.kernel.configs
        if len(configs) == 1 or interpreting() or tensors[0].device.type != "cuda":
            return configs[0]
        tensors = list(tensors)
        if not self.kernel.idempotent or _aliased(tensors):
            for i in self._written:  # time on copies: the real outputs stay untouched
                tensors[i] = storage_view(tensors[i]).clone()
        operands = self._operands(tensors, sizes)
        best, best_ms = configs[0], float("inf")
        for candidate in configs:
            try:
                ms = _time(functools.partial(self._launch, candidate, operands, sizes))
            except Exception:  # a config that does not compile (resources) is skipped
                continue
            if ms < best_ms:
                best, best_ms = candidate, ms
        return best


class _DirectLaunch:
    """A compiled kernel bound to one set of sizes: its grid and block arguments are
    fixed, so a launch is the tensors plus one call into Triton's C launcher.

    It applies only where Triton's jit would pick the same binary: every pointer
    16-byte aligned (as when it was compiled), no launch hooks (profilers), no debug
    bounds arguments. Otherwise `make` says why there is none, or `launch` returns
    False (and `refusal` says why), and the jit path runs.
    """

    __slots__ = ("blocks", "buffers", "device", "function", "grid", "metadata", "run", "sizes")

    def __init__(
        self,
        compiled: Any,
        grid: tuple[int, int, int],
        sizes: list[int],
        blocks: list[int],
        device: int,
        buffers: Sequence[str] = (),
    ) -> None:
        self.run = compiled.run
        self.function = compiled.function
        self.metadata = compiled.packed_metadata
        self.grid = grid
        self.sizes = sizes
        self.blocks = blocks
        self.device = device
        self.buffers = buffers  # the tensors' names, for `refusal`

    @staticmethod
    def make(
        launcher: TritonLauncher,
        compiled: Any,
        config: LaunchConfig,
        operands: list[Any],
        sizes: list[int],
    ) -> _DirectLaunch | str:
        """The direct launch for one set of sizes, or why there is none."""
        kernel = launcher.kernel
        if interpreting():
            return INTERPRETER
        if kernel.bounds_arguments:
            return BOUNDS_ARGUMENTS
        if compiled is None or not hasattr(compiled, "packed_metadata"):
            return f"Triton's jit returned no compiled kernel with packed metadata ({compiled!r})"
        hooks = _hooks_active()
        if hooks is None:
            return "this Triton keeps its launch hooks where ember does not look for them"
        if hooks:
            return LAUNCH_HOOK
        tensors = operands[: launcher._buffers]
        if not tensors:
            return "the kernel takes no tensors"
        names = kernel.buffer_arguments
        for name, t in zip(names, tensors, strict=True):
            if t.device.type != "cuda":
                return f"buffer {name} is on {t.device.type}, not a CUDA device"
            if t.data_ptr() % 16:
                return f"buffer {name} was not 16-byte aligned at the first call"
        blocks = [value for _, value in config.blocks]
        grid = launcher.grid(config, sizes)
        device = tensors[0].device.index or 0
        direct = _DirectLaunch(compiled, grid, sizes, blocks, device, names)
        try:  # a Triton whose launcher takes other arguments fails here, before launching
            direct.run(
                0, 1, 1, _stream(direct.device), direct.function, direct.metadata,
                None, None, None, *operands, *blocks,
            )  # fmt: skip
        except TypeError as exc:
            return f"Triton's compiled launcher takes other arguments ({exc})"
        return direct

    def launch(self, tensors: Sequence[torch.Tensor]) -> bool:
        """Launch with `tensors`' storages; False (nothing launched) where a pointer
        is not 16-byte aligned or a launch hook is registered.

        Pointers go to Triton's launcher as integers: handed a tensor, it calls the
        tensor's `data_ptr` and asks the driver whether the pointer is a device
        pointer, per argument and launch; the tensors were CUDA tensors when the
        launch was bound, and Dynamo guards their device."""
        pointers = []
        for t in tensors:
            pointer = t.data_ptr()
            offset: int = t.storage_offset()  # type: ignore[assignment]  # an int at run time
            if offset:
                pointer -= offset * t.element_size()
            if pointer % 16:
                return False
            pointers.append(pointer)
        runtime = _RUNTIME
        if runtime is None:
            if _hooks_active() is not False:
                return False
        elif getattr(runtime.launch_enter_hook, "calls", True) or getattr(
            runtime.launch_exit_hook, "calls", True
        ):
            return False
        g0, g1, g2 = self.grid
        self.run(
            g0, g1, g2, _stream(self.device), self.function, self.metadata, None, None, None,
            *pointers, *self.sizes, *self.blocks,
        )  # fmt: skip
        return True

    def refusal(self, tensors: Sequence[torch.Tensor]) -> str:
        """Why `launch` returned False for `tensors` (read only after it did)."""
        for number, t in enumerate(tensors):
            if storage_view(t).data_ptr() % 16:
                name = self.buffers[number] if number < len(self.buffers) else f"#{number}"
                return f"buffer {name} is not 16-byte aligned"
        if _hooks_active():
            return LAUNCH_HOOK
        return "the direct launch refused these tensors"


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


def _stream(device: int) -> int:
    """The current CUDA stream's handle (the call Triton itself makes per launch)."""
    return int(torch._C._cuda_getCurrentRawStream(device))


def _hook_chains() -> Any:
    """Triton's runtime knobs where both launch hooks are `HookChain`s (Triton 3.6+),
    read once: the direct launch then tests the chains' lists itself."""
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    hooks = [getattr(runtime, name, None) for name in ("launch_enter_hook", "launch_exit_hook")]
    if runtime is None or not all(isinstance(getattr(h, "calls", None), list) for h in hooks):
        return None
    return runtime


_RUNTIME = _hook_chains()


def _hooks_active() -> bool | None:
    """Whether a launch hook (a profiler's) is registered with Triton; None where this
    Triton keeps its hooks somewhere unknown. Triton 3.6+ holds each hook as a
    `HookChain`, never None: an empty chain calls nothing, so launching without it
    is the same launch."""
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None:
        return None
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def _aliased(tensors: Sequence[torch.Tensor]) -> bool:
    pointers = [t.untyped_storage().data_ptr() for t in tensors]
    return len(set(pointers)) != len(pointers)


def _time(run: Callable[[], None], repeats: int = 10) -> float:
    """Median milliseconds of `run` on the current stream (after a compile + warm-up)."""
    run()
    run()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]  # type: ignore[no-untyped-call]  # torch stub
    end = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]  # type: ignore[no-untyped-call]  # torch stub
    for s, e in zip(start, end, strict=True):
        s.record()
        run()
        e.record()
    torch.cuda.synchronize()
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
}  # fmt: skip


class InterpreterLibdevice:
    """Stands in for `libdevice` in kernel modules run by Triton's interpreter."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        try:
            fn = _LIBDEVICE_AS_TORCH[name]
        except KeyError:
            raise AttributeError(f"libdevice.{name} has no interpreter stand-in") from None
        return lambda *args: _apply(fn, args)


def _apply(fn: Callable[..., torch.Tensor], args: tuple[Any, ...]) -> Any:
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    arrays = [np.asarray(a.handle.data) for a in args]
    result = fn(*(torch.from_numpy(np.ascontiguousarray(x)) for x in arrays)).numpy()
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
