"""Loading and launching GPU kernel binaries through the CUDA driver API (ctypes).

Why not Triton's launcher. Ember renders its kernels, so it knows every argument's
type; what it needs at run time is a loaded function and one `cuLaunchKernel`. Going
through Triton's jit rebinds and re-specialises every argument per launch, and its
compiled launchers differ from one Triton release to the next (3.6 builds a C module
per argument signature with the host compiler; later ones take other arguments).
A binary loaded here needs no compiler and no Triton at all, which is what a compiled
artifact loaded in another process (or a package on another machine) needs too.

`Launch` holds one function's argument block: a ctypes array of pointers to value
slots, built once. A launch writes the tensor addresses into their slots and calls
the driver: about 1.5 us of Python on the 2-core build machine for six tensors,
before the driver's own cost.

The driver library is the one torch's CUDA runtime loaded (libcuda.so.1); contexts
are the devices' primary contexts, the ones torch uses, so a function loaded here
runs on torch's streams and inside torch's CUDA graph captures.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Sequence
from typing import Any

# CUresult codes read by name below
_INVALID_CONTEXT = 201
# CUfunction_attribute
_SHARED_SIZE_BYTES = 1
_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
# CUdevice_attribute
_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
_CACHE_PREFER_SHARED = 1
_STATIC_SHARED_LIMIT = 48 * 1024  # shared memory a block gets without opting in

_c = ctypes
_void_p = _c.c_void_p


class CudaDriverError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's error."""


@functools.cache
def _lib() -> Any:
    try:
        lib = _c.CDLL("libcuda.so.1")
    except OSError as exc:
        raise CudaDriverError(
            f"the CUDA driver library libcuda.so.1 cannot be loaded: {exc}"
        ) from exc
    u, i, p = _c.c_uint, _c.c_int, _void_p
    signatures: dict[str, list[Any]] = {
        "cuGetErrorString": [i, _c.POINTER(_c.c_char_p)],
        "cuModuleLoadData": [_c.POINTER(p), _c.c_char_p],
        "cuModuleUnload": [p],
        "cuModuleGetFunction": [_c.POINTER(p), p, _c.c_char_p],
        "cuFuncGetAttribute": [_c.POINTER(i), i, p],
        "cuFuncSetAttribute": [p, i, i],
        "cuFuncSetCacheConfig": [p, i],
        "cuDeviceGet": [_c.POINTER(i), i],
        "cuDeviceGetAttribute": [_c.POINTER(i), i, i],
        "cuDevicePrimaryCtxRetain": [_c.POINTER(p), i],
        "cuCtxGetCurrent": [_c.POINTER(p)],
        "cuCtxSetCurrent": [p],
        "cuLaunchKernel": [p, u, u, u, u, u, u, u, p, p, p],
    }
    for name, argtypes in signatures.items():
        function = getattr(lib, name)
        function.argtypes = argtypes
        function.restype = i
    return lib


def _error_text(code: int) -> str:
    text = _c.c_char_p()
    if _lib().cuGetErrorString(code, _c.byref(text)) == 0 and text.value:
        return f"{text.value.decode()} ({code})"
    return f"CUDA driver error {code}"


def _check(code: int, what: str) -> None:
    if code != 0:
        raise CudaDriverError(f"{what} failed: {_error_text(code)}")


def _make_current(device: int) -> None:
    """Make `device`'s primary context (torch's) current on this thread."""
    current = _void_p()
    _check(_lib().cuCtxGetCurrent(_c.byref(current)), "cuCtxGetCurrent")
    context = _primary_context(device)
    if current.value != context.value:
        _check(_lib().cuCtxSetCurrent(context), "cuCtxSetCurrent")


@functools.cache
def _primary_context(device: int) -> Any:
    """`device`'s primary context, retained once for the process (each retain counts
    one more user of the context)."""
    lib = _lib()
    handle = _c.c_int()
    _check(lib.cuDeviceGet(_c.byref(handle), device), "cuDeviceGet")
    context = _void_p()
    _check(lib.cuDevicePrimaryCtxRetain(_c.byref(context), handle), "cuDevicePrimaryCtxRetain")
    return context


