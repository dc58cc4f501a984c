"""A Triton compile worker: run as a script, it imports Triton and nothing of torch.

    python .../ember/runtime/compile_worker.py

It is started by ember.runtime.compile_pool as a plain subprocess, by file path, so
that importing it imports neither the `ember.runtime` package nor torch (which takes
seconds and holds a CUDA context). It reads pickled compile requests from stdin and
writes one pickled reply per request: the compiled binary described in plain values
(`compile_binary`), or a string saying what went wrong. A request names the kernel's
module file (a file of ember's cache, checked against its recorded SHA-256 before it
is loaded) and function and gives the exact specialisation to compile (signature,
constants, attributes, target, options), which the parent builds from what it
rendered; nothing of Triton's jit state is involved.

It first compiles a tiny kernel of its own for the same target the parent names on
the command line (Triton's first compile in a process loads its compiler libraries,
about a second), then writes "ready".

Replies go to a private copy of stdout; anything else written to fd 1 (by Triton or
the tools it runs) goes to stderr and cannot corrupt a reply. Only the parent, our own
process, writes the requests, so unpickling them is safe.
"""

from __future__ import annotations

import sys

# Run as a script, Python puts this file's directory first on the path, where
# ember.runtime's own modules (config.py, logs.py, ...) would shadow same-named ones.
sys.path[:] = [p for p in sys.path if p != (__file__.rpartition("/")[0] or ".")]

import collections  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
import importlib.util  # noqa: E402
import linecache  # noqa: E402
import os  # noqa: E402
import pickle  # noqa: E402
import types  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import IO, Any  # noqa: E402

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402


@triton.jit  # type: ignore[untyped-decorator]  # Triton is untyped
def _warm_up_kernel(out, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]  # jit kernel
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, i.to(tl.float32) * 2.0, mask=i < n)


# path -> the kernel module loaded from it: the most recent MODULES_KEPT, since a
# worker serves every graph the parent compiles; a dropped one is read again.
MODULES_KEPT = 256
_modules: collections.OrderedDict[str, Any] = collections.OrderedDict()


@functools.cache
def _store() -> Any:
    """ember.runtime.store, loaded by its file path (it imports the standard library
    only; importing it as part of ember.runtime would import torch)."""
    location = Path(__file__).with_name("store.py")
    spec = importlib.util.spec_from_file_location("ember_compile_worker_store", location)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {location}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _function(path: str, module_name: str, function: str) -> Any:
    """The jit function `function` of the file at `path` (a cache entry's file, checked
    against its recorded SHA-256 first), made into a module under the name the parent
    gave it, the way the parent's ember.runtime.loader.load_module makes it: compiled
    from the checked text, never imported (no `.pyc` written or read), the text in
    `linecache` for Triton's jit to read. Nothing of the function differs from the
    parent's, so both compute the same Triton cache key."""
    module = _modules.get(path)
    if module is None:
        data = _store().read_file(Path(path))
        if data is None:
            raise ImportError(f"kernel module {path} is missing or fails its check; not loaded")
        text = data.decode()
        code = compile(text, path, "exec", dont_inherit=True)
        module = types.ModuleType(module_name)
        module.__file__ = path
        linecache.cache[path] = (len(text), None, text.splitlines(keepends=True), path)
        exec(code, module.__dict__)
        _modules[path] = module
        while len(_modules) > MODULES_KEPT:
            _modules.popitem(last=False)
    else:
        _modules.move_to_end(path)
    return getattr(module, function)


def compile_binary(request: dict[str, Any]) -> dict[str, Any]:
    """Compile one kernel specialisation and describe its binary in plain values.

    The request names the kernel (`path`, `module`, `function`) and what Triton's
    compile takes: `signature` (a type per argument, "constexpr" for block sizes),
    `constexprs` and `attrs` keyed by argument position, `target` (backend, arch,
    warp size) and `options` (warps, stages, debug). The reply has the binary
    (`image`), its entry `symbol`, the kernel's parameter count as the binary declares
    it (`params`: Triton appends scratch pointers of its own after the signature's
    arguments), threads per block, shared memory and scratch needs. It is the same
    function in the workers and in the parent's threads."""
    fn = _function(request["path"], request["module"], request["function"])
    source = ASTSource(fn, request["signature"], request["constexprs"], request["attrs"])
    backend, arch, warp_size = request["target"]
    kernel = triton.compile(
        source, target=GPUTarget(backend, arch, warp_size), options=request["options"]
    )
    metadata = kernel.metadata
    symbol = str(metadata.name)
    return {
        "symbol": symbol,
        "image": bytes(kernel.asm["cubin"]),
        "params": count_parameters(str(kernel.asm.get("ptx", "")), symbol),
        "threads": int(metadata.num_warps) * warp_size,
        "shared": int(metadata.shared),
        "num_ctas": int(getattr(metadata, "num_ctas", 1)),
        "cluster": list(getattr(metadata, "cluster_dims", (1, 1, 1)) or (1, 1, 1)),
        "scratch": int(getattr(metadata, "global_scratch_size", 0) or 0),
        "scratch_align": int(getattr(metadata, "global_scratch_align", 1) or 1),
        "profile_scratch": int(getattr(metadata, "profile_scratch_size", 0) or 0),
        "cooperative": bool(getattr(metadata, "launch_cooperative_grid", False)),
        "pdl": bool(getattr(metadata, "launch_pdl", False)),
        "triton": triton.__version__,
    }


def count_parameters(ptx: str, symbol: str) -> int:
    """How many parameters the PTX entry `symbol` declares (-1 if it is not found)."""
    head = ptx.find(f".entry {symbol}(")
    if head < 0:
        return -1
    end = ptx.find(")", head)
    return ptx[head:end].count(".param ")


def warm_up(backend: str, arch: int, warp_size: int) -> None:
    signature = {"out": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    source = ASTSource(_warm_up_kernel, signature, {(2,): 128}, {(0,): [["tt.divisibility", 16]]})
    triton.compile(source, target=GPUTarget(backend, arch, warp_size), options={"num_warps": 4})


def serve(requests: IO[bytes], replies: IO[bytes], target: tuple[str, int, int] | None) -> None:
    if target is not None:
        with contextlib.suppress(Exception):  # the real requests will say what is wrong
            warm_up(*target)
    pickle.dump("ready", replies)
    replies.flush()
    while True:
        try:
            request = pickle.load(requests)
        except EOFError:
            return
        reply: dict[str, Any] | str
        try:
            reply = compile_binary(request)
        except Exception as exc:  # reported to the parent, which compiles the kernel itself
            reply = f"error: {type(exc).__name__}: {exc}".replace("\n", " ")
        pickle.dump(reply, replies)
        replies.flush()


def main(argv: list[str]) -> None:
    # Sixteen workers would print each of Triton's warnings sixteen times on the
    # user's terminal; what goes wrong in a compile comes back in the reply instead.
    warnings.simplefilter("ignore")
    target = (argv[0], int(argv[1]), int(argv[2])) if len(argv) == 3 else None
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, replies, target)


if __name__ == "__main__":
    main(sys.argv[1:])