class Function:
    """One kernel of a loaded binary on one device, ready to launch with up to
    `shared` bytes of dynamic shared memory."""

    def __init__(self, image: bytes, symbol: str, device: int, shared: int) -> None:
        lib = _lib()
        _make_current(device)
        module = _void_p()
        _check(lib.cuModuleLoadData(_c.byref(module), image), f"loading kernel {symbol}")
        function = _void_p()
        _check(
            lib.cuModuleGetFunction(_c.byref(function), module, symbol.encode()),
            f"finding {symbol} in its binary",
        )
        self.module, self.handle, self.symbol, self.device = module, function, symbol, device
        if shared > _STATIC_SHARED_LIMIT:
            self._opt_in(shared)

    def _opt_in(self, shared: int) -> None:
        """Allow more dynamic shared memory than the default 48 KiB (Hopper's blocks
        may use up to 227 KiB, but only after asking)."""
        lib = _lib()
        limit, static = _c.c_int(), _c.c_int()
        _check(
            lib.cuDeviceGetAttribute(
                _c.byref(limit), _MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, self.device
            ),
            "reading the device's shared memory limit",
        )
        if shared > limit.value:
            raise CudaDriverError(
                f"kernel {self.symbol} needs {shared} bytes of shared memory; "
                f"device {self.device} allows {limit.value}"
            )
        _check(
            lib.cuFuncGetAttribute(_c.byref(static), _SHARED_SIZE_BYTES, self.handle),
            f"reading {self.symbol}'s static shared memory",
        )
        _check(lib.cuFuncSetCacheConfig(self.handle, _CACHE_PREFER_SHARED), "cuFuncSetCacheConfig")
        _check(
            lib.cuFuncSetAttribute(
                self.handle, _MAX_DYNAMIC_SHARED_SIZE_BYTES, limit.value - static.value
            ),
            f"raising {self.symbol}'s shared memory limit",
        )


# ctypes slot types by argument kind ('p': a device pointer)
_SLOTS = {"p": _c.c_uint64, "i32": _c.c_int32, "i64": _c.c_int64, "u32": _c.c_uint32}


class Launch:
    """`function` with a fixed grid, block and shared memory, and an argument block of
    the given `kinds` (one of `_SLOTS`' keys per kernel parameter, in order), whose
    `fixed` slots hold the same value at every launch (sizes, null scratch pointers).

    `block()` gives the calling thread's value slots and the block's address; a
    launch fills the slots and calls `launch(stream, address)`. The driver copies the
    arguments during the call, so slots may be overwritten right after. Each thread has
    its own block (autograd runs a CUDA backward on a thread of its own), so two
    threads launching one kernel never see each other's arguments."""

    def __init__(
        self,
        function: Function,
        grid: tuple[int, int, int],
        threads: int,
        shared: int,
        kinds: Sequence[str],
        fixed: dict[int, int] | None = None,
    ) -> None:
        self.function = function
        self.fixed = dict(fixed or {})  # slot -> value, the same at every launch
        self.grid = grid
        self.threads = threads
        self.shared = shared
        self.kinds = tuple(kinds)
        self._blocks: dict[int, tuple[list[Any], int, Any]] = {}
        self._call = _lib().cuLaunchKernel
        self._handle = function.handle
        # grid, block and shared memory: the arguments before the stream
        self._shape = (*grid, threads, 1, 1, shared)

    def block(self) -> tuple[list[Any], int]:
        """The calling thread's argument slots and the address of its block."""
        found = self._blocks.get(threading.get_ident())
        if found is None:
            slots = [_SLOTS[k]() for k in self.kinds]
            for index, value in self.fixed.items():
                slots[index].value = value
            array = (_void_p * max(len(slots), 1))(*[_c.addressof(s) for s in slots])
            # the array points into the slots: the entry keeps both alive
            found = self._blocks[threading.get_ident()] = (slots, _c.addressof(array), array)
        return found[0], found[1]

    def launch(self, stream: int, address: int) -> None:
        g0, g1, g2 = self.grid
        handle = self.function.handle
        code = self._call(
            handle, g0, g1, g2, self.threads, 1, 1, self.shared, stream, address, None
        )
        if code:
            if code == _INVALID_CONTEXT:  # a thread that never made torch's context current
                _make_current(self.function.device)
                code = self._call(
                    handle, g0, g1, g2, self.threads, 1, 1, self.shared, stream, address, None
                )
            _check(code, f"launching {self.function.symbol}")
